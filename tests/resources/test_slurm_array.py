"""resources/slurm_array.py: the executor resource's Slurm kind on a real Slurm cluster (tests/slurm_cluster.py):
the job array runs, a failed task is resubmitted alone, and nothing is left pending in the queue."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resources.executor import ExecutorResource
from tests.resources.test_executor import BIN, RecordRuns


@pytest.mark.slow  # a real Slurm cluster (tests/slurm_cluster.py): ~40 s with its start-up
def test_on_a_real_slurm_cluster_the_job_array_runs_and_a_failed_task_is_resubmitted_alone(slurm, tmp_path):
    executor = ExecutorResource(
        kind="slurm", slurm_partition=slurm.partition, slurm_time="00:05:00", slurm_poll_seconds=0.5,
        # The array's tasks unpickle RecordRuns from this test module: the repository must be importable there.
        slurm_env_command=f"source {BIN / 'activate'} && export PYTHONPATH={Path(__file__).resolve().parents[2]}")
    (tmp_path / "fail-1").touch()
    logs = tmp_path / "logs"
    with pytest.raises(RuntimeError, match=r"tasks \[1\] of 3 did not complete"):
        executor.run([RecordRuns(str(tmp_path))], logging_dir=logs, tasks=3)
    assert sorted((tmp_path / "runs.txt").read_text().split()) == ["0", "1", "2"]
    stats = json.loads(executor.run([RecordRuns(str(tmp_path))], logging_dir=logs, tasks=3).read_text())
    assert sorted((tmp_path / "runs.txt").read_text().split()) == ["0", "1", "1", "2"]  # only task 1 again
    assert stats[0]["stats"]["weight"]["total"] == 6
    # Nothing of ours is left in the queue (datatrove's own stats job is not submitted: run() merges them).
    assert not [job for job in slurm.jobs() if job.get("JobState") in ("PENDING", "RUNNING")]
