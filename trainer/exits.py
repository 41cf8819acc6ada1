"""How the trainer ends: its exit statuses and the failure.json it leaves. Torch-free on purpose: the launcher
(resources/launcher.py) imports it, and a training asset never loads torch.

    0  CLEAN        the token budget is reached
    2  CONFIG       a bad config, or a checkpoint this config cannot resume (e.g. another batch.global_batch)
    3  GUARD_STOP   the spike guard stops the run (too many skipped steps or rollbacks)
    4  HANG         the step watchdog ended a hang (trainer.health.watchdog); a restart resumes
    5  SDC          one rank gave corrupt figures too often (trainer.health.rank_checks); restarting on the same node
                    cannot help
    6  DRAIN        it stopped (checkpointed) so the launcher restarts it without a straggler's node
    7  STOP         SIGINT or SIGTERM asked it to stop (a stopped Dagster run, scancel, a time limit): it checkpointed
                    after the step all ranks agreed on; a restart resumes there

Every failure also writes <output_dir>/failure.json: under torchrun the launcher sees torchrun's own exit
status (1), so that file is how it knows what happened. Its schema (FAILURE_FIELDS): kind, exit_status and
message always; rank, host and step where one is to blame; the watchdog adds its own figures.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

CLEAN = 0
CONFIG_EXIT = 2
GUARD_EXIT = 3
HANG_EXIT = 4
SDC_EXIT = 5
DRAIN_EXIT = 6
STOP_EXIT = 7

FAILURE_FILE = "failure.json"
# kind -> exit status: the failure.json kinds the trainer writes.
KINDS = {"config": CONFIG_EXIT, "guard_stop": GUARD_EXIT, "hang": HANG_EXIT, "sdc": SDC_EXIT,
         "straggler": DRAIN_EXIT, "stopped": STOP_EXIT}
FAILURE_FIELDS = ("kind", "exit_status", "message", "rank", "host", "step")  # the first three always present

# The statuses a restart cannot help: the launcher fails the launch at once, with this reason.
NOT_RESTARTABLE = {CONFIG_EXIT: "a bad config or a checkpoint this config refuses",
                   GUARD_EXIT: "the spike guard stopped the run",
                   SDC_EXIT: "a rank stopped for silent data corruption"}

DRAIN_ENV = "PRETRAIN_LAUNCHER_CAN_DRAIN"  # set by a launcher that can restart without a node


def node_name() -> str:
    """The node a failure record names: Slurm's name for it where there is one (what --exclude takes, and two
    Slurm nodes may share a host), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


class TrainerExit(Exception):
    """A stop the trainer decides on: its kind (a KINDS key) says the exit status; `extra` goes to failure.json."""

    kind = "config"

    def __init__(self, message: str, **extra):
        super().__init__(message)
        self.extra = extra
        # True when every rank raises it after the same step (Trainer.stop_after_step: a signal, a drain), so the
        # ranks can leave together: torchrun stops the ranks still running as soon as one has exited.
        self.agreed = False

    @property
    def exit_status(self) -> int:
        return KINDS[self.kind]


def failure_record(kind: str, message: str, **extra) -> dict:
    """failure.json's content for a stop of this kind."""
    return {"kind": kind, "exit_status": KINDS[kind], "message": message, **extra}


def write_failure(output_dir: str | Path, record: dict) -> None:
    """<output_dir>/failure.json: why the trainer stopped, for the launcher (which cannot tell from the exit
    status under torchrun: it exits 1 whatever its workers did). Atomic; every rank writing it is fine."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{FAILURE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, out / FAILURE_FILE)
