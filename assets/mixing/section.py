"""What the three mixing assets share: their keys, the recipe's mixing section as they version it, the proxy
run's settings, the JSON result file each of them commits, and how a scheduled tick names its draw."""

import json
from datetime import datetime, timezone

from dagster import AssetKey, DynamicPartitionsDefinition

from assets.recipe import Recipe
from assets.recipe.training import LaunchSettings, proxy_run
from storage.objects import ObjectStore

CANDIDATES = DynamicPartitionsDefinition(name="mix_candidates")
RESULT_FILE = "result.json"
# The run tag naming the scheduled tick whose candidates mix_candidates draws (the schedule sets it); a run
# without it draws the recipe's base sweep (BASE_DRAW).
TICK_TAG = "pretrain/mix_tick"
BASE_DRAW = "base"
_TICK_FORMAT = "%Y-%m-%dT%H:%MZ"


def tick_label(when: datetime) -> str:
    """A scheduled time as a draw's name, to the minute in UTC: '2026-12-06T03:00Z'."""
    return when.astimezone(timezone.utc).strftime(_TICK_FORMAT)


def tick_seed(label: str) -> int | None:
    """The engine's tick for a draw (its time in epoch seconds); None for the base sweep."""
    if label == BASE_DRAW:
        return None
    try:
        return int(datetime.strptime(label, _TICK_FORMAT).replace(tzinfo=timezone.utc).timestamp())
    except ValueError:
        raise ValueError(f"run tag {TICK_TAG}={label!r}: expected a UTC time like 2026-12-06T03:00Z") from None


def candidates_key() -> AssetKey:
    return AssetKey(["mixing", "mix_candidates"])


def sweep_key() -> AssetKey:
    return AssetKey(["mixing", "mix_sweep"])


def weights_key() -> AssetKey:
    return AssetKey(["mixing", "mixture_weights"])


def proxy_settings(recipe: Recipe) -> dict:
    """The proxy's run-config fields: training.main with mixing.proxy merged over it (assets/recipe/training.py proxy_run)."""
    return proxy_run(recipe.training.main, ("mixing.proxy", recipe.mixing.proxy))[0]


def proxy_launch(recipe: Recipe) -> LaunchSettings:
    """How a proxy run is started: training.main's `launch` with mixing.proxy's over it (not versioned)."""
    return proxy_run(recipe.training.main, ("mixing.proxy", recipe.mixing.proxy))[1]


def mixing_section(recipe: Recipe) -> dict:
    """The sweep's section. Each asset's code version hashes what decides its own output: the candidates only the
    draw (draw_section), the sweep all of this, the weights also the target (weights_section); a new proxy
    reruns the sweep, not the draw."""
    # When it runs is not what it makes, nor is the bound on main's epochs (the weights' alone: weights_section).
    m = recipe.mixing.model_dump(mode="json", exclude={"schedule", "status", "max_epochs"})
    m["proxy"] = {k: v for k, v in m["proxy"].items() if k != "launch"}  # nor how its processes start
    return {"mixing": m, "proxy": proxy_settings(recipe)}


def draw_section(recipe: Recipe) -> dict:
    return {k: mixing_section(recipe)["mixing"][k] for k in ("prior", "candidates", "concentration", "seed")}


def weights_section(recipe: Recipe) -> dict:
    """The sweep's settings but the proxy, and the data budget the search keeps to: max_epochs on main's tokens."""
    section = {k: v for k, v in mixing_section(recipe)["mixing"].items() if k != "proxy"}
    return {**section, "max_epochs": recipe.mixing.max_epochs, "main_train_tokens": recipe.training.main["train_tokens"]}


def write_result(out_dir, payload: dict) -> None:
    (out_dir / RESULT_FILE).write_text(json.dumps(payload, indent=1, sort_keys=True))


def read_result(store: ObjectStore, prefix: str) -> dict:
    return json.loads(store.get_bytes(f"{prefix}/{RESULT_FILE}"))


def target_loss(val_loss: dict[str, float], target: str) -> float | None:
    """The loss the mixture search minimizes (`mixing.target`): the mean of the per-source validation losses
    ("average"), or one source's; None when the run has none of it."""
    if target == "average":
        return sum(val_loss.values()) / len(val_loss) if val_loss else None
    return val_loss.get(target)


def mixture_prediction(payload: dict, prefix: str, recipe: Recipe) -> dict | None:
    """What mixing/mixture_weights predicted for the mixture a training stage trains on: the fit's target loss,
    and the run it is a prediction for (the proxy's tokens); None for weights that carry no prediction."""
    if "predicted_target_loss" not in payload:
        return None
    proxy = proxy_settings(recipe)
    return {"predicted_target_loss": payload["predicted_target_loss"], "target": payload["target"], "fit": prefix,
            "loo_rmse": payload.get("loo_rmse"), "proxy_tokens": proxy["train_tokens"]}


def mixture_prediction_metadata(prediction: dict | None, val_loss: dict[str, float], train_tokens: int) -> dict:
    """A training stage's metadata: the target loss it achieved beside the one the mixture fit predicted. The fit
    predicts the proxy's loss at this mixture (fewer tokens, often a smaller model), so a stage that trains more
    lands below it; the gap says how far main's scale is from the proxy's, the fit's own error is fit_loo_rmse."""
    if not prediction:
        return {}
    achieved = target_loss(val_loss, prediction["target"])
    below = None if achieved is None else prediction["predicted_target_loss"] - achieved
    held_out = "not measured" if prediction["loo_rmse"] is None else f"{prediction['loo_rmse']:.4f}"
    return {"target_loss": achieved, "mixture_predicted_target_loss": prediction["predicted_target_loss"],
            "mixture_prediction_for": f"the proxy: {prediction['proxy_tokens']:,} tokens (this stage: "
                                      f"{train_tokens:,}); the fit's held-out error {held_out}",
            "mixture_fit": prediction["fit"], "target_loss_below_prediction": below}
