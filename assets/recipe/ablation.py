"""The recipe's `ablation` section: filter ablations as proxy runs, one arm per variant of a source's filter.

    ablation: {sources: [web], tokens: 65536, repeats: 2, leave_one_out: [perplexity],
               sweep: {setting: quality_model.threshold, values: [0.3, 0.5]}}

What the filter steps and settings it names must be is checked against the whole recipe (assets/recipe/__init__.py);
the assets are assets/curation/ablation.py's.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from assets.recipe.training import split_launch
from trainer.reporting.config import ZeroShotTask


class ThresholdSweep(BaseModel):
    """One ablation arm per value of one filter setting, `<step>.<field>` of a source's filter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    setting: str = Field(description="a filter setting, e.g. quality_model.threshold or perplexity.max_perplexity")
    values: list[float | int | str] = Field(min_length=1)

    @field_validator("setting")
    @classmethod
    def _step_dot_field(cls, setting: str) -> str:
        if not re.fullmatch(r"[a-z0-9_]+\.[a-z0-9_]+", setting):
            raise ValueError(f"give a filter step and one of its fields, e.g. quality_model.threshold; got {setting!r}")
        return setting


class AblationSection(BaseModel):
    """Filter ablations (assets/curation/ablation.py): per source, proxy runs of equal tokens and seed on its raw
    text and on its curated text (and, if asked, one arm per filter step left out and one per value of a setting),
    each scored on the `reference` section's val_files and on zero-shot tasks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sources: list[str] = Field(min_length=1, description="the sources whose filters are judged")
    tokens: int = Field(65536, ge=1, description="training tokens per arm (every arm the same)")
    seed: int = Field(0, description="the first seed; repeats take seed, seed + 1, ...")
    repeats: int = Field(1, ge=1, description="seeds per arm: from 2 on, the run-to-run spread and a verdict")
    proxy: dict[str, Any] = Field({}, description="stage fields merged over training.main and mixing.proxy")
    leave_one_out: bool | list[str] = Field(False, description="one arm per filter step left out (true: every "
                                            "step the source's filter sets; or a list of steps)")
    sweep: ThresholdSweep | None = None
    tasks: list[ZeroShotTask] | None = Field(None, description="zero-shot tasks (None: evaluation.tasks)")
    limit: int = Field(50, ge=1, description="items per zero-shot task")
    eval_batches: int = Field(8, ge=1, description="global batches of each reference text per evaluation")

    @model_validator(mode="after")
    def _check(self):
        split_launch("ablation.proxy", self.proxy)
        return self
