"""The environment variables that configure the executor resource (PRETRAIN_EXECUTOR, ...), validated by pydantic.

    env = ExecutorEnvironment.read(os.environ)     # raises naming a bad variable
    fields = env.resource_fields()                 # ExecutorResource(**fields)

Apart from resources/executor.py because it imports no Dagster: `pretrain materialize` reads it first thing, to
start the local executor's helper processes while Dagster and the code location load (assets/cli/materialize.py).
"""

from __future__ import annotations

from typing import Literal, Mapping, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Kind = Literal["local", "ray", "slurm"]
KINDS = get_args(Kind)


class ExecutorEnvironment(BaseModel):
    """The variables ExecutorResource.from_env reads; one unset or empty leaves the resource's default."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: Kind = Field("local", alias="PRETRAIN_EXECUTOR")
    workers: int | None = Field(None, alias="PRETRAIN_EXECUTOR_WORKERS")  # None: 1 for local, else -1 (no limit)
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
        fields.setdefault("workers", 1 if self.kind == "local" else -1)
        if self.slurm_account:
            fields["slurm_sbatch_args"] = {"account": self.slurm_account}
        return fields
