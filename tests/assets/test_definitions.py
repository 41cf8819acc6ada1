"""The real `defs` that workspace.yaml serves loads, with one raw_crawl asset per demo source."""

import copy
import importlib

from dagster import AssetKey, Definitions

from assets.recipe import DEMO_RECIPE, load_recipe
from tests.assets.test_recipe import write_recipe


def test_real_defs_load():
    import assets.definitions

    module = importlib.reload(assets.definitions)  # built under this test's PRETRAIN_HOME
    defs = module.defs
    assert isinstance(defs, Definitions)
    Definitions.validate_loadable(defs)
    recipe = load_recipe(DEMO_RECIPE)
    graph = defs.resolve_asset_graph()
    expected = {AssetKey(["curation", s.name, "raw_crawl"]) for s in recipe.sources}
    assert expected <= set(graph.get_all_asset_keys())
    for key in expected:
        node = graph.get(key)
        assert node.group_name == "curation"
        assert node.code_version.startswith("raw_crawl:v2:")
        assert node.description


def _code_versions(recipe_path) -> dict[str, str]:
    from assets.definitions import build_defs

    graph = build_defs(load_recipe(recipe_path)).resolve_asset_graph()
    return {k.to_user_string(): graph.get(k).code_version for k in graph.get_all_asset_keys()}


def test_code_versions_differ_per_source_and_follow_the_section(tmp_path):
    versions = _code_versions(DEMO_RECIPE)
    assert len(set(versions.values())) == len(versions)

    def stricter_web_filter(raw):
        [web] = [s for s in raw["sources"] if s["name"] == "web"]
        web["filter"] = copy.deepcopy(web["filter"])  # the demo's YAML shares it with cc and cc_wet (an anchor)
        web["filter"]["gopher_quality"]["max_non_alpha_words_ratio"] = 0.5

    (tmp_path / "same").mkdir()
    (tmp_path / "changed").mkdir()
    before = _code_versions(write_recipe(tmp_path / "same", lambda raw: None))
    after = _code_versions(write_recipe(tmp_path / "changed", stricter_web_filter))
    assert before == versions  # a copy of the recipe elsewhere is the same recipe
    # Exactly the asset that reads sources[web].filter: everything downstream of it goes stale through its data
    # version (its version key includes the upstream data versions), not through its own code version.
    assert {k for k in versions if before[k] != after[k]} == {"curation/web/filtered"}
    assert after["curation/web/filtered"].startswith("filtered:v2:")


def test_workspace_yaml_points_at_defs():
    import yaml

    workspace = yaml.safe_load((DEMO_RECIPE.parents[1] / "workspace.yaml").read_text())
    target = workspace["load_from"][0]["python_module"]
    assert (target["module_name"], target["attribute"]) == ("assets.definitions", "defs")
