"""`pretrain materialize` with several steps at once: independent assets run side by side.

    ok = materialize_parallel(defs, instance, keys, jobs=2, recipe_arg=None)

Every selected asset (every partition of a partitioned one, the mix sweep's proxy runs) is one Dagster run
(`execute_in_process` of the global asset job on that one key) in the persistent instance, so `pretrain
status` and the UI see each of them; the runs of one invocation share the tag `pretrain/materialize`. A
run starts once everything it depends on in the selection has succeeded, at most `jobs` at a time:
PRETRAIN_JOBS or `--jobs`, by default the CPUs this process may use. With one job (or a selection where
nothing can overlap) the runs execute in this process, one after the other.

Why this and not Dagster's multiprocess executor (measured on 2 cores): the executor starts a fresh
process per step that re-imports the code location (1.3-2 s of CPU each, 43 runs in the demo); its
forkserver variant avoids that but keeps the environment (PRETRAIN_HOME, the recipe) of the first run
in the process; it cannot run the sweep's partitions (one run each) side by side; and no step knows
whether it runs alone. Here `jobs` long-lived worker processes (spawned, so they see this process's
environment) import the code location once each, and the scheduler, which knows what runs and what may
still start, sets each run's threads:

- a run that may overlap another one (something else is running, or not yet started and not downstream
  of it) gets OMP_NUM_THREADS = cores // jobs (at least 1), so two trainers on two cores use one thread
  each instead of fighting over both (the launcher passes the environment on to the trainer);
- a run that is alone for its whole life (training/main, after the sweep) keeps every core.
An OMP_NUM_THREADS the user set is left alone. Two 1-thread proxy runs at once did the sweep in 55 s where
one 2-thread run at a time took 75 s; a 2-thread trainer beside another busy process ran ~6x slower (466
against ~2,900 tokens/s: its OpenMP threads wait on a core that is taken).

The cost: a run per asset adds ~0.3-1 s of instance writes (SQLite) each. `make demo` on 2 cores: 5:06 with
two jobs against 6:32 with one (AVX2-only kernels, fp32), 4:35 where bf16 is native.

A failed run fails the command, naming the asset, its run and the error; as within one Dagster run, what
depends on it does not run, everything else does. Progress: a line per run started and finished
(`pretrain: [3/38] done curation/web/filtered in 6.1 s (run 1a2b3c4d): 363 documents of 1,171`, the figures
from the asset's metadata: assets/runs/figures.py), and Dagster's log lines (each names its run id and step) as before.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from multiprocessing.connection import wait

from assets.runs.dead import owner_tags
from assets.runs.figures import key_figures

JOBS_ENV = "PRETRAIN_JOBS"
THREADS_ENV = "OMP_NUM_THREADS"
SESSION_TAG = "pretrain/materialize"  # one id for every run of one `pretrain materialize`
THREADS_TAG = "pretrain/omp_num_threads"  # set on a run that was given fewer threads to share the CPUs


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_jobs() -> int:
    """PRETRAIN_JOBS, else the number of CPUs this process may use."""
    raw = os.environ.get(JOBS_ENV)
    if not raw:
        return cpu_count()
    try:
        jobs = int(raw)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise ValueError(f"{JOBS_ENV}: expected a whole number of steps at once, 1 or more; got {raw!r}")
    return jobs


@dataclass
class Task:
    key: object  # AssetKey
    partition: str | None = None
    started: bool = False

    @property
    def name(self) -> str:
        return self.key.to_user_string() + (f"[{self.partition}]" if self.partition is not None else "")


@dataclass
class Outcome:
    success: bool
    run_id: str | None = None
    error: str = ""
    figures: str = ""  # what the run made, in a few words (assets/runs/figures.py)


@dataclass
class _Asset:
    """One selected asset in the scheduler: its selected ancestors, and its tasks once it is ready."""

    key: object
    needs: set
    tasks: list[Task] | None = None  # None: not expanded yet (a partitioned asset's partitions come late)
    left: int = 0  # tasks not yet succeeded


def materialize_parallel(defs, instance, keys: list, jobs: int, recipe_arg: str | None,
                         run_tags: dict | None = None) -> bool:
    """Materialize `keys` in dependency order, up to `jobs` runs at once, each run tagged with `run_tags` too
    (`--refresh`). False (reported on stderr) if one failed."""
    graph = defs.resolve_asset_graph()
    ancestors = _ancestors_in(graph, set(keys))
    descendants = {k: {d for d in keys if k in ancestors[d]} for k in keys}
    # Which ready run goes first: the one with the longest chain of runs still behind it (the critical path,
    # counted in runs: nothing tells a step's duration before it ran), then the one whose inputs took longest to
    # make (a big source stays big: on the demo web's filter, the longest step, starts as soon as its raw crawl
    # is done, not after the other sources' filters), then key order.
    height: dict = {}
    for key in sorted(keys, key=lambda k: len(descendants[k])):  # a descendant has fewer descendants: done first
        height[key] = max((height[d] + 1 for d in descendants[key]), default=0)
    parents = {k: {p for p in graph.get(k).parent_keys if p in ancestors[k]} for k in keys}
    took: dict = {}  # key -> seconds its run took (the longest partition's), this session

    def priority(asset: _Asset) -> tuple:
        return (-height[asset.key], -max((took.get(p, 0.0) for p in parents[asset.key]), default=0.0),
                asset.key.to_user_string())

    assets = {k: _Asset(k, ancestors[k]) for k in keys}
    for asset in assets.values():
        if not graph.get(asset.key).is_partitioned:  # a partitioned one waits: its partitions may come from upstream
            asset.tasks, asset.left = [Task(asset.key)], 1
    can_overlap = any(graph.get(k).is_partitioned for k in keys) or any(
        b not in ancestors[a] and a not in ancestors[b] for i, a in enumerate(keys) for b in keys[i + 1:])
    jobs = max(1, jobs)
    threads_each = str(max(1, cpu_count() // jobs))
    user_threads = os.environ.get(THREADS_ENV)
    tags = {**(run_tags or {}), SESSION_TAG: uuid.uuid4().hex[:12]}

    done: set = set()
    failed: set = set()  # keys with a failed run (or no partitions): what depends on them never starts
    running: dict[int, Task] = {}  # worker slot -> its task
    began: dict[int, float] = {}  # worker slot -> when its task was given out
    failures: list[tuple[str, Outcome]] = []  # (task name, outcome)
    finished = 0

    def total() -> str:
        return "?" if any(a.tasks is None for a in assets.values()) else str(sum(len(a.tasks) for a in assets.values()))

    def expand(asset: _Asset) -> None:
        node = graph.get(asset.key)
        partitions = node.partitions_def.get_partition_keys(dynamic_partitions_store=instance) if node.is_partitioned \
            else [None]
        asset.tasks = [Task(asset.key, p) for p in partitions]
        asset.left = len(asset.tasks)
        if not partitions:
            failed.add(asset.key)
            failures.append((asset.key.to_user_string(), Outcome(False, error="no partitions yet (materialize what "
                                                                             "registers them)")))

    def may_overlap(task: Task) -> bool:
        """Could another run be going on while this one runs (running now, or able to start before it ends)?"""
        if running:
            return True
        return any(other.key not in done and other.key not in descendants[task.key]
                   and other.key not in failed and not other.needs & failed
                   and (other.tasks is None or any(not t.started and t is not task for t in other.tasks))
                   for other in assets.values())

    runner = (_PoolRunner(jobs, recipe_arg) if jobs > 1 and can_overlap
              else _InProcessRunner(defs.resolve_implicit_global_asset_job_def(), instance))
    previous_term = None
    if isinstance(runner, _PoolRunner) and threading.current_thread() is threading.main_thread():
        previous_term = signal.signal(signal.SIGTERM, _interrupt)  # `kill PID` stops the runs like a Ctrl-C
    try:
        try:
            runner.start()
        except RuntimeError as exc:  # a worker could not load the code location
            print(f"pretrain: {exc}", file=sys.stderr)
            return False
        while True:
            ready = sorted((a for a in assets.values() if a.key not in done and a.needs <= done), key=priority)
            for asset in ready:
                if asset.tasks is None:
                    expand(asset)
            for task in (t for a in ready if a.key not in failed for t in a.tasks if not t.started):
                slot = runner.free_slot()
                if slot is None:
                    break
                env = {THREADS_ENV: threads_each} if user_threads is None and jobs > 1 and may_overlap(task) else {}
                task.started = True
                running[slot], began[slot] = task, time.monotonic()
                threads = f" ({THREADS_ENV}={threads_each}: it shares the CPUs)" if env else ""
                _progress(f"[{finished + len(running)}/{total()}] started  {task.name}{threads}")
                runner.submit(slot, task, env, {**tags, THREADS_TAG: env[THREADS_ENV]} if env else tags)
            if not running:
                break
            slot, outcome = runner.next_result()
            task, seconds = running.pop(slot), time.monotonic() - began.pop(slot)
            finished += 1
            run = f"run {outcome.run_id[:8]}" if outcome.run_id else "no run"
            took[task.key] = max(took.get(task.key, 0.0), seconds)
            if outcome.success:
                assets[task.key].left -= 1
                if assets[task.key].left == 0:
                    done.add(task.key)
                figures = f": {outcome.figures}" if outcome.figures else ""
                _progress(f"[{finished}/{total()}] done     {task.name} in {seconds:.1f} s ({run}){figures}")
            else:
                # Like a step failure within one Dagster run: what depends on it is skipped, the rest goes on.
                failed.add(task.key)
                failures.append((task.name, outcome))
                _progress(f"[{finished}/{total()}] FAILED   {task.name} after {seconds:.1f} s ({run}); "
                          "what depends on it will not run")
    except KeyboardInterrupt:
        # The workers run in their own process group (a Ctrl-C reaches only this process): each running run
        # is interrupted once, through Dagster, which stops its trainer (resources/launcher.py) and fails the run.
        print(f"pretrain: interrupted; stopping {', '.join(t.name for t in running.values()) or 'nothing'}",
              file=sys.stderr)
        runner.interrupt()
        return False
    finally:
        runner.close()
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)

    for name, outcome in failures:
        run = f" (Dagster run {outcome.run_id})" if outcome.run_id else ""
        print(f"pretrain: {name} failed{run}: {outcome.error}", file=sys.stderr)
    left = [k.to_user_string() for k in keys if k not in done and k not in failed]
    if left:
        print(f"pretrain: not materialized because of the failure: {', '.join(left)}", file=sys.stderr)
    return not failures


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _progress(line: str) -> None:
    print(f"pretrain: {line}", file=sys.stderr, flush=True)


def _ancestors_in(graph, selected: set) -> dict:
    """Each selected key's ancestors that are selected too, through unselected assets in between."""
    memo: dict = {}

    def ancestors(key) -> set:
        if key not in memo:
            memo[key] = set()  # guards a cycle (none in a valid asset graph)
            found: set = set()
            for parent in graph.get(key).parent_keys:
                if parent == key or not graph.has(parent):
                    continue
                found.add(parent)
                found |= ancestors(parent)
            memo[key] = found
        return memo[key]

    return {k: ancestors(k) & selected - {k} for k in selected}


def run_task(job, instance, task: Task, env: dict, tags: dict) -> Outcome:
    """One Dagster run materializing `task` in this process, with `env` set while it runs; the run's tags name this
    process, so that a later command finds the run failed if the process dies first (assets/runs/dead.py)."""
    tags = {**tags, **owner_tags()}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        result = job.execute_in_process(instance=instance, asset_selection=[task.key], partition_key=task.partition,
                                        raise_on_error=False, tags=tags)
    except Exception as exc:  # before the run could start (e.g. an unknown partition): no run to look at
        return Outcome(False, error=f"{type(exc).__name__}: {exc}")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if not result.success:
        return Outcome(False, result.run_id, _failure_message(result))
    figures = [key_figures({k: v.value for k, v in event.materialization.metadata.items()})
               for event in result.get_asset_materialization_events()]
    return Outcome(True, result.run_id, figures="; ".join(f for f in figures if f))


def _failure_message(result) -> str:
    """What went wrong in a failed run, in a line or a few: the step's Failure description or the error."""
    messages = []
    for event in result.all_events:
        if event.is_step_failure:
            data = event.step_failure_data
            if data.user_failure_data is not None and data.user_failure_data.description:
                messages.append(data.user_failure_data.description)
                continue
            error = data.error
            while error is not None and error.cause is not None and "DagsterExecutionStepExecutionError" in (
                    error.cls_name or ""):
                error = error.cause
            if error is not None:
                messages.append(f"{error.cls_name}: {error.message.strip()}" if error.cls_name and not
                                error.message.startswith(error.cls_name) else error.message.strip())
        elif event.is_run_failure and not messages:
            messages.append(event.message or "the run failed")
    return "\n".join(messages) or "the run failed (see its log in the Dagster UI)"


class _InProcessRunner:
    """One run at a time, in this process: no worker to start."""

    def __init__(self, job, instance):
        self.job, self.instance, self.pending = job, instance, None

    def start(self):
        pass

    def free_slot(self):
        return None if self.pending else 0

    def submit(self, slot, task, env, tags):
        self.pending = (task, env, tags)

    def next_result(self):
        task, env, tags = self.pending
        self.pending = None
        return 0, run_task(self.job, self.instance, task, env, tags)

    def interrupt(self):
        pass

    def close(self):
        pass


class _PoolRunner:
    """`jobs` worker processes, each with the code location loaded once, each running one task at a time."""

    def __init__(self, jobs: int, recipe_arg: str | None):
        self.jobs, self.recipe_arg = jobs, recipe_arg
        self.workers: list = []  # [(process, connection)]
        self.busy: dict[int, Task] = {}
        self.dead: set[int] = set()  # slots whose worker died: given no more tasks

    def start(self):
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: this environment, no inherited state
        for _ in range(self.jobs):
            mine, theirs = ctx.Pipe()
            process = ctx.Process(target=_worker, args=(theirs, self.recipe_arg), name="pretrain-worker", daemon=False)
            process.start()
            theirs.close()
            self.workers.append((process, mine))
        # Every worker ready before the first task: tasks given out together then also start together.
        for process, conn in self.workers:
            try:
                message = conn.recv()
            except EOFError:
                raise RuntimeError(f"a worker process (pid {process.pid}) exited at start") from None
            if message[0] != "ready":
                raise RuntimeError(f"a worker process could not load the code location:\n{message[1]}")

    def free_slot(self):
        return next((i for i in range(len(self.workers)) if i not in self.busy and i not in self.dead), None)

    def submit(self, slot, task, env, tags):
        self.busy[slot] = task
        self.workers[slot][1].send((task.key.to_user_string(), task.partition, env, tags))

    def next_result(self):
        conns = {self.workers[slot][1]: slot for slot in self.busy}
        sentinels = {self.workers[slot][0].sentinel: slot for slot in self.busy}
        ready = wait([*conns, *sentinels])
        for item in ready:
            if item in conns:
                slot = conns[item]
                try:
                    outcome = item.recv()
                except EOFError:
                    outcome = None
                if outcome is not None:
                    del self.busy[slot]
                    return slot, outcome
        # A worker that died (killed, out of memory) before answering: its task failed.
        slot = next(s for item, s in {**conns, **sentinels}.items() if item in ready)
        process = self.workers[slot][0]
        process.join(5)
        self.dead.add(slot)
        task = self.busy.pop(slot)
        return slot, Outcome(False, error=f"the worker process (pid {process.pid}) running {task.name} died "
                                          f"(exit status {process.exitcode}); its Dagster run may be left unfinished")

    def interrupt(self, grace: float = 60.0):
        """SIGINT to every busy worker, then wait (up to `grace` s) for their runs to end as interrupted."""
        for slot in self.busy:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.workers[slot][0].pid, signal.SIGINT)
        deadline = time.time() + grace
        while self.busy and time.time() < deadline:
            conns = {self.workers[slot][1]: slot for slot in self.busy}
            for conn in wait(list(conns), timeout=max(0.0, deadline - time.time())):
                with contextlib.suppress(EOFError, OSError):
                    conn.recv()
                self.busy.pop(conns[conn], None)

    def close(self):
        for process, conn in self.workers:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.time() + 30
        for process, conn in self.workers:
            process.join(max(0.1, deadline - time.time()))
            if process.is_alive():
                process.terminate()
                process.join(5)
            conn.close()


def _worker(conn, recipe_arg):
    """A worker process: load the recipe's Definitions once, then run the tasks it is sent."""
    os.setpgrp()  # a terminal's Ctrl-C goes to the parent alone, which interrupts each run once (interrupt())
    try:
        if recipe_arg:  # what `--recipe` named: assets.definitions loads it at import, as workspace.yaml would
            os.environ["PRETRAIN_RECIPE"] = recipe_arg
        from dagster import AssetKey, DagsterInstance

        from assets.definitions import defs

        job = defs.resolve_implicit_global_asset_job_def()
        instance = DagsterInstance.get()
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))
    try:
        while True:
            message = conn.recv()
            if message is None:
                break
            key, partition, env, tags = message
            try:
                outcome = run_task(job, instance, Task(AssetKey.from_user_string(key), partition), env, tags)
            except Exception as exc:
                outcome = Outcome(False, error=f"{type(exc).__name__}: {exc}")
            conn.send(outcome)
    except (EOFError, KeyboardInterrupt):
        pass
