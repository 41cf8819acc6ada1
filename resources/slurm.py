"""The trainer on Slurm: a batch job (sbatch) whose one step (srun) runs a torchrun on every node.

    LauncherResource(launcher="slurm", nnodes=4, nproc_per_node=8,
                     slurm=SlurmConfig(partition="gpu", time="7-00:00:00", gpus_per_node=8, cpus_per_task=64))

The launcher submits the job with `sbatch` (sbatch_options: the allocation) and returns to following it: the
batch script is trainer/job/detach.py's wrapper, which runs `srun` (step_command) as its child and records the exit status
in job.json. So the job belongs to Slurm, not to the Dagster run worker that submitted it: a worker that dies, a
restarted daemon or a redeployed code location leave it training, and the next launch in the same work dir finds
it by its Slurm job id and follows it (resources/launcher.py).

On every node the step's task runs
    torchrun --nproc_per_node N --nnodes $SLURM_STEP_NUM_NODES --node_rank $SLURM_NODEID
             --rdzv_backend c10d --rdzv_endpoint <the step's first node>:rdzv_port --rdzv_id <job.step> -m trainer
The step's variables, not the job's: the step is what the trainer's ranks are.

Pipes across nodes: c10d's rendezvous gives global rank 0 to whichever agent sorts first, so the rank that
reports (trainer/reporting/pipes.py: rank 0 only) may run on any node. The launcher therefore puts the Pipes
context and message files, job.json and the job's log in the run's work folder (`pipes_files`), which, like the
venv and the store, must be on a filesystem every node and the submitting host share; the Pipes environment
variables reach every task through `--export=ALL` on both sbatch and srun.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from dagster import Config, PipesFileContextInjector, PipesFileMessageReader


class SlurmConfig(Config):
    partition: str | None = None  # the Slurm partition (None: the cluster's default)
    time: str | None = None  # the job's time limit, e.g. "7-00:00:00" (None: the partition's default)
    gpus_per_node: int | None = None  # GPUs asked of each node (--gpus-per-node; None: none asked)
    cpus_per_task: int | None = None  # CPUs of the one task per node: all of torchrun's processes share them
    job_name: str = "pretrain"  # the batch job's name in squeue and sacct
    rdzv_port: int = 29400  # c10d rendezvous port on the step's first node
    exclude: list[str] = []  # nodes the job must not use (the launcher adds a node it takes out: SDC, hangs)
    sbatch_args: list[str] = []  # anything else for the allocation, e.g. ["--account=ml", "--qos=high", "--exclusive"]


def sbatch_options(config: SlurmConfig, nnodes: int) -> list[str]:
    """sbatch and the allocation's options: nnodes nodes, one task each (trainer/job/detach.py adds the script, its
    output and the hold)."""
    if nnodes < 1:
        raise ValueError(f"launcher.nnodes ({nnodes}) must be >= 1")
    cmd = ["sbatch", "--export=ALL", "--job-name", config.job_name, "--nodes", str(nnodes), "--ntasks-per-node", "1"]
    if config.partition:
        cmd += ["--partition", config.partition]
    if config.time:
        cmd += ["--time", config.time]
    cmd += _per_node(config)
    if config.exclude:
        cmd.append(f"--exclude={','.join(config.exclude)}")
    return [*cmd, *config.sbatch_args]


def step_command(config: SlurmConfig, nnodes: int, nproc_per_node: int, torchrun: str,
                 trainer_args: list[str]) -> list[str]:
    """The srun step the batch script runs: one task per node, each running the per-node script below."""
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError(f"launcher.nnodes ({nnodes}) and launcher.nproc_per_node ({nproc_per_node}) must be >= 1")
    # A step inherits neither --cpus-per-task nor the GPUs per node from its job (Slurm >= 22.05): given again.
    return ["srun", "--export=ALL", "--kill-on-bad-exit=1", "--nodes", str(nnodes), "--ntasks-per-node", "1",
            *_per_node(config), "bash", "-c", node_script(config, nproc_per_node, torchrun, trainer_args)]


def _per_node(config: SlurmConfig) -> list[str]:
    cmd = []
    if config.gpus_per_node is not None:
        cmd += ["--gpus-per-node", str(config.gpus_per_node)]
    if config.cpus_per_task is not None:
        cmd += ["--cpus-per-task", str(config.cpus_per_task)]
    return cmd


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
