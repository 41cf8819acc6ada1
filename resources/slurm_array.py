"""The datatrove Slurm executor the executor resource submits: its job array only.

datatrove's SlurmPipelineExecutor also submits a job that merges the tasks' stats once the array has succeeded
(`--dependency=afterok`). After a failed task that job can never start and sits pending in the queue for good,
and a resumed run would add another. ExecutorResource.run merges every task's stats itself (old and new, after
a resume), so this executor submits the array and nothing else.

This module imports datatrove and nothing of Dagster: each array task unpickles the executor, and so imports
the module of its class, on the compute node.
"""

from __future__ import annotations

from datatrove.executor import SlurmPipelineExecutor


class SlurmArrayExecutor(SlurmPipelineExecutor):
    """datatrove's Slurm executor without its stats-merging job (see the module doc)."""

    def launch_merge_stats(self) -> None:
        pass
