"""The real `defs` that workspace.yaml serves loads, with one raw_crawl asset per demo source; code versions follow
the recipe section and the code each asset runs: an edit to a copy of the source moves exactly the assets that
use what was edited."""

import copy
import importlib
import json
import re

from dagster import AssetKey, Definitions

from assets.core.factory import CODE_METADATA
from assets.core.source_hash import code_digest
from assets.recipe import DEMO_RECIPE, load_recipe
from tests.assets.test_recipe import write_recipe
from tests.conftest import REPO


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
        # The stage, the digest of the code it runs, the digest of its recipe section.
        assert re.fullmatch(r"raw_crawl:[0-9a-f]{12}:[0-9a-f]{12}", node.code_version)
        assert code_refs(node) == ["assets.curation.raw_crawl"]
        assert node.parent_keys == {AssetKey(["curation", key.path[1], "inputs"])}  # the observed input files
        assert node.description


# What the code location must not import as it loads: each costs the UI, the daemon and every `pretrain` command
# its import time (numpy ~0.1 s, datatrove's io ~0.15 s through fsspec and huggingface_hub, tokenizers, torch
# seconds). Asset modules import engine configs at the top and the engines where an asset runs.
HEAVY_AT_LOAD = ("numpy", "datatrove", "tokenizers", "xxhash", "warcio", "trafilatura", "torch", "deepspeed",
                 "pyarrow", "pandas", "fasttext", "great_expectations")


def test_loading_the_code_location_imports_no_engine_library():
    import subprocess
    import sys

    code = ("import json, sys\n"
            "import assets.definitions\n"
            "keys = {k.to_user_string() for k in assets.definitions.defs.resolve_asset_graph().get_all_asset_keys()}\n"
            "assert {'curation/deduplicated', 'mixing/mix_sweep', 'training/main'} <= keys, sorted(keys)\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True, text=True)
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "dagster" in loaded  # the check sees what was imported
    assert sorted(loaded & set(HEAVY_AT_LOAD)) == []


def _code_versions(recipe_path) -> dict[str, str]:
    from assets.definitions import build_defs

    graph = build_defs(load_recipe(recipe_path)).resolve_asset_graph()
    return {k.to_user_string(): graph.get(k).code_version for k in graph.get_all_asset_keys()
            if graph.get(k).is_materializable}


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
    assert after["curation/web/filtered"].split(":")[:2] == before["curation/web/filtered"].split(":")[:2]


def code_refs(node) -> list[str]:
    return node.metadata[CODE_METADATA].value


def copy_of_the_code(root):
    """The repository's Python packages, as text, under `root`: a copy to edit."""
    for package in ("assets", "pipelines", "trainer"):
        for path in (REPO / package).rglob("*.py"):
            target = root / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    return root


def edited(root, module: str, old: str, new: str):
    """`old` replaced by `new` in the copy of `module`; `new` appended where `old` is empty."""
    path = root / (module.replace(".", "/") + ".py")
    text = path.read_text()
    if not old:
        path.write_text(text + new)
        return
    assert text.count(old) == 1, f"{old!r} is not once in {module}"
    path.write_text(text.replace(old, new))


def changed_by_edit(tmp_path, module: str, old: str, new: str) -> set[str]:
    """The demo's assets whose code digest moves when `old` becomes `new` in a copy of `module`'s source."""
    from assets.definitions import build_defs

    graph = build_defs(load_recipe(DEMO_RECIPE)).resolve_asset_graph()
    nodes = {k.to_user_string(): graph.get(k) for k in graph.get_all_asset_keys() if graph.get(k).is_materializable}
    copy = copy_of_the_code(tmp_path / "copy")
    edited(copy, module, old, new)
    changed = set()
    for name, node in nodes.items():
        refs = code_refs(node)
        here = code_digest(refs) if refs else None
        # What the code version carries is the digest of the code it names (the tokenizer's: none, it is kept).
        assert node.code_version.split(":")[1] == (here[:12] if here else "kept"), name
        if refs and code_digest(refs, copy) != here:
            changed.add(name)
    return changed


def test_editing_one_filter_step_makes_stale_only_the_filtered_sources_that_use_it(tmp_path):
    recipe = load_recipe(DEMO_RECIPE)
    uses = {step: {f"curation/{s.name}/filtered" for s in recipe.sources if getattr(s.filter, step) is not None}
            for step in ("code", "quality_model", "pii")}
    assert uses["code"] == {"curation/code/filtered"}
    assert uses["quality_model"] == {f"curation/{name}/filtered" for name in ("web", "cc", "cc_wet")}
    assert changed_by_edit(tmp_path / "code", "pipelines.filters.code", 'return False, "code_long_line"',
                           'return False, "code_too_long_line"') == uses["code"]
    # The quality model's scorer (quality.py): the filtered sources that score with it, and the classifier's own assets.
    assert changed_by_edit(tmp_path / "model", "pipelines.filters.quality", "return self.scores([text])[0]",
                           "return self.scores([text])[-1]") == uses["quality_model"] | {"curation/quality_classifier"}
    assert changed_by_edit(tmp_path / "pii", "pipelines.filters.pii", "return 8 <= sum(ch.isdigit() for ch in match.group(0)) <= 15",
                           "return 7 <= sum(ch.isdigit() for ch in match.group(0)) <= 15") == uses["pii"]


def test_editing_engine_code_makes_stale_the_assets_that_run_it_and_never_the_kept_tokenizer(tmp_path):
    recipe = load_recipe(DEMO_RECIPE)
    packed = {f"tokenization/{s.name}/packed" for s in recipe.sources}
    # pipelines/tokenization/pack.py packs the shards and draws the tokenizer's sample: the tokenizer is kept all the same.
    # web's ablation packs its arms with it too.
    assert changed_by_edit(tmp_path / "pack", "pipelines.tokenization.pack", "", "\nEDITED = True\n") == packed | {
        "curation/web/ablation"}
    # The trainer runs in a process of its own (python -m trainer): every stage, evaluation and proxy run uses it.
    changed = changed_by_edit(tmp_path / "trainer", "trainer.train", "", "\nEDITED = True\n")
    training = {f"training/{name}" for name in _stage_names()} | {f"evaluation/{name}" for name in _stage_names()}
    assert training | {"mixing/mix_sweep", "curation/web/ablation"} <= changed  # the ablation's proxy runs too
    assert not {name for name in changed if name.startswith(("curation/", "tokenization/"))} - {"curation/web/ablation"}


def _stage_names() -> list[str]:
    from assets.definitions import build_defs

    graph = build_defs(load_recipe(DEMO_RECIPE)).resolve_asset_graph()
    return sorted(k.path[1] for k in graph.get_all_asset_keys() if k.path[0] == "training")


def test_workspace_yaml_points_at_defs():
    import yaml

    workspace = yaml.safe_load((DEMO_RECIPE.parents[1] / "workspace.yaml").read_text())
    target = workspace["load_from"][0]["python_module"]
    assert (target["module_name"], target["attribute"]) == ("assets.definitions", "defs")
