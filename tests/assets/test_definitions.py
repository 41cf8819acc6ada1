"""The real `defs` that workspace.yaml serves loads, with one raw_crawl asset per demo source."""

import importlib

from dagster import AssetKey, Definitions

from assets.recipe import DEMO_RECIPE, load_recipe


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
        assert node.code_version.startswith("raw_crawl:v1:")
        assert node.description


def test_code_versions_differ_per_source_and_follow_the_section():
    from assets.definitions import build_defs

    recipe = load_recipe(DEMO_RECIPE)
    versions = {k: build_defs(recipe).resolve_asset_graph().get(k).code_version for k in build_defs(recipe).resolve_all_asset_keys()}
    assert len(set(versions.values())) == len(versions)


def test_workspace_yaml_points_at_defs():
    import yaml

    workspace = yaml.safe_load((DEMO_RECIPE.parents[1] / "workspace.yaml").read_text())
    target = workspace["load_from"][0]["python_module"]
    assert (target["module_name"], target["attribute"]) == ("assets.definitions", "defs")
