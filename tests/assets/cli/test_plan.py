"""`pretrain plan`'s reading of a recipe (assets/cli/plan.py): each training stage with its own tokens and sequence
length, as the stages merge. The planner's figures: tests/trainer/planner/test_plan.py."""

import yaml

from assets.cli import main
from assets.cli.plan import training_stages
from assets.recipe import DEMO_RECIPE, load_recipe


def test_the_demo_stages_with_their_own_tokens_and_shapes():
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    stages, options = training_stages(load_recipe(DEMO_RECIPE))
    assert [name for name, _, _ in stages] == ["main", "long_512", "anneal"]
    tokens = {name: tokens for name, _, tokens in stages}
    assert tokens == {"main": raw["training"]["main"]["train_tokens"],
                      "long_512": raw["training"]["long_context"][0]["train_tokens"],
                      "anneal": raw["training"]["anneal"]["train_tokens"]}
    shapes = {name: shape for name, shape, _ in stages}
    assert shapes["long_512"].seq_len == 512 and shapes["main"].seq_len == raw["training"]["main"]["batch"]["seq_len"]
    assert shapes["anneal"].d_model == raw["training"]["main"]["model"]["d_model"]  # merged over main
    assert options["long_512"]["micro_batch"] == 4


def test_fit_without_budget_is_refused(capsys):
    assert main(["plan", "--fit", "fit.json"]) == 2
    assert "--fit: goes with --budget" in capsys.readouterr().err
