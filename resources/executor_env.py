"""The environment variables that configure the executor resource (PRETRAIN_EXECUTOR, ...), validated by pydantic.

    env = ExecutorEnvironment.read(os.environ)     # raises naming a bad variable
    fields = env.resource_fields()                 # ExecutorResource(**fields)

Apart from resources/executor.py because it imports no Dagster: `pretrain materialize` reads it first thing, to
start the local executor's helper processes while Dagster and the code location load (assets/cli/materialize.py).
"""

from __future__ import annotations

import os
from typing import Literal, Mapping, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Kind = Literal["local", "ray", "slurm"]
KINDS = get_args(Kind)
# The CPUs a run was given, when it shares the machine: `pretrain materialize` sets it for a run that may overlap
# others (cores // jobs, as it shares threads: assets/runs/parallel.py), and the test suite for each xdist worker.
# Unset: every CPU this process may use. The local executor runs that many tasks at once unless
# PRETRAIN_EXECUTOR_WORKERS says otherwise.
CPUS_ENV = "PRETRAIN_CPUS"


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's or `taskset`'s share, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def given_cpus(env: Mapping[str, str] | None = None) -> int:
    """The CPUs this run was given: PRETRAIN_CPUS when set (a share of the machine), else available_cpus()."""
    raw = (os.environ if env is None else env).get(CPUS_ENV)
    return count_in(CPUS_ENV, raw, "CPUs") if raw else available_cpus()


def local_workers(workers: int | None) -> int:
    """How many tasks the local executor runs at once: `workers` (PRETRAIN_EXECUTOR_WORKERS) when set, else the CPUs
    the run was given."""
    return workers if workers is not None else given_cpus()


def count_in(variable: str, raw: str, what: str) -> int:
    """The value `raw` of a count variable (PRETRAIN_CPUS, PRETRAIN_JOBS), else a ValueError naming it."""
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{variable}: expected a whole number of {what}, 1 or more; got {raw!r}")
    return count


class ExecutorEnvironment(BaseModel):
    """The variables ExecutorResource.from_env reads; one unset or empty leaves the resource's default."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: Kind = Field("local", alias="PRETRAIN_EXECUTOR")
    # None: local runs as many tasks at once as the run was given CPUs (given_cpus, when it runs); else -1 (no limit)
    workers: int | None = Field(None, alias="PRETRAIN_EXECUTOR_WORKERS")
    tasks: int | None = Field(None, alias="PRETRAIN_EXECUTOR_TASKS")  # None: each stage's own count
    cpus_per_task: int | None = Field(None, alias="PRETRAIN_EXECUTOR_CPUS_PER_TASK")
    mem_per_cpu_gb: float | None = Field(None, alias="PRETRAIN_EXECUTOR_MEM_PER_CPU_GB")
    ray_address: str | None = Field(None, alias="PRETRAIN_RAY_ADDRESS")
    slurm_partition: str | None = Field(None, alias="PRETRAIN_SLURM_PARTITION")
    slurm_time: str | None = Field(None, alias="PRETRAIN_SLURM_TIME")
    slurm_job_name: str | None = Field(None, alias="PRETRAIN_SLURM_JOB_NAME")
    slurm_qos: str | None = Field(None, alias="PRETRAIN_SLURM_QOS")
    slurm_env_command: str | None = Field(None, alias="PRETRAIN_SLURM_ENV_COMMAND")
    slurm_account: str | None = Field(None, alias="PRETRAIN_SLURM_ACCOUNT")  # an #SBATCH --account line

    @classmethod
    def read(cls, env: Mapping[str, str]) -> "ExecutorEnvironment":
        """Validate the mapping's variables; a bad one is named: "PRETRAIN_EXECUTOR_WORKERS: 'two' is not ..."."""
        names = {field.alias for field in cls.model_fields.values()}
        try:
            return cls.model_validate({name: value for name, value in env.items() if name in names and value})
        except ValidationError as exc:
            error = exc.errors()[0]
            problem = {"literal_error": f"is not one of {', '.join(KINDS)}", "int_parsing": "is not an integer",
                       "float_parsing": "is not a number"}.get(error["type"], error["msg"])
            raise ValueError(f"{error['loc'][0]}: {error['input']!r} {problem}") from None

    def resource_fields(self) -> dict:
        """The ExecutorResource fields the environment sets."""
        fields = self.model_dump(exclude_none=True, exclude={"slurm_account"})
        if self.kind != "local":
            fields.setdefault("workers", -1)
        if self.slurm_account:
            fields["slurm_sbatch_args"] = {"account": self.slurm_account}
        return fields
