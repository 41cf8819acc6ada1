"""pipelines/runner.py: tasks that resume, every task's stats merged, stats read back; the local runner.
(The same sequence on the executor resource's kinds: tests/resources/test_executor.py and test_slurm_array.py.)"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from datatrove.pipeline.base import PipelineStep

from pipelines.runner import LocalRunner, WorkerPool, _run_task, completed_ranks, run_resumable, stat_totals
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


class MeetAndRecord(PipelineStep):
    """Writes <rank>.json with its process id and the value of PRETRAIN_TEST_MARK as the task sees it. Every task
    waits (up to a minute) until `meet` tasks have started, so the run passes only if that many ran at once; with
    `helpers_die`, a task in any process other than `parent` exits that process on the spot."""

    name = "meet and record"

    def __init__(self, folder: str, meet: int, parent: int, helpers_die: bool = False):
        super().__init__()
        self.folder, self.meet, self.parent, self.helpers_die = folder, meet, parent, helpers_die

    def run(self, data, rank: int = 0, world_size: int = 1):
        folder = Path(self.folder)
        (folder / f"started-{rank}").touch()
        if self.helpers_die and os.getpid() != self.parent:
            os._exit(3)
        deadline = time.monotonic() + 60
        while len(list(folder.glob("started-*"))) < self.meet and time.monotonic() < deadline:
            time.sleep(0.01)
        (folder / f"{rank}.json").write_text(json.dumps({"pid": os.getpid(), "mark": os.environ.get("PRETRAIN_TEST_MARK")}))
        self.stat_update("met", value=int(len(list(folder.glob("started-*"))) >= self.meet))
        yield from data or []


def test_two_workers_are_two_helpers_that_see_the_environment_as_it_is_now(tmp_path, monkeypatch):
    runner = LocalRunner(workers=2)
    runner.warm()  # the helpers start now, and keep serving the later runs of this process
    for run, mark in enumerate(["first", "second"]):
        monkeypatch.setenv("PRETRAIN_TEST_MARK", mark)  # set after the helper started
        folder = tmp_path / str(run)
        folder.mkdir()
        stats = runner.run([MeetAndRecord(str(folder), meet=2, parent=os.getpid())], logging_dir=folder / "logs", tasks=4)
        records = [json.loads((folder / f"{rank}.json").read_text()) for rank in range(4)]
        assert {r["mark"] for r in records} == {mark}
        pids = {r["pid"] for r in records}
        assert os.getpid() not in pids and len(pids) == 2  # two helpers took the tasks; this process waited
        assert stat_totals(stats)["met"] == 4  # the first two tasks ran at the same time
        if run == 0:
            helpers = pids
        else:
            assert pids == helpers  # the same helper processes: started once, not per run


class HoldsAnOpenStream(PipelineStep):
    """Keeps a gzip stream open on itself while it runs, as a writer does: a step in that state does not pickle."""

    name = "holds an open stream"

    def __init__(self, folder: str):
        super().__init__()
        self.folder = folder

    def run(self, data, rank: int = 0, world_size: int = 1):
        import gzip

        self.stream = gzip.open(Path(self.folder) / f"{rank}.gz", "wb")
        self.stream.write(b"x")
        yield from data or []


def test_a_task_leaves_the_executor_it_was_given_as_it_was_for_the_next_task(tmp_path):
    """A helper runs task after task on one executor: a task that set its running copy of the steps on it (a
    writer's open gzip stream) would hand the next task used steps, and made the steps unpicklable for the next
    run's job ("cannot pickle 'zlib.Compress' object", seen in the suite under load when the executor was sent)."""
    import dill
    from datatrove.executor import LocalPipelineExecutor

    pipeline = [HoldsAnOpenStream(str(tmp_path))]
    executor = LocalPipelineExecutor(pipeline, tasks=2, workers=2, logging_dir=str(tmp_path / "logs"))
    _run_task(executor, pipeline, 0, 0)
    assert (tmp_path / "0.gz").exists()  # the task ran
    assert executor.pipeline is pipeline and not hasattr(pipeline[0], "stream")
    dill.loads(dill.dumps(pipeline))  # what the pool sends a helper with the next run


def test_with_two_workers_this_process_never_imports_datatroves_executor(tmp_path):
    """The helpers build the executor (they imported it as they started): the run's own process skips datatrove.io,
    fsspec and huggingface_hub, a third of a second of a one-second stage. One executor.json is written, as datatrove
    writes it."""
    import subprocess
    import sys

    script = f"""
import sys
from datatrove.pipeline.base import PipelineStep
from pipelines.runner import LocalRunner, stat_totals

class Count(PipelineStep):
    name = "count"
    def run(self, data, rank=0, world_size=1):
        self.stat_update("ran")
        yield from data or []

stats = LocalRunner(workers=2).run([Count()], logging_dir={str(tmp_path / "logs")!r}, tasks=3)
print(stat_totals(stats)["ran"], "datatrove.executor" in sys.modules, "fsspec" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "False", "False"]
    assert json.loads((tmp_path / "logs" / "executor.json").read_text())["world_size"] == 3


def test_tasks_after_the_first_ask_sysconfig_nothing_and_loguru_sees_the_same_library_folders(tmp_path):
    """datatrove adds loguru sinks for every task, and each add asked sysconfig for 36 install paths afresh (8-9 ms
    a task): a process now asks once, in its first run. Counted in a fresh process."""
    import subprocess
    import sys

    script = f"""
import sysconfig
calls = [0]
get_paths = sysconfig.get_paths
def counting(*args, **kwargs):
    calls[0] += 1
    return get_paths(*args, **kwargs)
sysconfig.get_paths = counting

import json
from loguru._better_exceptions import ExceptionFormatter
from datatrove.pipeline.base import PipelineStep
from pipelines.runner import LocalRunner, stat_totals

expected = ExceptionFormatter._get_lib_dirs()  # loguru's own answer, before any task
class Count(PipelineStep):
    name = "count"
    def run(self, data, rank=0, world_size=1):
        self.stat_update("ran")
        yield from data or []

counts = []
for run in range(2):
    before = calls[0]
    stats = LocalRunner(workers=1).run([Count()], logging_dir={str(tmp_path)!r} + f"/logs{{run}}", tasks=6)
    counts.append((stat_totals(stats)["ran"], calls[0] - before))
print(json.dumps({{"counts": counts, "same": ExceptionFormatter._get_lib_dirs() == expected,
                  "folders": len(expected)}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    (first_ran, _), (second_ran, second_calls) = result["counts"]
    assert (first_ran, second_ran) == (6, 6)
    assert second_calls == 0  # uncached: 6 tasks x 3 sinks x 36 paths = 648
    assert result["same"] and result["folders"] > 0


def test_a_helper_that_dies_fails_the_run_naming_it_and_the_next_run_gets_a_new_one(tmp_path):
    runner = LocalRunner(workers=2)
    runner.warm()
    folder = tmp_path / "dies"
    folder.mkdir()
    with pytest.raises(RuntimeError, match=r"a helper process died \(exit code 3\)"):
        runner.run([MeetAndRecord(str(folder), meet=2, parent=os.getpid(), helpers_die=True)],
                   logging_dir=folder / "logs", tasks=3)
    assert completed_ranks(folder / "logs", 3) == set()  # every helper died on its first task
    again = runner.run([MeetAndRecord(str(folder), meet=0, parent=os.getpid())], logging_dir=folder / "logs", tasks=3)
    assert stat_totals(again)["met"] == 3 and completed_ranks(folder / "logs", 3) == {0, 1, 2}


def test_helpers_hear_sigterm_even_when_this_process_ignores_it(tmp_path):
    """A process started where SIGTERM is ignored (a shell's background job, nohup) passes that on to the helpers it
    spawns; a helper sets SIGTERM back to its default, so that a SIGTERM to the process group stops it too."""
    WorkerPool.close_all()
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        folder = tmp_path / "run"
        folder.mkdir()
        LocalRunner(workers=2).run([MeetAndRecord(str(folder), meet=2, parent=os.getpid())],
                                   logging_dir=folder / "logs", tasks=2)  # a helper ran a task: it is set up
        [pool] = WorkerPool._pools.values()
        helpers = list(pool.pool._pool)

        def ignores_sigterm(pid: int) -> bool:
            mask = re.search(r"SigIgn:\s*([0-9a-f]+)", Path(f"/proc/{pid}/status").read_text()).group(1)
            return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))

        assert ignores_sigterm(os.getpid())  # what the helpers inherited
        assert helpers and not any(ignores_sigterm(p.pid) for p in helpers)
        pool.pool.terminate()  # ends each helper, then joins: returns only once they are gone
        assert all(p.exitcode == -signal.SIGKILL for p in helpers)
    finally:
        signal.signal(signal.SIGTERM, previous)
        WorkerPool.close_all()


def test_a_pool_closed_while_its_helpers_still_start_ends_them_where_this_process_ignores_sigterm():
    """Until its initializer runs, a helper ignores SIGTERM as this process does; Pool.terminate() sent SIGTERM and
    then waited: a pool started and closed at once (`pretrain materialize`'s early start, then an error) or a dead
    helper's replacement waited forever (twice in one suite run). The pool ends its helpers with SIGKILL."""
    import threading

    WorkerPool.close_all()
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    helpers = []
    try:
        pool = WorkerPool(2)
        helpers = list(pool.pool._pool)
        closer = threading.Thread(target=pool.close, daemon=True)
        closer.start()  # at once: the helpers are still starting (importing, before their initializer)
        closer.join(timeout=60)
        assert not closer.is_alive(), "closing the pool waited for a helper that never heard its signal"
        assert [p.exitcode for p in helpers] == [-signal.SIGKILL] * 2
    finally:
        signal.signal(signal.SIGTERM, previous)
        for p in helpers:  # a failed run leaves none behind
            if p.exitcode is None:
                os.kill(p.pid, signal.SIGKILL)


def _filter_models_loaded() -> tuple[bool, bool]:
    """In a helper: whether spaCy's tokenizer and the toxicity model are in memory, without loading either."""
    import sys

    words, toxicity = sys.modules.get("pipelines.filters.words"), sys.modules.get("pipelines.filters.toxicity")
    return (words is not None and words._nlp is not None,
            toxicity is not None and toxicity._load_predict_prob.cache_info().currsize == 1)


def test_a_helper_has_the_filters_models_loaded_before_its_first_task():
    """A filter stage's tasks need spaCy's tokenizer and the toxicity model: a helper loads them as it starts, so
    the stage's tasks do not wait for that load."""
    WorkerPool.close_all()
    try:
        pool = WorkerPool(1)
        assert pool.pool.apply(_filter_models_loaded) == (True, True)  # the initializer ran before this call
    finally:
        WorkerPool.close_all()
