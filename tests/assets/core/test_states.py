"""asset_states on a small real graph and instance: an observed source, a -> b, and a partitioned p; missing until
materialized (a partitioned asset until every partition is), then fresh, then stale with Dagster's causes."""

import pytest
from dagster import (
    AssetKey,
    DataVersion,
    Definitions,
    StaticPartitionsDefinition,
    asset,
    materialize,
    observable_source_asset,
)

from assets.core.states import asset_states
from assets.home import ensure_dagster_home

VERSION = {"src": "v1"}  # what the observable source reports when observed


@observable_source_asset(key="src")
def src():
    return DataVersion(VERSION["src"])


def graph_of(a_code: str):
    @asset(key="a", deps=[src], code_version=a_code)
    def a():
        return None

    @asset(key="b", deps=[a], code_version="1")
    def b():
        return None

    @asset(key="p", deps=[a], code_version="1", partitions_def=StaticPartitionsDefinition(["x", "y"]))
    def p():
        return None

    return [src, a, b, p]


def states(instance, assets) -> dict[str, tuple[str, str]]:
    graph = Definitions(assets=assets).resolve_asset_graph()
    keys = [AssetKey(name) for name in ("a", "b", "p")]
    return {key.to_user_string(): (state, cause) for key, state, cause in asset_states(instance, graph, keys)}


def observe(instance, assets):
    from dagster import define_asset_job

    job = Definitions(assets=assets, jobs=[define_asset_job("observe", selection=[src.key])]).resolve_job_def("observe")
    assert job.execute_in_process(instance=instance).success


@pytest.mark.slow  # five Dagster runs: 8 s
def test_missing_fresh_and_stale_with_their_causes():
    from dagster import DagsterInstance

    ensure_dagster_home()
    instance = DagsterInstance.get()
    assets = graph_of("1")
    assert set(states(instance, assets).values()) == {("missing", "never materialized")}

    observe(instance, assets)
    assert materialize(assets[1:3], instance=instance, selection=["a", "b"]).success
    assert materialize([assets[3]], instance=instance, partition_key="x").success
    assert states(instance, assets) == {"a": ("fresh", "-"), "b": ("fresh", "-"),
                                        "p": ("missing", "never materialized")}  # p's partition y is missing
    assert materialize([assets[3]], instance=instance, partition_key="y").success
    assert states(instance, assets)["p"] == ("fresh", "-")

    # a's code changed: a is stale; what reads it stays fresh until a has a new data version (one step at a
    # time, which is why `pretrain materialize --stale` loops).
    changed = graph_of("2")
    assert states(instance, changed) == {"a": ("stale", "has a new code version"), "b": ("fresh", "-"),
                                         "p": ("fresh", "-")}

    VERSION["src"] = "v2"  # new input files: the source's observation has a new data version
    try:
        observe(instance, assets)
    finally:
        VERSION["src"] = "v1"
    assert states(instance, assets)["a"] == ("stale", "src has a new data version")


def test_a_partitioned_assets_records_are_read_at_once_not_once_a_partition(tmp_path, monkeypatch):
    """Every partition materialized (runless events, as a run records them: the code version, a data version), then
    the connections asset_states opens: as many for 8 partitions as for 2."""
    from dagster import AssetMaterialization, DagsterInstance
    from dagster._core.definitions.data_version import CODE_VERSION_TAG, DATA_VERSION_TAG
    from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

    opened = []
    connect = SqliteEventLogStorage._connect

    def counted(self, *args, **kwargs):  # Dagster's own connection, counted
        opened.append(1)
        return connect(self, *args, **kwargs)

    monkeypatch.setattr(SqliteEventLogStorage, "_connect", counted)
    counts = {}
    for partitions in (2, 8):
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / f"dagster-{partitions}"))
        ensure_dagster_home()
        instance = DagsterInstance.get()
        names = [f"part{i}" for i in range(partitions)]

        @asset(key="q", code_version="1", partitions_def=StaticPartitionsDefinition(names))
        def q():
            return None

        for name in names:
            instance.report_runless_asset_event(AssetMaterialization(
                asset_key="q", partition=name, tags={CODE_VERSION_TAG: "1", DATA_VERSION_TAG: f"data-{name}"}))
        graph = Definitions(assets=[q]).resolve_asset_graph()
        opened.clear()
        assert asset_states(instance, graph, [AssetKey("q")]) == [(AssetKey("q"), "fresh", "-")]
        counts[partitions] = len(opened)
    assert counts[2] == counts[8], counts
