"""A training stage's data budget (assets/mixing/budget.py, called by assets/training/stage.py before it launches):
a recipe whose mixture would read a small source 10 times fails before any trainer starts, naming the source and
its epochs, through `pretrain materialize` on the curated home's real packed c4 and math; the same stage with
mixing.max_epochs set higher launches, and its manifest records each source's epochs."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from dagster import AssetKey, DagsterInstance, Failure

from assets.cli import main
from assets.core.upstream import latest_output
from assets.mixing.budget import packed_tokens
from assets.recipe import DEMO_RECIPE, Recipe
from storage.local import LocalStore
from tests.assets.curated import two_small_sources
from tests.assets.training.real_packed import real_packed
from tests.assets.training.test_inputs import committed, context_for
from tests.assets.training.test_stage import PRIOR, RecordingLauncher, run_stage, specs_of

MAIN_TOKENS = 262144  # the demo's main stage


def demo_with_max_epochs(max_epochs: float | None) -> Recipe:
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    if max_epochs is not None:
        raw["mixing"]["max_epochs"] = max_epochs
    return Recipe.model_validate({**raw, "path": DEMO_RECIPE})


def test_a_stage_over_max_epochs_launches_nothing_and_a_higher_max_epochs_lets_it_train(monkeypatch, tmp_path):
    """The demo's main stage on real packed text with a chosen mixture that draws c4 10 times: refused under the
    default max_epochs (4) before the launcher is asked; with mixing.max_epochs 12 it launches, and its manifest
    holds c4's 10 epochs and each source's tokens."""
    instance = DagsterInstance.ephemeral()
    store = LocalStore(tmp_path / "store")
    outs, _ = real_packed(instance, store, tmp_path, {s: 9_000 if s == "c4" else 90_000 for s in PRIOR})
    c4 = packed_tokens(outs["c4"].manifest)
    share = 10 * c4 / MAIN_TOKENS  # the weight at which main's tokens read c4 10 times
    chosen = {"c4": share, **{s: (1 - share) / 4 for s in PRIOR if s != "c4"}}
    committed(instance, store, tmp_path, AssetKey(["mixing", "mixture_weights"]),
              {"result.json": json.dumps({"weights": chosen})})
    launcher = RecordingLauncher()
    context = context_for(instance, tmp_path, launcher=launcher, store=SimpleNamespace(url=str(tmp_path / "store")))

    main_stage = specs_of(monkeypatch, demo_with_max_epochs(None))[0]
    with pytest.raises(Failure) as err:
        run_stage(main_stage, context, store)
    assert err.value.description.startswith("training/main would read source c4 10.0 times (epochs; max_epochs is 4)")
    assert f"over its {c4:,} training tokens" in err.value.description and "mixing.max_epochs" in err.value.description
    assert launcher.runs == [] and not list((tmp_path / "work").rglob("run.json"))  # nothing was started

    main_stage = specs_of(monkeypatch, demo_with_max_epochs(12))[0]  # the same version: max_epochs gates, not builds
    context = context_for(instance, tmp_path / "again", launcher=launcher, store=context.resources.store)
    _, manifest = run_stage(main_stage, context, store)
    assert len(launcher.runs) == 1 and manifest["max_epochs"] == 12
    assert manifest["epochs"]["c4"] == pytest.approx(10.0, abs=0.01)
    assert manifest["tokens_available"] == {s: packed_tokens(outs[s].manifest) for s in PRIOR}
    for s in PRIOR:  # each source: its share of main's tokens over its own
        assert manifest["epochs"][s] == pytest.approx(MAIN_TOKENS * chosen[s] / manifest["tokens_available"][s],
                                                      abs=0.01)
    instance.dispose()


@pytest.mark.slow  # a `pretrain materialize` (and the curated home, once a session)
def test_a_recipe_that_repeats_a_small_source_10_times_fails_naming_it(tmp_path, monkeypatch, capsys, curated_home):
    """`pretrain materialize --select training/main` with main's tokens at 10 passes over c4 (equal weights over c4
    and math, no mixing section: the default max_epochs, 4): the run fails naming c4 and its 10 epochs, and no
    trainer was started (no run.json)."""
    c4 = packed_tokens(latest_output(DagsterInstance.get(), LocalStore(curated_home / "store"),
                                     AssetKey(["tokenization", "c4", "packed"])).manifest)
    raw = two_small_sources()
    for section in ("mixing", "evaluation"):
        raw.pop(section, None)
    raw["training"] = {"main": {**raw["training"]["main"], "train_tokens": 10 * 2 * c4}}  # c4 is half the mixture
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    capsys.readouterr()
    assert main(["materialize", "--select", "training/main"]) != 0
    out = capsys.readouterr()
    log = out.out + out.err + "".join(p.read_text(errors="replace") for p in Path(curated_home).rglob("*.log"))
    assert "training/main would read source c4 10.0 times (epochs; max_epochs is 4)" in log
    assert not list((curated_home / "work").rglob("run.json"))
