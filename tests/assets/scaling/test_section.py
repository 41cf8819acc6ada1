"""assets/scaling/section.py: the ladder recipe's rungs, and how N, C and the mixture-weighted loss are counted (the
section itself: tests/assets/recipe/test_scaling.py)."""

from pathlib import Path

import pytest
import yaml

from assets.cli import main
from assets.recipe import REPO_ROOT, RecipeError, load_recipe
from assets.scaling.section import compute, largest_budget, largest_size, rungs, smallest, weighted_loss
from assets.recipe.scaling import scaling_params

LADDER = REPO_ROOT / "recipes" / "ladder.yaml"


def ladder_raw() -> dict:
    raw = yaml.safe_load(LADDER.read_text())
    raw["base_dir"] = str((LADDER.parent / raw["base_dir"]).resolve())
    return raw


def write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


SIZES = [{"d_model": 32, "n_layers": 1, "n_heads": 2}, {"d_model": 48, "n_layers": 1, "n_heads": 2},
         {"d_model": 64, "n_layers": 2, "n_heads": 4}, {"d_model": 96, "n_layers": 2, "n_heads": 4},
         {"d_model": 128, "n_layers": 2, "n_heads": 4}]


def test_the_ladder_recipe_has_five_sizes_below_main_at_budgets_up_to_mains_and_counts_every_parameter():
    recipe = load_recipe(LADDER)
    ladder = rungs(recipe)
    sizes, budgets = recipe.scaling.sizes, recipe.scaling.tokens
    assert len(sizes) >= 5 and len(budgets) >= 3 and len(ladder) == len(sizes) * len(budgets)
    assert [r.name for r in ladder[:2]] == [f"{sizes[0].name}-t{budgets[0]}", f"{sizes[0].name}-t{budgets[1]}"]
    # d=32, 1 layer, 2 heads sharing 1 kv head, d_ff 128: q and o 2·32², k and v 2·32·16, SwiGLU 3·32·128, two
    # norms 2·32 and QK-norm's 2·16, the final norm 32, and the embedding and head 2·8192·32 (every parameter).
    assert ladder[0].n_params == 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 128 + 2 * 32 + 2 * 16 + 32 + 2 * 8192 * 32
    # Main is a size beyond every rung, at the ladder's largest budget: the fit predicts it as its held-out size check
    # predicts the largest size.
    assert max(r.n_params for r in ladder) < scaling_params(recipe.training.main)
    assert max(budgets) == recipe.training.main["train_tokens"]
    assert smallest(ladder).name == ladder[0].name
    # The held-out checks: every rung of the largest size; each size's rung of the largest budget.
    assert [r.name for r in largest_size(ladder)] == [r.name for r in ladder[-len(budgets):]]
    assert [r.name for r in largest_budget(ladder)] == [r.name for r in ladder[len(budgets) - 1::len(budgets)]]
    assert compute(ladder[0].n_params, budgets[0]) == 6 * ladder[0].n_params * budgets[0]


def test_budgets_in_tokens_per_parameter_round_up_to_whole_steps(tmp_path):
    raw = ladder_raw()
    raw["scaling"].pop("tokens")
    raw["scaling"]["tokens_per_param"] = [1, 2, 4]
    recipe = load_recipe(write(tmp_path, raw))
    step = 16 * 128  # training.main's global_batch × seq_len
    for rung in rungs(recipe):
        assert rung.tokens % step == 0 and rung.tokens >= rung.n_params
        assert rung.tokens - step < int(rung.name.rsplit("-t", 1)[1]) <= rung.tokens


def test_the_loss_is_the_validation_loss_weighted_by_the_mixture():
    assert weighted_loss({"web": 4.0, "math": 2.0}, {"web": 0.75, "math": 0.25}) == pytest.approx(3.5)
    # A source without held-out documents is left out and the rest renormalised; none at all: no loss.
    assert weighted_loss({"web": 4.0}, {"web": 0.5, "cc": 0.5}) == pytest.approx(4.0)
    assert weighted_loss({}, {"web": 1.0}) is None
