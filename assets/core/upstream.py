"""Finding an asset's committed output: what a downstream asset reads, and what `pretrain where` shows.

Every asset records the store prefix of its output in its materialization metadata ("prefix"); the
manifest under that prefix is the commit marker and lists the files. A downstream asset reads the
upstream's latest materialization, so its version key can include the upstream's data version.
"""

from dataclasses import dataclass
from pathlib import Path

from dagster import AssetKey, DagsterInstance, DataVersion, MaterializeResult, MetadataValue

from storage.manifest import read_manifest
from storage.objects import ObjectStore


class OutputNotFound(LookupError):
    """An asset has no committed output (never materialized, or its manifest is gone)."""


@dataclass(frozen=True)
class Output:
    key: AssetKey
    prefix: str
    manifest: dict
    partition: str | None = None  # a partitioned asset's (a crawl's dump)

    @property
    def data_version(self) -> str:
        return self.manifest["data_version"]

    def files(self, pattern_prefix: str = "part-") -> list[str]:
        """Store keys of the output's data files (by default the document parts), in manifest order."""
        return [f"{self.prefix}/{f['path']}" for f in self.manifest["files"] if f["path"].startswith(pattern_prefix)]

    def download(self, store: ObjectStore, dest: Path, pattern_prefix: str = "part-") -> list[Path]:
        """Local copies of the data files (engines such as datatrove's readers want local paths)."""
        paths = []
        for key in self.files(pattern_prefix):
            path = dest / key.rsplit("/", 1)[-1]
            store.download(key, path)
            paths.append(path)
        return paths


def output_location(store: ObjectStore, prefix: str) -> dict:
    """Materialization metadata naming where an output lives; `latest_output` reads "prefix" back."""
    return {"uri": MetadataValue.path(store.uri(prefix)), "prefix": prefix}


def committed_result(store: ObjectStore, prefix: str, manifest: dict, *, metadata: dict, **result) -> MaterializeResult:
    """An asset's result for a committed output: DataVersion = the manifest's digest, plus its location."""
    return MaterializeResult(
        data_version=DataVersion(manifest["data_version"]),
        metadata={**output_location(store, prefix), **metadata},
        **result,
    )


def latest_output(instance: DagsterInstance, store: ObjectStore, key: AssetKey, partition: str | None = None) -> Output:
    """The latest committed output of `key` (of one partition's, given `partition`)."""
    if partition is None:
        event = instance.get_latest_materialization_event(key)
    else:
        from dagster import AssetRecordsFilter

        found = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[partition]),
                                                limit=1).records
        event = found[0] if found else None
    name = key.to_user_string() + (f"[{partition}]" if partition is not None else "")
    if event is None or "prefix" not in event.asset_materialization.metadata:
        raise OutputNotFound(f"{name} has never been materialized: run `pretrain materialize --select "
                             f"{key.to_user_string()}`")
    return output_at(store, key, event.asset_materialization.metadata["prefix"].value, partition)


def partition_outputs(instance: DagsterInstance, store: ObjectStore, key: AssetKey, partitions: list[str]) -> dict:
    """{partition: its latest committed output} of a partitioned asset, each of `partitions`, in their order;
    OutputNotFound names the first never materialized. The newest storage id of each partition in one query, those
    records in one more: a crawl of a hundred dumps is two queries, not a hundred."""
    from assets.core.records import partition_materializations

    records = partition_materializations(instance, key)
    outputs = {}
    for partition in partitions:
        record = records.get(partition)
        if record is None or "prefix" not in record.asset_materialization.metadata:
            raise OutputNotFound(f"{key.to_user_string()}[{partition}] has never been materialized: run `pretrain "
                                 f"materialize --select {key.to_user_string()}`")
        outputs[partition] = output_at(store, key, record.asset_materialization.metadata["prefix"].value, partition)
    return outputs


def output_at(store: ObjectStore, key: AssetKey, prefix: str, partition: str | None = None) -> Output:
    """The committed output of `key` under `prefix` (e.g. one partition's, from its materialization)."""
    manifest = read_manifest(store, prefix)
    if manifest is None:
        raise OutputNotFound(f"{store.uri(prefix)} has no manifest: the output of {key.to_user_string()} is missing "
                             "or incomplete")
    return Output(key=key, prefix=prefix, manifest=manifest, partition=partition)
