"""`pretrain status` asks the instance about all the assets at once (assets/core/records.py, states.py): at 20 sources
it opens as many database connections as at 10, with every source's raw_crawl materialized and half of them on
inputs observed since (stale), and it builds the definitions once."""

import sys

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, Definitions
from dagster._core.definitions.data_version import (
    CODE_VERSION_TAG,
    DATA_VERSION_IS_USER_PROVIDED_TAG,
    DATA_VERSION_TAG,
    get_input_data_version_tag,
    get_input_event_pointer_tag,
)
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage

from assets.cli import main
from tests.assets.test_cli import write_demo_copy


def c4_copies(count: int):
    """The demo with `count` copies of its c4 source and the stages that do not name the others."""
    def mutate(raw):
        c4 = next(s for s in raw["sources"] if s["name"] == "c4")
        raw["sources"] = [{**c4, "name": f"c4_{i}"} for i in range(count)]
        for section in ("quality_classifier", "ablation", "training"):
            raw.pop(section)
        raw["mixing"]["prior"] = {f"c4_{i}": 1.0 / count for i in range(count)}
    return mutate


def record_raw_crawls(recipe_path, stale: set[str]):
    """A materialization of every source's raw_crawl with the provenance a run records (its code version, the
    inputs observation it read); those of `stale` read an older observation than the latest."""
    from assets.definitions import build_defs
    from assets.recipe import load_recipe

    graph = build_defs(load_recipe(recipe_path)).resolve_asset_graph()
    instance = DagsterInstance.get()
    for key in graph.get_all_asset_keys():
        if key.path[-1] != "raw_crawl":
            continue
        inputs = AssetKey([*key.path[:-1], "inputs"])
        observed = instance.fetch_observations(inputs, limit=1).records[0]
        version = "older" if key.path[1] in stale else observed.asset_observation.tags[DATA_VERSION_TAG]
        instance.report_runless_asset_event(AssetMaterialization(asset_key=key, tags={
            CODE_VERSION_TAG: graph.get(key).code_version, DATA_VERSION_TAG: f"data-{key.path[1]}",
            get_input_data_version_tag(inputs): version,
            get_input_event_pointer_tag(inputs): str(observed.storage_id)}))


def counted_status(monkeypatch, capsys, recipe) -> tuple[dict, str]:
    """({connections: opened, definitions: built}, the output) of one `pretrain status`, as in a new process."""
    counts = {"connections": 0, "definitions": 0}

    def counted(function, what):
        def wrapper(*args, **kwargs):
            counts[what] += 1
            return function(*args, **kwargs)
        return wrapper

    with monkeypatch.context() as patch:
        # Dagster's own calls counted, nothing replaced: every connection to the event log (each shard) and the
        # runs database, and every Definitions made.
        patch.setattr(SqliteEventLogStorage, "_connect", counted(SqliteEventLogStorage._connect, "connections"))
        patch.setattr(SqliteRunStorage, "connect", counted(SqliteRunStorage.connect, "connections"))
        patch.setattr(Definitions, "__new__", staticmethod(counted(Definitions.__new__, "definitions")))
        # As in a new process: the command imports assets.definitions itself (a build at import would count).
        # The package's attribute is put back too, so later tests see one module (importlib.reload checks).
        if "assets.definitions" in sys.modules:
            patch.setattr(sys.modules["assets"], "definitions", sys.modules["assets.definitions"])
            patch.delitem(sys.modules, "assets.definitions")
        capsys.readouterr()
        assert main(["status", "--recipe", str(recipe)]) == 0
        return counts, capsys.readouterr().out


def status_cost(tmp_path, monkeypatch, capsys, sources: int) -> tuple[int, int, dict, int]:
    """(connections opened, Definitions built, {asset: (state, cause)}) of a second `pretrain status` at `sources`,
    and the connections of the first, on a fresh home."""
    home = tmp_path / f"home-{sources}"
    monkeypatch.setenv("PRETRAIN_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    recipe = tmp_path / f"recipe-{sources}.yaml"
    write_demo_copy(recipe, c4_copies(sources))
    first, _ = counted_status(monkeypatch, capsys, recipe)  # a fresh home: records each source's inputs observation
    instance, versions = DagsterInstance.get(), set()
    for i in range(sources):  # one runless observation each, with its data version, as Dagster's own event is
        [record] = instance.fetch_observations(AssetKey(["curation", f"c4_{i}", "inputs"]), limit=5).records
        assert record.run_id == "" and record.asset_observation.tags[DATA_VERSION_IS_USER_PROVIDED_TAG] == "true"
        versions.add(record.asset_observation.tags[DATA_VERSION_TAG])
    assert len(versions) == 1 and len(versions.pop()) == 64  # the copies read the same files: one sha256
    stale = {f"c4_{i}" for i in range(0, sources, 2)}
    record_raw_crawls(recipe, stale)

    counts, out = counted_status(monkeypatch, capsys, recipe)
    rows = {line.split(None, 2)[0]: tuple(line.split(None, 2)[1:]) for line in out.splitlines()}
    for i in range(sources):
        state, cause = rows[f"curation/c4_{i}/raw_crawl"]
        if f"c4_{i}" in stale:
            assert state == "stale" and f"curation/c4_{i}/inputs" in cause, (i, state, cause)
        else:
            assert (state, cause) == ("fresh", "-"), (i, state, cause)
        assert rows[f"curation/c4_{i}/filtered"] == ("missing", "never materialized")
    return counts["connections"], counts["definitions"], rows, first["connections"]


@pytest.mark.slow  # four `pretrain status` commands: 15 s
def test_status_queries_do_not_grow_with_the_sources_and_the_definitions_are_built_once(tmp_path, monkeypatch,
                                                                                          capsys):
    connections_10, definitions_10, rows_10, first_10 = status_cost(tmp_path, monkeypatch, capsys, 10)
    connections_20, definitions_20, rows_20, first_20 = status_cost(tmp_path, monkeypatch, capsys, 20)
    # The first, on a fresh home, records 10 or 20 observations in one batch: as many connections either way.
    assert first_10 == first_20, (first_10, first_20)
    # Four assets a source: raw_crawl, filtered, decontaminated, packed (the inputs are observed, not listed).
    assert len(rows_20) == len(rows_10) + 4 * 10
    assert connections_10 == connections_20, (connections_10, connections_20)
    assert definitions_10 == definitions_20 == 1


def test_observations_recorded_in_one_batch_are_the_rows_dagster_writes_one_by_one(tmp_path):
    """record_observations against Dagster's report_runless_asset_event, each on a SQLite instance of its own: the
    same events, tags and asset records are read back from both (two keys, one observed twice)."""
    from dagster import AssetObservation

    from assets.core.records import latest_observations, record_observations

    keys = [AssetKey(["curation", "a", "inputs"]), AssetKey(["curation", "b", "inputs"])]
    rounds = [{keys[0]: "v1", keys[1]: "w1"}, {keys[0]: "v2"}]
    for name in ("batched", "single"):
        (tmp_path / name).mkdir()
    batched, single = (DagsterInstance.local_temp(str(tmp_path / name)) for name in ("batched", "single"))
    for versions in rounds:
        record_observations(batched, versions)
        for key, version in versions.items():
            single.report_runless_asset_event(AssetObservation(
                asset_key=key, tags={DATA_VERSION_TAG: version, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"}))

    def read(instance):
        events = {key: [(r.run_id, r.event_log_entry.job_name, r.event_log_entry.dagster_event_type,
                         dict(r.asset_observation.tags)) for r in instance.fetch_observations(key, limit=10).records]
                  for key in keys}
        latest = {key: r.asset_observation.tags[DATA_VERSION_TAG]
                  for key, r in latest_observations(instance, keys).items()}
        data_versions = {key: instance.get_latest_data_version_record(key).asset_observation.tags[DATA_VERSION_TAG]
                         for key in keys}
        return events, latest, data_versions, sorted(instance.all_asset_keys())

    assert read(batched) == read(single)
    events, latest, _, asset_keys = read(batched)
    assert latest == {keys[0]: "v2", keys[1]: "w1"} and len(events[keys[0]]) == 2 and asset_keys == sorted(keys)
