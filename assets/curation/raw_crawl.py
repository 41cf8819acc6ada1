"""`curation/<source>/raw_crawl`: the source's input files (WARC/WET/JSONL/Parquet/text; local paths or fsspec
URLs such as s3://bucket/crawl/*.warc.gz) normalized to datatrove documents, every input record accounted for:
written, skipped by nature (e.g. WARC request records), or bad by reason (and listed in rejected-NNNNN.jsonl.gz
beside the parts).

The stage is pipelines/ingest/step.py's IngestStep run by the executor resource, one task per input file unless the
resource says otherwise (its outputs are named after the input files, so the task count never changes them);
the counts come from the run's merged datatrove stats. Resumable: a re-materialization after a kill runs only
the tasks that had not finished.

`curation/<source>/inputs` is an observable source asset: each observation lists the source's inputs again and
records their fingerprints' digest as its data version (file_fingerprints: a local file's sha256, an S3 object's
ETag, size and modification time), so a new file matching the source's glob, or a file replaced in place, makes
the raw_crawl asset stale in the UI. The observe_inputs schedule (assets/definitions.py) and `pretrain status`
and `pretrain materialize` observe them; raw_crawl's version key holds the same fingerprints.
"""

import hashlib

from dagster import AssetKey, DataVersion, Failure, MetadataValue, observable_source_asset

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.core.versioning import file_fingerprints
from assets.dumps import dump_partitioned
from assets.plots import bar_chart, count_table
from assets.recipe import Recipe, SourceConfig


def raw_crawl_key(source_name: str) -> AssetKey:
    return AssetKey(["curation", source_name, "raw_crawl"])


def inputs_key(source_name: str) -> AssetKey:
    return AssetKey(["curation", source_name, "inputs"])


def _listed(recipe: Recipe, source: SourceConfig, dump: str | None = None) -> list:
    try:
        return recipe.input_files(source, dump)  # remote inputs are listed here, not when the recipe loads
    except ValueError as exc:
        where = f" (dump {dump})" if dump is not None else ""
        raise Failure(description=f"sources[{source.name}].inputs{where}: {exc}") from None


def inputs_version(fingerprints: list[str]) -> str:
    """The observed data version of a source's input set: sha256 of its files' fingerprints, in order."""
    return hashlib.sha256("\n".join(fingerprints).encode()).hexdigest()


def source_inputs_asset(recipe: Recipe, source: SourceConfig):
    """The observable source asset of one source's input files (see the module docstring)."""
    import warnings

    from dagster import BetaWarning

    # Dagster marks observable source assets beta; said once here, not once per source on every command.
    warnings.filterwarnings("ignore", message=".*observable_source_asset.*", category=BetaWarning)

    @observable_source_asset(
        key=inputs_key(source.name), group_name="curation",
        description=(f"The input files of source `{source.name}` ({', '.join(source.inputs)}), observed: a new "
                     "matching file or a changed one gives a new data version, and raw_crawl turns stale."),
    )
    def _inputs(context):
        return DataVersion(inputs_version(file_fingerprints(_listed(recipe, source))))

    return _inputs


def observe_inputs(instance, recipe: Recipe) -> list[str]:
    """Observe every source's input set now, as the observable source assets would, outside a run (`pretrain
    status` and `pretrain materialize` start with it); an observation is recorded only where the version differs
    from the latest one. Returns the sources whose inputs changed."""
    from dagster._core.definitions.data_version import DATA_VERSION_TAG

    from assets.core.records import latest_observations, record_observations

    # Every source's latest observation in one query and the new ones in one batch, not a query and a write per
    # source (1,000 sources: 1,000 of each, ~30 s on a fresh home).
    observed = [source for source in recipe.sources if not source.has_dumps]  # a crawl's dumps are partitions
    latest = latest_observations(instance, [inputs_key(source.name) for source in observed])
    changed = {}
    for source in observed:
        key = inputs_key(source.name)
        version = inputs_version(file_fingerprints(_listed(recipe, source)))
        if key not in latest or latest[key].asset_observation.tags.get(DATA_VERSION_TAG) != version:
            changed[source.name] = (key, version)
    record_observations(instance, dict(changed.values()))
    return list(changed)


def raw_crawl_asset(recipe: Recipe, source: SourceConfig):
    def prepare(inputs: Inputs) -> Inputs:
        dump = inputs.context.partition_key if source.has_dumps else None
        files = _listed(recipe, source, dump)
        return inputs.but(fingerprints=file_fingerprints(files), manifest={"inputs": [str(path) for path in files]},
                          extra={"files": files})

    def build(inputs: Inputs, out_dir) -> dict:
        from pipelines.ingest.step import BadInputError, check_bad_fraction, ingest_pipeline, ingest_stats
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
        key=raw_crawl_key(source.name), group="curation", stage="raw_crawl", section=source.raw_section(),
        description=(
            f"Source `{source.name}` ({source.format}): its inputs read and normalized to documents "
            "(text, id, metadata.url/origin, source). Driven by the recipe's "
            f"`sources[{source.name}]` inputs, format and reader settings."
        ),
        # Observed, so new or replaced input files show as stale; a crawl of dumps is one partition per dump folder
        # instead (assets/dumps.py), each keyed on its own files' fingerprints.
        deps=[] if source.has_dumps else [inputs_key(source.name)],
        prepare=prepare, build=build, metadata=metadata,
        resources=frozenset({"executor"}),
        resumable=True,  # the work folder (task completion markers, finished inputs' parts) is kept per version
        asset_args=dump_partitioned(source),
    ))


def _records(counts: dict) -> dict[str, int]:
    rows = {"written": counts["kept"]}
    rows.update({f"skipped: {kind}": n for kind, n in counts["skipped"].items()})
    rows.update({f"bad: {reason}": n for reason, n in counts["dropped"].items()})
    return rows


def _bad_fraction(counts: dict) -> float:
    bad = sum(counts["dropped"].values())
    return round(bad / max(1, bad + counts["kept"]), 6)
