"""The training launcher: runs the trainer as an external process through Dagster Pipes.

    launcher = LauncherResource(launcher="torchrun", nproc_per_node=2)
    result = launcher.launch(context, run_config, work_dir)   # -> LaunchResult(summary, records)

The trainer process streams its progress lines into the Dagster run's log and its metric records
(train, eval, skip, checkpoint events) back as Pipes custom messages; the asset turns them into
metadata. A training asset never imports torch: this is its only way to the trainer.

A trainer that dies or fails is launched again, up to max_restarts times (within restart_window_hours, when
set), and resumes from its newest committed checkpoint; each restart is logged as a warning and listed in
LaunchResult.restarts. Exit statuses a restart cannot help (NOT_RESTARTABLE: 2 bad config, 3 spike guard, 5 silent
data corruption) fail at once, except where the launcher can leave a node out (Slurm, or DeepSpeed's hostfile, with
more than one node): a node named by the silent-data-corruption check, by a straggler's drain, or by two hangs is
excluded (`sbatch --exclude`, a hostfile without it) and the job restarts on the rest at the same global batch;
every exclusion is in the restart's record (`excluded`, `why`) and in job.json for `pretrain jobs`. The status
comes from the trainer's <output_dir>/failure.json when it wrote one (moved aside to failure-<attempt>.json), else
from torchrun's failure report (torchrun itself exits 1), else the process's own. A stage may override these
fields for its launch (`launch(..., settings=)`, a recipe stage's `launch:` in assets/recipe/training.py).

The job outlives the Dagster run that started it (trainer/job/detach.py): the local launchers (python, torchrun,
deepspeed) start the command detached, in a session of its own with its output in <work>/job-<attempt>.log, and
follow it through files in the work dir (job.json, the Pipes context and messages files, the log, the trainer's
metrics.jsonl). A run worker that dies (SIGKILL, a restarted daemon, a redeployed code location) leaves the job
training; the next launch in the same work dir (a new materialization of the stage, or Dagster's run monitoring
resuming the run) finds it running and follows it instead of starting a second trainer, or finds how it ended
while nobody watched. Stopping the Dagster run sends the job SIGINT: the trainer checkpoints and stops. The
records of a launch are the trainer's metrics.jsonl lines from where its job started, so a launch that
reattached has every record of the job, not only those sent after it came. On Slurm the job is a batch job
(sbatch, resources/slurm.py) that the launcher follows the same way, by its Slurm job id; stopping the Dagster run
sends the job's steps SIGINT (`scancel --signal=INT`), then cancels the job if it has not stopped.

How the processes start is resource configuration, never asset code:
- launcher "python": one process (`python -m trainer`).
- launcher "torchrun": nproc_per_node processes; with nnodes > 1 a c10d rendezvous at rdzv_endpoint
  (run the same command on every node) — or a single node with --standalone.
- launcher "deepspeed": DeepSpeed's launcher, with a hostfile for several nodes.
- launcher "slurm": a batch job of nnodes nodes (sbatch; partition, time, GPUs and extra sbatch args in `slurm`,
  resources/slurm.py) whose one srun step runs a torchrun per node with a c10d rendezvous on the step's first
  node. Submit from any host that can run sbatch; the work dir, venv and store must be on a shared filesystem.

Long because one resource launches, restarts, follows and stops every launcher kind's job, and the loop that does it
is one piece; Slurm's own arguments live in resources/slurm.py, the job files in trainer/job/.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dagster import (
    AssetExecutionContext,
    ConfigurableResource,
    DagsterExecutionInterruptedError,
    Failure,
    PipesSubprocessClient,
    open_pipes_session,
)

from resources.slurm import SlurmConfig, pipes_files, sbatch_options, step_command
# trainer/evaluation/harness.py, trainer/exits.py and trainer/job/detach.py are torch-free at import: the launcher never
# imports torch.
from trainer.evaluation.harness import RANK_VARIABLES
from trainer.exits import DRAIN_ENV, DRAIN_EXIT, FAILURE_FILE, HANG_EXIT, NOT_RESTARTABLE, SDC_EXIT
from trainer.job.detach import Job, read_job, release, start_job, submit_job, write_job

FOLLOW_POLL_S = 0.2  # how often a followed job's log, and its job.json, are read
ALIVE_POLL_S = 2.0  # how often whether it still runs is asked (on Slurm: one squeue call)
HANGS_TO_EXCLUDE = 2  # a node named by this many hangs is left out of the restart (one hang may be the network's)
JOB_TAG = "pretrain/job"  # the Dagster run's tag naming the training job it follows (trainer/job/detach.py Job.name)
RESTART_LOG = ("attempt", "time", "reason", "excluded", "why")  # what job.json keeps of each restart
THREADS_ENV = "OMP_NUM_THREADS"  # torch's CPU threads (launcher `threads`)
INTERRUPT_GRACE_S = 20.0  # a stopped Dagster run waits this long for the job to drain before it goes


@dataclass
class LaunchResult:
    summary: dict  # the trainer's summary.json (steps, tokens, losses, val_loss, skipped)
    records: list[dict] = field(default_factory=list)  # every metric record the trainer reported
    command: list[str] = field(default_factory=list)
    # One per restart, in order: {attempt, exit_status, reason, failure (failure.json or None), resumed_step, time},
    # and when a node was left out: excluded (the node), why ("silent data corruption", "straggler", "2 hangs"), the
    # command without it, and on Slurm the sbatch options with its --exclude.
    restarts: list[dict] = field(default_factory=list)

    def events(self, name: str) -> list[dict]:
        return [r for r in self.records if r.get("event") == name]


class LauncherResource(ConfigurableResource):
    launcher: Literal["python", "torchrun", "deepspeed", "slurm"] = "python"
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # host:port of the c10d rendezvous when nnodes > 1
    rdzv_id: str = "pretrain"
    hostfile: str | None = None  # deepspeed: one line per node, "host slots=N" (a node left out: a copy without it)
    master_port: int | None = None  # deepspeed: None = a free port on this machine
    env: dict[str, str] = {}  # added to the trainer's environment (e.g. NCCL_* settings)
    # CPU threads of each trainer process (its OMP_NUM_THREADS). Fixed by the settings, never by what else runs: a
    # loss, and through the mix sweep the mixture, depends on the thread count. None: the environment's
    # OMP_NUM_THREADS, else torch's default (the machine's cores).
    threads: int | None = None
    slurm: SlurmConfig = SlurmConfig()  # launcher "slurm": a batch job over nnodes nodes (resources/slurm.py)
    max_restarts: int = 2  # a failed trainer is launched again (resuming) up to this many times...
    # ...within any window of this many hours (None: in the whole launch). A run of weeks loses a node every few
    # days: a lifetime count would end it, while three failures within hours say something is broken.
    restart_window_hours: float | None = None

    def command(self, run_json: str | os.PathLike) -> list[str]:
        bin_dir = Path(sys.executable).parent
        trainer = ["-m", "trainer", "--config", str(run_json)]
        if self.launcher == "python":
            if self.nproc_per_node != 1 or self.nnodes != 1:
                raise ValueError("launcher 'python' runs one process: use 'torchrun' or 'deepspeed' for more")
            return [sys.executable, *trainer]
        if self.launcher == "slurm":  # the step the batch job runs (submit_job adds sbatch's side)
            return step_command(self.slurm, self.nnodes, self.nproc_per_node, str(bin_dir / "torchrun"), trainer)
        if self.launcher == "torchrun":
            cmd = [str(bin_dir / "torchrun"), "--nproc_per_node", str(self.nproc_per_node)]
            if self.nnodes == 1:
                # --standalone picks a free port itself (a fixed --master_port 0 hangs: STACK.md).
                return [*cmd, "--standalone", *trainer]
            if not self.rdzv_endpoint:
                raise ValueError("launcher.rdzv_endpoint (host:port) is required when launcher.nnodes > 1")
            return [*cmd, "--nnodes", str(self.nnodes), "--node_rank", str(self.node_rank),
                    "--rdzv_backend", "c10d", "--rdzv_endpoint", self.rdzv_endpoint, "--rdzv_id", self.rdzv_id,
                    *trainer]
        cmd = [str(bin_dir / "deepspeed")]
        if self.hostfile:
            cmd += ["--hostfile", self.hostfile]
        # --num_gpus is DeepSpeed's name for processes per node, also on CPU (DS_ACCELERATOR=cpu).
        cmd += ["--num_gpus", str(self.nproc_per_node), "--master_port", str(self.master_port or _free_port())]
        return [*cmd, "--module", "trainer", "--config", str(run_json)]

    def trainer_env(self) -> dict[str, str]:
        """The trainer's environment: this process's, `env` over it, and `threads` as OMP_NUM_THREADS."""
        env = {**os.environ, **self.env, **({THREADS_ENV: str(self.threads)} if self.threads else {})}
        env.pop("WORLD_SIZE", None)  # a stale value would make `python -m trainer` wait for other ranks
        return env

    def with_settings(self, settings: Mapping | None) -> LauncherResource:
        """This launcher with one stage's own settings over its fields (a recipe's `launch:` mapping)."""
        if not settings:
            return self
        fields = type(self).model_fields
        unknown = sorted(set(settings) - set(fields))
        if unknown:
            raise ValueError(f"launch.{unknown[0]}: not a launcher field (launch sets {', '.join(fields)})")
        return type(self)(**{**{name: getattr(self, name) for name in fields}, **settings})

    def launch(self, context: AssetExecutionContext, run_config: dict, work_dir: str | os.PathLike,
               settings: Mapping | None = None) -> LaunchResult:
        """Write run.json into work_dir, run the trainer to completion, return its summary and records.

        `settings` overrides this resource's fields for this launch (a stage's `launch:` in the recipe).
        A trainer that dies or fails is launched again, up to max_restarts times: it resumes from its
        newest committed checkpoint. Exit statuses a restart cannot help (NOT_RESTARTABLE) fail at once;
        the trainer's stderr is in the run log."""
        if settings:
            return self.with_settings(settings).launch(context, run_config, work_dir)
        work = Path(work_dir)
        work.mkdir(parents=True, exist_ok=True)
        run_json = work / "run.json"
        run_json.write_text(json.dumps(run_config, indent=1))
        output_dir = Path(run_config["output_dir"])
        command = self.command(run_json)
        context.log.info("launching the trainer: " + " ".join(command))
        env = self.trainer_env()
        if _take_failure(output_dir, 0) is not None:  # left by an earlier launch: not this one's reason
            context.log.info(f"an earlier {FAILURE_FILE} in {output_dir} was moved aside to failure-0.json")
        records: list[dict] = []
        restarts: list[dict] = []
        attempts: list[str] = []
        earlier = read_job(work)  # an earlier launch of this run: its exclusions and restarts carry over
        launcher, hangs = self._with_earlier_exclusions(earlier, work), {}  # hangs: node -> how many hangs named it
        command = launcher.command(run_json)
        history = list(earlier.extra.get("restarts", [])) if earlier is not None else []
        while True:
            attempt = len(attempts) + 1
            logged = history + [{k: r[k] for k in RESTART_LOG if k in r} for r in restarts]
            status, messages = launcher._attempt(context, command, {**env, **launcher._drain_env()}, work,
                                                 attempt=attempt, metrics=output_dir / "metrics.jsonl", restarts=logged)
            records += messages
            if restarts and restarts[-1]["resumed_step"] is None:
                resumed = [r for r in messages if r.get("event") == "resumed"]
                if resumed:
                    restarts[-1]["resumed_step"] = resumed[0]["step"]
                    context.log.warning(f"restart {len(restarts)}: the trainer resumed at step {resumed[0]['step']}")
            if status == 0:
                break
            failure = _take_failure(output_dir, attempt)
            if failure is not None and isinstance(failure.get("exit_status"), int):
                status = failure["exit_status"]  # the trainer's own word (torchrun's status is 1 whatever it was)
            reason = _reason(status, failure)
            attempts.append(f"attempt {attempt}: {reason}")
            exclude = launcher._node_to_exclude(status, failure, hangs)
            if status in NOT_RESTARTABLE and exclude is None:
                raise Failure(description=f"the trainer failed with code {status} ({reason}) on attempt {attempt}: "
                                          "not restarted, a restart cannot help", allow_retries=False)
            now = time.time()
            recent = [r for r in restarts if self.restart_window_hours is None
                      or now - r["time"] < self.restart_window_hours * 3600]
            if len(recent) >= self.max_restarts:
                # Every failure that counted, each with its reason: what someone has to look at.
                first = recent[0]["attempt"] if recent else attempt
                failed = attempts[first - 1:]
                counted = (f"all {attempt} attempts" if self.restart_window_hours is None else
                           f"{len(failed)} attempts within {self.restart_window_hours:g} h")
                raise Failure(description=f"the trainer failed on {counted} (max_restarts {self.max_restarts}): "
                                          f"{'; '.join(failed)}. Last reason: {reason}",
                              allow_retries=False)  # the restarts were the retries
            restarts.append({"attempt": attempt, "exit_status": status, "reason": reason, "failure": failure,
                             "resumed_step": None, "time": now})
            if exclude is not None:
                host, why = exclude
                launcher = launcher._without(host, work)
                command = launcher.command(run_json)
                restarts[-1].update(excluded=host, why=why, command=command)
                if launcher.launcher == "slurm":
                    restarts[-1]["sbatch"] = sbatch_options(launcher.slurm, launcher.nnodes)
                context.log.warning(f"EXCLUDED {host} ({why}): the job goes on on {launcher.nnodes} node(s) without "
                                    f"{', '.join(launcher.excluded())}, at the same global batch")
            # Loud on purpose: a restart hides a fault (a dead node, a hang) that someone should look at.
            window = f" in {self.restart_window_hours:g} h" if self.restart_window_hours is not None else ""
            context.log.warning(f"RESTART {len(recent) + 1}/{self.max_restarts}{window}: the trainer failed on attempt "
                                f"{attempt} ({reason}); relaunching it, it resumes from its newest committed checkpoint")
        summary_path = output_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        return LaunchResult(summary=summary, records=records, command=command, restarts=restarts)

    def _drain_env(self) -> dict[str, str]:
        """Tell the trainer it may stop for a straggler's node to be left out (only where one can be)."""
        return {DRAIN_ENV: "1"} if self._can_exclude() else {}

    def _can_exclude(self) -> bool:
        """A node can be left out of a restart: on Slurm (--exclude), or with DeepSpeed's hostfile (a copy without
        it); and only with another node to go on with."""
        return self.nnodes > 1 and (self.launcher == "slurm" or (self.launcher == "deepspeed" and bool(self.hostfile)))

    def _node_to_exclude(self, status: int, failure: dict | None, hangs: dict) -> tuple[str, str] | None:
        """(node, why) when this failure names a node the restart should leave out, else None: the node of a rank
        stopped for silent data corruption (restarting on it cannot help), of a straggler that drained, or one
        that two hangs named. Counts hangs by node in `hangs`."""
        host = (failure or {}).get("host")
        if not host:
            return None
        if status == HANG_EXIT:
            hangs[host] = hangs.get(host, 0) + 1
        why = {SDC_EXIT: "silent data corruption", DRAIN_EXIT: "straggler"}.get(status)
        if status == HANG_EXIT and hangs[host] >= HANGS_TO_EXCLUDE:
            why = f"{hangs[host]} hangs"
        return (host, why) if why and self._can_exclude() else None

    def excluded(self) -> list[str]:
        """The nodes this launch leaves out."""
        return list(self.slurm.exclude) if self.launcher == "slurm" else _hostfile_excluded(self.hostfile)

    def _with_earlier_exclusions(self, earlier: Job | None, work: Path) -> LauncherResource:
        """On Slurm, the nodes an earlier launch in this work dir (its job, `earlier`) left out stay out (a Dagster
        restart must not put the job back on a node that corrupted its data)."""
        if self.launcher != "slurm" or earlier is None:
            return self
        launcher = self
        for host in earlier.extra.get("excluded_nodes", []):
            if host not in launcher.excluded() and launcher.nnodes > 1:
                launcher = launcher._without(host, work)
        return launcher

    def _without(self, host: str, work: Path) -> LauncherResource:
        """This launch on the nodes left when `host` is excluded too (the trainer resumes on fewer ranks at the
        same global batch: its checkpoints reshard). Slurm: --exclude; DeepSpeed: a hostfile without it."""
        if self.launcher == "slurm":
            return self.with_settings({"nnodes": self.nnodes - 1,
                                       "slurm": self.slurm.model_copy(update={"exclude": [*self.slurm.exclude, host]})})
        lines = Path(self.hostfile).read_text().splitlines()
        kept = [line for line in lines if line.split() and line.split()[0] != host]
        if len(kept) == len(lines):
            raise Failure(description=f"{host} is to be left out but is not in the hostfile {self.hostfile}")
        excluded = [*_hostfile_excluded(self.hostfile), host]
        path = work / f"hostfile-without-{len(excluded)}"
        path.write_text(f"{EXCLUDED_MARK}{' '.join(excluded)}\n" + "\n".join(kept) + "\n")
        return self.with_settings({"nnodes": self.nnodes - 1, "hostfile": str(path)})

    def _attempt(self, context: AssetExecutionContext, command: list[str], env: dict, work: Path, *,
                 attempt: int, metrics: Path, restarts: list[dict]) -> tuple[int, list[dict]]:
        """One run of `command` under a Pipes session of its own: (the trainer's exit status, its records).

        Like PipesSubprocessClient.run, which raises on a non-zero exit and so loses the status and the
        records a failed attempt reported. The command's stderr is passed on to ours line by line and its tail
        kept: torchrun exits 1 whatever its ranks did, and only its failure report says what they did."""
        tail: deque[str] = deque(maxlen=400)
        # Pipes through files in the work dir: a job that outlives this session goes on writing there, and a later
        # session on the same files reads what it writes from then on.
        with open_pipes_session(context=context, **pipes_files(work)) as session:
            job = read_job(work)
            if job is not None and job.alive():
                context.log.warning(f"the training job started earlier is still running ({job.describe()}): "
                                    "following it instead of starting another trainer")
                release(job)  # a Slurm job its launcher submitted held, and died before it released
            elif job is not None and job.exit_status is not None and not job.extra.get("followed"):
                context.log.warning(f"the training job ended while no run followed it ({job.describe()})")
            else:
                offset = metrics.stat().st_size if metrics.exists() else 0
                start = dict(work=work, env={**env, **session.get_bootstrap_env_vars()}, attempt=attempt,
                             metrics_offset=offset,
                             extra={"dagster_run_id": context.run.run_id, "excluded_nodes": self.excluded(),
                                    "restarts": restarts})  # for `pretrain jobs` and `pretrain status`
                job = (submit_job(sbatch_options(self.slurm, self.nnodes), command, **start)
                       if self.launcher == "slurm" else start_job(command, **start))
                context.log.info(f"started the training {job.describe()}; its output: {job.log}")
            # Which job this run follows, in the run's tags: found from the UI, and by whoever looks for the job.
            context.instance.add_run_tags(context.run.run_id, {
                JOB_TAG: job.name, f"{JOB_TAG}_work": str(work),
                f"{JOB_TAG}_assets": ",".join(sorted(k.to_user_string() for k in context.selected_asset_keys))})
            status = _follow(context, job, work, tail)
        records = _records_since(metrics, job.metrics_offset)
        if status != 0 and self.launcher in ("torchrun", "slurm"):
            status = _ranks_status("".join(tail), status)
        return status, records

    def run_python(self, context: AssetExecutionContext, args: list[str], work_dir: str | os.PathLike) -> None:
        """One plain Python process under Pipes on this machine (an evaluation, not a training job)."""
        client = PipesSubprocessClient(env=dict(self.env), cwd=str(work_dir))
        client.run(context=context, command=plain_process([sys.executable, *args]))


def plain_process(command: list[str]) -> list[str]:
    """`command` run alone, as no rank: Pipes always passes this process's environment on, so `env -u` unsets. With
    LOCAL_RANK alone (left by a one-rank group in the parent) a process could take itself for one of several ranks."""
    return ["env", *(f"--unset={name}" for name in RANK_VARIABLES), *command]


# The first line of a hostfile the launcher wrote without some nodes: which ones (DeepSpeed skips # lines).
EXCLUDED_MARK = "# excluded: "


def _hostfile_excluded(hostfile: str | None) -> list[str]:
    if not hostfile or not Path(hostfile).is_file():
        return []
    first = Path(hostfile).read_text().split("\n", 1)[0]
    return first[len(EXCLUDED_MARK):].split() if first.startswith(EXCLUDED_MARK) else []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Written by the trainer when it fails ({"kind": "hang", "exit_status": 4, "rank": r, "step": s, "host": h,
# "message": "..."}, trainer/health/watchdog.py): its exit_status is the one that counts, the kind and message the reason.


def _follow(context: AssetExecutionContext, job: Job, work: Path, tail: deque) -> int:
    """Pass the job's log on to our stderr (keeping its tail) until the job ends; its exit status. A job gone
    without one (its wrapper killed too, the host rebooted) counts as killed: -9. Marks the job followed, so a
    later launch starts a new one rather than reporting this end again."""
    asked = 0.0
    with open(job.log, "rb") as log:
        try:
            while True:
                _pass_on(log, tail)
                current = read_job(work)
                if current is None or current.identity != job.identity:
                    raise RuntimeError(f"{work / 'job.json'} no longer names the job followed ({job.describe()}): "
                                       "another launch took over this work dir")
                if current.exit_status is not None:
                    break
                if time.monotonic() - asked > ALIVE_POLL_S:
                    asked = time.monotonic()
                    if not current.alive():
                        # It may have written its status between the two looks.
                        current = read_job(work) or current
                        break
                time.sleep(FOLLOW_POLL_S)
        except DagsterExecutionInterruptedError:
            # The Dagster run was stopped: the job checkpoints and stops (it would outlive a run that died).
            context.log.info("[pipes] execution interrupted: asking the training job to checkpoint and stop (SIGINT)")
            job.signal(signal.SIGINT)
            deadline = time.monotonic() + INTERRUPT_GRACE_S
            while job.alive() and time.monotonic() < deadline:
                time.sleep(FOLLOW_POLL_S)
            if job.alive():
                context.log.warning(f"the job did not stop within {INTERRUPT_GRACE_S:.0f} s: killing it")
                job.kill()
            raise
        _pass_on(log, tail)
    status = current.exit_status if current.exit_status is not None else -signal.SIGKILL
    current.extra["followed"] = True
    write_job(work, current)
    return status


def _pass_on(log, tail: deque) -> None:
    for line in iter(log.readline, b""):
        os.write(2, line)
        tail.append(line.decode(errors="replace"))


def _records_since(metrics: Path, offset: int) -> list[dict]:
    """The trainer's metric records from byte `offset` of metrics.jsonl on (what its job wrote). NaN and
    infinities become strings, as they do through Pipes (metadata is JSON)."""
    if not metrics.exists():
        return []
    with open(metrics, "rb") as f:
        f.seek(offset)
        lines = f.read().splitlines()
    return [json.loads(line, parse_constant=lambda c: str(float(c))) for line in lines if line.strip()]


def _ranks_status(report: str, status: int) -> int:
    """The ranks' exit status from torchrun's failure report ("exitcode  : 2 (pid: 123)"), else `status`.

    A status no restart can help wins over the others (the ranks stopped by the agent after it); then a rank
    killed by a signal other than the agent's own SIGTERM (its peers fail only because it vanished: "connection
    reset"); else the root cause, the first failure torchrun observed."""
    codes = [int(c) for c in re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", report, re.M)]
    if not codes:
        return status
    for chosen in ([c for c in codes if c in NOT_RESTARTABLE], [c for c in codes if c < 0 and c != -signal.SIGTERM]):
        if chosen:
            return chosen[0]
    root = report.rsplit("Root Cause", 1)[-1]
    found = re.search(r"^\s*exitcode\s*:\s*(-?\d+)", root, re.M)
    return int(found.group(1)) if found else codes[-1]


def _take_failure(output_dir: Path, attempt: int) -> dict | None:
    """The trainer's failure.json of this attempt, moved aside (failure-<attempt>.json) for a clean next one."""
    path = output_dir / FAILURE_FILE
    if not path.is_file():
        return None
    try:
        failure = json.loads(path.read_text())
    except ValueError as exc:
        failure = {"kind": "unreadable", "message": f"{path}: {exc}"}
    path.rename(output_dir / f"failure-{attempt}.json")
    return failure if isinstance(failure, dict) else {"kind": "unreadable", "message": repr(failure)}


def _reason(status: int, failure: dict | None) -> str:
    if failure is not None:
        where = ", ".join(f"{k} {failure[k]}" for k in ("rank", "step", "host") if failure.get(k) is not None)
        what = f"{failure.get('kind', 'failure')} ({where})" if where else str(failure.get("kind", "failure"))
        return f"exit status {status}: {what}: {failure.get('message', '')}".rstrip(": ")
    if status in NOT_RESTARTABLE:
        return f"exit status {status}: {NOT_RESTARTABLE[status]}"
    if status == 4:
        return "exit status 4: a hang ended by the trainer's watchdog"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"exit status {status}: a trainer process was killed by {name}"
    return f"exit status {status}"
