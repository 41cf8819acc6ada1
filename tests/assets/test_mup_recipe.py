"""A recipe's `model: {parametrization: mup, ...}` reaches every run it makes: main, the later stages merged over it,
and the mix sweep's proxies (mixing.proxy merged over main), each at its own width over the one base width."""

import pytest

from assets.mixing.section import proxy_settings
from assets.recipe import RecipeError, load_recipe
from assets.recipe.training import check_stage
from tests.assets.test_recipe import write_recipe

MUP = {"parametrization": "mup", "mup_base_width": 64}


def test_main_its_stages_and_the_sweeps_proxies_train_under_mup(tmp_path):
    def mup_main(raw):
        raw["training"]["main"]["model"].update(MUP)
        raw["mixing"]["proxy"]["model"] = {"n_layers": 1, "d_model": 64}  # the proxy at the base width

    recipe = load_recipe(write_recipe(tmp_path, mup_main))
    stages = dict(recipe.training.run_configs())
    assert set(stages) == {"main", "long_512", "anneal"}
    assert {(cfg.model.parametrization, cfg.model.mup_base_width, cfg.model.d_model) for cfg in stages.values()} == {
        ("mup", 64, 128)}
    proxy = check_stage("mixing.proxy", proxy_settings(recipe))
    assert (proxy.model.parametrization, proxy.model.mup_base_width, proxy.model.d_model) == ("mup", 64, 64)


def test_a_layout_mup_cannot_take_fails_the_recipe_naming_the_stage_and_field(tmp_path):
    def mup_pipeline(raw):
        raw["training"]["main"]["model"].update(MUP)
        raw["training"]["main"]["parallel"] = {"pipeline": 2}
        raw["training"]["main"]["batch"].pop("ramp_start")

    with pytest.raises(RecipeError, match=r"training.main.model.parametrization \"mup\" cannot be combined with "
                                          r"parallel.pipeline > 1"):
        load_recipe(write_recipe(tmp_path, mup_pipeline))
