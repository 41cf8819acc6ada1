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
still start, shares the cores out:

- a run that starts a trainer (its asset's `launch` metadata) keeps the threads its settings give it
  (launch `threads` × processes; none given: every core), never fewer because something else runs: a
  loss, and through the mix sweep the chosen mixture, depends on the thread count, and the same recipe
  must give the same data versions with `--jobs 1` or `--jobs 2`. It starts once that many cores are free
  (or nothing else runs), and nothing of lower priority starts before it, so it never waits for ever; nor
  does a lower run start that would keep it waiting when it is next (holds_back);
- any other run that may overlap another one (something else is running, or not yet started and not
  downstream of it) gets OMP_NUM_THREADS = cores // jobs (at least 1) and counts as cores / jobs; it is given
  that many CPUs (PRETRAIN_CPUS), which is how many tasks its data stage runs at once when
  PRETRAIN_EXECUTOR_WORKERS is unset (resources/executor.py);
- a run that is alone for its whole life keeps every core, threads and executor tasks alike.
An OMP_NUM_THREADS the user set is left alone (PRETRAIN_CPUS is still set: it is ours). Two 1-thread proxy runs at once did the sweep in 55 s where
one 2-thread run at a time took 75 s; a 2-thread trainer beside another busy process ran ~6x slower (466
against ~2,900 tokens/s: its OpenMP threads wait on a core that is taken).

The cost: a run per asset adds ~0.3-1 s of instance writes (SQLite) each. `make demo` on 2 cores: 5:06 with
two jobs against 6:32 with one (AVX2-only kernels, fp32), 4:35 where bf16 is native.

A failed run fails the command, naming the asset, its run and the error; as within one Dagster run, what
depends on it does not run, everything else does. Progress goes to a report (assets/runs/progress.py): a line per
run finished (`pretrain: [3/38] done curation/web/filtered in 6.1 s (run 1a2b3c4d): 363 documents of 1,171`, the
figures from the asset's metadata: assets/runs/figures.py), the counts for the live line, and each run's id when it
starts (the scheduler chooses it), by which the report follows the run wherever it executes. Where the runs
execute: assets/runs/runners.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass

from assets.core.factory import IN_ORDER
from assets.runs.progress import StreamReport
from assets.runs.runners import InProcessRunner, Outcome, PoolRunner, Task
from resources.executor_env import CPUS_ENV, available_cpus, count_in

JOBS_ENV = "PRETRAIN_JOBS"
THREADS_ENV = "OMP_NUM_THREADS"
SESSION_TAG = "pretrain/materialize"  # one id for every run of one `pretrain materialize`
THREADS_TAG = "pretrain/omp_num_threads"  # set on a run that was given fewer threads to share the CPUs
CPUS_TAG = "pretrain/cpus"  # set on a run that was given a share of the CPUs (PRETRAIN_CPUS: its executor's tasks)
LAUNCH_METADATA = "launch"  # a trainer-starting asset's launch settings (over the launcher resource's defaults)



def trainer_cores(node) -> int | None:
    """The cores a run of this asset keeps busy where its settings fix them: a trainer's threads × processes per
    node from its `launch` metadata (threads not given: every core, torch's default); None for any other run."""
    launch = node.metadata.get(LAUNCH_METADATA)
    if launch is None:
        return None
    launch = getattr(launch, "value", launch) or {}
    return (launch.get("threads") or available_cpus()) * (launch.get("nproc_per_node") or 1)


def default_jobs() -> int:
    """PRETRAIN_JOBS, else the number of CPUs this process may use."""
    raw = os.environ.get(JOBS_ENV)
    return count_in(JOBS_ENV, raw, "steps at once") if raw else available_cpus()


@dataclass
class _Asset:
    """One selected asset in the scheduler: its selected ancestors, and its tasks once it is ready."""

    key: object
    needs: set
    tasks: list[Task] | None = None  # None: not expanded yet (a partitioned asset's partitions come late)
    left: int = 0  # tasks not yet succeeded


def materialize_parallel(defs, instance, keys: list, jobs: int, recipe_arg: str | None,
                         run_tags: dict | None = None, report=None, partitions: dict | None = None) -> bool:
    """Materialize `keys` in dependency order, up to `jobs` runs at once, each run tagged with `run_tags` too
    (`--refresh`; a SESSION_TAG there names the command, else a new one does). A partitioned key runs every
    partition, or those `partitions` names for it (`--stale`: the stale and missing ones). False if one failed.
    Progress and failures go to `report` (assets/runs/progress.py; by default every line to stderr)."""
    partitions_of = partitions or {}
    report = report or StreamReport()
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
    cores = available_cpus()
    threads_each = str(max(1, cores // jobs))
    fixed = {k: trainer_cores(graph.get(k)) for k in keys}  # a trainer's own cores, or None
    user_threads = os.environ.get(THREADS_ENV)
    tags = {SESSION_TAG: uuid.uuid4().hex[:12], **(run_tags or {})}

    done: set = set()
    failed: set = set()  # keys with a failed run (or no partitions): what depends on them never starts
    running: dict[int, Task] = {}  # worker slot -> its task
    began: dict[int, float] = {}  # worker slot -> when its task was given out
    run_ids: dict[int, str] = {}  # worker slot -> the run id its task was given
    failures: list[tuple[str, Outcome]] = []  # (task name, outcome)
    finished = 0

    def total() -> int | None:
        return None if any(a.tasks is None for a in assets.values()) else sum(len(a.tasks) for a in assets.values())

    def count(n: int) -> str:
        return f"[{n}/{total() if total() is not None else '?'}]"

    def expand(asset: _Asset) -> None:
        node = graph.get(asset.key)
        partitions = node.partitions_def.get_partition_keys(dynamic_partitions_store=instance) if node.is_partitioned \
            else [None]
        if asset.key in partitions_of:
            partitions = [p for p in partitions if p in partitions_of[asset.key]]
        if node.metadata.get(IN_ORDER):
            partitions = sorted(partitions)
        asset.tasks = [Task(asset.key, p) for p in partitions]
        asset.left = len(asset.tasks)
        if not partitions and asset.key in partitions_of:  # nothing of it is stale after all
            done.add(asset.key)
        elif not partitions:
            failed.add(asset.key)
            failures.append((asset.key.to_user_string(), Outcome(False, error="no partitions yet (materialize what "
                                                                             "registers them)")))

    def cores_of(key) -> float:
        return cores / jobs if fixed[key] is None else fixed[key]

    def holds_back(task: Task, left: float) -> bool:
        """Would `task` keep a higher trainer waiting for its cores? One not started, that runs as soon as what runs
        now is done (training/main after the fit that runs now), and needs more cores than `task` would leave: on the
        demo the filter ablation (two proxy runs, 44 s) started as mixture_weights did and held training/main back."""
        now = done | {t.key for t in running.values()}
        return any(fixed[other.key] is not None and height[other.key] > height[task.key]
                   and other.key not in done | failed and other.needs <= now
                   and (other.tasks is None or not any(t.started for t in other.tasks))
                   and cores_of(other.key) > left + 1e-9 for other in assets.values())

    def may_overlap(task: Task) -> bool:
        """Could another run be going on while this one runs (running now, or able to start before it ends)?"""
        if running:
            return True
        return any(other.key not in done and other.key not in descendants[task.key]
                   and other.key not in failed and not other.needs & failed
                   and (other.tasks is None or any(not t.started and t is not task for t in other.tasks))
                   for other in assets.values())

    console = report.console_events  # Dagster's events on stderr, or written by the report (assets/runs/runners.py)
    runner = (PoolRunner(jobs, recipe_arg, console) if jobs > 1 and can_overlap
              else InProcessRunner(defs.resolve_implicit_global_asset_job_def(), instance, console))
    previous_term = None
    if isinstance(runner, PoolRunner) and threading.current_thread() is threading.main_thread():
        previous_term = signal.signal(signal.SIGTERM, _interrupt)  # `kill PID` stops the runs like a Ctrl-C
    try:
        try:
            runner.start()
        except RuntimeError as exc:  # a worker could not load the code location
            report.say(f"pretrain: {exc}")
            return False
        report.counts(0, total())
        while True:
            ready = sorted((a for a in assets.values() if a.key not in done and a.needs <= done), key=priority)
            for asset in ready:
                if asset.tasks is None:
                    expand(asset)
            for task in (t for a in ready if a.key not in failed for t in _startable(a, graph, running)):
                busy = sum(cores_of(t.key) for t in running.values())
                if running and busy + cores_of(task.key) > cores + 1e-9:
                    break  # it waits for its cores, and what comes after it in priority waits with it
                if running and holds_back(task, cores - busy - cores_of(task.key)):
                    continue
                slot = runner.free_slot()
                if slot is None:
                    break
                shares = jobs > 1 and fixed[task.key] is None and may_overlap(task)
                env = {CPUS_ENV: threads_each} if shares else {}
                if shares and user_threads is None:
                    env[THREADS_ENV] = threads_each
                task.started = True
                running[slot], began[slot], run_ids[slot] = task, time.monotonic(), str(uuid.uuid4())
                threads = f" ({THREADS_ENV}={threads_each}: it shares the CPUs)" if THREADS_ENV in env else ""
                report.run_started(run_ids[slot], task.name,
                                   f"pretrain: {count(finished + len(running))} started  {task.name}{threads}")
                run_tags = {**tags, **({THREADS_TAG: env[THREADS_ENV]} if THREADS_ENV in env else {}),
                            **({CPUS_TAG: env[CPUS_ENV]} if CPUS_ENV in env else {})}
                runner.submit(slot, task, env, run_tags, run_ids[slot])
            if not running:
                break
            slot, outcome = runner.next_result()
            task, seconds, run_id = running.pop(slot), time.monotonic() - began.pop(slot), run_ids.pop(slot)
            finished += 1
            run = f"run {outcome.run_id[:8]}" if outcome.run_id else "no run"
            took[task.key] = max(took.get(task.key, 0.0), seconds)
            if outcome.success:
                assets[task.key].left -= 1
                if assets[task.key].left == 0:
                    done.add(task.key)
                figures = f": {outcome.figures}" if outcome.figures else ""
                report.run_ended(run_id, f"pretrain: {count(finished)} done     {task.name} in {seconds:.1f} s ({run})"
                                         f"{figures}")
            else:
                # Like a step failure within one Dagster run: what depends on it is skipped, the rest goes on.
                failed.add(task.key)
                failures.append((task.name, outcome))
                report.run_ended(run_id, f"pretrain: {count(finished)} FAILED   {task.name} after {seconds:.1f} s "
                                         f"({run}); what depends on it will not run")
            report.counts(finished, total())
    except KeyboardInterrupt:
        # The workers run in their own process group (a Ctrl-C reaches only this process): each running run
        # is interrupted once, through Dagster, which stops its trainer (resources/launcher.py) and fails the run.
        report.say(f"pretrain: interrupted; stopping {', '.join(t.name for t in running.values()) or 'nothing'}")
        runner.interrupt()
        return False
    finally:
        runner.close()
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)

    for name, outcome in failures:
        run = f" (Dagster run {outcome.run_id})" if outcome.run_id else ""
        report.say(f"pretrain: {name} failed{run}: {outcome.error}")
    left = [k.to_user_string() for k in keys if k not in done and k not in failed]
    if left:
        report.say(f"pretrain: not materialized because of the failure: {', '.join(left)}")
    return not failures


def _startable(asset: _Asset, graph, running: dict) -> list:
    """The asset's tasks that may start now: all not started, or for partitions run in order (IN_ORDER) the next one
    once none of the asset's is running."""
    waiting = [t for t in asset.tasks if not t.started]
    if not graph.get(asset.key).metadata.get(IN_ORDER):
        return waiting
    return [] if any(t.key == asset.key for t in running.values()) else waiting[:1]


def _interrupt(signum, frame):
    raise KeyboardInterrupt


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
