"""Curation assets, one set per recipe source (group "curation").

raw_crawl: the source's input files (WARC/WET/JSONL/Parquet/text) normalized to datatrove documents,
every input record accounted for: written, skipped by nature (e.g. WARC request records), or bad
by reason (and listed in rejected.jsonl.gz beside the parts).
"""

import shutil

from dagster import AssetExecutionContext, AssetKey, Failure, MaterializeResult, MetadataValue, asset

from assets.plots import bar_chart, count_table
from assets.recipe import Recipe, SourceConfig
from assets.upstream import committed_result
from assets.versioning import code_version, file_fingerprints, manifest_header, version_key
from pipelines.ingest import BadInputError, ingest_source
from resources.scratch import ScratchResource
from storage.manifest import commit_folder, read_manifest
from resources.store_resource import StoreResource

# Bump when the ingest code changes what it writes for the same settings.
RAW_CRAWL_IMPLEMENTATION = "v1"


def raw_crawl_key(source_name: str) -> AssetKey:
    return AssetKey(["curation", source_name, "raw_crawl"])


def raw_crawl_asset(recipe: Recipe, source: SourceConfig):
    key = raw_crawl_key(source.name)
    section = source.raw_section()
    version = code_version("raw_crawl", RAW_CRAWL_IMPLEMENTATION, section)

    @asset(
        key=key,
        group_name="curation",
        code_version=version,
        kinds={"python"},
        description=(
            f"Source `{source.name}` ({source.format}): its inputs read and normalized to documents "
            "(text, id, metadata.url/origin, source). Driven by the recipe's "
            f"`sources[{source.name}]` inputs, format and reader settings."
        ),
    )
    def raw_crawl(context: AssetExecutionContext, store: StoreResource, scratch: ScratchResource) -> MaterializeResult:
        inputs = recipe.input_files(source)
        vkey = version_key(version, inputs=file_fingerprints(inputs))
        prefix = "/".join(key.path + [vkey])
        object_store = store.open()

        manifest = read_manifest(object_store, prefix)
        if manifest is not None:
            context.log.info(f"{object_store.uri(prefix)} is already committed for this version; reusing it")
        else:
            work = scratch.new_dir("/".join(key.path))
            context.log.info(f"ingesting {len(inputs)} file(s) of {source.name} into {work}")
            try:
                stats = ingest_source(
                    name=source.name,
                    inputs=inputs,
                    format=source.format,
                    reader=source.reader,
                    out_dir=work,
                    progress=context.log.info,
                )
            except BadInputError as exc:
                raise Failure(
                    description=f"{exc} (the rejected records are listed in {work}/rejected.jsonl.gz)",
                    metadata={"bad": MetadataValue.json(exc.stats.bad), "scratch": str(work)},
                ) from exc
            manifest = commit_folder(
                object_store,
                prefix,
                work,
                {
                    **manifest_header(key.path, vkey, version, section, context.run.run_id),
                    "upstream": {},
                    "inputs": [str(path) for path in inputs],
                    "files": stats.files,
                    "counts": {
                        "records": stats.records,
                        "kept": stats.documents,
                        "skipped": stats.skipped,
                        "dropped": stats.bad,
                        "bytes_in": stats.bytes_in,
                    },
                },
            )
            shutil.rmtree(work, ignore_errors=True)

        counts = manifest["counts"]
        return committed_result(
            object_store,
            prefix,
            manifest,
            metadata={
                "documents": counts["kept"],
                "records": counts["records"],
                "skipped": MetadataValue.json(counts["skipped"]),
                "dropped_by_reason": MetadataValue.json(counts["dropped"]),
                # Every input record in one table: written, skipped by nature, or bad by reason.
                "records_accounted": _records_table(counts),
                "records_plot": bar_chart(_records(counts), title=f"{source.name}: input records", ylabel="records"),
                "bad_fraction": _bad_fraction(counts),
                "input_bytes": counts["bytes_in"],
                "files": len(manifest["files"]),
                "version_key": vkey,
                "data_version": manifest["data_version"],
            },
        )

    return raw_crawl


def _records(counts: dict) -> dict[str, int]:
    rows = {"written": counts["kept"]}
    rows.update({f"skipped: {kind}": n for kind, n in counts["skipped"].items()})
    rows.update({f"bad: {reason}": n for reason, n in counts["dropped"].items()})
    return rows


def _records_table(counts: dict):
    return count_table(_records(counts), key="records", value="count")


def _bad_fraction(counts: dict) -> float:
    bad = sum(counts["dropped"].values())
    return round(bad / max(1, bad + counts["kept"]), 6)
