"""Runs whose process is gone, marked failed.

A `pretrain materialize` killed with SIGKILL (by a user, a job scheduler, the OOM killer) leaves its Dagster run
STARTED with no process behind it. Under `make ui` the daemon's run monitoring marks such runs failed; without a
daemon nothing did, and the UI showed them "in progress" for good. So every run that `pretrain` executes carries its
process as tags (run_task in assets/runs/parallel.py): the host, the pid, and the process's start time, which tells a
reused pid from the original. Every `pretrain` command that opens the instance calls `fail_dead_runs` first: a run of
this host still open whose process is gone (or a zombie) is reported failed, with the reason in its event log.

Runs started elsewhere (the UI, a schedule through the daemon) have no such tags and are the daemon's to watch; runs
of another host are left alone, since their process cannot be seen from here.
"""

from __future__ import annotations

import socket

HOST_TAG = "pretrain/host"
PID_TAG = "pretrain/pid"
PROCESS_STARTED_TAG = "pretrain/process_started"  # psutil's create_time of the process, in seconds since the epoch
SAME_PROCESS_S = 1.0  # create times closer than this are one process: psutil reads them to clock ticks (0.01 s)


def owner_tags() -> dict[str, str]:
    """The tags that name the process executing a run: this one."""
    import psutil

    me = psutil.Process()
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(me.pid), PROCESS_STARTED_TAG: f"{me.create_time():.3f}"}


def process_alive(pid: int, started: float) -> bool:
    """Whether the process that started at `started` is still running as `pid` (not ended, not a zombie, not a
    newer process that reused the pid)."""
    import psutil

    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - started) < SAME_PROCESS_S and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: it exists, so it may still be the run's
        return True


def fail_dead_runs(instance) -> list[str]:
    """Report failed every open run of this host whose process is gone; returns a line per run marked."""
    from dagster import DagsterRunStatus, RunsFilter

    open_states = [DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED,
                   DagsterRunStatus.CANCELING]
    marked = []
    for run in instance.get_runs(filters=RunsFilter(statuses=open_states, tags={HOST_TAG: socket.gethostname()})):
        try:
            pid, started = int(run.tags[PID_TAG]), float(run.tags[PROCESS_STARTED_TAG])
        except (KeyError, ValueError):  # tags written by hand or by another tool: not ours to judge
            continue
        if process_alive(pid, started):
            continue
        assets = ", ".join(key.to_user_string() for key in sorted(run.asset_selection or (), key=str)) or run.job_name
        reason = (f"the process that ran it (pid {pid} on {run.tags[HOST_TAG]}) is gone: killed, or its machine "
                  f"stopped, before the run ended")
        instance.report_run_failed(run, message=f"Run {run.run_id} ({assets}): {reason}. Marked failed by pretrain.")
        marked.append(f"run {run.run_id} ({assets}) marked failed: {reason}")
    return marked
