"""The recipe's `mixing` section: the proxy-model mix sweep (RegMix) over the sources, and the data budget.

    mixing: {prior: {web: 0.5, books: 0.5}, candidates: 8, proxy: {train_tokens: 200000, model: {n_layers: 1}}}

Each candidate's proxy is training.main with `proxy` merged over it (assets/recipe/training.py proxy_run); the
mixing assets (assets/mixing/) version and run it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from assets.recipe.training import split_launch
from trainer.data.config import MixingConfig


class MixingSection(BaseModel):
    """The proxy-model sweep (RegMix): candidates around the prior, each trained with `proxy` merged over main."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prior: dict[str, float]
    candidates: int = 8
    concentration: float = 10.0
    seed: int = 0
    target: str = Field("average", description="'average' of the per-domain validation losses, or one source")
    proxy: dict[str, Any] = {}  # stage fields merged over training.main (smaller model, fewer tokens, its launch)
    schedule: str | None = Field(None, description="cron schedule that re-runs the sweep, e.g. '0 3 * * 0'")
    status: Literal["running", "stopped"] = "stopped"  # the schedule's default status
    # The data budget (assets/mixing/budget.py): the most times a training stage may read a source; the search
    # keeps to it on main's tokens and a stage over it fails before launch. Muennighoff et al.: ~4 epochs of
    # repeated data are nearly as good as fresh data, many more are wasted.
    max_epochs: float = Field(4.0, gt=0, description="most epochs of any source in a training stage")

    def engine_config(self) -> MixingConfig:
        return MixingConfig(prior=self.prior, candidates=self.candidates, concentration=self.concentration,
                            seed=self.seed)

    @model_validator(mode="after")
    def _check(self):
        self.engine_config()  # the engine's own checks, messages naming mixing.*
        split_launch("mixing.proxy", self.proxy)
        if self.target != "average" and self.target not in self.prior:
            raise ValueError(f"target must be 'average' or one of {sorted(self.prior)}, got {self.target!r}")
        return self
