"""assets/recipe/scaling.py: the recipe's `scaling` section (bad sizes and budgets fail naming the field, exit 2 from
the command) and N, every parameter of the model the trainer builds."""

import pytest

from assets.cli import main
from assets.recipe import RecipeError, load_recipe
from assets.recipe.scaling import Size, scaling_params
from tests.assets.scaling.test_section import SIZES, ladder_raw, write


@pytest.mark.parametrize("change, field", [
    ({"sizes": SIZES[:4]}, r"scaling\.sizes: List should have at least 5 items"),
    ({"tokens": [65536, 131072]}, r"scaling\.tokens: List should have at least 3 items"),
    ({"sizes": [*SIZES[:4], {"d_model": 100, "n_layers": 2, "n_heads": 3}]},
     r"scaling\.sizes\[4\]: Value error, d_model 100 is not divisible by n_heads 3"),
    ({"sizes": [*SIZES[:4], {"d_model": 96, "n_layers": 2, "n_heads": 4, "n_kv_heads": 3}]},
     r"scaling\.sizes\[4\]: Value error, n_heads 4 is not divisible by n_kv_heads 3"),
    ({"sizes": [*SIZES[:4], {"width": 96, "n_layers": 2, "n_heads": 4}]}, r"scaling\.sizes\[4\]\.width: Extra inputs"),
    ({"sizes": [*SIZES[:4], SIZES[0]]}, r"scaling\.sizes\[4\]: d32-l1-h2 is given twice"),
    ({"sizes": [*SIZES[:4], {"d_model": 96, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4}]},
     r"scaling\.sizes\[4\] \(d96-l2-h4-kv4\): 1,794,624 parameters, as many as scaling\.sizes\[3\]"),
    ({"tokens_per_param": [1, 2, 4]}, r"scaling: give the token budgets as `tokens` or as `tokens_per_param`"),
    ({"tokens": [65536, 65536, 131072]}, r"scaling\.tokens: a budget is given twice"),
    ({"tokens": [65536, 0, 131072]}, r"scaling\.tokens\[1\]: a budget must be > 0"),
    ({"proxy": {"optimizer": {"lr": 1}}}, r"scaling\.proxy\.optimizer: not a stage field"),
    ({"proxy": {"launch": {"nodes": 2}}}, r"scaling\.proxy\.launch\.nodes: not a launch field"),
])
def test_a_bad_scaling_section_fails_naming_the_field(tmp_path, change, field):
    raw = ladder_raw()
    raw["scaling"] = {**raw["scaling"], **change}
    with pytest.raises(RecipeError, match=field):
        load_recipe(write(tmp_path, raw))


def test_the_command_exits_2_naming_the_field(tmp_path, capsys):
    raw = ladder_raw()
    raw["scaling"]["sizes"] = SIZES[:3]
    assert main(["status", "--recipe", str(write(tmp_path, raw))]) == 2
    assert "scaling.sizes: List should have at least 5 items" in capsys.readouterr().err


def test_a_ladder_needs_a_training_section(tmp_path):
    raw = ladder_raw()
    raw.pop("training")
    raw.pop("mixing")
    with pytest.raises(RecipeError, match=r"scaling: the rungs train training\.main's model at each size"):
        load_recipe(write(tmp_path, raw))


@pytest.mark.parametrize("model", [{"d_model": 32, "n_layers": 1, "n_heads": 2},
                                   {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "qk_norm": True}])
def test_n_is_every_parameter_of_the_model_the_trainer_builds(model):
    from trainer.model.config import ModelConfig
    from trainer.model.transformer import Transformer

    built = Transformer(ModelConfig(**{"vocab_size": 512, **model}))
    assert scaling_params({"model": {"vocab_size": 512, **model}}) == sum(p.numel() for p in built.parameters())


def test_a_size_is_named_by_its_shape():
    assert Size(d_model=64, n_layers=2, n_heads=4).name == "d64-l2-h4"
    assert Size(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2).name == "d64-l2-h4-kv2"
