"""`curation/<source>/raw_crawl`: the source's input files (WARC/WET/JSONL/Parquet/text; local paths or fsspec
URLs such as s3://bucket/crawl/*.warc.gz) normalized to datatrove documents, every input record accounted for:
written, skipped by nature (e.g. WARC request records), or bad by reason (and listed in rejected-NNNNN.jsonl.gz
beside the parts).

The stage is pipelines/ingest.py's IngestStep run by the executor resource, one task per input file unless the
resource says otherwise (its outputs are named after the input files, so the task count never changes them);
the counts come from the run's merged datatrove stats. Resumable: a re-materialization after a kill runs only
the tasks that had not finished.
"""

from dagster import AssetKey, Failure, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.core.versioning import file_fingerprints
from assets.plots import bar_chart, count_table
from assets.recipe import Recipe, SourceConfig
from pipelines.ingest import BadInputError, check_bad_fraction, ingest_pipeline, ingest_stats

# Bump when the ingest code changes what it writes for the same settings.
# v2: a datatrove step in N tasks; parts named after their input file (part-<file>-<k>), rejected-<file>.
RAW_CRAWL_IMPLEMENTATION = "v2"


def raw_crawl_key(source_name: str) -> AssetKey:
    return AssetKey(["curation", source_name, "raw_crawl"])


def raw_crawl_asset(recipe: Recipe, source: SourceConfig):
    def prepare(inputs: Inputs) -> Inputs:
        try:
            files = recipe.input_files(source)  # remote inputs are listed here, not when the recipe loads
        except ValueError as exc:
            raise Failure(description=f"sources[{source.name}].inputs: {exc}") from None
        return inputs.but(fingerprints=file_fingerprints(files), manifest={"inputs": [str(path) for path in files]},
                          extra={"files": files})

    def build(inputs: Inputs, out_dir) -> dict:
        files = inputs.extra["files"]
        executor = inputs.resources.executor
        logs = inputs.work / "logs" / "ingest"
        tasks = executor.tasks_for(len(files))
        inputs.log.info(f"ingesting {len(files)} file(s) of {source.name} into {out_dir} in {tasks} task(s)")
        steps = ingest_pipeline(name=source.name, inputs=files, format=source.format, reader=source.reader,
                                out_dir=out_dir, logging_dir=logs)
        stats_path = executor.run(steps, logging_dir=logs, tasks=tasks)
        stats = ingest_stats(stats_path, logging_dir=logs, inputs=len(files))
        inputs.log.info(f"{source.name}: {stats.summary()}")
        try:
            check_bad_fraction(stats, name=source.name, reader=source.reader, out_dir=out_dir)
        except BadInputError as exc:
            raise Failure(
                description=f"{exc} (the rejected records are listed in {out_dir}/rejected-*.jsonl.gz)",
                metadata={"bad": MetadataValue.json(exc.stats.bad), "scratch": str(out_dir)},
            ) from exc
        return {"files": stats.files + stats.rejected,
                "counts": {"records": stats.records, "kept": stats.documents, "skipped": stats.skipped,
                           "dropped": stats.bad, "bytes_in": stats.bytes_in}}

    def metadata(inputs: Inputs, output: Output) -> dict:
        counts = output.manifest["counts"]
        return {
            "documents": counts["kept"],
            "records": counts["records"],
            "skipped": MetadataValue.json(counts["skipped"]),
            "dropped_by_reason": MetadataValue.json(counts["dropped"]),
            # Every input record in one table: written, skipped by nature, or bad by reason.
            "records_accounted": count_table(_records(counts), key="records", value="count"),
            "records_plot": bar_chart(_records(counts), title=f"{source.name}: input records", ylabel="records"),
            "bad_fraction": _bad_fraction(counts),
            "input_bytes": counts["bytes_in"],
            "files": len([f for f in output.manifest["files"] if f["path"].startswith("part-")]),
        }

    return output_asset(OutputSpec(
        key=raw_crawl_key(source.name), group="curation", stage="raw_crawl",
        implementation=RAW_CRAWL_IMPLEMENTATION, section=source.raw_section(),
        description=(
            f"Source `{source.name}` ({source.format}): its inputs read and normalized to documents "
            "(text, id, metadata.url/origin, source). Driven by the recipe's "
            f"`sources[{source.name}]` inputs, format and reader settings."
        ),
        prepare=prepare, build=build, metadata=metadata,
        resources=frozenset({"executor"}),
        resumable=True,  # the work folder (task completion markers, finished inputs' parts) is kept per version
    ))


def _records(counts: dict) -> dict[str, int]:
    rows = {"written": counts["kept"]}
    rows.update({f"skipped: {kind}": n for kind, n in counts["skipped"].items()})
    rows.update({f"bad: {reason}": n for reason, n in counts["dropped"].items()})
    return rows


def _bad_fraction(counts: dict) -> float:
    bad = sum(counts["dropped"].values())
    return round(bad / max(1, bad + counts["kept"]), 6)
