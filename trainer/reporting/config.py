"""What a run reports and how often: a run.json's `metrics` section, and the zero-shot tasks it can score."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainer.base_config import RunConfigSection


# The zero-shot tasks, by lm-evaluation-harness's names: the in-training evaluator (trainer/evaluation/evaluate.py) and the
# evaluation assets' lm-eval runs (trainer/evaluation/harness.py) both know each of them.
ZeroShotTask = Literal["lambada_openai", "hellaswag", "arc_easy", "arc_challenge", "piqa", "winogrande", "boolq", "mmlu"]


class MetricsConfig(RunConfigSection):
    log_interval: int = 10  # steps between progress lines / metric records
    eval_interval: int = 0  # steps between per-domain validation losses (0 = only at the end)
    eval_batches: int = 2  # global batches of held-out data per domain per evaluation
    tensorboard: bool = True
    peak_flops: float | None = None  # overrides the device table for MFU
    # Zero-shot tasks (trainer.evaluation.evaluate) every downstream_interval steps and at the end (0 = off), downstream_limit
    # items each, from the benchmark folder downstream_benchmarks with data.tokenizer (a training asset gives both).
    downstream_interval: int = Field(0, ge=0)
    downstream_tasks: list[ZeroShotTask] = ["lambada_openai", "hellaswag", "arc_easy", "piqa"]
    downstream_limit: int = Field(50, ge=1)
    downstream_benchmarks: str | None = None

    def _check(self) -> None:
        if self.log_interval < 1:
            raise ValueError(f"metrics.log_interval must be >= 1, got {self.log_interval}")
        if self.eval_interval < 0 or self.eval_batches < 0:
            raise ValueError("metrics.eval_interval and metrics.eval_batches must be >= 0")
