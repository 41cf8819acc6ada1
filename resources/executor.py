"""The datatrove executor resource: where a stage's pipeline steps run. Assets never choose; definitions.py does.

    stats_path = executor.run(steps, logging_dir=work / "logs" / "filter", tasks=executor.tasks_for(len(files)))

One method for every kind, so moving a stage to a cluster changes no asset code:

- `local` (the default) runs the tasks on this machine (pipelines/runner.py's LocalRunner), W at once: W is
  `workers` (PRETRAIN_EXECUTOR_WORKERS) when set, else the CPUs the run was given, read when it runs
  (resources/executor_env.py's given_cpus: all this process may use, or its share when `pretrain materialize` runs
  several assets at once). With one worker it runs them in this process, one after another (no process start-up,
  no pickling of the steps); with W, in W spawned helpers that start when the run does (loading the filter's
  models while it starts) and serve every phase of it, while this process waits (spawning needs the
  `if __name__ == "__main__":` guard in any script that ends up here).
  Outputs never depend on W (see below), so the default costs no reproducibility.
- `ray` runs datatrove's RayPipelineExecutor on the Ray cluster at `ray_address` (None: a one-node cluster
  started in this process), `workers` tasks at once, each reserving `cpus_per_task` CPUs.
- `slurm` submits datatrove's SlurmPipelineExecutor (an sbatch job array on `slurm_partition`, without datatrove's
  stats job: resources/slurm_array.py) and waits for it. Run it from a login node whose filesystem the compute
  nodes share: logging_dir and the pipeline's input and output folders must be visible from the nodes.

Every kind leaves the same files for the same steps (tests/resources/test_executor.py compares manifests on local
and Ray), and every kind returns the run's merged stats.json. The stages name their outputs after their input
units, never after a task's rank, so the task count changes how the work is spread, not what is written.

Tasks: a stage passes its natural count (`tasks_for(default)`: e.g. one task per input file); the resource's
`tasks` setting (PRETRAIN_EXECUTOR_TASKS) overrides it for every stage, which is how a cluster run asks for more.

Resume (pipelines/runner.py, the same for every kind): a run in a logging folder where some tasks completed runs
only the others, then merges the stats of every task, so a stage killed half-way and materialized again does
the rest and reports the counts of the whole. `run` returns only when every task has completed, else raises: a
stage commits its output only after that.
`ExecutorResource.from_env()` is the environment mapping that definitions.py uses (PRETRAIN_EXECUTOR, ...):
pydantic validates the variables (resources/executor_env.py, which `pretrain materialize` reads before Dagster
loads, to start the local helpers early), as it does the recipe and the trainer's run.json.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

from dagster import ConfigurableResource

from pipelines.runner import LocalRunner, run_resumable, tasks_for
from resources.executor_env import ExecutorEnvironment, Kind, local_workers

class ExecutorResource(ConfigurableResource):
    """How datatrove pipelines run: `local`, `ray` or `slurm` (see the module doc)."""

    kind: Kind = "local"
    # Tasks running at once. local: 1 = in this process, None = the CPUs the run was given (given_cpus, when it runs);
    # ray/slurm: -1 (or None) = no limit.
    workers: int | None = None
    tasks: int | None = None  # tasks per stage, for every stage; None: each stage's own count (tasks_for)
    cpus_per_task: int = 1  # ray and slurm: CPUs reserved for each task
    mem_per_cpu_gb: float = 2.0  # ray and slurm: memory reserved per CPU
    ray_address: str | None = None  # "HOST:PORT" of the cluster's head, "auto", or None for an in-process cluster
    slurm_partition: str | None = None  # required for kind "slurm"
    slurm_time: str = "12:00:00"  # sbatch --time of each task
    slurm_job_name: str = "pretrain"
    slurm_qos: str | None = None  # sbatch --qos; None leaves the cluster's default
    slurm_env_command: str | None = None  # run before each task; default: activate the venv running this process
    slurm_sbatch_args: dict[str, str] = {}  # further #SBATCH lines, e.g. {"account": "llm"}
    slurm_poll_seconds: float = 30.0  # how often squeue is asked whether the job array is still there

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ExecutorResource":
        """The resource as the environment configures it: PRETRAIN_EXECUTOR=local|ray|slurm and its settings
        (ExecutorEnvironment lists the variables). A bad value is refused naming its variable."""
        resource = cls(**ExecutorEnvironment.read(os.environ if env is None else env).resource_fields())
        resource.validate()
        return resource

    def validate(self) -> None:
        """Refuse a configuration that cannot run, naming the field (before any work starts)."""
        if self.workers is not None and self.workers < 1 and not (self.workers == -1 and self.kind != "local"):
            raise ValueError(f"executor.workers: must be >= 1 (or -1 for no limit with ray/slurm), got {self.workers}")
        if self.tasks is not None and self.tasks < 1:
            raise ValueError(f"executor.tasks: must be >= 1 (or unset: each stage's own count), got {self.tasks}")
        if self.cpus_per_task < 1:
            raise ValueError(f"executor.cpus_per_task: must be >= 1, got {self.cpus_per_task}")
        if self.mem_per_cpu_gb <= 0:
            raise ValueError(f"executor.mem_per_cpu_gb: must be > 0, got {self.mem_per_cpu_gb}")
        if self.kind == "slurm" and not self.slurm_partition:
            raise ValueError("executor.slurm_partition: required for kind 'slurm' (PRETRAIN_SLURM_PARTITION)")

    def setup_for_execution(self, context) -> None:
        """Dagster calls this when a run that uses the resource starts: the local helper processes start then, in
        the background, while the run loads its inputs (pipelines/runner.py's WorkerPool)."""
        if self.kind == "local" and self.local_workers() > 1:
            LocalRunner(workers=self.local_workers()).warm()

    def local_workers(self) -> int:
        """How many tasks the local executor runs at once: `workers`, else the CPUs the run was given."""
        return local_workers(self.workers)

    def tasks_for(self, default: int) -> int:
        """The task count for a stage whose natural count is `default` (e.g. its input files): the resource's
        `tasks` when set, else `default` (at least 1)."""
        return tasks_for(self.tasks, default)

    def run(self, pipeline: list, *, logging_dir: str | Path, tasks: int = 1) -> Path:
        """Run the steps as `tasks` datatrove tasks (each reads its share of the input), resuming the tasks a
        previous run in the same logging_dir did not finish (see the module doc).

        Returns the path of the merged stats.json of every task (per step: name and stats), which is what a
        stage reads its counts from whatever the kind. Raises when any task did not complete."""
        self.validate()
        logging_dir = Path(logging_dir)
        if self.kind == "local":
            return LocalRunner(workers=self.local_workers()).run(pipeline, logging_dir=logging_dir, tasks=tasks)

        def launch() -> None:  # the incomplete tasks, on the cluster
            if self.kind == "ray":
                self._run_on_ray(self.ray_executor(pipeline, logging_dir=logging_dir, tasks=tasks))
            else:
                self._run_on_slurm(self.slurm_executor(pipeline, logging_dir=logging_dir, tasks=tasks))

        return run_resumable(launch, logging_dir=logging_dir, tasks=tasks, label=self.kind)

    # -- Ray ---------------------------------------------------------------------------------------------------
    def ray_executor(self, pipeline: list, *, logging_dir: str | Path, tasks: int):
        from datatrove.executor import RayPipelineExecutor

        return RayPipelineExecutor(
            pipeline,
            tasks=tasks,
            workers=tasks if self.workers in (None, -1) else min(self.workers, tasks),
            logging_dir=str(logging_dir),
            skip_completed=True,
            cpus_per_task=self.cpus_per_task,
            mem_per_cpu_gb=self.mem_per_cpu_gb,
        )

    def _run_on_ray(self, executor) -> None:
        import ray

        # Connect only when this process is not a Ray driver already, and then disconnect after the run: a
        # stage run inside someone else's Ray session must not end it.
        connected_here = not ray.is_initialized()
        if connected_here:
            ray.init(address=self.ray_address, include_dashboard=False, log_to_driver=False)
        try:
            executor.run()
        finally:
            if connected_here:
                ray.shutdown()

    # -- Slurm -------------------------------------------------------------------------------------------------
    def slurm_executor(self, pipeline: list, *, logging_dir: str | Path, tasks: int):
        """The SlurmPipelineExecutor for this configuration (nothing is submitted until its run())."""
        from resources.slurm_array import SlurmArrayExecutor

        sbatch_args = dict(self.slurm_sbatch_args)
        mem = self.mem_per_cpu_gb
        if not float(mem).is_integer():  # datatrove writes "<int>G": give a fraction in megabytes instead
            sbatch_args.setdefault("mem-per-cpu", f"{math.ceil(mem * 1024)}M")
        logging_dir = Path(logging_dir)
        return SlurmArrayExecutor(
            pipeline,
            tasks=tasks,
            workers=-1 if self.workers is None else self.workers,
            time=self.slurm_time,
            partition=self.slurm_partition,
            cpus_per_task=self.cpus_per_task,
            mem_per_cpu_gb=max(1, int(mem)),
            job_name=self.slurm_job_name,
            qos=self.slurm_qos,
            # The compute nodes run the same environment, from the shared filesystem.
            env_command=self.slurm_env_command or f"source {Path(sys.prefix) / 'bin' / 'activate'}",
            sbatch_args=sbatch_args,
            logging_dir=str(logging_dir),
            slurm_logs_folder=str(logging_dir / "slurm_logs"),
            skip_completed=True,
        )

    def _run_on_slurm(self, executor) -> None:
        if shutil.which("sbatch") is None:
            raise RuntimeError("executor (slurm): sbatch is not on PATH; run from a Slurm login node, or set kind 'local'")
        executor.run()  # sbatch: the job array (only the incomplete tasks)
        # datatrove returns once submitted; a stage needs the outputs, so wait for the array to leave the queue.
        while _squeue_has(executor.job_id):
            time.sleep(self.slurm_poll_seconds)


def _squeue_has(job_id) -> bool:
    """Whether Slurm still lists any task of the job (pending or running)."""
    result = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%i"], capture_output=True, text=True)
    # squeue exits non-zero with "Invalid job id" once a finished job has been purged from its memory.
    return result.returncode == 0 and bool(result.stdout.strip())

