"""Running a stage's datatrove steps as N tasks that resume: the part of an executor that is the same on every
kind, and the local runner the engines' own tests and benches use.

    stats_path = LocalRunner(workers=2).run(steps, logging_dir=Path("logs/filter"), tasks=8)
    totals = stat_totals(stats_path)          # {"documents": 1234, "dropped_language": 56, ...}

A task that finished leaves datatrove's completion marker (logging_dir/completions/NNNNN) and its stats
(logging_dir/stats/NNNNN.json). `run_resumable` runs only the tasks without both, then merges the stats of every
task, old and new, into logging_dir/stats.json: a stage killed half-way and run again does the rest and reports
the counts of the whole. A folder left by a run with another task count starts over (its markers name other
shares of the input). It raises unless every task completed, so a stage commits nothing half-done.
resources/executor.py runs the same sequence on Ray and Slurm; this module imports no Dagster.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Callable


def tasks_for(setting: int | None, default: int) -> int:
    """A stage's task count: the runner's setting when it has one, else the stage's natural count (at least 1)."""
    return setting if setting is not None else max(1, int(default))


def run_resumable(launch: Callable[[], None], *, logging_dir: Path, tasks: int, label: str = "local") -> Path:
    """Call `launch()` (which runs the pipeline's incomplete tasks with skip_completed) unless every task has
    completed already; return the merged stats.json of all `tasks`. Raises naming the tasks that did not finish."""
    if tasks < 1:
        raise ValueError(f"executor: tasks must be >= 1, got {tasks}")
    logging_dir = Path(logging_dir)
    done = completed_ranks(logging_dir, tasks)
    if done:
        print(f"executor ({label}): {len(done)} of {tasks} tasks already completed in {logging_dir}; "
              f"running the other {tasks - len(done)}", file=sys.stderr)
    if len(done) < tasks:
        launch()
    missing = sorted(set(range(tasks)) - completed_ranks(logging_dir, tasks))
    if missing:
        raise RuntimeError(f"executor ({label}): tasks {missing[:10]} of {tasks} did not complete; see the task "
                           f"logs in {logging_dir}/logs (running again runs only those)")
    return merge_stats(logging_dir, tasks)


def completed_ranks(logging_dir: Path, tasks: int) -> set[int]:
    """The ranks whose completion marker and stats a previous run in logging_dir left, for this task count.
    A folder used with another task count is cleared first: its markers name other shares of the input."""
    logging_dir = Path(logging_dir)
    record = logging_dir / "tasks"
    if record.is_file() and record.read_text().strip() != str(tasks):
        for name in ("completions", "stats", "stats.json"):
            path = logging_dir / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    logging_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(f"{tasks}\n")
    completions, stats = logging_dir / "completions", logging_dir / "stats"
    return {rank for rank in range(tasks)
            if (completions / f"{rank:05d}").is_file() and (stats / f"{rank:05d}.json").is_file()}


def merge_stats(logging_dir: Path, tasks: int) -> Path:
    """stats.json: the sum of every task's stats/NNNNN.json, in rank order (datatrove's own merge covers only the
    tasks of its last call)."""
    from datatrove.utils.stats import PipelineStats

    total = PipelineStats()
    for rank in range(tasks):
        total += PipelineStats.from_json(json.loads((Path(logging_dir) / "stats" / f"{rank:05d}.json").read_text()))
    path = Path(logging_dir) / "stats.json"
    with open(path, "w") as f:
        total.save_to_disk(f)
    return path


def stat_totals(stats_path: Path, step: str | None = None) -> Counter:
    """{stat name: total} from a merged stats.json, over every step or the one whose name ends with `step`.
    Step names read "<type>: <name>" ("📖 - READER: 🐿 Jsonl"); a value is a number or a {"total": ...} summary."""
    totals: Counter = Counter()
    steps = json.loads(Path(stats_path).read_text())
    if step is not None:
        steps = [s for s in steps if s["name"].endswith(step)]
        if not steps:
            raise ValueError(f"{stats_path}: no stats of the step {step!r}")
    for entry in steps:
        for key, value in entry["stats"].items():
            if isinstance(value, dict):
                if "total" in value:
                    totals[key] += value["total"]
            else:
                totals[key] += value
    return totals


class LocalRunner:
    """datatrove's local tasks through run_resumable: `workers` tasks at once (1: one after another in this
    process), for `tasks` tasks per stage when set, else each stage's own count. The run()/tasks_for() of
    ExecutorResource, for engine code and tests that run without Dagster.

    With W >= 2 workers, W spawned helpers (a WorkerPool kept for the life of this process and reused by every
    phase and stage) claim the tasks one at a time from a shared counter, and this process waits for them, as
    datatrove's own local executor does. `warm()` starts the helpers ahead of the first run (the executor resource
    calls it when a run starts, `pretrain materialize` before it loads the code location): a helper imports
    datatrove and loads the filter stage's models (WARM_CALLS) while the run starts, on cores its start-up leaves
    idle, so no task of the stage waits for a model load, and the run's own process never holds the models. A run
    on a pool nobody warmed waits for its start (~1.3 s on 2 cores), once per process.
    When this process was a worker too it loaded them on its first filter task, ~3 s of one core inside the
    stage, which kept a 2-worker filter stage at the machine's own 2-process speed-up (bench/scale.py).

    Not LocalPipelineExecutor.run(): it forks a multiprocess Manager from this process even for one worker, and
    a fork of a threaded process (a Dagster run, a test session with a Ray or S3 client) can deadlock in the child
    on a lock another thread held. Each task runs datatrove's own _run_for_rank (logs, stats, completion marker);
    a helper takes this process's environment and working directory with each run, so it sees them as they are
    now, not as they were when it started."""

    def __init__(self, workers: int = 1, tasks: int | None = None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers, self.tasks = workers, tasks

    def tasks_for(self, default: int) -> int:
        return tasks_for(self.tasks, default)

    def warm(self) -> None:
        """Start this runner's helper processes now (in the background: this returns at once)."""
        if self.workers > 1:
            WorkerPool.get(self.workers)

    def run(self, pipeline: list, *, logging_dir: Path, tasks: int) -> Path:
        def launch() -> None:
            ranks = sorted(set(range(tasks)) - completed_ranks(logging_dir, tasks))
            job = _Job(pipeline, str(logging_dir), tasks, min(self.workers, tasks))
            if self.workers == 1:
                executor = job.executor(save=True)
                for rank in ranks:
                    _run_task(executor, pipeline, rank, 0)
                return
            WorkerPool.get(self.workers).run(job, ranks, helpers=min(self.workers, len(ranks)))

        return run_resumable(launch, logging_dir=logging_dir, tasks=tasks)


class _Job:
    """What a helper needs to run a stage's tasks: the steps and datatrove's executor settings, not the executor.
    Each helper builds its own LocalPipelineExecutor, so with W >= 2 the run's process never imports datatrove's
    executor (0.34 s in a fresh process: datatrove.io, fsspec, huggingface_hub), which the helpers loaded as they
    started; in a 1.3 s dedup stage that import was a sixth of the 2-worker side (bench/scale.py)."""

    def __init__(self, pipeline: list, logging_dir: str, tasks: int, workers: int):
        self.pipeline, self.logging_dir, self.tasks, self.workers = pipeline, logging_dir, tasks, workers

    def executor(self, save: bool):
        """datatrove's executor for these tasks; `save` writes its executor.json (one process of a run does)."""
        from datatrove.executor import LocalPipelineExecutor

        executor = LocalPipelineExecutor(self.pipeline, tasks=self.tasks, workers=self.workers,
                                         logging_dir=self.logging_dir, skip_completed=True)
        if save:
            executor.save_executor_as_json()
        return executor


def _run_task(executor, pipeline: list, rank: int, local_rank: int) -> None:
    """One task: a fresh copy of the steps (their stats start at zero), datatrove's run for that rank, on a copy of
    the executor: the run sets its pipeline on the executor (with a writer's open gzip stream), and the one given
    here must stay as it was for the next task. datatrove prints a task's log to the console on local rank 0 only:
    this process's tasks print as datatrove's own do, a helper's go to their log file alone."""
    from copy import copy, deepcopy

    _cache_loguru_lib_dirs()
    executor = copy(executor)
    executor.pipeline = deepcopy(pipeline)
    executor._run_for_rank(rank, local_rank)


@functools.cache
def _cache_loguru_lib_dirs() -> None:
    """Once per process: loguru's logger.add() builds an ExceptionFormatter that asks sysconfig for 36 install
    paths, each expanded afresh (~3 ms an add), and datatrove adds three sinks a task (the task's log, then the
    default again): 8-9 ms of a task's ~9 ms of overhead around its steps, 0.11 s of a 1 s dedup stage's 14 tasks
    (loguru 0.7.3). The paths are the interpreter's, fixed while the process runs; a copy each call, as before."""
    try:
        from loguru._better_exceptions import ExceptionFormatter
    except ImportError:  # another loguru: its own speed
        return
    lib_dirs = getattr(ExceptionFormatter, "_get_lib_dirs", None)
    if lib_dirs is not None:
        cached = functools.cache(lib_dirs)
        ExceptionFormatter._get_lib_dirs = staticmethod(lambda: list(cached()))


# Imported by each helper as it starts (before its first task arrives): what every stage's tasks need.
WARM_MODULES = ("numpy", "orjson", "datatrove.executor", "datatrove.pipeline.readers", "datatrove.pipeline.writers",
                "pipelines.shards")
# Then called (module:function), for the filter stage, the slowest to start: its tasks load spaCy's tokenizer and
# the toxicity model on their first document (0.65 s on one core, 3 s before they were read without torch and
# scikit-learn). A helper starts with the run, on a core the run's own start-up leaves idle, so it takes its first
# task with both loaded.
WARM_CALLS = ("pipelines.filters.words:_spacy", "pipelines.filters.toxicity:_load_predict_prob")
POLL_S = 0.05


class WorkerPool:
    """`size` spawned helper processes that claim the tasks of a run from a counter they share.
    One pool per size per process (`get`), kept until the process exits; a pool whose helper died is replaced."""

    _pools: dict[int, "WorkerPool"] = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, size: int) -> "WorkerPool":
        with cls._lock:
            pool = cls._pools.get(size)
            if pool is None or pool.pid != os.getpid() or not pool.healthy():
                if pool is not None and pool.pid == os.getpid():
                    pool.close()
                pool = cls._pools[size] = WorkerPool(size)
            return pool

    def __init__(self, size: int):
        import multiprocess  # datatrove's dill-pickling multiprocessing: steps defined anywhere pickle

        context = multiprocess.get_context("spawn")
        self.pid, self.size = os.getpid(), size
        self.next = context.Value("q", 0)  # the index of the next unclaimed task of the current run
        self.pool = _helper_pool_class()(size, initializer=_start_helper, initargs=(self.next,), context=context)
        self.processes = list(self.pool._pool)  # the helpers as started: one that is gone has died
        self.busy = threading.Lock()  # one run at a time: the counter belongs to it
        atexit.register(self.close)

    @classmethod
    def close_all(cls) -> None:
        """Stop every pool of this process: before something here forks (datatrove's LocalPipelineExecutor does),
        as a fork taken while the pools' threads hold a lock can deadlock in the child."""
        with cls._lock:
            for pool in cls._pools.values():
                if pool.pid == os.getpid():
                    pool.close()
            cls._pools.clear()

    def healthy(self) -> bool:
        return all(p.exitcode is None for p in self.processes)

    def close(self) -> None:
        try:
            self.pool.terminate()
            self.pool.join()
        except Exception:  # at exit, a pool half torn down already
            pass

    def run(self, job: _Job, ranks: list[int], helpers: int) -> None:
        """Run the tasks `ranks` of `job` on `helpers` of the helpers; raise the first task's error, after every
        other task has run (a stage run again then has only the failed ones to do)."""
        with self.busy:
            self.next.value = 0
            pending = [self.pool.apply_async(_helper_claims, (job, list(ranks), dict(os.environ), os.getcwd(), i == 0))
                       for i in range(helpers)]
            errors: list[BaseException] = []
            for result in pending:
                while not result.ready():
                    if not self.healthy():
                        dead = [p.exitcode for p in self.processes if p.exitcode is not None]
                        self.close()
                        raise RuntimeError(f"executor (local): a helper process died (exit code {dead[0]}) while "
                                           f"running tasks of {job.logging_dir}; running again runs "
                                           "only the tasks that did not complete")
                    result.wait(POLL_S)
                errors += [RuntimeError(text) for text in result.get()]
            if errors:
                raise errors[0]


@functools.cache
def _helper_pool_class():
    """multiprocess's Pool, whose terminate() ends each helper with SIGKILL, not SIGTERM. A helper inherits this
    process's ignored signals (a shell's background job ignores SIGTERM) until its initializer sets SIGTERM back to
    the default; a pool closed while a helper was still starting (started and closed at once, or a dead helper's
    replacement) sent it a SIGTERM it never heard, then waited for it forever (seen twice in one suite run). A
    helper holds nothing to clean up: the default SIGTERM would not have let it either."""
    import multiprocess.pool

    class HelperPool(multiprocess.pool.Pool):
        @staticmethod
        def Process(ctx, *args, **kwds):
            process = ctx.Process(*args, **kwds)
            process.terminate = process.kill
            return process

    return HelperPool


def _start_helper(counter) -> None:
    global _COUNTER
    _COUNTER = counter
    # A spawned process inherits ignored signals: started from a shell that ignores SIGTERM (a background job,
    # nohup), a helper would outlive a SIGTERM sent to the whole process group (a service manager stopping it).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import importlib

    for module in WARM_MODULES:
        importlib.import_module(module)
    for call in WARM_CALLS:
        module, function = call.split(":")
        try:
            getattr(importlib.import_module(module), function)()
        except Exception:  # noqa: BLE001 -- a task that needs it loads it again and reports the error in its log
            pass


_COUNTER = None


def _helper_claims(job: _Job, ranks: list[int], environ: dict, cwd: str, save: bool) -> list[str]:
    """A helper's share of a run (`save`: this one writes the executor.json); its errors as text (an exception
    object may not pickle back)."""
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    return [f"{type(exc).__name__}: {exc}" for exc in _claim_tasks(_COUNTER, job.executor(save), job.pipeline, ranks)]


def _claim_tasks(counter, executor, pipeline: list, ranks: list[int]) -> list[BaseException]:
    """Run tasks of `ranks` until none is left unclaimed; the errors of those that failed (each is in its log)."""
    errors = []
    while True:
        with counter.get_lock():
            claimed = counter.value
            counter.value += 1
        if claimed >= len(ranks):
            return errors
        try:
            _run_task(executor, pipeline, ranks[claimed], 1)
        except Exception as exc:  # noqa: BLE001 -- the other tasks still run; the caller raises the first
            errors.append(exc)
