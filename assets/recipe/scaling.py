"""The recipe's `scaling` section: the scaling-law ladder's model sizes and token budgets, and how N is counted.

    scaling:
      sizes:  [{d_model: 32, n_layers: 1, n_heads: 2}, ..., {d_model: 96, n_layers: 2, n_heads: 4}]   # >= 5
      tokens: [65536, 131072, 262144]            # >= 3 budgets; or tokens_per_param: [10, 20, 40]
      proxy:  {metrics: {downstream_interval: 0}} # stage fields merged over training.main
      held_out: true                             # fits without the largest size, and without the largest budget
      bootstrap: 200

The rungs, the fit and the predictions are the scaling assets' (assets/scaling/; how N, D, C and the loss are
counted: assets/scaling/section.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from assets.recipe.training import split_launch
from trainer.model.config import ModelConfig


class Size(BaseModel):
    """One model shape of the ladder; the rest of the model (vocabulary, d_ff rule, ...) is training.main's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    d_model: int = Field(ge=8)
    n_layers: int = Field(ge=1)
    n_heads: int = Field(ge=1)
    n_kv_heads: int | None = Field(None, ge=1, description="grouped-query attention (None: as many as n_heads)")

    @model_validator(mode="after")
    def _a_model_shape(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"head dim d_model/n_heads = {self.d_model // self.n_heads} must be even (RoPE)")
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        return self

    @property
    def name(self) -> str:
        kv = f"-kv{self.n_kv_heads}" if self.n_kv_heads is not None else ""
        return f"d{self.d_model}-l{self.n_layers}-h{self.n_heads}{kv}"

    def model(self) -> dict:
        """The model fields the size sets over training.main's (n_kv_heads always: main's may not divide n_heads)."""
        return {"d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads,
                "n_kv_heads": self.n_kv_heads}


class ScalingSection(BaseModel):
    """The scaling-law ladder (assets/scaling/): proxies of every size at every token budget, fitted to
    L(N, D) = E + A/N^alpha + B/D^beta."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sizes: list[Size] = Field(min_length=5, description="model shapes, at least 5")
    tokens: list[int] | None = Field(None, min_length=3, description="token budgets, at least 3")
    tokens_per_param: list[float] | None = Field(None, min_length=3, description=(
        "token budgets as multiples of each size's N (at least 3), instead of `tokens`"))
    seed: int = Field(0, description="every rung's seed, and the bootstrap's")
    proxy: dict[str, Any] = Field({}, description="stage fields merged over training.main (schedule, batch, launch)")
    held_out: bool = Field(True, description=(
        "also fit without every rung of the largest size, and separately without each size's largest budget, and "
        "report the error on each rung left out"))
    bootstrap: int = Field(200, ge=0, description="resamples for the parameters' intervals")

    @model_validator(mode="after")
    def _check(self):
        if (self.tokens is None) == (self.tokens_per_param is None):
            raise ValueError("scaling: give the token budgets as `tokens` or as `tokens_per_param`, one of them")
        budgets = self.tokens if self.tokens is not None else self.tokens_per_param
        field = "tokens" if self.tokens is not None else "tokens_per_param"
        for i, value in enumerate(budgets):
            if not value > 0:
                raise ValueError(f"scaling.{field}[{i}]: a budget must be > 0, got {value!r}")
        if len(set(budgets)) != len(budgets):
            raise ValueError(f"scaling.{field}: a budget is given twice ({budgets})")
        names = [s.name for s in self.sizes]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(f"scaling.sizes[{i}]: {name} is given twice")
        split_launch("scaling.proxy", self.proxy)
        return self


def scaling_params(settings: dict) -> int:
    """N of a stage's run-config fields: every parameter (the trainer's count,
    trainer.model.config.ParameterCount.total)."""
    return ModelConfig(**settings.get("model", {})).parameter_count().total
