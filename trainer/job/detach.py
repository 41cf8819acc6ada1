"""A training job that outlives whoever started it: the trainer's command run by a small detached wrapper.

    job = start_job(command, work=work, env=env, attempt=1)   # returns once the wrapper has written job.json
    job = read_job(work)                                      # the newest job started in `work`, or None
    job_summary(work)                                         # what `pretrain jobs` shows of it
    job.alive()                                               # its wrapper still runs (same host, same pid and start)
    job.exit_status                                           # None while it runs; the command's status after

A Dagster run worker that starts the trainer as its own child takes the trainer down with it when it dies (a
restarted daemon, a redeployed code location, a host that kills the worker). Here the launcher starts
`python -m trainer.job.detach` in a session of its own (start_new_session: no signal sent to the worker's process
group reaches it), stdin from /dev/null and stdout/stderr into <work>/job-<attempt>.log (a pipe to a dead reader
would kill it on the next write). The wrapper runs the command as its child, passes SIGINT and SIGTERM on to it
(the trainer drains: it checkpoints and stops), waits, and writes the exit status into job.json. So a launcher
that comes back later (a new materialization, Dagster's run monitoring) finds in job.json whether the job still
runs, follows it if so, and otherwise reads how it ended: no second trainer is started while one runs.

The job's identity is (host, pid, the process's start time in clock ticks since boot): a pid reused by another
process after a reboot or a wrap-around is not taken for the job. Torch-free and Dagster-free: the launcher
resource and `pretrain jobs` read these files, and the wrapper starts in a fraction of a second.

On Slurm (`submit_job`) the same wrapper is the batch script's one command: sbatch queues it, Slurm runs it on the
allocation's first node, and it runs the srun step as its child. The job's identity is then its Slurm job id:
whether it still runs is Slurm's word (squeue), a signal goes through `scancel --signal`, and a kill is `scancel`.
The job is submitted held and released only once job.json names its id, so no wrapper can start, or end, before
the file that says which job it is exists.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

JOB_FILE = "job.json"
START_TIMEOUT_S = 30.0  # the wrapper writes job.json within this of being started, else the start failed


# squeue's states of a job that has ended (the rest: pending, running, completing, suspended, ...).
SLURM_ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
               "TIMEOUT"}
SLURM_TIMEOUT_S = 60.0  # for one squeue/scancel/scontrol call: slurmctld answers in milliseconds when it is up


@dataclass
class Job:
    pid: int | None  # the wrapper's: it is the job's process group and session leader (None: a Slurm job not yet started)
    host: str | None
    started_ticks: int | None  # /proc/<pid>/stat field 22: tells this process from a later one with the same pid
    started_at: float  # wall clock, for people
    attempt: int
    command: list[str]
    log: str  # stdout and stderr of the command
    metrics_offset: int = 0  # bytes of <output_dir>/metrics.jsonl before the job started: its records follow
    exit_status: int | None = None
    ended_at: float | None = None
    extra: dict = field(default_factory=dict)  # what the launcher adds (the Dagster run id that started it, ...)
    slurm_job_id: str | None = None  # a job submitted with sbatch (submit_job): Slurm says whether it runs

    @property
    def identity(self) -> tuple:
        """What tells this job from any other started in the same work dir."""
        return ("slurm", self.slurm_job_id) if self.slurm_job_id else (self.host, self.pid, self.started_ticks)

    @property
    def name(self) -> str:
        """The identity as one string (the Dagster run's `pretrain/job` tag): slurm:<id>, or host:pid:start ticks."""
        return f"slurm:{self.slurm_job_id}" if self.slurm_job_id else f"{self.host}:{self.pid}:{self.started_ticks}"

    def alive(self) -> bool:
        """The wrapper still runs on this host (a job on another host cannot be seen from here: not alive); a Slurm
        job: queued or running, as squeue says (when slurmctld cannot be asked, it is taken as alive: a job taken
        for dead would be started a second time)."""
        if self.exit_status is not None:
            return False
        if self.slurm_job_id:
            state = slurm_state(self.slurm_job_id)
            return state is None or state not in SLURM_ENDED
        if self.host != socket.gethostname():
            return False
        ticks = _start_ticks(self.pid)
        if ticks is None:
            return False
        return self.started_ticks is None or ticks == self.started_ticks

    def signal(self, signum: int) -> None:
        """Send SIGINT or SIGTERM to the wrapper, which passes it on to the command (the trainer drains). Not to
        the group: the command would get it twice, and a second SIGINT means "stop now" to many programs."""
        if self.slurm_job_id:
            # To the job's steps (srun's tasks: each node's torchrun, which passes it to its ranks), not to the batch
            # script: the wrapper there would pass it to srun, which takes one SIGINT as a request for its status.
            _slurm("scancel", f"--signal={signal.Signals(signum).name.removeprefix('SIG')}", self.slurm_job_id)
        elif self.alive():
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL to the whole job (its process group; on Slurm, scancel: every step and the batch script):
        nothing is left running."""
        if self.slurm_job_id:
            _slurm("scancel", self.slurm_job_id)
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def describe(self) -> str:
        state = "running" if self.alive() else (f"ended with status {self.exit_status}"
                                                if self.exit_status is not None else "gone (no exit status)")
        where = f"pid {self.pid} on {self.host}" if self.pid is not None else "not started yet"
        if self.slurm_job_id:
            where = f"Slurm job {self.slurm_job_id} ({'batch script ' + where if self.pid is not None else 'queued'})"
        return f"job {where}, attempt {self.attempt}, started {time.ctime(self.started_at)}: {state}"


def read_job(work: str | os.PathLike) -> Job | None:
    """The job last started in `work`, or None. A job.json that does not parse is an error naming the file."""
    path = Path(work) / JOB_FILE
    if not path.is_file():
        return None
    try:
        return Job(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: not a job file ({exc}); move it aside to start a new job") from None


def job_summary(work: str | os.PathLike) -> dict | None:
    """What `pretrain jobs` shows of the job in `work` (None if none was started there): read from the job's own
    files (job.json, run.json, the trainer's metrics.jsonl), so it needs neither Dagster nor the job's host."""
    job = read_job(work)
    if job is None:
        return None
    work = Path(work)
    run = json.loads((work / "run.json").read_text()) if (work / "run.json").is_file() else {}
    metrics = Path(run.get("output_dir", work / "out")) / "metrics.jsonl"
    last, restarts = None, 0
    if metrics.is_file():
        with open(metrics, "rb") as f:
            for line in f:
                record = json.loads(line) if line.strip() else {}
                if record.get("event") == "train":
                    last = record
                elif record.get("event") == "resumed":
                    restarts += 1
    state = "running" if job.alive() else ("done" if job.exit_status == 0 else
                                           f"failed ({job.exit_status})" if job.exit_status is not None else "gone")
    eta = None
    if state == "running" and last and last.get("tokens_per_s") and run.get("train_tokens"):
        eta = max(0.0, (run["train_tokens"] - last["tokens"]) / last["tokens_per_s"])
    return {"stage": run.get("stage", work.parent.name), "version": work.name, "state": state, "host": job.host,
            "pid": job.pid, "slurm_job_id": job.slurm_job_id, "attempt": job.attempt, "started_at": job.started_at,
            "ended_at": job.ended_at,
            "step": last and last["step"], "tokens": last and last["tokens"], "loss": last and last["loss"],
            "eta_s": eta, "resumes": restarts, "excluded_nodes": job.extra.get("excluded_nodes", []),
            # The launcher's record of every restart of this run: attempt, time, reason, and the node it left out.
            "restarts": job.extra.get("restarts", []), "work": str(work)}


def start_job(command: list[str], *, work: str | os.PathLike, env: dict, attempt: int, metrics_offset: int = 0,
              extra: dict | None = None) -> Job:
    """Start `command` detached from this process (see the module doc) and return its Job once job.json says
    the wrapper runs. Raises if the wrapper did not start."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / JOB_FILE).unlink(missing_ok=True)
    log = work / f"job-{attempt}.log"
    spec = {"attempt": attempt, "command": command, "log": str(log), "metrics_offset": metrics_offset,
            "extra": extra or {}}
    with open(log, "ab") as out, open(os.devnull, "rb") as devnull:
        # By path, not `-m trainer.job.detach`: it needs only the standard library, wherever the package is installed.
        wrapper = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(work / JOB_FILE), json.dumps(spec)],
                                   cwd=str(work), env=env, stdin=devnull, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        job = read_job(work)
        if job is not None and job.pid == wrapper.pid:
            return job
        if wrapper.poll() is not None:
            raise RuntimeError(f"the job wrapper exited with status {wrapper.returncode} before it started "
                               f"{command[0]}; see {log}")
        time.sleep(0.05)
    wrapper.kill()
    raise RuntimeError(f"the job wrapper wrote no {work / JOB_FILE} within {START_TIMEOUT_S:.0f} s; see {log}")


def submit_job(sbatch: list[str], command: list[str], *, work: str | os.PathLike, env: dict, attempt: int,
               metrics_offset: int = 0, extra: dict | None = None) -> Job:
    """Submit `command` as a Slurm batch job: `sbatch` with the options in `sbatch` (nodes, partition, time, ...;
    resources/slurm.py), running the wrapper on <work>/job-<attempt>.sbatch, its output appended to
    <work>/job-<attempt>.log. The job is submitted held, recorded in job.json, then released. Raises with
    sbatch's own message if it refuses the job."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / JOB_FILE).unlink(missing_ok=True)
    log = work / f"job-{attempt}.log"
    log.touch()  # followed from the start, also while the job waits in the queue
    spec = {"attempt": attempt, "command": command, "log": str(log), "metrics_offset": metrics_offset,
            "extra": extra or {}, "slurm": True}
    script = work / f"job-{attempt}.sbatch"
    script.write_text("#!/bin/bash\n# The training job's wrapper (trainer/job/detach.py): it runs the srun step and records "
                      "its exit status in job.json.\nexec " + shlex.join([sys.executable, str(Path(__file__).resolve()),
                                                                        str(work / JOB_FILE), json.dumps(spec)]) + "\n")
    out = subprocess.run([*sbatch, "--parsable", "--hold", "--output", str(log), "--open-mode=append",
                          "--chdir", str(work), str(script)], env=env, capture_output=True, text=True,
                         timeout=SLURM_TIMEOUT_S)
    if out.returncode != 0:
        raise RuntimeError(f"sbatch refused the training job ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    job_id = out.stdout.strip().split(";")[0]  # "<id>" or "<id>;<cluster>"
    job = Job(pid=None, host=None, started_ticks=None, started_at=time.time(), attempt=attempt, command=command,
              log=str(log), metrics_offset=metrics_offset, extra=extra or {}, slurm_job_id=job_id)
    write_job(work, job)
    refused = release(job)
    if refused:
        _slurm("scancel", job_id)
        raise RuntimeError(f"Slurm job {job_id} was submitted held but could not be released ({refused}): cancelled it")
    return job


def release(job: Job) -> str | None:
    """Let a held Slurm job start: None, or scontrol's complaint (a job that is not held is one: a launcher that
    died between the submission and the release left it held, and the next one that follows it releases it)."""
    return _slurm("scontrol", "release", job.slurm_job_id) if job.slurm_job_id else None


def slurm_state(job_id: str) -> str | None:
    """The job's state as squeue gives it ("RUNNING", "PENDING", ...), "COMPLETED" once slurmctld no longer knows
    it (past MinJobAge), or None when slurmctld could not be asked."""
    try:
        out = subprocess.run(["squeue", "--noheader", "--jobs", job_id, "--format", "%T"], capture_output=True,
                             text=True, timeout=SLURM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return "COMPLETED" if "Invalid job id" in out.stderr else None
    state = out.stdout.strip().split("\n")[0].strip()
    return state or "COMPLETED"


def _slurm(*args: str) -> str | None:
    """scancel or scontrol on a job: None, or what went wrong. Callers mostly go on either way (a job that has just
    ended refuses a signal; a job not held refuses a release): whether the job still runs is squeue's word."""
    try:
        out = subprocess.run(list(args), capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if out.returncode == 0 else (out.stderr.strip() or f"exit status {out.returncode}")


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when no such process runs (or it is a zombie:
    it has exited and waits for its parent to read its status)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if sys.platform.startswith("linux"):
            return None
        try:  # no /proc: whether the pid exists is all there is to know
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return -1
    # The command name (field 2) is in parentheses and may hold spaces: the fields after it are split safely.
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def write_job(work: str | os.PathLike, job: Job) -> None:
    """Replace job.json in `work` by `job`, atomically: a reader sees the old file or the new one."""
    path = Path(work) / JOB_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(job), indent=1))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """The wrapper: run the command of `spec`, record it in job.json at the start and with its status at the end."""
    parser = argparse.ArgumentParser(description="run a training command detached, recording it in job.json")
    parser.add_argument("job_file")
    parser.add_argument("spec", help="JSON: attempt, command, log, metrics_offset, extra")
    args = parser.parse_args(argv)
    path, spec = Path(args.job_file), json.loads(args.spec)
    # A batch job: its id is Slurm's (the launcher submitted it held and wrote job.json before releasing it).
    slurm_job_id = os.environ.get("SLURM_JOB_ID") if spec.pop("slurm", False) else None
    job = Job(pid=os.getpid(), host=socket.gethostname(), started_ticks=_start_ticks(os.getpid()),
              started_at=time.time(), slurm_job_id=slurm_job_id, **spec)
    child = subprocess.Popen(spec["command"])  # same session and group: a signal to the group reaches both

    def pass_on(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    # Written after the handlers are set: whoever reads job.json may signal the group from then on.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, pass_on)
    write_job(path.parent, job)
    while True:
        try:
            status = child.wait()
            break
        except InterruptedError:  # a signal arrived while waiting: pass_on ran, go on waiting
            continue
    job.exit_status, job.ended_at = status, time.time()
    write_job(path.parent, job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
