"""What the two scaling assets and the training stages share: the keys, the rungs (one proxy run per model size
and token budget of the recipe's `scaling` section, assets/recipe/scaling.py), the proxy's run settings, how D,
the compute and the loss of a run are counted, and the result files.

The counts, the same for the ladder, the fit and every stage's prediction:
- N is every parameter, the input embedding and the output head included (Hoffmann et al. 2022's count;
  trainer.model.config.ParameterCount.total, the one count the planner and MFU read too). Not Kaplan et al.'s
  non-embedding count: at a ladder's sizes the vocabulary's two matrices are 70-95% of the weights and learn most
  of what the short runs learn (their losses sit near the unigram entropy), so leaving them out misstates how the
  model grows. Measured on recipes/ladder.yaml's rungs: with the non-embedding N the largest size, held out, was
  predicted 2.7-6.4% off, with every parameter 0.8-3.9% (README, Scaling ladder); at large scale, where the
  embedding is a small share, the two counts agree (Pearce & Song 2024, Porian et al. 2024: Kaplan's count is much
  of why its exponents differ from Chinchilla's).
- D is the tokens the run trained on (the trainer's own count).
- C = 6·N·D, the compute axis of the fit and of its compute-optimal N and D (trainer/planner/scaling_law.py);
  the full training FLOPs (embedding head and attention included) are recorded beside it.
- The loss is the final validation loss averaged over the domains with the run's mixture weights: the loss of
  the distribution it trained on, the same for the proxies and the stage the fit predicts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dagster import AssetKey, StaticPartitionsDefinition

from assets.recipe.scaling import Size, scaling_params
from assets.recipe.training import merge, proxy_run
from trainer.config import BatchConfig
from trainer.model.config import ModelConfig
from trainer.planner.plan import ModelShape, flops_per_token

if TYPE_CHECKING:
    from assets.recipe import Recipe

RESULT_FILE = "result.json"
FIT_FILE = "fit.json"  # ScalingFit.to_json(): what `pretrain plan --budget` reads


def ladder_key() -> AssetKey:
    return AssetKey(["scaling", "ladder"])


def fit_key() -> AssetKey:
    return AssetKey(["scaling", "fit"])


@dataclass(frozen=True)
class Rung:
    """One proxy run: a model size at a token budget (a partition of scaling/ladder)."""

    name: str  # the partition key: "<size>-t<tokens>"
    size: Size
    tokens: int
    n_params: int  # N: every parameter (scaling_params)

    @property
    def settings(self) -> dict:
        """What this rung sets over the ladder's common proxy settings (the partition's own version)."""
        return {"model": self.size.model(), "train_tokens": self.tokens}


def proxy_settings(recipe: Recipe) -> dict:
    """The ladder's common run-config fields: training.main with scaling.proxy merged over it and the section's seed
    (assets/recipe/training.py proxy_run); each rung then sets its model size and train_tokens."""
    return proxy_run(recipe.training.main, ("scaling.proxy", recipe.scaling.proxy), seed=recipe.scaling.seed)[0]


def proxy_launch(recipe: Recipe) -> dict:
    """How a rung's trainer is started: training.main's `launch` with scaling.proxy's over it (not versioned)."""
    return proxy_run(recipe.training.main, ("scaling.proxy", recipe.scaling.proxy))[1].overrides()


def rung_settings(recipe: Recipe, rung: Rung) -> dict:
    return merge(proxy_settings(recipe), rung.settings)


def train_flops(settings: dict, tokens: float) -> float:
    """The full training FLOPs of `tokens` (embedding head and attention included: the planner's count)."""
    model = ModelConfig(**settings.get("model", {}))
    return flops_per_token(ModelShape.from_model_config(model, seq_len=_seq_len(settings))) * tokens


def compute(n_params: float, tokens: float) -> float:
    """C = 6·N·D, the fit's compute axis."""
    return 6.0 * n_params * tokens


def rungs(recipe: Recipe) -> list[Rung]:
    """Every rung, by size then budget, in the recipe's order. A budget in tokens per parameter is rounded up to
    whole optimizer steps (global_batch × seq_len tokens)."""
    section = recipe.scaling
    base = proxy_settings(recipe)
    step = _step_tokens(base)
    out = []
    for size in section.sizes:
        n = scaling_params(merge(base, {"model": size.model()}))
        budgets = section.tokens if section.tokens is not None else [
            -(-round(m * n) // step) * step for m in section.tokens_per_param]
        out += [Rung(name=f"{size.name}-t{int(d)}", size=size, tokens=int(d), n_params=n) for d in budgets]
    return out


def largest_size(runs: list[Rung]) -> list[Rung]:
    """Every rung of the largest model size (most N): the held-out size, which the rest of the ladder predicts."""
    top = max(r.n_params for r in runs)
    return [r for r in runs if r.n_params == top]


def largest_budget(runs: list[Rung]) -> list[Rung]:
    """Each size's rung of the most tokens: the held-out budget, which each size's shorter runs predict."""
    most = {}
    for r in runs:
        if r.n_params not in most or r.tokens > most[r.n_params].tokens:
            most[r.n_params] = r
    return [r for r in runs if most[r.n_params] is r]


def smallest(runs: list[Rung]) -> Rung:
    """The rung of least compute."""
    return min(runs, key=lambda r: (compute(r.n_params, r.tokens), r.n_params))


def partitions(recipe: Recipe) -> StaticPartitionsDefinition:
    return StaticPartitionsDefinition([r.name for r in rungs(recipe)])


def weighted_loss(val_loss: dict[str, float], weights: dict[str, float]) -> float | None:
    """The validation loss averaged over the domains with the mixture's weights (renormalised over the domains
    that hold out documents); None when no weighted domain has a validation loss."""
    held = {k: w for k, w in weights.items() if k in val_loss and w > 0}
    if not held:
        return None
    return sum(val_loss[k] * w for k, w in held.items()) / sum(held.values())


def write_result(out_dir, payload: dict) -> None:
    (out_dir / RESULT_FILE).write_text(json.dumps(payload, indent=1, sort_keys=True))


def _step_tokens(settings: dict) -> int:
    return int(settings.get("batch", {}).get("global_batch", BatchConfig().global_batch)) * _seq_len(settings)


def _seq_len(settings: dict) -> int:
    return int(settings.get("batch", {}).get("seq_len", BatchConfig().seq_len))
