"""A training stage's loss, predicted by the latest scaling fit before it trains and checked after.

The fit is read from the Dagster instance and the store (the latest scaling/fit materialization), not declared
as a dependency: the prediction is metadata, never part of the stage's version, so a refit does not make a
trained stage stale. The fit covers a stage that trains what the ladder trained, the one law of one schedule:

- training/main, on the ladder's mixture and sequence length: N its parameters, D its tokens;
- a later stage that continues (continue_from) a covered stage with nothing changed but its tokens: the same run
  going on, D the tokens of the whole chain.

Any other stage (its own mixture, a longer sequence, weights only with a fresh schedule, another LR) learns a
different law than the ladder's: its metadata says which of these it is instead of a number.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from dagster import AssetObservation

from assets.core.upstream import OutputNotFound, latest_output
from assets.scaling.section import FIT_FILE, RESULT_FILE, fit_key, scaling_params, weighted_loss

if TYPE_CHECKING:
    from assets.core.factory import Inputs
    from assets.recipe import Recipe

# A continued stage is the same run going on only if these fields are unchanged (train_tokens of course changes).
SAME_RUN_FIELDS = ("model", "optim", "schedule", "batch")


def predicted(inputs: Inputs, recipe: Recipe, stage: str, weights: dict[str, float]) -> dict:
    """{"predicted_loss", "n_params", "tokens", "fit"} for this stage, or {"reason"} why there is none. Logged,
    and recorded as an observation of the stage's asset before it trains."""
    from trainer.planner.scaling_law import ScalingFit
    try:
        output = latest_output(inputs.context.instance, inputs.store, fit_key())
    except OutputNotFound:
        return {"reason": "no scaling/fit materialized yet"}
    fit = ScalingFit.from_json(json.loads(inputs.store.get_bytes(f"{output.prefix}/{FIT_FILE}")))
    ladder = json.loads(inputs.store.get_bytes(f"{output.prefix}/{RESULT_FILE}"))
    covered = _coverage(recipe, stage, weights, ladder)
    if isinstance(covered, str):
        return {"reason": covered}
    n_params, tokens = covered
    prediction = {"predicted_loss": fit.predict(n_params, tokens), "n_params": n_params, "tokens": tokens,
                  "fit": output.prefix}
    inputs.log.info(f"the scaling fit ({output.prefix}) predicts a final validation loss of "
                    f"{prediction['predicted_loss']:.4f} for {n_params:,} parameters and {tokens:,} tokens")
    inputs.context.log_event(AssetObservation(asset_key=inputs.context.asset_key, metadata={
        "predicted_val_loss": prediction["predicted_loss"], "predicted_for": f"N={n_params:,}, D={tokens:,}",
        "scaling_fit": output.prefix}))
    return prediction


def prediction_metadata(prediction: dict | None, val_loss: dict[str, float], weights: dict[str, float]) -> dict:
    """The stage's metadata: predicted and achieved loss (mixture-weighted validation loss) and the error."""
    if not prediction or "predicted_loss" not in prediction:
        return {"predicted_val_loss": f"none: {(prediction or {}).get('reason', 'not asked')}"}
    achieved = weighted_loss(val_loss, weights)
    out = {"predicted_val_loss": prediction["predicted_loss"], "scaling_fit": prediction["fit"]}
    if achieved is not None:
        error = prediction["predicted_loss"] - achieved
        out.update(achieved_val_loss=achieved, prediction_error=error, prediction_error_pct=100 * abs(error) / achieved)
    return out


def _coverage(recipe: Recipe, stage: str, weights: dict[str, float], ladder: dict) -> tuple[int, int] | str:
    """(N, D) of a stage the fit covers, else why it does not."""
    if ladder.get("weights") != weights:
        return f"not on the ladder's mixture {ladder.get('weights')}: the fit's losses are of that mixture"
    settings = dict(recipe.training.stage_settings())
    run = settings[stage]
    if run.get("batch", {}).get("seq_len") != ladder.get("seq_len"):
        return f"sequence length {run.get('batch', {}).get('seq_len')}, the ladder's is {ladder.get('seq_len')}"
    tokens = int(run["train_tokens"])
    chain = stage
    while chain != "main":
        later = recipe.training.stage(chain)
        how, parent = recipe.training.starts()[chain]
        if how != "continue_from":
            return f"it starts from the weights of {parent} with a fresh optimizer and schedule: not one ladder run"
        if later.min_doc_tokens:
            return f"it trains on documents of {later.min_doc_tokens} tokens or more only"
        changed = [f for f in SAME_RUN_FIELDS if settings[chain].get(f) != settings[parent].get(f)]
        if changed:
            return f"it changes {', '.join(changed)} over {parent}: not the run the ladder's law describes"
        tokens += int(settings[parent]["train_tokens"])
        chain = parent
    return scaling_params(run), tokens
