"""Lineage: the chain of outputs a training stage was made from, down to every raw source.

    records = lineage(instance, store, [latest_output(...packed...), latest_output(...tokenizer...)])
    # [{"asset": "tokenization/web/packed", "data_version": "…", "code_version": "packed:v1:…",
    #   "run_id": "…", "recipe_section_sha256": "…", "prefix": "tokenization/web/packed/…"}, …]

Each output's manifest names its upstream outputs by asset and data version ("upstream"); the
materialization with that data version gives the prefix of that exact output (not merely the latest
one), whose manifest names its own upstream, and so on to raw_crawl. The list is ordered breadth
first from the given roots, each output once. The training assets pass it to the trainer, which
writes it into every checkpoint manifest, so a checkpoint alone says what made it (DESIGN.md).
"""

from __future__ import annotations

from collections import deque

from dagster import AssetKey, DagsterInstance

from assets.core.upstream import Output
from storage.manifest import read_manifest
from storage.objects import ObjectStore

DATA_VERSION_TAG = "dagster/data_version"
SEARCH_LIMIT = 1000  # materializations of one asset searched for a data version


class LineageError(LookupError):
    pass


def find_output(instance: DagsterInstance, store: ObjectStore, key: AssetKey, data_version: str) -> Output:
    """The committed output of `key` with this data version (its materialization's prefix, its manifest)."""
    records = instance.fetch_materializations(key, limit=SEARCH_LIMIT).records
    for record in records:
        materialization = record.asset_materialization
        if materialization is None or materialization.tags.get(DATA_VERSION_TAG) != data_version:
            continue
        prefix = materialization.metadata.get("prefix")
        if prefix is None:
            continue
        manifest = read_manifest(store, prefix.value)
        if manifest is not None and manifest.get("data_version") == data_version:
            return Output(key=key, prefix=prefix.value, manifest=manifest, partition=record.partition_key)
    raise LineageError(f"{key.to_user_string()}: no committed output with data version {data_version[:12]}… "
                       f"among its last {SEARCH_LIMIT} materializations")


def record_of(output: Output) -> dict:
    m = output.manifest
    return {"asset": output.key.to_user_string(), "data_version": m["data_version"],
            "code_version": m.get("code_version"), "run_id": m.get("run_id"),
            "recipe_section_sha256": m.get("recipe_section_sha256"), "prefix": output.prefix,
            **({"partition": output.partition} if output.partition is not None else {})}


def lineage(instance: DagsterInstance, store: ObjectStore, roots: list[Output]) -> list[dict]:
    seen: set[tuple[str, str]] = set()
    out: list[dict] = []
    queue = deque(roots)
    while queue:
        output = queue.popleft()
        ident = (output.key.to_user_string(), output.data_version)  # a dump's partition has its own data version
        if ident in seen:
            continue
        seen.add(ident)
        out.append(record_of(output))
        for asset, data_version in sorted((output.manifest.get("upstream") or {}).items()):
            queue.append(find_output(instance, store, AssetKey.from_user_string(asset), data_version))
    return out


def cross_check(instance: DagsterInstance, records: list[dict]) -> list[str]:
    """Problems found when a checkpoint's lineage is compared with this Dagster instance (empty: all agree)."""
    problems = []
    for entry in records:
        key = AssetKey.from_user_string(entry["asset"])
        found = [r for r in instance.fetch_materializations(key, limit=SEARCH_LIMIT).records
                 if r.asset_materialization is not None
                 and r.asset_materialization.tags.get(DATA_VERSION_TAG) == entry["data_version"]]
        if not found:
            problems.append(f"{entry['asset']}: data version {entry['data_version'][:12]}… is not in this instance")
        elif entry.get("run_id") and entry["run_id"] not in {r.run_id for r in found}:
            problems.append(f"{entry['asset']}: recorded run {entry['run_id']} did not materialize that version here")
    return problems
