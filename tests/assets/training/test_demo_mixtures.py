"""The demo's training/main trains on any mixture the sweep can choose, with the spike guard on at its defaults.

A stand-in for the stage, as the issue that asked for it allows (issue 49: `make demo` failed when main spiked right
after its batch ramp and the guard stopped it): the demo's main model, optimizer, LR schedule and batch ramp from
recipes/demo.yaml, the guard as the recipe leaves it, on each of the demo sweep's candidate mixtures (the prior first).
What is cheaper than the stage: the five sources are curated without their filters (raw pages are the harsher
data), and each run stops at twice the ramp's tokens (steps 0-39 of its 136: the ramp ends at step 24), sixteen steps
past it, eight past the window where the spikes came (steps 27-31), with no checkpoints to write. Stopping early
changes no step before it: main's schedule is warmup-stable (decay_fraction 0), its LR the same at any length.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from assets.recipe import DEMO_RECIPE, load_recipe
from tests.assets.curated import materialize_in

SOURCES = ("web", "c4", "books", "code", "math")


def one(paths) -> Path:
    [path] = list(paths)
    return path


@pytest.fixture(scope="module")
def demo_sources(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """(the demo recipe's path in a home of its own, {source: its packed folder}) with the demo's tokenizer."""
    root = tmp_path_factory.mktemp("demo-sources")
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    raw["sources"] = [{k: v for k, v in s.items() if k != "filter"} for s in raw["sources"] if s["name"] in SOURCES]
    raw["decontamination"]["benchmarks"] = ["benchmarks/gsm8k_test.jsonl"]
    for section in ("quality_classifier", "reference", "ablation", "evaluation"):
        raw.pop(section, None)
    raw["training"] = {"main": raw["training"]["main"]}  # the stage under test, as the demo sets it
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    home = root / "pretrain-home"
    materialize_in(home, recipe, ",".join(f"+tokenization/{s}/packed" for s in SOURCES))
    # One version of each in this new home: its folder in the local store.
    folders = {s: one(home.glob(f"store/tokenization/{s}/packed/*")) for s in SOURCES}
    return recipe, folders


@pytest.mark.slow  # ~3 min: the demo's five sources curated, then five 40-step runs of the demo's main model
def test_the_demos_main_trains_on_every_candidate_mixture_with_the_guard_on(tmp_path, demo_sources):
    from trainer.config import RunConfig, from_dict
    from trainer.data.mixture_search import candidate_mixtures
    from trainer.train import train

    recipe_path, folders = demo_sources
    demo = load_recipe(DEMO_RECIPE)
    [(name, main)] = [(n, s) for n, s in load_recipe(recipe_path).training.stage_settings() if n == "main"]
    assert main == dict(demo.training.main)  # the demo's own main settings, launch included
    mixtures = candidate_mixtures(demo.mixing.engine_config())
    assert mixtures[0] == demo.mixing.prior and len(mixtures) == demo.mixing.candidates
    batch = main["batch"]
    assert main["schedule"]["kind"] == "wsd" and main["schedule"]["decay_fraction"] == 0  # LR: no end in sight
    stop = 2 * batch["ramp_tokens"]  # 40 steps: 16 of 8 sequences, then 24 of 16 (the ramp ends after 8 of them)
    for i, weights in enumerate(mixtures):
        settings = {k: v for k, v in main.items() if k not in ("launch", "checkpoint", "metrics")}
        run = from_dict(RunConfig, {
            **settings, "train_tokens": stop, "output_dir": str(tmp_path / f"mixture-{i}"),
            "data": {"shards": {s: str(folders[s]) for s in weights}, "weights": weights},
            "metrics": {"log_interval": 8, "eval_batches": 1, "tensorboard": False},
            "checkpoint": {"interval_steps": 0, "save_final": False, "resume": False}})
        assert run.guard.enabled and run.guard == type(run.guard)()  # the guard at its defaults
        summary = train(run)  # a guard stop raises
        assert summary["tokens"] == stop and summary["steps"] == 40, (weights, summary)
        records = (tmp_path / f"mixture-{i}" / "metrics.jsonl").read_text()
        assert '"rollback"' not in records, (weights, summary["skipped"])
