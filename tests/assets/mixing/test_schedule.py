"""The scheduled sweep learns at each tick: two schedule ticks evaluated on a real (SQLite) instance draw different
candidates, the mixing sensor requests exactly each tick's new partitions, then the refit, and mixture_weights
fits the runs of every tick together. The proxy runs are not trained here (test_mixing.py trains them): each
partition's result is committed to the store and recorded as mix_sweep writes it, with a loss that depends on
the mixture; each source's packed output gives mixture_weights a million tokens to count (the data budget)."""

import json
from datetime import datetime, timezone

import pytest
import yaml
from dagster import (
    AssetMaterialization,
    DagsterInstance,
    DagsterRunStatus,
    build_schedule_context,
    build_sensor_context,
)
from dagster._core.test_utils import create_run_for_test  # a run record as `pretrain materialize` leaves one

from assets.definitions import build_defs
from assets.home import ensure_dagster_home
from assets.mixing import SCHEDULE_JOB, SWEEP_JOB, WEIGHTS_JOB
from assets.mixing.mix_sweep import mix_sweep_spec
from assets.mixing.section import RESULT_FILE, TICK_TAG, candidates_key, sweep_key, weights_key
from assets.recipe import DEMO_RECIPE, load_recipe
from storage.local import LocalStore
from storage.manifest import commit_folder
from tests.assets.mixing.test_mixture_weights import plenty_of_tokens

SLOPE = {"books": 0.4, "code": -0.2, "web": 0.1}  # the target loss the fake proxies report: linear in the weights
TICK_1 = datetime(2026, 12, 6, 3, 0, tzinfo=timezone.utc)  # two Sundays of the recipe's "0 3 * * 0"
TICK_2 = datetime(2026, 12, 13, 3, 0, tzinfo=timezone.utc)


def write_recipe(tmp_path):
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    raw["mixing"] = {"prior": {"web": 0.5, "code": 0.3, "books": 0.2}, "candidates": 3, "concentration": 6.0,
                     "target": "average", "proxy": {"train_tokens": 4096}, "schedule": "0 3 * * 0"}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_recipe(path)


def record_proxy_runs(instance, store, tmp_path, recipe, names, candidates) -> None:
    """What each finished sweep partition leaves: its result committed under its own prefix, and its
    materialization (the prefix) in the instance."""
    code_version = mix_sweep_spec(recipe).code_version
    for name in names:
        weights = candidates[name]
        folder = tmp_path / "swept" / name
        folder.mkdir(parents=True)
        loss = 3.0 + sum(SLOPE[s] * w for s, w in weights.items())
        (folder / RESULT_FILE).write_text(json.dumps({"mixture": name, "weights": weights, "target_loss": loss,
                                                      "val_loss": {s: loss for s in weights}}))
        prefix = f"mixing/mix_sweep/{name}/recorded"
        commit_folder(store, prefix, folder, {"asset": "mixing/mix_sweep", "code_version": code_version})
        instance.report_runless_asset_event(AssetMaterialization(sweep_key(), partition=name,
                                                                 metadata={"prefix": prefix}))


def latest_metadata(instance, key) -> dict:
    [record] = instance.fetch_materializations(key, limit=1).records
    return {k: v.value for k, v in record.asset_materialization.metadata.items()}


@pytest.mark.slow  # ~15-30 s: five in-process runs on a SQLite instance
def test_two_ticks_draw_new_candidates_and_the_fit_uses_the_runs_of_both(tmp_path):
    recipe = write_recipe(tmp_path)
    ensure_dagster_home()
    instance = DagsterInstance.get()
    defs = build_defs(recipe)
    repo = defs.get_repository_def()
    schedule, sensor = defs.resolve_schedule_def("mix_sweep_schedule"), defs.resolve_sensor_def("mix_sweep_sensor")
    store = defs.resources["store"].open()
    assert isinstance(store, LocalStore)
    plenty_of_tokens(instance, store, tmp_path, sorted(recipe.mixing.prior))

    def tick(when):
        [request] = schedule.evaluate_tick(build_schedule_context(instance=instance, scheduled_execution_time=when,
                                                                  repository_def=repo)).run_requests
        return request

    def run(request):
        job = defs.resolve_job_def(request.job_name or SCHEDULE_JOB)
        result = job.execute_in_process(instance=instance, tags=request.tags, partition_key=request.partition_key)
        assert result.success
        return result

    cursor = None

    def sense():
        nonlocal cursor
        # instance_ref, as the daemon gives it: a partition key is checked against the dynamic partitions
        context = build_sensor_context(instance_ref=instance.get_ref(), cursor=cursor, repository_def=repo)
        requests = sensor.evaluate_tick(context).run_requests
        cursor = context.cursor
        return requests

    # Tick 1: a run request tagged with its tick; the same tick asks for the same draw, the next for another.
    first = tick(TICK_1)
    assert first.tags[TICK_TAG] == first.run_key == "2026-12-06T03:00Z"
    assert tick(TICK_1).tags == first.tags and tick(TICK_2).tags[TICK_TAG] == "2026-12-13T03:00Z"
    run(first)
    drawn = latest_metadata(instance, candidates_key())
    assert set(drawn["draws"]) == {"base", "2026-12-06T03:00Z"} and drawn["new_partitions"] == 6
    base, tick_1 = set(drawn["draws"]["base"]), set(drawn["draws"]["2026-12-06T03:00Z"])
    assert len(base) == len(tick_1) == 3 and not base & tick_1
    assert set(instance.get_dynamic_partitions("mix_candidates")) == base | tick_1

    # The sensor asks for each new partition's proxy run once, and no fit while those are outstanding.
    requests = sense()
    assert {r.partition_key for r in requests} == base | tick_1 and {r.job_name for r in requests} == {SWEEP_JOB}
    assert sense() == []  # requested already: not again (runs not finished yet, nor failed-and-retried)
    record_proxy_runs(instance, store, tmp_path, recipe, sorted(base | tick_1), drawn["candidates"])
    [refit] = sense()
    assert refit.job_name == WEIGHTS_JOB and refit.partition_key is None
    run(refit)
    fit = latest_metadata(instance, weights_key())
    assert fit["fit_runs"] == 6 and set(fit["swept"]) == base | tick_1
    assert fit["runs_per_draw"] == {"base": 3, "2026-12-06T03:00Z": 3}
    # 6 runs < 10 features of the quadratic model over 3 sources: the linear one, and it says why.
    assert (fit["fit_model"], fit["fit_features"]) == ("linear", 3)
    assert "6 proxy runs < 10 features of the quadratic model over 3 sources" in fit["fit_warning"]
    run_id = instance.fetch_materializations(weights_key(), limit=1).records[0].run_id
    warnings = [e.message for e in instance.all_logs(run_id) if e.level == 30]  # logging.WARNING
    assert any("mixture fit: 6 proxy runs < 10 features" in m for m in warnings), warnings
    assert sense() == []  # fitted: nothing new

    # Tick 2: three more candidates, only they are run, and the fit is over all nine.
    second = tick(TICK_2)
    assert second.run_key != first.run_key
    run(second)
    drawn = latest_metadata(instance, candidates_key())
    tick_2 = set(drawn["draws"]["2026-12-13T03:00Z"])
    assert set(drawn["draws"]) == {"base", "2026-12-06T03:00Z", "2026-12-13T03:00Z"}
    assert len(tick_2) == 3 and not tick_2 & (base | tick_1) and drawn["new_partitions"] == 3
    requests = sense()
    assert {r.partition_key for r in requests} == tick_2
    # A proxy run not ended yet (here one that `pretrain materialize` started) holds the refit back.
    last = sorted(tick_2)[-1]
    going = create_run_for_test(instance, job_name="__ASSET_JOB", status=DagsterRunStatus.STARTED,
                                tags={"dagster/partition": last}, asset_selection=frozenset({sweep_key()}))
    record_proxy_runs(instance, store, tmp_path, recipe, sorted(tick_2 - {last}), drawn["candidates"])
    assert sense() == []
    record_proxy_runs(instance, store, tmp_path, recipe, [last], drawn["candidates"])
    instance.report_run_failed(going)  # ended (its outcome does not matter to the sensor)
    [second_refit] = sense()
    assert second_refit.job_name == WEIGHTS_JOB and second_refit.run_key != refit.run_key
    run(second_refit)
    fit = latest_metadata(instance, weights_key())
    assert fit["fit_runs"] == 9 and set(fit["swept"]) == base | tick_1 | tick_2
    assert fit["runs_per_draw"] == {"base": 3, "2026-12-06T03:00Z": 3, "2026-12-13T03:00Z": 3}
    # Linear losses: the chosen mixture leans to the source with the lowest slope (code).
    assert fit["weights"]["code"] > 0.3 and fit["pending"] == []

    # The same tick again draws the same candidates: the committed output is reused, nothing new registered.
    version = latest_metadata(instance, candidates_key())["data_version"]
    run(second)
    again = latest_metadata(instance, candidates_key())
    assert again["data_version"] == version and again["new_partitions"] == 0
