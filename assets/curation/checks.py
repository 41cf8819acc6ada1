"""The curation assets' checks (documents_valid, no_benchmark_ngrams), on the committed output.

documents_valid (filtered, deduplicated, decontaminated): great-expectations 1.x called directly (dagster-ge needs
    GE < 1 and pandas < 3, docs/stack.md) on the output's documents: text present and within length
    bounds, unique ids, languages in the source's allowed set (for a source with a language filter), no PII pattern
    left (the scrubber's own patterns, pipelines/filters.py, under the source's PII settings). Severity ERROR, not
    blocking: a violation shows on the asset, it does not stop the run.
no_benchmark_ngrams (decontaminated): every n-gram of the committed documents' normalized words looked up in the
    benchmark index again; any hit fails it. BLOCKING: the check fails the step, so nothing downstream (the packed
    shards) materializes from contaminated documents in that run.

Both read the output back from the store through its manifest, so they run the same whether the asset computed
its output or reused one already committed for the version (a reused output is checked again every time).

    parts = {"web": Output(key, prefix, manifest).files()}
    result = documents_check(store, parts, {"web": recipe.source("web").filter})   # an AssetCheckResult
"""

from __future__ import annotations

import gzip
from collections import Counter
from typing import Iterator, Mapping

import orjson
from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey, MetadataValue

from pipelines.decontam import BenchmarkIndex
from pipelines.dedup import WordHasher, ngram_hashes, normalized_words
from pipelines.filters import FilterConfig, find_pii
from storage.objects import ObjectStore

DOCUMENTS_CHECK = "documents_valid"
BENCHMARK_CHECK = "no_benchmark_ngrams"
MAX_TEXT_CHARS = 8 * 2**20  # the reader's max_document_bytes default: nothing longer can come out of ingest
EXAMPLES = 10  # ids of offending documents listed in a check's metadata


def documents_check_spec(key: AssetKey) -> AssetCheckSpec:
    return AssetCheckSpec(
        DOCUMENTS_CHECK, asset=key,
        description="great-expectations on the output's documents: non-empty text within length bounds, unique ids, "
                    "languages in the source's allowed set, no PII pattern left.",
    )


def benchmark_check_spec(key: AssetKey) -> AssetCheckSpec:
    return AssetCheckSpec(
        BENCHMARK_CHECK, asset=key, blocking=True,
        description="Blocking: the committed documents re-scanned against the benchmark n-gram index; any surviving "
                    "benchmark n-gram fails the check and stops everything downstream in the run.",
    )


def read_documents(store: ObjectStore, keys: list[str]) -> Iterator[dict]:
    """The documents of gzip JSONL parts in the store, in order."""
    for key in keys:
        for line in gzip.decompress(store.get_bytes(key)).splitlines():
            if line.strip():
                yield orjson.loads(line)


def validate_documents(docs: list[dict], config: FilterConfig | Mapping[str, FilterConfig]) -> tuple[bool, dict]:
    """great-expectations on documents of one source (`config` its filter settings) or of several (`config` maps
    each source to its settings; a document's source is its metadata.source).

    Returns (success, {expectation: {"success", "unexpected", "examples"}}). Ids must be unique across the whole
    set; with several sources a document is identified by "<source>/<id>", as dedup's cluster ids name it (two
    sources may each give their own documents the same id)."""
    success, details, _ = _validate(docs, config)
    return success, details


def _validate(docs: list[dict], config: FilterConfig | Mapping[str, FilterConfig]) -> tuple[bool, dict, Counter]:
    """validate_documents, plus the PII left by type (found once, used for the expectation and the metadata)."""
    import great_expectations as gx
    import pandas as pd

    if not docs:  # nothing kept (e.g. a one-page source whose page went at language ID): nothing to violate
        return True, {}, Counter()
    filters = {"": config} if isinstance(config, FilterConfig) else dict(config)
    several = len(filters) > 1
    sources = [d.get("metadata", {}).get("source", "") if several else next(iter(filters)) for d in docs]
    unknown = sorted(set(sources) - set(filters))
    if unknown:
        raise ValueError(f"documents of source(s) {unknown} have no filter settings; known: {sorted(filters)}")
    found = [find_pii(d["text"], filters[s].pii) if filters[s].pii else {} for s, d in zip(sources, docs)]
    frame = pd.DataFrame({
        "source": sources,
        "id": [f"{s}/{d['id']}" if several else d["id"] for s, d in zip(sources, docs)],
        "text": [d["text"] for d in docs],
        "language": [d.get("metadata", {}).get("language", "") for d in docs],
        "pii_left": [sum(map(len, f.values())) for f in found],
    })
    expectations = [
        gx.expectations.ExpectColumnValuesToNotBeNull(column="text"),
        gx.expectations.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1, max_value=MAX_TEXT_CHARS),
        gx.expectations.ExpectColumnValuesToBeUnique(column="id"),
        gx.expectations.ExpectColumnValuesToBeBetween(column="pii_left", min_value=0, max_value=0),
    ]
    for name, settings in filters.items():
        if settings.language is None:
            continue  # no language filter (code): no language to hold it to
        # One expectation per source, on that source's rows only: each source has its own allowed set.
        where = {"row_condition": f'source=="{name}"', "condition_parser": "pandas"} if several else {}
        expectations.append(gx.expectations.ExpectColumnValuesToBeInSet(
            column="language", value_set=list(settings.language.languages), **where))
    context = gx.get_context(mode="ephemeral")
    batch = (context.data_sources.add_pandas("output").add_dataframe_asset("documents")
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame}))
    result = batch.validate(gx.ExpectationSuite(name="curated_documents", expectations=expectations))
    details = {}
    for r in result.results:
        kwargs = r.expectation_config.kwargs
        name = f"{r.expectation_config.type}({kwargs.get('column')})"
        if kwargs.get("row_condition"):
            name += f"[{_condition_source(kwargs['row_condition'])}]"
        details[name] = {"success": bool(r.success), "unexpected": int(r.result.get("unexpected_count") or 0),
                         "examples": [str(x)[:80] for x in (r.result.get("partial_unexpected_list") or [])[:5]]}
    pii: Counter = Counter()
    for hits_by_kind in found:
        pii.update({kind: len(hits) for kind, hits in hits_by_kind.items()})
    return bool(result.success), details, pii


def documents_check(store: ObjectStore, parts: Mapping[str, list[str]], filters: Mapping[str, FilterConfig]) -> AssetCheckResult:
    """documents_valid on an output's parts, `parts` mapping each source to its part keys in the store."""
    docs = []
    for source, keys in parts.items():
        for doc in read_documents(store, keys):
            # Where the document lies decides its source (the folder of a dedup output), not what it claims.
            doc.setdefault("metadata", {})["source"] = source
            docs.append(doc)
    success, details, pii = _validate(docs, {s: filters[s] for s in parts})
    return AssetCheckResult(
        check_name=DOCUMENTS_CHECK,
        passed=success,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "documents": len(docs),
            "expectations": MetadataValue.json(details),
            # Types and counts only: the values are what must not leak, into the event log least of all.
            "pii_left_by_type": MetadataValue.json(dict(pii)),
        },
    )


def benchmark_check(store: ObjectStore, keys: list[str], index: BenchmarkIndex) -> AssetCheckResult:
    """no_benchmark_ngrams: each document's n-grams (normalized words, as the index has them) looked up again.

    Deliberately not the decontaminator's span logic: every n-gram of the committed text, so a cut that leaves
    a benchmark n-gram behind, or a document that slipped through, fails the check."""
    hasher = WordHasher()
    hits = {name: 0 for name in index.names}  # documents with a surviving n-gram of each benchmark
    ngrams = 0
    offenders: list[str] = []
    documents = 0
    for doc in read_documents(store, keys):
        documents += 1
        words = normalized_words(doc.get("text") or "")
        if len(words) < index.ngram:
            continue  # shorter than an n-gram: nothing the index could hold
        positions, names = index.matches(ngram_hashes(hasher(words), index.ngram))
        if len(positions):
            ngrams += len(positions)
            offenders.append(str(doc.get("id")))
            for name in names:
                hits[name] += 1
    return AssetCheckResult(
        check_name=BENCHMARK_CHECK,
        passed=not offenders,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "documents": documents,
            "documents_with_hits": len(offenders),
            "surviving_ngrams": ngrams,
            "hits_per_benchmark": MetadataValue.json(hits),
            "examples": MetadataValue.json(offenders[:EXAMPLES]),
            "benchmark_ngrams": len(index.hashes),
            "ngram": index.ngram,
        },
    )


def _condition_source(condition) -> str:
    """'c4' from the row condition GE hands back (a string, or {"pass_through_filter": 'source=="c4"'})."""
    text = condition.get("pass_through_filter", "") if isinstance(condition, dict) else str(condition)
    return text.split("==", 1)[-1].strip("\"' ")
