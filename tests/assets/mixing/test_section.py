"""assets/mixing/section.py: the mixing assets' keys, the proxy's run settings (training.main with mixing.proxy over
it, no checkpoints, no launch) and which recipe fields each versioned section holds, for the demo recipe."""

import copy

import yaml
from dagster import AssetKey

from assets.mixing.section import (
    CANDIDATES,
    RESULT_FILE,
    candidates_key,
    draw_section,
    mixing_section,
    proxy_launch,
    proxy_settings,
    read_result,
    sweep_key,
    weights_key,
    weights_section,
    write_result,
)
from assets.recipe import DEMO_RECIPE, Recipe, load_recipe
from assets.recipe.training import PROXY_THREADS
from storage.local import LocalStore

RAW = yaml.safe_load(DEMO_RECIPE.read_text())


def demo_with(change) -> Recipe:
    raw = copy.deepcopy(RAW)
    change(raw)
    return Recipe.model_validate({**raw, "path": DEMO_RECIPE})


def test_keys_and_partitions():
    assert (candidates_key(), sweep_key(), weights_key()) == (
        AssetKey(["mixing", "mix_candidates"]), AssetKey(["mixing", "mix_sweep"]), AssetKey(["mixing", "mixture_weights"]))
    assert CANDIDATES.name == "mix_candidates" and RESULT_FILE == "result.json"


def test_proxy_settings_are_main_with_the_proxy_over_it_and_no_checkpoints():
    recipe = load_recipe(DEMO_RECIPE)
    main = RAW["training"]["main"]
    settings = proxy_settings(recipe)
    assert "launch" not in settings
    assert settings["train_tokens"] == RAW["mixing"]["proxy"]["train_tokens"] == 65536
    assert settings["model"] == {**main["model"], "n_layers": 1}
    for field in ("optim", "schedule", "batch", "deepspeed"):
        assert settings[field] == main[field]
    # The proxy reports its validation loss only: no downstream evaluation during its short run.
    assert settings["metrics"] == {**main["metrics"], "downstream_interval": 0} != main["metrics"]
    assert settings["checkpoint"] == {**main["checkpoint"], "interval_steps": 0, "save_final": False, "resume": False}
    # How the proxy starts: main's launch (the proxy gives none) on a proxy's fixed threads, not in its settings.
    assert proxy_launch(recipe).overrides() == {**main["launch"], "threads": PROXY_THREADS} == {"max_restarts": 2,
                                                                                               "threads": 1}


def test_each_section_holds_what_decides_its_output():
    recipe = load_recipe(DEMO_RECIPE)
    section = mixing_section(recipe)
    assert section["proxy"] == proxy_settings(recipe)
    assert "schedule" not in section["mixing"] and "status" not in section["mixing"]
    assert section["mixing"]["proxy"] == {"train_tokens": 65536, "model": {"n_layers": 1},
                                          "metrics": {"downstream_interval": 0}}
    assert draw_section(recipe) == {"prior": RAW["mixing"]["prior"], "candidates": 4, "concentration": 8.0, "seed": 0}
    # The weights keep the search to the data budget: max_epochs (only theirs: not the sweep's) on main's tokens.
    assert "max_epochs" not in section["mixing"]
    assert weights_section(recipe) == {**{k: v for k, v in section["mixing"].items() if k != "proxy"},
                                       "max_epochs": 4.0, "main_train_tokens": 262144}
    assert weights_section(recipe)["target"] == "average"

    def proxy(raw):
        raw["mixing"]["proxy"]["train_tokens"] = 32768

    def when(raw):
        raw["mixing"]["schedule"] = "0 4 * * *"
        raw["mixing"]["proxy"]["launch"] = {"nproc_per_node": 2}

    def seed(raw):
        raw["mixing"]["seed"] = 1

    def target(raw):
        raw["mixing"]["target"] = "web"

    def budget(raw):
        raw["mixing"]["max_epochs"] = 8

    def main_tokens(raw):
        raw["training"]["main"]["train_tokens"] = 131072

    def sections(r):
        return draw_section(r), mixing_section(r), weights_section(r)

    base = sections(recipe)
    assert [a != b for a, b in zip(base, sections(demo_with(proxy)))] == [False, True, False]
    assert [a != b for a, b in zip(base, sections(demo_with(when)))] == [False, False, False]
    assert [a != b for a, b in zip(base, sections(demo_with(seed)))] == [True, True, True]
    assert [a != b for a, b in zip(base, sections(demo_with(target)))] == [False, True, True]
    assert [a != b for a, b in zip(base, sections(demo_with(budget)))] == [False, False, True]
    # The proxy sets its own train_tokens: main's budget moves the search's bound alone.
    assert [a != b for a, b in zip(base, sections(demo_with(main_tokens)))] == [False, False, True]


def test_result_file_round_trip(tmp_path):
    store = LocalStore(tmp_path / "store")
    (tmp_path / "out").mkdir()
    write_result(tmp_path / "out", {"b": 1, "a": [0.5]})
    store.put_file("mixing/x/result.json", tmp_path / "out" / RESULT_FILE)
    assert read_result(store, "mixing/x") == {"a": [0.5], "b": 1}
    assert (tmp_path / "out" / RESULT_FILE).read_text().startswith('{\n "a"')  # sorted keys, indented
