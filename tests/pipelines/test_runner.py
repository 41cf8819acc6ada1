"""pipelines/runner.py: tasks that resume, every task's stats merged, stats read back; the local runner.
(The same sequence on the executor resource's kinds: tests/resources/test_executor.py and test_slurm_array.py.)"""

from __future__ import annotations

import json

import pytest

from pipelines.runner import LocalRunner, completed_ranks, run_resumable, stat_totals
from tests.resources.test_executor import RecordRuns


def test_a_killed_run_resumes_only_its_unfinished_tasks_on_two_workers(tmp_path):
    runner = LocalRunner(workers=2)
    (tmp_path / "fail-3").touch()
    logs = tmp_path / "logs"
    with pytest.raises(Exception, match="task 3 killed"):
        runner.run([RecordRuns(str(tmp_path))], logging_dir=logs, tasks=4)
    finished = completed_ranks(logs, 4)
    assert 3 not in finished and finished  # which others finished depends on the pool; 3 did not
    first = (tmp_path / "runs.txt").read_text().split()
    stats = runner.run([RecordRuns(str(tmp_path))], logging_dir=logs, tasks=4)
    again = (tmp_path / "runs.txt").read_text().split()[len(first):]
    assert sorted(again) == sorted(str(rank) for rank in set(range(4)) - finished)
    assert stat_totals(stats)["weight"] == 1 + 2 + 3 + 4


def test_nothing_is_launched_when_every_task_completed_and_a_task_that_never_ran_is_named(tmp_path):
    logs = tmp_path / "logs"
    LocalRunner().run([RecordRuns(str(tmp_path))], logging_dir=logs, tasks=2)
    launched = []
    assert stat_totals(run_resumable(lambda: launched.append(1), logging_dir=logs, tasks=2))["weight"] == 3
    assert launched == []
    # A launch that leaves a task undone (a cluster that lost it) is an error naming the task, not a short count.
    (logs / "completions" / "00001").unlink()
    with pytest.raises(RuntimeError, match=r"tasks \[1\] of 2 did not complete"):
        run_resumable(lambda: None, logging_dir=logs, tasks=2)


def test_stat_totals_sums_every_step_or_the_named_one(tmp_path):
    path = tmp_path / "stats.json"
    path.write_text(json.dumps([
        {"name": "📖 - READER: 🐿 Jsonl", "stats": {"documents": {"total": 10, "n": 2}, "time": 0.5}},
        {"name": "🔻 - FILTER: 🌍 Language", "stats": {"dropped_language": 3, "doc_len": {"mean": 7.0}}},
        {"name": "💽 - WRITER: 🐿 Jsonl", "stats": {"total": 7, "dropped_language": 1}},
    ]))
    assert stat_totals(path) == {"documents": 10, "time": 0.5, "dropped_language": 4, "total": 7}
    assert stat_totals(path, step="FILTER: 🌍 Language") == {"dropped_language": 3}  # a summary without total: none
    with pytest.raises(ValueError, match="no stats of the step 'Nope'"):
        stat_totals(path, step="Nope")


def test_the_task_count_is_the_stages_own_unless_the_runner_sets_one():
    assert LocalRunner().tasks_for(7) == 7 and LocalRunner().tasks_for(0) == 1
    assert LocalRunner(tasks=3).tasks_for(7) == 3
    with pytest.raises(ValueError, match="workers must be >= 1"):
        LocalRunner(workers=0)
