"""How a run is split over GPUs: a run.json's `parallel` (tensor, pipeline and sequence parallelism) and
`deepspeed` (the ZeRO stage and its options) sections."""

from __future__ import annotations

from typing import Literal
from pydantic import field_validator

from trainer.base_config import RunConfigSection


class ParallelConfig(RunConfigSection):
    """How the model is split over ranks beyond data parallelism (sequence parallelism is batch.sequence_parallel)."""

    # Pipeline stages (trainer.parallel.pipeline, DeepSpeed's PipelineEngine, 1F1B): every `pipeline` ranks hold one copy of
    # the model, the transformer blocks split evenly between them; the micro-batches of a step (global batch /
    # (micro_batch × data-parallel size)) flow through them. 1: no pipeline.
    pipeline: int = 1
    # Tensor parallelism (trainer.parallel.tensor, DeepSpeed AutoTP): every `tensor` consecutive ranks (one node's
    # GPUs: it all-reduces twice per block in forward and backward) split each block's projections, attention by
    # heads and the MLP by its hidden units; they read the same samples. 1: none.
    tensor: int = 1

    def _check(self) -> None:
        for name in ("pipeline", "tensor"):
            if getattr(self, name) < 1:
                raise ValueError(f"parallel.{name} must be >= 1, got {getattr(self, name)}")


class DeepSpeedConfig(RunConfigSection):
    zero_stage: Literal[0, 1, 2, 3] = 0
    # bf16 weights and activations with fp32 master weights in the optimizer, or fp32 throughout. "auto":
    # bf16 where the device computes it natively (trainer.parallel.precision), fp32 elsewhere; true / false force it.
    bf16: bool | Literal["auto"] = "auto"

    @field_validator("zero_stage", "bf16", mode="before")
    @classmethod
    def _choices(cls, value, info):
        # Before the types, in run.json's words: a Literal compares by == (true would pass as stage 1), and a
        # union's own error would name its members rather than the field.
        if info.field_name == "zero_stage" and isinstance(value, bool):
            raise ValueError(f"deepspeed.zero_stage: must be one of [0, 1, 2, 3], got {value!r}")
        if info.field_name == "bf16" and value is not True and value is not False and value != "auto":
            raise ValueError(f'deepspeed.bf16: expected true, false or "auto", got {value!r}')
        return value
