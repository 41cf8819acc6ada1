"""The training launcher: runs the trainer as an external process through Dagster Pipes.

    launcher = LauncherResource(launcher="torchrun", nproc_per_node=2)
    result = launcher.launch(context, run_config, work_dir)   # -> LaunchResult(summary, records)

The trainer process streams its progress lines into the Dagster run's log and its metric records
(train, eval, skip, checkpoint events) back as Pipes custom messages; the asset turns them into
metadata. A training asset never imports torch: this is its only way to the trainer.

How the processes start is resource configuration, never asset code:
- launcher "python": one process (`python -m trainer`).
- launcher "torchrun": nproc_per_node processes; with nnodes > 1 a c10d rendezvous at rdzv_endpoint
  (run the same command on every node) — or a single node with --standalone.
- launcher "deepspeed": DeepSpeed's launcher, with a hostfile for several nodes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dagster import AssetExecutionContext, ConfigurableResource, PipesSubprocessClient


@dataclass
class LaunchResult:
    summary: dict  # the trainer's summary.json (steps, tokens, losses, val_loss, skipped)
    records: list[dict] = field(default_factory=list)  # every metric record the trainer reported
    command: list[str] = field(default_factory=list)

    def events(self, name: str) -> list[dict]:
        return [r for r in self.records if r.get("event") == name]


class LauncherResource(ConfigurableResource):
    launcher: Literal["python", "torchrun", "deepspeed"] = "python"
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # host:port of the c10d rendezvous when nnodes > 1
    rdzv_id: str = "pretrain"
    hostfile: str | None = None  # deepspeed: one line per node, "host slots=N"
    master_port: int | None = None  # deepspeed: None = a free port on this machine
    env: dict[str, str] = {}  # added to the trainer's environment (e.g. OMP_NUM_THREADS, NCCL_* settings)

    def command(self, run_json: str | os.PathLike) -> list[str]:
        bin_dir = Path(sys.executable).parent
        trainer = ["-m", "trainer", "--config", str(run_json)]
        if self.launcher == "python":
            if self.nproc_per_node != 1 or self.nnodes != 1:
                raise ValueError("launcher 'python' runs one process: use 'torchrun' or 'deepspeed' for more")
            return [sys.executable, *trainer]
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

    def launch(self, context: AssetExecutionContext, run_config: dict, work_dir: str | os.PathLike) -> LaunchResult:
        """Write run.json into work_dir, run the trainer to completion, return its summary and records.

        A non-zero exit fails the asset with Dagster's error (the trainer's stderr is in the run log)."""
        work = Path(work_dir)
        work.mkdir(parents=True, exist_ok=True)
        run_json = work / "run.json"
        run_json.write_text(json.dumps(run_config, indent=1))
        command = self.command(run_json)
        context.log.info("launching the trainer: " + " ".join(command))
        env = {**os.environ, **self.env}
        env.pop("WORLD_SIZE", None)  # a stale value would make `python -m trainer` wait for other ranks
        invocation = PipesSubprocessClient(env=env, cwd=str(work)).run(context=context, command=command)
        records = [m for m in invocation.get_custom_messages() if isinstance(m, dict)]
        summary_path = Path(run_config["output_dir"]) / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        return LaunchResult(summary=summary, records=records, command=command)


    def run_python(self, context: AssetExecutionContext, args: list[str], work_dir: str | os.PathLike) -> None:
        """One plain Python process under Pipes on this machine (an evaluation, not a training job)."""
        env = {**os.environ, **self.env}
        env.pop("WORLD_SIZE", None)
        PipesSubprocessClient(env=env, cwd=str(work_dir)).run(context=context, command=[sys.executable, *args])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
