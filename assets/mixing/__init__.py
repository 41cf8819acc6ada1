"""The mixing group: the proxy-model sweep over candidate mixtures, and the chosen weights (RegMix).

    mixing/mix_candidates    mix_candidates.py    mixtures drawn around the prior, one sweep partition each
    mixing/mix_sweep         mix_sweep.py         one proxy run per candidate (partitioned)
    mixing/mixture_weights   mixture_weights.py   the fitted, chosen mixture
    (shared)                 section.py           keys, versioned sections, proxy settings, result files

Each output is committed to the store like every other (manifest last), so a training stage reads the
chosen weights, with their data version, from the store.

A scheduled sweep learns at each tick (RegMix's loop): the recipe's cron (mix_sweep_schedule) draws the tick's
new candidates (mix_candidates with the tick as a run tag: the same tick draws the same ones) and registers
them as new sweep partitions; mix_sweep_sensor runs each new partition's proxy once and, once no sweep run is
left to wait for, refits mixture_weights over every completed run of every tick. Earlier partitions and their
results stay. Dagster then shows the earlier partitions as stale (the list of candidates they read grew): a
rerun reuses each result, since a partition's version key is its own mixture, not the list.
"""

import json
from datetime import datetime, timezone

from dagster import (
    AssetSelection,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    define_asset_job,
    schedule,
    sensor,
)

from assets.mixing.mix_candidates import mix_candidates_asset
from assets.mixing.mix_sweep import mix_sweep_asset
from assets.mixing.mixture_weights import mixture_weights_asset
from assets.mixing.section import CANDIDATES, TICK_TAG, candidates_key, sweep_key, tick_label, weights_key
from assets.recipe import Recipe

SCHEDULE_JOB, SWEEP_JOB, WEIGHTS_JOB = "mix_sweep_schedule_job", "mix_sweep_job", "mixture_weights_job"
PARTITION_TAG = "dagster/partition"  # the tag Dagster gives a partition's run
# A run that has not ended: the sensor neither requests its partition again nor refits while one is left.
UNFINISHED = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
              DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def mixing_assets(recipe: Recipe) -> list:
    if recipe.mixing is None or recipe.training is None:
        return []
    return [mix_candidates_asset(recipe), mix_sweep_asset(recipe), mixture_weights_asset(recipe)]


def mixing_schedules(recipe: Recipe) -> list:
    """The recipe's cron draws a tick's new candidates (mix_candidates, tagged with the tick: the same tick draws
    the same ones); the mixing sensor then runs their proxies and refits the weights."""
    if recipe.mixing is None or recipe.training is None or not recipe.mixing.schedule:
        return []
    job = define_asset_job(SCHEDULE_JOB, selection=AssetSelection.assets(candidates_key()),
                           description="Draw a tick's new candidates; the mixing sensor runs the rest.")

    @schedule(name="mix_sweep_schedule", cron_schedule=recipe.mixing.schedule, job=job,
              default_status=_status(recipe, DefaultScheduleStatus))
    def mix_sweep_schedule(context):
        tick = tick_label(context.scheduled_execution_time or datetime.now(timezone.utc))
        return RunRequest(run_key=tick, tags={TICK_TAG: tick})

    return [mix_sweep_schedule]


def mixing_sensors(recipe: Recipe) -> list:
    """mix_sweep_sensor: runs each sweep partition no run has materialized yet, once, and when no sweep run is
    left to wait for and a proxy run finished after the last fit, refits mixture_weights over all of them."""
    if recipe.mixing is None or recipe.training is None:
        return []
    sweep_job = define_asset_job(SWEEP_JOB, selection=AssetSelection.assets(sweep_key()),
                                 description="One proxy run: a partition of mixing/mix_sweep.")
    weights_job = define_asset_job(WEIGHTS_JOB, selection=AssetSelection.assets(weights_key()),
                                   description="Refit the mixture over every completed proxy run.")

    @sensor(name="mix_sweep_sensor", jobs=[sweep_job, weights_job], minimum_interval_seconds=60,
            default_status=_status(recipe, DefaultSensorStatus))
    def mix_sweep_sensor(context: SensorEvaluationContext):
        return sweep_requests(context)

    return [mix_sweep_sensor]


def sweep_requests(context: SensorEvaluationContext):
    """The mixing sensor's evaluation. Its cursor lists the partitions it has requested, so a failed proxy run is
    not retried in a loop (rerun it by hand) and does not hold the refit back."""
    instance = context.instance
    requested = set(json.loads(context.cursor)) if context.cursor else set()
    done = instance.get_materialized_partitions(sweep_key())
    # Sweep runs not ended yet: the sensor's own, and those of `pretrain materialize` (one asset per run).
    unfinished = {run.tags.get(PARTITION_TAG) for run in instance.get_runs(RunsFilter(statuses=UNFINISHED))
                  if run.job_name == SWEEP_JOB or sweep_key() in (run.asset_selection or ())}
    new = [name for name in instance.get_dynamic_partitions(CANDIDATES.name)
           if name not in done and name not in unfinished and name not in requested]
    requests = [RunRequest(job_name=SWEEP_JOB, partition_key=name, run_key=f"mix_sweep:{name}") for name in new]
    if not new and not unfinished:
        [latest_run] = instance.fetch_materializations(sweep_key(), limit=1).records or [None]  # any partition's
        [latest_fit] = instance.fetch_materializations(weights_key(), limit=1).records or [None]
        if latest_run is not None and (latest_fit is None or latest_run.storage_id > latest_fit.storage_id):
            requests.append(RunRequest(job_name=WEIGHTS_JOB, run_key=f"mixture_weights:{latest_run.storage_id}"))
    context.update_cursor(json.dumps(sorted(requested | set(new))))
    return requests or SkipReason("no new sweep partition, and no proxy run finished since the last fit")


def _status(recipe: Recipe, kind):
    return kind.RUNNING if recipe.mixing.status == "running" else kind.STOPPED
