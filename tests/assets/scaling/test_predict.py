"""assets/scaling/predict.py: which training stages a ladder's fit covers (main; a stage that only continues it) and
why the others are not predicted, and the metadata a stage gets (the run through the fit is in test_ladder.py)."""

import pytest
import yaml

from assets.recipe import DEMO_RECIPE, load_recipe
from assets.scaling.predict import _coverage, prediction_metadata
from assets.recipe.scaling import scaling_params

MIXTURE = {"web": 0.4, "c4": 0.2, "books": 0.1, "code": 0.1, "math": 0.2}
LADDER = {"weights": MIXTURE, "seq_len": 128}


def demo_with(tmp_path, stages):
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    raw["training"] = {"main": raw["training"]["main"], "stages": stages}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_recipe(path)


def test_main_on_the_ladders_mixture_and_sequence_length_is_covered():
    recipe = load_recipe(DEMO_RECIPE)
    n = scaling_params(recipe.training.main)
    assert _coverage(recipe, "main", MIXTURE, LADDER) == (n, 262144)
    assert "not on the ladder's mixture" in _coverage(recipe, "main", {"web": 1.0}, LADDER)
    assert "sequence length 128, the ladder's is 64" in _coverage(recipe, "main", MIXTURE, {**LADDER, "seq_len": 64})


def test_the_demos_later_stages_learn_other_laws_and_say_which():
    recipe = load_recipe(DEMO_RECIPE)
    assert "sequence length 512" in _coverage(recipe, "long_512", MIXTURE, LADDER)
    assert "not on the ladder's mixture" in _coverage(recipe, "anneal", {"books": 0.4, "math": 0.3, "code": 0.3}, LADDER)


def test_a_stage_that_only_continues_main_is_the_same_run_going_on(tmp_path):
    recipe = demo_with(tmp_path, [{"name": "more", "continue_from": "main", "train_tokens": 65536},
                                  {"name": "fresh", "init_from": "more", "train_tokens": 65536},
                                  {"name": "hotter", "continue_from": "more", "train_tokens": 65536,
                                   "optim": {"lr": 1.0e-3}}])
    n = scaling_params(recipe.training.main)
    assert _coverage(recipe, "more", MIXTURE, LADDER) == (n, 262144 + 65536)
    assert "weights of more with a fresh optimizer" in _coverage(recipe, "fresh", MIXTURE, LADDER)
    assert "it changes optim over more" in _coverage(recipe, "hotter", MIXTURE, LADDER)


def test_the_metadata_gives_predicted_achieved_and_error_or_why_not():
    meta = prediction_metadata({"predicted_loss": 4.2, "n_params": 1, "tokens": 2, "fit": "scaling/fit/abc"},
                               {"web": 4.0, "math": 3.0}, {"web": 0.5, "math": 0.5})
    assert meta["achieved_val_loss"] == pytest.approx(3.5) and meta["prediction_error"] == pytest.approx(0.7)
    assert meta["prediction_error_pct"] == pytest.approx(20.0) and meta["scaling_fit"] == "scaling/fit/abc"
    assert prediction_metadata({"reason": "no scaling/fit materialized yet"}, {}, {}) == {
        "predicted_val_loss": "none: no scaling/fit materialized yet"}
