"""`curation/<source>/filtered`: the source's raw_crawl documents through its recipe `filter` steps
(pipelines/filters/pipeline.py), run by the executor resource.

Kept documents are written under the name of the raw part they came from (part-*.jsonl.gz), PII replaced by
typed placeholders; every dropped document goes to rejected-<step>-<part name> with metadata.filter_reason, and
the manifest's counts say how many went for each reason. A source whose filter has `quality_model` also reads
curation/quality_classifier; one whose filter has `perplexity` reads curation/reference_lm, and its metadata shows
the documents' perplexities as CCNet's head/middle/tail buckets and a histogram.
"""

import dataclasses
import gzip
import hashlib
import math
import time
from pathlib import Path

from dagster import AssetKey, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.dumps import dump_partitioned
from assets.curation.checks import documents_check, documents_check_spec, language_counts
from assets.curation.quality_classifier import CLASSIFIER_KEY, MODEL_FILE
from assets.curation.raw_crawl import raw_crawl_key
from assets.curation.reference_lm import REFERENCE_KEY
from assets.plots import bar_chart, count_table
from assets.recipe import DEMO_RECIPE, Recipe, SourceConfig
from pipelines.filters.config import PIPELINE_CODE, STEP_CODE, FilterConfig



def filtered_key(source_name: str) -> AssetKey:
    return AssetKey(["curation", source_name, "filtered"])


def _list_path(recipe: Recipe, source: SourceConfig, name: str) -> Path:
    """A blocklist named in the recipe: next to the recipe file, else among those shipped in recipes/ (so a
    copy of the demo recipe elsewhere still finds lists/blocked_domains.txt)."""
    anchors = ([recipe.path.parent] if recipe.path else []) + [DEMO_RECIPE.parent]
    for anchor in anchors:
        path = (anchor / name).resolve()
        if path.is_file():
            return path
    raise ValueError(f"sources[{source.name}].filter.url: list file {name!r} not found next to the recipe "
                     f"or in {DEMO_RECIPE.parent}")


def resolved_filter(recipe: Recipe, source: SourceConfig) -> tuple[FilterConfig, dict[str, str]]:
    """The source's filter settings with absolute list paths, and {list name: sha256 of its contents}."""
    config = source.filter
    if config.url is None:
        return config, {}
    paths = {name: _list_path(recipe, source, name) for name in config.list_files()}
    url = dataclasses.replace(config.url, **{
        field: tuple(str(paths[name]) for name in getattr(config.url, field))
        for field in ("blocked_domains_files", "blocked_words_files", "blocked_subwords_files")
    })
    return dataclasses.replace(config, url=url), {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in paths.items()}


def filter_code(config: FilterConfig) -> list[str]:
    """The code a source's filtering runs (assets/core/source_hash.py references): the pipeline, the reader and
    writer, and only the steps its settings turn on, so editing one step's code makes stale only the sources
    that use it."""
    names = [*PIPELINE_CODE]
    for step, code in STEP_CODE.items():
        if getattr(config, step) is not None:
            names += [name for name in code if name not in names]  # Gopher's two steps share their module
    return [*(f"pipelines.{name}" for name in names), "pipelines.input_shards", "pipelines.shards", "pipelines.runner"]


def run_filter(inputs: Inputs, config: FilterConfig, out_dir: Path, *, raw: Output, model: Output | None,
               reference: Output | None, logs: str = "filter") -> dict:
    """raw's documents through `config` (list paths resolved) on the executor into out_dir; the manifest's fields
    ("files", "counts", "seconds", "perplexity"). The filtered asset's build; a filter ablation's arm with a step
    left out or a setting changed runs it on the same raw output (assets/curation/ablation.py)."""
    from pipelines.filters.pipeline import filter_counts, filter_pipeline
    work = inputs.work
    files = raw.files()  # read in place, from the store's folder or bucket: nothing is copied first
    model_path = None
    if config.quality_model is not None:
        model_path = model.download(inputs.store, work / "model", pattern_prefix=MODEL_FILE)[0]
    reference_dir = None
    if config.perplexity is not None:
        reference_dir = work / "reference"
        reference.download(inputs.store, reference_dir, pattern_prefix="")
    steps = filter_pipeline(config, input_dir=inputs.store.uri(raw.prefix), output_dir=out_dir,
                            lists_root=Path("/"), model_path=model_path,  # list paths are absolute
                            reference_dir=reference_dir)
    started = time.perf_counter()
    executor = inputs.resources.executor
    # One task per input part by default; every part's output is named after it, so the count is free.
    stats_path = executor.run(steps, logging_dir=work / "logs" / logs, tasks=executor.tasks_for(len(files)))
    seconds = time.perf_counter() - started
    counts = filter_counts(stats_path.parent)
    written = [{"path": p.name, "records": _count_lines(p)} for p in sorted(out_dir.glob("*.jsonl.gz"))]
    kept = sum(f["records"] for f in written if f["path"].startswith("part-"))
    assert kept == counts["kept"], f"{kept} documents written but the writer counted {counts['kept']}"
    scores = _perplexity_summary(out_dir) if config.perplexity is not None else None
    return {"files": written, "counts": counts, "seconds": round(seconds, 3),
            **({"perplexity": scores} if scores else {})}


def filtered_asset(recipe: Recipe, source: SourceConfig):
    key = filtered_key(source.name)
    uses_model = source.filter.quality_model is not None
    if uses_model and recipe.quality_classifier is None:
        raise ValueError(f"sources[{source.name}].filter.quality_model needs the recipe's quality_classifier section")
    resolved, lists = resolved_filter(recipe, source)
    uses_reference = source.filter.perplexity is not None
    reads = {"documents": raw_crawl_key(source.name), **({"model": CLASSIFIER_KEY} if uses_model else {}),
             **({"reference": REFERENCE_KEY} if uses_reference else {})}

    def build(inputs: Inputs, out_dir: Path) -> dict:
        return run_filter(inputs, resolved, out_dir, raw=inputs.outputs["documents"],
                          model=inputs.outputs.get("model"), reference=inputs.outputs.get("reference"))

    def checks(inputs: Inputs, output: Output) -> list:
        return [documents_check(inputs.store, {source.name: output.files()}, {source.name: source.filter},
                                recipe.checks)]

    def metadata(inputs: Inputs, output: Output) -> dict:
        manifest = output.manifest
        counts = manifest["counts"]
        return {
            "documents_in": counts["in"],
            "documents": counts["kept"],
            "dropped": sum(counts["dropped"].values()),
            "dropped_by_reason": MetadataValue.json(counts["dropped"]),
            "drop_table": MetadataValue.md(_drop_table(counts)),
            "drops_plot": bar_chart({"kept": counts["kept"], **counts["dropped"]},
                                    title=f"{source.name}: kept and dropped by reason", ylabel="documents"),
            **_language_metadata(inputs.store, output.files(), source),
            "pii_replaced": MetadataValue.json(counts["pii"]),
            **_perplexity_metadata(manifest.get("perplexity"), source.name),
            "rejected_files": MetadataValue.json([f["path"] for f in manifest["files"] if f["path"].startswith("rejected-")]),
            # Of the run that computed this output (a reused output keeps its original figure).
            "docs_per_second": round(counts["in"] / manifest["seconds"], 1) if manifest.get("seconds") else 0.0,
        }

    return output_asset(OutputSpec(
        key=key, group="curation", stage="filtered", code=filter_code(source.filter),
        # The lists' contents, not just their names: editing a blocklist makes the source's filtered asset stale.
        section={**source.filtered_section(), "lists": lists},
        description=(
            f"Source `{source.name}` filtered: URL blocklists, language ID, quality rules, PII scrubbing, as the "
            f"recipe's `sources[{source.name}].filter` says. Dropped documents are kept aside with their reason."
        ),
        reads=reads, build=build, metadata=metadata,
        # On the committed output, read back from the store: a reused output is checked as well.
        checks=checks, check_specs=[documents_check_spec(key)],
        resources=frozenset({"executor"}), out_name="output", resumable=True,
        # A crawl of dumps is filtered dump by dump: each partition reads its own raw_crawl partition.
        same_partition=frozenset({"documents"}), asset_args=dump_partitioned(source),
    ))


def _count_lines(path: Path) -> int:
    with gzip.open(path, "rb") as f:
        return sum(1 for _ in f)


def _language_metadata(store, parts: list[str], source: SourceConfig) -> dict:
    """The kept documents' languages (metadata.language, set by language ID), when the source's filter has it."""
    if source.filter.language is None:
        return {}
    ordered = dict(language_counts(store, parts).most_common())  # streamed, a part at a time
    return {
        "languages": count_table(ordered, key="language", value="documents"),
        "languages_plot": bar_chart(ordered, title=f"{source.name}: kept documents by language", ylabel="documents"),
    }


def _drop_table(counts: dict) -> str:
    rows = sorted(counts["dropped"].items(), key=lambda item: (-item[1], item[0]))
    lines = ["| reason | documents |", "|---|---|", *[f"| {reason} | {n} |" for reason, n in rows]]
    lines.append(f"| **kept** | {counts['kept']} of {counts['in']} |")
    return "\n".join(lines)


# CCNet's buckets (Wenzek et al. 2020): the 30th and 60th percentiles of the perplexities split documents into head,
# middle and tail. CCNet cuts per language over a whole snapshot; here over every document the source's perplexity
# step scored (kept or dropped by it), the one population a source's filtering sees whole.
_BUCKET_CUTS = (30, 60)


def _perplexity_summary(out_dir: Path) -> dict | None:
    """The perplexities of every document the perplexity step scored (the kept parts and its rejected files):
    count, CCNet cut-offs, bucket sizes, percentiles and a histogram."""
    from pipelines.shards import iter_documents
    import numpy as np

    scores = [doc["metadata"]["perplexity"]
              for path in sorted(out_dir.glob("*.jsonl.gz")) if path.name.startswith(("part-", "rejected-perplexity-"))
              for doc in iter_documents(path) if "perplexity" in doc.get("metadata", {})]
    if not scores:
        return None
    values = np.asarray(scores)
    head, middle = (float(np.percentile(values, p)) for p in _BUCKET_CUTS)
    # Quarter-octave bins (edges 2^(k/4)): perplexities spread over a few octaves, and whole octaves put the
    # demo's 237 English pages in 3 bars.
    bins: dict[int, int] = {}
    for value in values:
        k = math.floor(4 * math.log2(max(value, 1.0)))
        bins[k] = bins.get(k, 0) + 1
    return {
        "scored": len(scores),
        "cuts": {"head_max": round(head, 2), "middle_max": round(middle, 2)},
        "buckets": {"head": int((values <= head).sum()), "middle": int(((values > head) & (values <= middle)).sum()),
                    "tail": int((values > middle).sum())},
        "percentiles": {str(p): round(float(np.percentile(values, p)), 2) for p in (5, 25, 50, 75, 95)},
        "histogram": {f"{round(2 ** (k / 4))}-{round(2 ** ((k + 1) / 4))}": bins[k] for k in sorted(bins)},
    }


def _perplexity_metadata(summary: dict | None, name: str) -> dict:
    if not summary:
        return {}
    cuts, buckets = summary["cuts"], summary["buckets"]
    table = ["| bucket | perplexity | documents |", "|---|---|---|",
             f"| head | <= {cuts['head_max']} | {buckets['head']} |",
             f"| middle | <= {cuts['middle_max']} | {buckets['middle']} |",
             f"| tail | > {cuts['middle_max']} | {buckets['tail']} |"]
    return {
        "perplexity_scored": summary["scored"],
        "perplexity_buckets": MetadataValue.md("\n".join(table)),
        "perplexity_percentiles": MetadataValue.json(summary["percentiles"]),
        "perplexity_plot": bar_chart(summary["histogram"], title=f"{name}: documents by reference-model perplexity",
                                     ylabel="documents"),
    }
