"""Where the runs of `pretrain materialize` execute: in this process one after the other (InProcessRunner), or in
`jobs` worker processes that each load the code location once and run one task at a time (PoolRunner). The
scheduler (assets/runs/parallel.py) decides what runs when; a runner only runs what it is given and answers with an
Outcome.

Every run gets its run id from the scheduler, before it starts: whoever shows the command's progress
(assets/runs/progress.py) follows the run by that id while it runs, wherever it executes.

With `console_events=False` Dagster's console logger of each run prints only CRITICAL records, not every event to
stderr: the command writes the runs' event log into its log file itself, read from the instance (assets/runs/watch.py).
On stderr it was not whole: while a step runs, Dagster captures stderr for the step's compute log and mirrors it back
with `tail -F`, which drops what came in the step's last second (its STEP_SUCCESS line, often).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait

from assets.runs.dead import owner_tags
from assets.runs.figures import key_figures


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


QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def run_task(job, instance, task: Task, env: dict, tags: dict, run_id: str | None = None,
             console_events: bool = True) -> Outcome:
    """One Dagster run materializing `task` in this process, as run `run_id` (a new id if None), with `env` set while
    it runs, its events printed on stderr unless not `console_events`; the run's tags name this process, so that a
    later command finds the run failed if the process dies first (assets/runs/dead.py)."""
    tags = {**tags, **owner_tags()}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        result = job.execute_in_process(instance=instance, asset_selection=[task.key], partition_key=task.partition,
                                        raise_on_error=False, tags=tags, run_id=run_id,
                                        run_config=None if console_events else _quiet_config(job, task))
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


def _quiet_config(job, task: Task) -> dict:
    """The run config of a run whose console logger prints only CRITICAL records, and a partition's own config (which
    execute_in_process derives only when given no run config)."""
    if task.partition is None:
        return QUIET_CONSOLE
    partitioned = job.get_subset(asset_selection={task.key}).partitioned_config
    own = partitioned.get_run_config_for_partition_key(task.partition) if partitioned is not None else {}
    return {**own, **QUIET_CONSOLE}


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


class InProcessRunner:
    """One run at a time, in this process: no worker to start."""

    def __init__(self, job, instance, console_events: bool = True):
        self.job, self.instance, self.console_events, self.pending = job, instance, console_events, None

    def start(self):
        pass

    def free_slot(self):
        return None if self.pending else 0

    def submit(self, slot, task, env, tags, run_id):
        self.pending = (task, env, tags, run_id)

    def next_result(self):
        task, env, tags, run_id = self.pending
        self.pending = None
        return 0, run_task(self.job, self.instance, task, env, tags, run_id, self.console_events)

    def interrupt(self):
        pass

    def close(self):
        pass


class PoolRunner:
    """`jobs` worker processes, each with the code location loaded once, each running one task at a time."""

    def __init__(self, jobs: int, recipe_arg: str | None, console_events: bool = True):
        self.jobs, self.recipe_arg, self.console_events = jobs, recipe_arg, console_events
        self.workers: list = []  # [(process, connection)]
        self.busy: dict[int, Task] = {}
        self.run_ids: dict[int, str] = {}  # slot -> the run id its task was given
        self.dead: set[int] = set()  # slots whose worker died: given no more tasks

    def start(self):
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: this environment, no inherited state
        for _ in range(self.jobs):
            mine, theirs = ctx.Pipe()
            process = ctx.Process(target=_worker, args=(theirs, self.recipe_arg, self.console_events), name="pretrain-worker", daemon=False)
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

    def submit(self, slot, task, env, tags, run_id):
        self.busy[slot], self.run_ids[slot] = task, run_id
        self.workers[slot][1].send((task.key.to_user_string(), task.partition, env, tags, run_id))

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
        return slot, Outcome(False, self.run_ids.get(slot), error=f"the worker process (pid {process.pid}) running {task.name} died "
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


def _worker(conn, recipe_arg, console_events):
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
            key, partition, env, tags, run_id = message
            try:
                outcome = run_task(job, instance, Task(AssetKey.from_user_string(key), partition), env, tags, run_id,
                                   console_events)
            except Exception as exc:
                outcome = Outcome(False, error=f"{type(exc).__name__}: {exc}")
            conn.send(outcome)
    except (EOFError, KeyboardInterrupt):
        pass
