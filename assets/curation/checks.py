"""The curation assets' checks (documents_valid, no_benchmark_ngrams), on the committed output.

documents_valid (filtered, deduplicated, decontaminated): great-expectations 1.x called directly (dagster-ge needs
    GE < 1 and pandas < 3, docs/stack.md) on the output's documents: text present and within length
    bounds, unique ids, languages in the source's allowed set (for a source with a language filter), no PII pattern
    left (the scrubber's own patterns, pipelines/filters/pii.py, under the source's PII settings). Severity ERROR, not
    blocking: a violation shows on the asset, it does not stop the run.
    Never one DataFrame of a whole output: the recipe's `checks` section (assets/recipe/curation.py ChecksConfig) says
    `chunks` (default: every document, in DataFrames of at most `chunk_documents` rows and `chunk_text_chars`
    characters of text, the results summed) or `sample` (the per-document expectations on a seeded reservoir
    sample of `sample_documents` documents, in the same frames). Each chunk is two frames: the text alone for the
    text expectations, and source, language and PII counts for the others (GE copies a whole frame per
    expectation: the text is copied only for the expectations on it).
    Unique ids is a property of the whole set, so in both modes it is checked on every id as they stream past
    (UniqueIds: 8 bytes per document, exact), not by GE on a frame.
no_benchmark_ngrams (decontaminated): every n-gram of the committed documents' normalized words looked up in the
    benchmark index again; any hit fails it. BLOCKING: the check fails the step, so nothing downstream (the packed
    shards) materializes from contaminated documents in that run. A full scan (it must see every document),
    streamed one document at a time.

Both read the output back from the store through its manifest, streaming each part (never the whole part in
memory), so they run the same whether the asset computed its output or reused one already committed for the
version (a reused output is checked again every time).

    parts = {"web": Output(key, prefix, manifest).files()}
    result = documents_check(store, parts, {"web": recipe.source("web").filter}, recipe.checks)  # AssetCheckResult
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey, MetadataValue

from assets.recipe import ChecksConfig
from pipelines.filters.config import FilterConfig
from storage.objects import ObjectStore

if TYPE_CHECKING:  # engines and numpy are imported where a check runs, not when the code location loads
    import numpy as np

    from pipelines.decontam.index import BenchmarkIndex

DOCUMENTS_CHECK = "documents_valid"
BENCHMARK_CHECK = "no_benchmark_ngrams"
MAX_TEXT_CHARS = 8 * 2**20  # the reader's max_document_bytes default: nothing longer can come out of ingest
EXAMPLES = 10  # ids of offending documents listed in a check's metadata
EXPECTATION_EXAMPLES = 5  # values listed per failed expectation
UNIQUE_IDS = "expect_column_values_to_be_unique(id)"

# (source, document) pairs, from the start each time it is called: the uniqueness check may need a second pass.
DocumentStream = Callable[[], Iterator[tuple[str, dict]]]


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
    """The documents of gzip JSONL parts in the store, in order, streamed: one line in memory at a time."""
    from pipelines.shards import store_documents
    for key in keys:
        yield from store_documents(store, key)


def language_counts(store: ObjectStore, keys: list[str]) -> Counter:
    """Documents per metadata.language ("?" where unset) of gzip JSONL parts, streamed (filtered's histogram)."""
    return Counter(doc.get("metadata", {}).get("language", "?") for doc in read_documents(store, keys))


class UniqueIds:
    """Are the ids of a stream unique? Exact, in BYTES_PER_DOCUMENT bytes per document.

    Each id's 8-byte blake2b goes into numpy arrays (8 bytes per document; 16 for a moment while they are joined
    and sorted at the end, nothing else per document). Equal hashes are duplicates or, rarely, collisions
    (~n^2/2^65: 3% at a billion documents), so when any repeat, a second pass over the ids keeps only those with
    a repeated hash and counts them by value: the answer is the same as GE's on one frame of every id."""

    BYTES_PER_DOCUMENT = 8
    _FLUSH = 65_536  # ids hashed into a Python list before it becomes a numpy array

    def __init__(self) -> None:
        self._arrays: list[np.ndarray] = []
        self._pending: list[int] = []
        self.count = 0

    @staticmethod
    def _hash(label: str) -> int:
        return int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "little")

    def add(self, label: str) -> None:
        self._pending.append(self._hash(label))
        self.count += 1
        if len(self._pending) >= self._FLUSH:
            self._flush()

    def _flush(self) -> None:
        import numpy as np

        if self._pending:
            self._arrays.append(np.array(self._pending, dtype=np.uint64))
            self._pending = []

    def duplicates(self, labels: Callable[[], Iterable[str]]) -> tuple[int, list[str]]:
        """(documents whose id is not unique, their ids in stream order, up to EXPECTATION_EXAMPLES), as GE's
        expect_column_values_to_be_unique counts them; `labels` gives every id again, in the same order."""
        import numpy as np

        self._flush()
        if not self._arrays:
            return 0, []
        hashes = np.concatenate(self._arrays)
        self._arrays = [hashes]
        hashes.sort()
        repeated = hashes[1:][hashes[1:] == hashes[:-1]]
        if not len(repeated):
            return 0, []
        suspects = set(np.unique(repeated).tolist())
        seen = [label for label in labels() if self._hash(label) in suspects]
        counts = Counter(seen)
        return (sum(n for n in counts.values() if n > 1),
                [label[:80] for label in seen if counts[label] > 1][:EXPECTATION_EXAMPLES])


@dataclass
class ValidationReport:
    """What documents_valid found: per expectation {"success", "unexpected", "examples"}, summed over frames."""

    details: dict = field(default_factory=dict)
    pii: Counter = field(default_factory=Counter)
    documents: int = 0  # seen (every id checked for uniqueness)
    validated: int = 0  # held to the per-document expectations (all of them, or the sample)
    frames: int = 0
    largest_frame_rows: int = 0  # the memory bound: no DataFrame is longer than this

    @property
    def success(self) -> bool:
        return all(d["success"] for d in self.details.values())

    def add(self, name: str, success: bool, unexpected: int, examples: list) -> None:
        entry = self.details.setdefault(name, {"success": True, "unexpected": 0, "examples": []})
        entry["success"] = entry["success"] and bool(success)
        entry["unexpected"] += int(unexpected)
        entry["examples"] = (entry["examples"] + [str(x)[:80] for x in examples])[:EXPECTATION_EXAMPLES]


def validate_documents(docs: list[dict], config: FilterConfig | Mapping[str, FilterConfig],
                       settings: ChecksConfig | None = None) -> tuple[bool, dict]:
    """great-expectations on documents of one source (`config` its filter settings) or of several (`config` maps
    each source to its settings; a document's source is its metadata.source). Without `settings`, the list is one
    frame (it is in memory already); with them, chunked or sampled as for a committed output.

    Returns (success, {expectation: {"success", "unexpected", "examples"}}). Ids must be unique across the whole
    set; with several sources a document is identified by "<source>/<id>", as dedup's cluster ids name it (two
    sources may each give their own documents the same id)."""
    filters = {"": config} if isinstance(config, FilterConfig) else dict(config)
    several = len(filters) > 1
    only = next(iter(filters))

    def stream() -> Iterator[tuple[str, dict]]:
        return ((d.get("metadata", {}).get("source", "") if several else only, d) for d in docs)

    whole = ChecksConfig(chunk_documents=max(1, len(docs)), chunk_text_chars=2**62)
    report = validate_stream(stream, filters, settings or whole)
    return report.success, report.details


def validate_stream(stream: DocumentStream, filters: Mapping[str, FilterConfig],
                    settings: ChecksConfig) -> ValidationReport:
    """documents_valid over a stream of (source, document), in frames of at most settings.chunk_documents rows
    and settings.chunk_text_chars characters of text."""
    several = len(filters) > 1
    report = ValidationReport()

    def label(source: str, doc: dict) -> str:
        return f"{source}/{doc.get('id')}" if several else str(doc.get("id"))

    ids = UniqueIds()

    def counted() -> Iterator[tuple[str, dict]]:
        for source, doc in stream():
            if source not in filters:
                raise ValueError(f"documents of source {source!r} have no filter settings; known: {sorted(filters)}")
            ids.add(label(source, doc))
            report.documents += 1
            yield source, doc

    if settings.mode == "chunks":
        rows = counted()
    else:  # every id still streams past the uniqueness check; the sample alone goes on to the frames
        rows = iter(seeded_sample(counted(), settings.sample_documents, settings.seed))
    suite = None
    for chunk in _chunks(rows, settings.chunk_documents, settings.chunk_text_chars):
        suite = suite or _Suite(filters)
        suite.validate(chunk, report)
    if report.documents == 0:  # nothing kept (e.g. a one-page source whose page went at language ID)
        return report
    unexpected, examples = ids.duplicates(lambda: (label(s, d) for s, d in stream()))
    report.add(UNIQUE_IDS, unexpected == 0, unexpected, examples)
    return report


def _chunks(rows: Iterator[tuple[str, dict]], documents: int, chars: int) -> Iterator[list]:
    """Consecutive lists of at most `documents` rows and `chars` characters of text (a longer document alone)."""
    chunk: list = []
    held = 0
    for row in rows:
        size = len(row[1].get("text") or "")
        if chunk and (len(chunk) >= documents or held + size > chars):
            yield chunk
            chunk, held = [], 0
        chunk.append(row)
        held += size
    if chunk:
        yield chunk


def seeded_sample(items: Iterator, k: int, seed: int) -> list:
    """A uniform sample of k items (all of them if fewer), in stream order; the same seed and stream, the same
    sample (Algorithm R, seeded). Holds k items, never more."""
    rng = random.Random(seed)
    sample: list[tuple[int, object]] = []
    for i, item in enumerate(items):
        if i < k:
            sample.append((i, item))
        else:
            j = rng.randrange(i + 1)
            if j < k:
                sample[j] = (i, item)
    return [item for _, item in sorted(sample, key=lambda pair: pair[0])]


class _Suite:
    """The per-document expectations and one GE context, built once and run on each frame."""

    def __init__(self, filters: Mapping[str, FilterConfig]):
        import great_expectations as gx

        self.filters = filters
        several = len(filters) > 1
        text = [
            gx.expectations.ExpectColumnValuesToNotBeNull(column="text"),
            gx.expectations.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1, max_value=MAX_TEXT_CHARS),
        ]
        expectations = [gx.expectations.ExpectColumnValuesToBeBetween(column="pii_left", min_value=0, max_value=0)]
        for name, settings in filters.items():
            if settings.language is None:
                continue  # no language filter (code): no language to hold it to
            # One expectation per source, on that source's rows only: each source has its own allowed set.
            where = {"row_condition": f'source=="{name}"', "condition_parser": "pandas"} if several else {}
            expectations.append(gx.expectations.ExpectColumnValuesToBeInSet(
                column="language", value_set=list(settings.language.languages), **where))
        context = gx.get_context(mode="ephemeral")
        self.batches = (context.data_sources.add_pandas("output").add_dataframe_asset("documents")
                        .add_batch_definition_whole_dataframe("frame"))
        self.suites = [gx.ExpectationSuite(name="document_text", expectations=text),
                       gx.ExpectationSuite(name="curated_documents", expectations=expectations)]

    def validate(self, chunk: list[tuple[str, dict]], report: ValidationReport) -> None:
        from pipelines.filters.pii import find_pii
        import pandas as pd

        found = []
        for source, doc in chunk:
            text, pii = doc.get("text"), self.filters[source].pii
            found.append(find_pii(text, pii) if pii and isinstance(text, str) else {})
        frames = [pd.DataFrame({"text": [d.get("text") for _, d in chunk]}), pd.DataFrame({
            "source": [s for s, _ in chunk],
            "language": [d.get("metadata", {}).get("language", "") for _, d in chunk],
            "pii_left": [sum(map(len, f.values())) for f in found],
        })]
        report.frames += 1
        report.validated += len(chunk)
        report.largest_frame_rows = max(report.largest_frame_rows, len(chunk))
        results = [self.batches.get_batch(batch_parameters={"dataframe": frame}).validate(suite)
                   for frame, suite in zip(frames, self.suites)]
        for r in (r for result in results for r in result.results):
            kwargs = r.expectation_config.kwargs
            name = f"{r.expectation_config.type}({kwargs.get('column')})"
            if kwargs.get("row_condition"):
                name += f"[{_condition_source(kwargs['row_condition'])}]"
            report.add(name, r.success, r.result.get("unexpected_count") or 0,
                       (r.result.get("partial_unexpected_list") or [])[:EXPECTATION_EXAMPLES])
        for hits_by_kind in found:
            report.pii.update({kind: len(hits) for kind, hits in hits_by_kind.items()})


def documents_check(store: ObjectStore, parts: Mapping[str, list[str]], filters: Mapping[str, FilterConfig],
                    settings: ChecksConfig | None = None) -> AssetCheckResult:
    """documents_valid on an output's parts, `parts` mapping each source to its part keys in the store;
    `settings` the recipe's checks section (default: chunks of 10,000 documents)."""
    settings = settings or ChecksConfig()

    def stream() -> Iterator[tuple[str, dict]]:
        for source, keys in parts.items():
            # Where the document lies decides its source (the folder of a dedup output), not what it claims.
            for doc in read_documents(store, keys):
                doc.setdefault("metadata", {})["source"] = source
                yield source, doc

    report = validate_stream(stream, {s: filters[s] for s in parts}, settings)
    return AssetCheckResult(
        check_name=DOCUMENTS_CHECK,
        passed=report.success,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "documents": report.documents,
            "validated": report.validated,
            "mode": settings.mode,
            "largest_frame_rows": report.largest_frame_rows,
            "id_check_bytes_per_document": UniqueIds.BYTES_PER_DOCUMENT,
            "expectations": MetadataValue.json(report.details),
            # Types and counts only: the values are what must not leak, into the event log least of all.
            "pii_left_by_type": MetadataValue.json(dict(report.pii)),
        },
    )


def benchmark_check(store: ObjectStore, keys: list[str], index: BenchmarkIndex) -> AssetCheckResult:
    """no_benchmark_ngrams: each document's n-grams (normalized words, as the index has them) looked up again.

    Deliberately not the decontaminator's span logic: every n-gram of the committed text, so a cut that leaves
    a benchmark n-gram behind, or a document that slipped through, fails the check. Streamed: one document in
    memory at a time, and only the first EXAMPLES offenders' ids kept."""
    from pipelines.dedup.minhash import WordHasher, ngram_hashes, normalized_words
    hasher = WordHasher()
    hits = {name: 0 for name in index.names}  # documents with a surviving n-gram of each benchmark
    ngrams = 0
    offenders = 0
    examples: list[str] = []
    documents = 0
    for doc in read_documents(store, keys):
        documents += 1
        words = normalized_words(doc.get("text") or "")
        if len(words) < index.ngram:
            continue  # shorter than an n-gram: nothing the index could hold
        positions, names = index.matches(ngram_hashes(hasher(words), index.ngram))
        if len(positions):
            ngrams += len(positions)
            offenders += 1
            if len(examples) < EXAMPLES:
                examples.append(str(doc.get("id")))
            for name in names:
                hits[name] += 1
    return AssetCheckResult(
        check_name=BENCHMARK_CHECK,
        passed=not offenders,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "documents": documents,
            "documents_with_hits": offenders,
            "surviving_ngrams": ngrams,
            "hits_per_benchmark": MetadataValue.json(hits),
            "examples": MetadataValue.json(examples),
            "benchmark_ngrams": len(index.hashes),
            "ngram": index.ngram,
        },
    )


def _condition_source(condition) -> str:
    """'c4' from the row condition GE hands back (a string, or {"pass_through_filter": 'source=="c4"'})."""
    text = condition.get("pass_through_filter", "") if isinstance(condition, dict) else str(condition)
    return text.split("==", 1)[-1].strip("\"' ")
