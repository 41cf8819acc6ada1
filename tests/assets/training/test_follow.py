"""assets/training/follow.py: the sensor that materializes a training stage again when its run failed while its
training job still runs, evaluated on a real Dagster instance with real failed runs and real detached jobs."""

import json
import os
import sys
import time

from dagster import (AssetExecutionContext, DagsterInstance, Failure, RunRequest, SkipReason, asset, build_sensor_context,
                     materialize)

from assets.training.follow import FOLLOWS_TAG, follow_requests
from tests.trainer.job.test_detach import wait_until_ended
from trainer.job.detach import read_job, start_job


def _failed_run(instance, name: str, tags: dict) -> str:
    """A failed run of an asset `name`, with these tags (what the launcher adds to a training run)."""

    @asset(name=name)
    def stage(context: AssetExecutionContext) -> None:
        raise Failure("the run worker died")  # as run monitoring marks it

    return materialize([stage], instance=instance, tags=tags, raise_on_error=False).run_id


def test_a_failed_run_whose_job_trains_on_is_materialized_again_once_and_the_others_are_left(tmp_path):
    instance = DagsterInstance.ephemeral()
    alive_work, ended_work = tmp_path / "alive", tmp_path / "ended"
    alive = start_job([sys.executable, "-c", "import time; time.sleep(60)"], work=alive_work, env=dict(os.environ),
                      attempt=1)
    ended = start_job([sys.executable, "-c", "pass"], work=ended_work, env=dict(os.environ), attempt=1)
    try:
        wait_until_ended(ended_work)
        follow = _failed_run(instance, "main", {"pretrain/job": alive.name, "pretrain/job_work": str(alive_work),
                                                "pretrain/job_assets": "training/main"})
        _failed_run(instance, "anneal", {"pretrain/job": ended.name, "pretrain/job_work": str(ended_work),
                                         "pretrain/job_assets": "training/anneal"})
        _failed_run(instance, "long_512", {})  # failed before it started a job
        # A job.json that names another job than the run's tag (a later launch took the work dir over).
        _failed_run(instance, "other", {"pretrain/job": "elsewhere:1:2", "pretrain/job_work": str(alive_work),
                                        "pretrain/job_assets": "training/other"})

        context = build_sensor_context(instance=instance)
        [request] = follow_requests(context)
        assert isinstance(request, RunRequest) and request.run_key == f"follow-{follow}"
        assert [k.to_user_string() for k in request.asset_selection] == ["training/main"]
        assert request.tags == {FOLLOWS_TAG: follow}
        assert json.loads(context.cursor) == [follow]
        # Evaluated again: the run was followed already.
        assert isinstance(follow_requests(build_sensor_context(instance=instance, cursor=context.cursor)), SkipReason)
    finally:
        read_job(alive_work).kill()
    # Once the job has ended, nothing is left to follow.
    deadline = time.monotonic() + 30
    while read_job(alive_work).alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert isinstance(follow_requests(build_sensor_context(instance=instance)), SkipReason)
