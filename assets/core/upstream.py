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


def latest_output(instance: DagsterInstance, store: ObjectStore, key: AssetKey) -> Output:
    event = instance.get_latest_materialization_event(key)
    name = key.to_user_string()
    if event is None or "prefix" not in event.asset_materialization.metadata:
        raise OutputNotFound(f"{name} has never been materialized: run `pretrain materialize --select {name}`")
    return output_at(store, key, event.asset_materialization.metadata["prefix"].value)


def output_at(store: ObjectStore, key: AssetKey, prefix: str) -> Output:
    """The committed output of `key` under `prefix` (e.g. one partition's, from its materialization)."""
    manifest = read_manifest(store, prefix)
    if manifest is None:
        raise OutputNotFound(f"{store.uri(prefix)} has no manifest: the output of {key.to_user_string()} is missing "
                             "or incomplete")
    return Output(key=key, prefix=prefix, manifest=manifest)
