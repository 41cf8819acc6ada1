"""Data budgets: how many times a run reads each source (its epochs: tokens drawn ÷ tokens available), and the
bound `mixing.max_epochs` puts on it (Muennighoff et al.: up to ~4 epochs of repeated data are nearly as good as
fresh data; many more are wasted).

    budget = stage_budget("training/main", folders, weights, settings, min_doc_tokens=0, max_epochs=4.0)
    budget["epochs"]            # {"c4": 0.87, "math": 0.12}: the stage's own draws, on its own weights
    caps = max_weights(available, train_tokens=262144, max_epochs=4.0)   # the search's per-source weight caps

A stage's epochs are the trainer's own count (MixtureDataset.epochs) of the samples its train_tokens make, on
its sequence length and its length filter (a long-context stage reads only its long documents): counted per
stage, not summed over the stages before it. The search scores 100,000 mixtures, too many to open a loader
for each: its caps are the same ratio in closed form, weight × train_tokens ÷ tokens available.
"""

from __future__ import annotations

from pathlib import Path

from dagster import Failure

from assets.recipe import Recipe
from assets.recipe.mixing import MixingSection
from trainer.config import BatchConfig

# What a recipe without a mixing section gets: mixing.max_epochs's default.
DEFAULT_MAX_EPOCHS = MixingSection.model_fields["max_epochs"].default


def max_epochs_of(recipe: Recipe) -> float:
    return recipe.mixing.max_epochs if recipe.mixing is not None else DEFAULT_MAX_EPOCHS


def max_weights(available: dict[str, int], *, train_tokens: int, max_epochs: float) -> dict[str, float]:
    """Each source's greatest weight that draws it at most max_epochs times in train_tokens."""
    return {name: max_epochs * tokens / train_tokens for name, tokens in available.items()}


def mixture_epochs(weights: dict[str, float], available: dict[str, int], *, train_tokens: int) -> dict[str, float]:
    """Epochs of each source when train_tokens are drawn on `weights` (normalised), in closed form."""
    total = sum(weights.values())
    return {name: round(train_tokens * w / total / available[name], 4) if w else 0.0
            for name, w in sorted(weights.items())}


def packed_tokens(manifest: dict) -> int:
    """A packed output's training tokens, from its manifest's index (pipelines/tokenization/packed_format.py)."""
    return int(manifest["packing"]["splits"]["train"]["tokens"])


def run_epochs(where: str, folders: dict[str, Path], weights: dict[str, float], settings: dict, *,
               min_doc_tokens: int = 0) -> dict:
    """{"epochs": ..., "tokens_available": ...}: what a run of `settings` (train_tokens, batch.seq_len) draws from
    each source, as the trainer's loader counts it, and the tokens each source has for it. A Failure for what
    the trainer would fail on at its start (an empty source, no document as long as min_doc_tokens)."""
    from trainer.data.mixture import DataConfig, MixtureDataset
    seq_len = settings.get("batch", {}).get("seq_len", BatchConfig().seq_len)
    try:
        data = MixtureDataset(DataConfig(shards={k: str(v) for k, v in folders.items()}, weights=weights,
                                         seq_len=seq_len, verify=False, min_doc_tokens=min_doc_tokens))
    except ValueError as exc:
        raise Failure(description=f"{where}: {exc}", allow_retries=False) from None
    epochs = data.epochs(-(-settings["train_tokens"] // seq_len))
    return {"epochs": {name: round(e, 4) for name, e in epochs.items()},
            "tokens_available": {name: source.tokens for name, source in zip(data.names, data.sources)}}


def stage_budget(where: str, folders: dict[str, Path], weights: dict[str, float], settings: dict, *,
                 min_doc_tokens: int, max_epochs: float) -> dict:
    """run_epochs and max_epochs; a Failure naming the source when one is over max_epochs (called before the
    stage launches anything)."""
    budget = run_epochs(where, folders, weights, settings, min_doc_tokens=min_doc_tokens)
    epochs, available = budget["epochs"], budget["tokens_available"]
    over = {name: e for name, e in epochs.items() if e > max_epochs}
    if over:
        name = max(over, key=over.get)
        kind = f"tokens in documents of {min_doc_tokens} or more" if min_doc_tokens else "training tokens"
        raise Failure(description=(
            f"{where} would read source {name} {over[name]:.1f} times (epochs; max_epochs is {max_epochs:g}): "
            f"{settings['train_tokens']:,} tokens at weight {weights[name] / sum(weights.values()):.3f}, over its "
            f"{available[name]:,} {kind}. Give {name} less weight, train on fewer tokens, add data, or set "
            "mixing.max_epochs higher to allow it"), allow_retries=False)
    return {**budget, "max_epochs": max_epochs}
