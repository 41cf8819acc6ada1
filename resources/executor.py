"""The datatrove executor resource: where a stage's pipeline steps run. Assets never choose; definitions.py does.

    stats_path = executor.run(steps, logging_dir=work / "logs", tasks=2)

kind "local" (the default) runs datatrove's LocalPipelineExecutor on this machine. With one worker it runs the
tasks in this process, one after another (no process start-up, no pickling of the steps); with more it uses a
forkserver pool, which needs the `if __name__ == "__main__":` guard in any script that ends up here (STACK.md).
Slurm and Ray are further kinds of this one resource, so moving a stage to a cluster changes no asset code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from dagster import ConfigurableResource


class ExecutorResource(ConfigurableResource):
    """How datatrove pipelines run: `local` (tasks in this process or a worker pool)."""

    kind: Literal["local"] = "local"
    workers: int = 1  # processes running tasks at once; 1 = in this process

    def run(self, pipeline: list, *, logging_dir: str | Path, tasks: int = 1) -> Path:
        """Run the steps as `tasks` datatrove tasks (each reads its share of the input files).

        Returns the path of the run's merged stats.json (per step: name and stats), which is what a stage
        reads its counts from whatever the kind."""
        if tasks < 1:
            raise ValueError(f"executor: tasks must be >= 1, got {tasks}")
        if self.workers < 1:
            raise ValueError(f"executor: workers must be >= 1, got {self.workers}")
        logging_dir = Path(logging_dir)
        if self.kind == "local":
            from datatrove.executor import LocalPipelineExecutor

            executor = LocalPipelineExecutor(
                pipeline,
                tasks=tasks,
                workers=min(self.workers, tasks),
                logging_dir=str(logging_dir),
                skip_completed=False,  # every call is a fresh output folder: never resume a stale one
            )
            executor.run()
        else:  # pragma: no cover - pydantic refuses other kinds
            raise ValueError(f"executor: unknown kind {self.kind!r}")
        stats = logging_dir / "stats.json"
        if not stats.is_file():
            raise RuntimeError(f"executor: the run left no {stats}; see the task logs in {logging_dir}/logs")
        return stats
