"""The trainer on a Slurm allocation: one `srun` step, one task per node, each task a torchrun.

    LauncherResource(launcher="slurm", nnodes=4, nproc_per_node=8,
                     slurm=SlurmConfig(partition="gpu", time="12:00:00", gpus_per_node=8, cpus_per_task=64))

The launcher runs this `srun` under Dagster Pipes from wherever the Dagster run executes. Outside an
allocation (a login node) srun asks Slurm for one with these options and waits for it; inside one (the
Dagster run itself started by sbatch/salloc) srun starts a step on the allocation's nodes. srun blocks
until every task ends, forwards their stdout/stderr to Dagster, and exits non-zero when one fails.

On every node the task runs
    torchrun --nproc_per_node N --nnodes $SLURM_STEP_NUM_NODES --node_rank $SLURM_NODEID
             --rdzv_backend c10d --rdzv_endpoint <the step's first node>:rdzv_port --rdzv_id <job.step> -m trainer
The step's variables, not the job's: inside a larger allocation the step may use only some of its nodes.

Pipes across nodes: c10d's rendezvous gives global rank 0 to whichever agent sorts first, so the rank
that reports (trainer/pipes_report.py: rank 0 only) may run on any node. The launcher therefore puts the
Pipes context and message files in the run's work folder (`pipes_files`), which, like the venv and the
store, must be on a filesystem every node shares; the Pipes environment variables reach every task
through `--export=ALL` (an sbatch --export=NONE would otherwise strip them from the step).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from dagster import Config, PipesFileContextInjector, PipesFileMessageReader


class SlurmConfig(Config):
    partition: str | None = None
    time: str | None = None  # time limit, e.g. "12:00:00" (only for an allocation srun makes itself)
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None  # CPUs of the one task per node: all of torchrun's processes share them
    job_name: str = "pretrain"
    rdzv_port: int = 29400  # c10d rendezvous port on the step's first node
    srun_args: list[str] = []  # anything else, e.g. ["--account=ml", "--qos=high", "--exclusive"]


def srun_command(config: SlurmConfig, nnodes: int, nproc_per_node: int, torchrun: str,
                 trainer_args: list[str]) -> list[str]:
    """The srun command line: one task per node, each running the per-node script below."""
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError(f"launcher.nnodes ({nnodes}) and launcher.nproc_per_node ({nproc_per_node}) must be >= 1")
    cmd = ["srun", "--export=ALL", "--kill-on-bad-exit=1",
           # Dagster stops a run with one SIGINT; srun alone would only print the step's status.
           "--quit-on-interrupt",
           "--job-name", config.job_name, "--nodes", str(nnodes), "--ntasks-per-node", "1"]
    if config.partition:
        cmd += ["--partition", config.partition]
    if config.time:
        cmd += ["--time", config.time]
    if config.gpus_per_node is not None:
        cmd += ["--gpus-per-node", str(config.gpus_per_node)]
    if config.cpus_per_task is not None:
        cmd += ["--cpus-per-task", str(config.cpus_per_task)]
    return [*cmd, *config.srun_args, "bash", "-c", node_script(config, nproc_per_node, torchrun, trainer_args)]


def node_script(config: SlurmConfig, nproc_per_node: int, torchrun: str, trainer_args: list[str]) -> str:
    """What each node's task runs (bash): torchrun for this node, rendezvous on the step's first node.

    The rendezvous host is that node's NodeAddr, the address Slurm itself reaches it at (its name when
    slurm.conf gives none); a node name need not resolve in DNS."""
    return "\n".join([
        "set -euo pipefail",
        'head=$(scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n 1)',
        'addr=$(scontrol show node --oneliner "$head" | tr " " "\\n" | sed -n "s/^NodeAddr=//p")',
        f"exec {shlex.quote(torchrun)} --nproc_per_node {nproc_per_node}"
        ' --nnodes "$SLURM_STEP_NUM_NODES" --node_rank "$SLURM_NODEID"'
        f' --rdzv_backend c10d --rdzv_endpoint "${{addr:-$head}}:{config.rdzv_port}"'
        ' --rdzv_id "$SLURM_JOB_ID.$SLURM_STEP_ID" ' + shlex.join(trainer_args),
    ])


def pipes_files(work_dir: str | Path) -> dict:
    """Pipes channels as files in the (shared) work folder, readable from whichever node runs rank 0."""
    work = Path(work_dir)
    return {"context_injector": PipesFileContextInjector(str(work / "pipes_context.json")),
            "message_reader": PipesFileMessageReader(str(work / "pipes_messages.jsonl"))}
