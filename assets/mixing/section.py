"""What the three mixing assets share: their keys, the recipe's mixing section as they version it, the proxy
run's settings, and the JSON result file each of them commits."""

import json

from dagster import AssetKey, DynamicPartitionsDefinition

from assets.recipe import Recipe
from assets.stages import LaunchSettings, merge, split_launch
from storage.objects import ObjectStore

MIXING_IMPLEMENTATION = "v1"
CANDIDATES = DynamicPartitionsDefinition(name="mix_candidates")
RESULT_FILE = "result.json"


def candidates_key() -> AssetKey:
    return AssetKey(["mixing", "mix_candidates"])


def sweep_key() -> AssetKey:
    return AssetKey(["mixing", "mix_sweep"])


def weights_key() -> AssetKey:
    return AssetKey(["mixing", "mixture_weights"])


def proxy_settings(recipe: Recipe) -> dict:
    """The proxy's run-config fields: training.main with mixing.proxy merged over it, no checkpoints."""
    settings, _ = split_launch("mixing.proxy", merge(recipe.training.main, recipe.mixing.proxy))
    return merge(settings, {"checkpoint": {"interval_steps": 0, "save_final": False, "resume": False}})


def proxy_launch(recipe: Recipe) -> LaunchSettings:
    """How a proxy run is started: training.main's `launch` with mixing.proxy's over it (not versioned)."""
    return split_launch("mixing.proxy", merge(recipe.training.main, recipe.mixing.proxy))[1]


def mixing_section(recipe: Recipe) -> dict:
    """The sweep's section. Each asset's code version hashes what decides its own output: the candidates only the
    draw (draw_section), the sweep all of this, the weights also the target (weights_section); a new proxy
    reruns the sweep, not the draw."""
    m = recipe.mixing.model_dump(mode="json", exclude={"schedule", "status"})  # when it runs is not what it makes
    m["proxy"] = {k: v for k, v in m["proxy"].items() if k != "launch"}  # nor how its processes start
    return {"mixing": m, "proxy": proxy_settings(recipe)}


def draw_section(recipe: Recipe) -> dict:
    return {k: mixing_section(recipe)["mixing"][k] for k in ("prior", "candidates", "concentration", "seed")}


def weights_section(recipe: Recipe) -> dict:
    return {k: v for k, v in mixing_section(recipe)["mixing"].items() if k != "proxy"}


def write_result(out_dir, payload: dict) -> None:
    (out_dir / RESULT_FILE).write_text(json.dumps(payload, indent=1, sort_keys=True))


def read_result(store: ObjectStore, prefix: str) -> dict:
    return json.loads(store.get_bytes(f"{prefix}/{RESULT_FILE}"))
