"""`curation/<source>/decontaminated`: the source's part of the deduplicated output without benchmark text.

Every document sharing an n-gram with a benchmark file the recipe lists is removed (or the span cut out of it,
pipelines/decontam/index.py). Output under curation/<source>/decontaminated/<version key>/: per input part of the
dedup output, part-NNNNN.jsonl.gz (kept) and removed-NNNNN.jsonl.gz (with metadata.contaminated_by), named
after that part, and decontamination_report.jsonl: one line per hit, naming the document, the benchmark, the
item's id and the matched text (pipelines/decontam/steps.py write_report; its summary and first hits are in the
asset's metadata). The benchmark n-gram index is built once per (files, n) and cached under the scratch root (the
per-source assets share it); the scan runs as the executor resource's tasks, each mapping the saved index and
streaming its share of the parts from the store. Counts come from the tasks' datatrove stats.
"""

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from dagster import AssetKey, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.source_hash import code_digest
from assets.core.upstream import Output
from assets.core.versioning import file_fingerprints, section_sha256
from assets.curation.checks import benchmark_check, benchmark_check_spec, documents_check, documents_check_spec
from assets.curation.deduplicated import deduplicated_key, dump_deduplicated_key
from assets.dumps import dump_partitioned
from assets.plots import bar_chart
from assets.recipe import Recipe, SourceConfig
from pipelines.decontam.config import DecontamConfig
from pipelines.inputs import expand_inputs
from storage.manifest import data_version_of

if TYPE_CHECKING:  # the engine is imported where the asset runs, not when the code location loads
    from pipelines.decontam.index import BenchmarkIndex


def decontaminated_key(source_name: str) -> AssetKey:
    return AssetKey(["curation", source_name, "decontaminated"])


def benchmark_files(recipe: Recipe) -> list[Path]:
    """The recipe's benchmark files (globs allowed), relative to its base_dir. ValueError names a missing one."""
    if not recipe.decontamination.benchmarks:
        return []
    try:
        return expand_inputs(list(recipe.decontamination.benchmarks), recipe.input_root)
    except ValueError as exc:
        raise ValueError(f"recipe {recipe.name!r}: decontamination.benchmarks: {exc}") from None


def decontaminated_asset(recipe: Recipe, source: SourceConfig):
    """Reads the `<source>/part-*` files of the global deduplicated asset, or of the source's own (a partition per
    dump) for a crawl of dumps."""
    upstream_key = dump_deduplicated_key(source.name) if source.has_dumps else deduplicated_key()
    key = decontaminated_key(source.name)
    settings = recipe.decontamination

    def prepare(inputs: Inputs) -> Inputs:
        benchmarks = benchmark_files(recipe)
        # Keyed on this source's slice of the dedup output, not the whole: a change in another source that
        # leaves this one's documents as they were finds this output committed and reuses it, so its data
        # version, and everything downstream of it, stays as it was.
        own = [f for f in inputs.outputs["documents"].manifest["files"] if f["path"].startswith(f"{source.name}/")]
        # Built (or loaded from the cache) either way: the blocking check re-scans a reused output as well.
        index, index_path = _cached_index(inputs.resources.scratch, benchmarks, settings, inputs.log.info)
        return inputs.but(key_upstream={f"{upstream_key.to_user_string()}[{source.name}]": data_version_of(own)},
                          fingerprints=file_fingerprints(benchmarks),
                          manifest={"inputs": [str(path) for path in benchmarks]},
                          extra={"index": index, "index_path": index_path})

    def build(inputs: Inputs, out_dir: Path) -> dict:
        from pipelines.decontam.steps import DecontamShards, REPORT_NAME, decontam_counts, write_report, written_files
        index = inputs.extra["index"]
        keys = inputs.outputs["documents"].files(pattern_prefix=f"{source.name}/part-")
        executor = inputs.resources.executor
        records = inputs.work / "records"  # each part's files and record counts, so the output is not read back
        step = DecontamShards(store=inputs.store, keys=keys, index_path=str(inputs.extra["index_path"]),
                              config=settings, output_dir=str(out_dir), records_dir=str(records))
        stats_path = executor.run([step], logging_dir=inputs.work / "logs" / "decontaminate",
                                  tasks=executor.tasks_for(len(keys)))
        counts = decontam_counts(stats_path, index.names)
        files = written_files(records, keys)
        written = {kind: sum(f["records"] for f in files if f["path"].startswith(kind)) for kind in ("part-", "removed-")}
        # Every document is accounted for: the files hold what the tasks counted.
        dropped = sum(counts["dropped"].values())
        assert (written["part-"], written["removed-"]) == (counts["kept"], dropped), (written, counts)
        # The audit: one line per hit (part, document id, dropped or cut, benchmark, item id, matched text),
        # committed with the parts; the manifest keeps its summary for the metadata.
        report = write_report(records, keys, out_dir / REPORT_NAME)
        files = sorted(files + [{"path": REPORT_NAME, "records": report["hits"]}], key=lambda f: f["path"])
        return {"files": files, "report": report,
                "counts": {**counts, "benchmark_ngrams": len(index.hashes), "short_items": index.short_items}}

    def checks(inputs: Inputs, output: Output) -> list:
        parts = output.files()
        return [documents_check(inputs.store, {source.name: parts}, {source.name: source.filter}, recipe.checks),
                benchmark_check(inputs.store, parts, inputs.extra["index"])]

    def metadata(inputs: Inputs, output: Output) -> dict:
        counts = output.manifest["counts"]
        return {
            "documents": counts["kept"],
            "documents_in": counts["in"],
            "dropped": sum(counts["dropped"].values()),
            "cut": counts["cut"],
            "hits_per_benchmark": MetadataValue.json(counts["hits"]),
            "hits_plot": bar_chart(dict(sorted(counts["hits"].items(), key=lambda item: -item[1])),
                                   title=f"{source.name}: contaminated documents per benchmark", ylabel="documents"),
            "benchmark_ngrams": counts["benchmark_ngrams"],
            **report_metadata(inputs.store, output),
        }

    return output_asset(OutputSpec(
        key=key, group="curation", stage="decontaminated",
        section={"source": source.name, "decontamination": dataclasses.asdict(settings)},
        description=(
            f"Source `{source.name}` after dedup, without documents that share a {settings.ngram}-gram with any of "
            f"the recipe's {len(settings.benchmarks)} benchmark file(s) (action: {settings.action}). Driven by the "
            "recipe's `decontamination` section."
        ),
        reads={"documents": upstream_key}, prepare=prepare, build=build, checks=checks, metadata=metadata,
        # The benchmark check blocks: a failure stops the packed shards (and all else downstream) in the run.
        check_specs=[documents_check_spec(key), benchmark_check_spec(key)],
        failures=(ValueError,),  # a benchmark file the recipe names is missing
        resources=frozenset({"executor"}), resumable=True,
        same_partition=frozenset({"documents"}), asset_args=dump_partitioned(source),  # a dump reads its own part
    ))


def report_metadata(store, output: Output) -> dict:
    """The report file's place, its hits per benchmark and item, and its first hits as a table."""
    report = output.manifest.get("report")
    if report is None:
        return {}
    rows = ["| benchmark | item | document | action | matched text |", "|---|---|---|---|---|"]
    for hit in report["first"]:
        span = " ".join(hit["span"].split())
        span = span if len(span) <= 120 else span[:117] + "..."
        cells = [hit["benchmark"], hit["item"], str(hit["id"]), hit["action"], span]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    first = "\n".join(rows) if report["first"] else "no hits"
    return {"report": MetadataValue.path(store.uri(f"{output.prefix}/{report['path']}")),
            "report_hits": report["hits"],
            "report_hits_per_benchmark": MetadataValue.json(report["hits_per_benchmark"]),
            "report_first_hits": MetadataValue.md(first)}


INDEX_CODE = ("pipelines.decontam.index",)  # the benchmark index's module and the engine modules it imports


def _cached_index(scratch, files: list[Path], settings: DecontamConfig, log) -> tuple["BenchmarkIndex", Path]:
    """The index and the file it is saved in. Building the index of all demo benchmarks takes ~15-25 s (multiple-
    choice items with their choices together as well: 5.4M n-grams, from 3.7M); every source's asset reuses one
    copy, and the scan's tasks map it from the file."""
    from pipelines.decontam.index import BenchmarkIndex, INDEX_FORMAT
    ngram, min_letter_words = settings.ngram, settings.min_letter_words
    # The code that builds the index is part of its key (INDEX_FORMAT is bumped by hand and can be forgotten):
    # an index built by other code is built again.
    digest = section_sha256(
        {"files": [str(p) for p in files], "fingerprints": file_fingerprints(files), "ngram": ngram,
         "min_letter_words": min_letter_words, "format": INDEX_FORMAT, "code": code_digest(INDEX_CODE)}
    )
    path = Path(scratch.root) / "decontam-index" / f"{digest[:16]}.index"
    if path.is_file():
        return BenchmarkIndex.load(path), path
    log(f"building the {ngram}-gram index of {len(files)} benchmark file(s)")
    index = BenchmarkIndex.build(files, ngram, min_letter_words)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    index.save(tmp)
    os.replace(tmp, path)  # atomic: a concurrent reader sees the whole file or none
    return index, path
