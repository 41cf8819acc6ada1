"""A crawl of dumps: a source whose inputs have `{dump}` (crawl/{dump}/*.warc.gz) is partitioned by dump.

    dumps_partitions(source)        the Dagster dynamic partitions of its assets, one per dump ("<source>_dumps")
    found_dumps(recipe, source)     the dumps it has now: the recipe's `dumps`, or every folder where {dump} stands
    sync_dumps(instance, recipe)    the instance's partitions made those (`pretrain status` and `materialize` do it)
    dump_sensor(recipe)             the same on a timer, under `dagster dev` or the daemon: a new dump folder on S3
                                    (or any fsspec store, or a local disk) becomes a partition on the next tick

Every per-source asset of such a source is partitioned: raw_crawl, filtered, deduplicated (its dumps one after
another against what was kept before: assets/curation/deduplicated.py), decontaminated and packed. A new dump is a
new partition: materializing it builds that partition only, and the earlier dumps' outputs stay as they were.

The recipe's `dumps` list is the whole set when it is given: a dump added there is added, one taken out is removed
(its outputs stay in the store). Without it, found folders are only ever added. Dumps are in name order (Common
Crawl's CC-MAIN-YYYY-WW names sort by time): the order the sequential dedup takes them in, so a recipe whose
`dumps` list is in another order is refused at load, naming the field (assets/recipe/sources.py).
"""

from __future__ import annotations

import functools
import glob as local_glob
import os
import re
from pathlib import Path

from dagster import (
    DefaultSensorStatus,
    DynamicPartitionsDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from assets.recipe import DUMP_NAME, DUMP_PLACEHOLDER, Recipe, SourceConfig
from pipelines.inputs import URL_SCHEME, remote_fs

DUMP_SENSOR_SECONDS = 300  # a crawl publishes a dump every month or two: a listing every 5 minutes is plenty


@functools.cache
def _partitions(name: str) -> DynamicPartitionsDefinition:
    # One object per name: Dagster compares partitions definitions, and the assets of one source must share theirs.
    return DynamicPartitionsDefinition(name=name)


def dumps_partitions(source: SourceConfig) -> DynamicPartitionsDefinition | None:
    """The dump partitions of a crawl of dumps (None for a source without)."""
    return _partitions(f"{source.name}_dumps") if source.has_dumps else None


def dump_partitioned(source: SourceConfig) -> dict:
    """An OutputSpec's asset_args for a per-source asset: partitioned by dump for a crawl of dumps, else nothing."""
    return {"partitions_def": dumps_partitions(source)} if source.has_dumps else {}


def dump_prefix(recipe: Recipe, source: SourceConfig) -> list[str]:
    """Where the dump folders are: each input's part before {dump}, as a URL or an absolute local path."""
    prefixes = []
    for spec in source.inputs:
        before = spec.split(DUMP_PLACEHOLDER, 1)[0]
        if URL_SCHEME.match(before):
            prefixes.append(before)
        else:
            prefixes.append(str(recipe.input_root / before.removeprefix("file://")))
    return list(dict.fromkeys(prefixes))


def listed_dumps(recipe: Recipe, source: SourceConfig) -> list[str]:
    """The folders found where {dump} stands, sorted: each a dump. ValueError names a prefix that cannot be listed."""
    found: set[str] = set()
    for prefix in dump_prefix(recipe, source):
        try:
            if URL_SCHEME.match(prefix):
                fs, path = remote_fs(prefix)
                fs.invalidate_cache()  # a folder created since the last listing must be seen
                names = [info["name"].rstrip("/").rsplit("/", 1)[-1] for info in fs.ls(path.rstrip("/"), detail=True)
                         if info.get("type") == "directory"]
            else:
                names = [Path(p).name for p in local_glob.glob(os.path.join(prefix, "*")) if os.path.isdir(p)]
        except FileNotFoundError:
            names = []
        except Exception as exc:  # credentials, network, an unknown protocol
            raise ValueError(f"sources[{source.name}].inputs: the dump folders under {prefix!r} could not be listed: "
                             f"{type(exc).__name__}: {str(exc)[:300]}") from exc
        found.update(name for name in names if re.fullmatch(DUMP_NAME, name))
    return sorted(found)


def found_dumps(recipe: Recipe, source: SourceConfig) -> list[str]:
    """The source's dumps now: the recipe's list, else the folders found."""
    return list(source.dumps) if source.dumps is not None else listed_dumps(recipe, source)


def dump_changes(known: list[str], source: SourceConfig, found: list[str]) -> tuple[list[str], list[str]]:
    """(dumps to add, dumps to remove) to make the partitions `known` what the source has (`found`)."""
    added = [d for d in found if d not in set(known)]
    removed = [d for d in known if d not in set(found)] if source.dumps is not None else []
    return added, removed


def sync_dumps(instance, recipe: Recipe) -> dict[str, list[str]]:
    """Make every crawl's partitions its dumps now; returns {source: the dumps added}. `pretrain status` and
    `pretrain materialize` call it first, as the sensor would."""
    added_by_source = {}
    for source in (s for s in recipe.sources if s.has_dumps):
        name = dumps_partitions(source).name
        known = list(instance.get_dynamic_partitions(name))
        added, removed = dump_changes(known, source, found_dumps(recipe, source))
        if added:
            instance.add_dynamic_partitions(name, added)
            added_by_source[source.name] = added
        for dump in removed:
            instance.delete_dynamic_partition(name, dump)
    return added_by_source


def dump_sensors(recipe: Recipe) -> list:
    """One sensor per crawl of dumps: each tick lists its dump folders (or reads the recipe's list) and adds the new
    ones as partitions. It starts nothing: what to build stays the user's (or an automation's) choice."""
    return [_dump_sensor(recipe, source) for source in recipe.sources if source.has_dumps]


def _dump_sensor(recipe: Recipe, source: SourceConfig):
    partitions = dumps_partitions(source)

    @sensor(name=f"{source.name}_dump_sensor", minimum_interval_seconds=DUMP_SENSOR_SECONDS,
            default_status=DefaultSensorStatus.RUNNING,
            description=f"Adds a partition to source `{source.name}`'s assets for each new dump folder "
                        f"({', '.join(source.inputs)}).")
    def _sensor(context: SensorEvaluationContext):
        known = list(context.instance.get_dynamic_partitions(partitions.name))
        added, removed = dump_changes(known, source, found_dumps(recipe, source))
        requests = []
        if added:
            requests.append(partitions.build_add_request(added))
        if removed:
            requests.append(partitions.build_delete_request(removed))
        return SensorResult(dynamic_partitions_requests=requests,
                            skip_reason=None if requests else f"no new dump of {source.name}")

    return _sensor
