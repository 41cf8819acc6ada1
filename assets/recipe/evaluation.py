"""The recipe's `evaluation` section: what each training stage's final checkpoint is measured on."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from trainer.reporting.config import ZeroShotTask


class EvaluationSection(BaseModel):
    """What the evaluation assets measure on each stage's final checkpoint: losses (trainer/evaluation/evaluate.py), zero-shot tasks
    by lm-evaluation-harness (trainer/evaluation/harness.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: list[ZeroShotTask] = Field(["lambada_openai", "hellaswag", "arc_easy", "piqa"],
                                      description="lm-evaluation-harness tasks (trainer/evaluation/harness.py)")
    limit: int | None = Field(200, ge=1, description="items per task (None: all)")
    benchmarks: str = Field("benchmarks", description="the benchmark folder, relative to base_dir")
    canary: str | None = Field("benchmarks/wikitext-2-test.txt", description="fixed text whose loss is tracked")
    canary_sequences: int = Field(8, ge=1)
    val_sequences: int = Field(16, ge=1, description="held-out sequences per domain")
