"""training_follow_sensor: what a resume by Dagster's run monitoring would do, with the default run launcher.

Run monitoring (assets/home.py) marks a run failed when its worker dies (a restarted daemon, a redeployed code
location, a host that killed it), but only the Kubernetes, ECS or Docker run launchers can resume it. The training
job goes on without the run (trainer/job/detach.py), so this sensor resumes it the one way that works everywhere: for a
failed run of a training stage whose job, the one its `pretrain/job` tag names, is still alive, it requests the
same assets again; the new run's launcher finds the job in the work dir (the run's `pretrain/job_work` tag) and
follows it instead of starting a second trainer. A run whose job ended, or that failed for a reason of its own
(restarts exhausted, a bad config), is left as it is. Each failed run is followed once (its id in the cursor, and
the run key)."""

from __future__ import annotations

import json

from dagster import (
    AssetKey,
    AssetSelection,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from resources.launcher import JOB_TAG
from trainer.job.detach import read_job

FOLLOWS_TAG = "pretrain/follows"  # on the new run: the failed run whose job it follows
LOOK_BACK_RUNS = 100  # failed runs looked at per evaluation, newest first
CURSOR_RUNS = 1000  # failed runs remembered as followed


def follow_sensors() -> list:
    @sensor(name="training_follow_sensor", asset_selection=AssetSelection.groups("training"),
            minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
            description="Materializes a training stage again when its run failed (its worker died) while its "
                        "training job still runs: the new run follows that job.")
    def training_follow_sensor(context: SensorEvaluationContext):
        return follow_requests(context)

    return [training_follow_sensor]


def follow_requests(context: SensorEvaluationContext):
    followed = json.loads(context.cursor) if context.cursor else []
    requests = []
    for record in context.instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.FAILURE]),
                                                   limit=LOOK_BACK_RUNS):
        run = record.dagster_run
        work, name = run.tags.get(f"{JOB_TAG}_work"), run.tags.get(JOB_TAG)
        # The assets the run materialized (the launcher tags them: a run of every asset has no selection).
        keys = sorted(run.asset_selection or [AssetKey.from_user_string(k)
                                              for k in run.tags.get(f"{JOB_TAG}_assets", "").split(",") if k])
        if not work or not name or not keys or run.run_id in followed:
            continue
        try:
            job = read_job(work)
        except ValueError as exc:  # a job.json that does not parse: say so, follow nothing
            context.log.warning(f"run {run.run_id}: {exc}")
            continue
        if job is None or job.name != name or not job.alive():
            continue
        followed.append(run.run_id)
        requests.append(RunRequest(run_key=f"follow-{run.run_id}", asset_selection=keys, tags={FOLLOWS_TAG: run.run_id}))
        context.log.info(f"run {run.run_id} failed while its training job ({job.describe()}) runs on: "
                         f"materializing {', '.join(k.to_user_string() for k in keys)} again to follow it")
    context.update_cursor(json.dumps(followed[-CURSOR_RUNS:]))
    return requests or SkipReason("no failed training run whose job still runs")
