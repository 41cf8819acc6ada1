"""mixture_weights records the digest of its own recipe section (the mixing settings without the proxy), with the
sweep's results faked in the store, so no proxy model is trained, and packed outputs that give each source a
million tokens (the data budget's counts: tests/assets/mixing/test_budget.py tests the budget itself)."""

import hashlib
import json

import pytest
import yaml
from dagster import AssetKey, AssetMaterialization, DagsterInstance, materialize

from assets.mixing.mix_candidates import mix_candidates_asset
from assets.mixing.mix_sweep import mix_sweep_spec
from assets.mixing.mixture_weights import mixture_weights_asset
from assets.mixing.section import RESULT_FILE, candidates_key, sweep_key, weights_key
from assets.recipe import DEMO_RECIPE, load_recipe
from resources.scratch import ScratchResource
from resources.store_resource import StoreResource
from storage.local import LocalStore
from storage.manifest import MANIFEST, commit_folder
from tests.assets.training.test_inputs import committed


def plenty_of_tokens(instance, store, tmp_path, sources):
    for name in sources:
        committed(instance, store, tmp_path, AssetKey(["tokenization", name, "packed"]), {"train.bin": name},
                  {"packing": {"splits": {"train": {"tokens": 1_000_000}}}})


@pytest.mark.slow  # ~2-10 s: two materializations in an ephemeral instance
def test_mixture_weights_records_the_sha256_of_its_recipe_section(tmp_path):
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    raw["mixing"] = {"prior": {"web": 0.5, "code": 0.5}, "candidates": 3, "concentration": 4.0, "seed": 7,
                     "target": "average", "proxy": {"train_tokens": 4096}, "schedule": "0 3 * * 0"}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    recipe = load_recipe(path)
    instance = DagsterInstance.ephemeral()
    resources = {"store": StoreResource(url=str(tmp_path / "store")), "scratch": ScratchResource(root=str(tmp_path / "work"))}
    store = LocalStore(tmp_path / "store")
    plenty_of_tokens(instance, store, tmp_path, ["web", "code"])

    assert materialize([mix_candidates_asset(recipe)], resources=resources, instance=instance).success
    [event] = instance.fetch_materializations(candidates_key(), limit=1).records
    candidates = json.loads(store.get_bytes(f"{event.asset_materialization.metadata['prefix'].value}/{RESULT_FILE}"))
    for i, (name, weights) in enumerate(sorted(candidates["candidates"].items())):  # what each proxy run would leave
        folder = tmp_path / "swept" / name
        folder.mkdir(parents=True)
        (folder / RESULT_FILE).write_text(json.dumps({"mixture": name, "weights": weights, "target_loss": 3.0 + i / 10}))
        commit_folder(store, f"mixing/mix_sweep/{name}/fake", folder,
                      {"asset": "mixing/mix_sweep", "code_version": mix_sweep_spec(recipe).code_version})
        instance.report_runless_asset_event(AssetMaterialization(sweep_key(), partition=name,
                                                                 metadata={"prefix": f"mixing/mix_sweep/{name}/fake"}))
    instance.add_dynamic_partitions("mix_candidates", list(candidates["candidates"]))

    assert materialize([mixture_weights_asset(recipe)], resources=resources, instance=instance).success
    [event] = instance.fetch_materializations(weights_key(), limit=1).records
    manifest = json.loads(store.get_bytes(f"{event.asset_materialization.metadata['prefix'].value}/{MANIFEST}"))
    # The section as the recipe states it: every mixing setting but the proxy (which only the sweep reads), when
    # the sweep reruns (schedule, status) and nothing the fitted model holds.
    section = {"prior": {"web": 0.5, "code": 0.5}, "candidates": 3, "concentration": 4.0, "seed": 7, "target": "average",
               "max_epochs": 4.0, "main_train_tokens": 262144}
    digest = hashlib.sha256(json.dumps(section, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert manifest["recipe_section_sha256"] == digest
    assert manifest["code_version"].startswith("mixture_weights:") and manifest["code_version"].endswith(digest[:12])
    instance.dispose()


@pytest.mark.slow  # ~2-10 s: three materializations in an ephemeral instance
def test_the_fit_leaves_out_runs_not_finished_or_of_another_proxy_and_names_them(tmp_path):
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    raw["mixing"] = {"prior": {"web": 0.5, "code": 0.5}, "candidates": 5, "concentration": 4.0,
                     "target": "average", "proxy": {"train_tokens": 4096}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    recipe = load_recipe(path)
    instance = DagsterInstance.ephemeral()
    resources = {"store": StoreResource(url=str(tmp_path / "store")),
                 "scratch": ScratchResource(root=str(tmp_path / "work"))}
    store = LocalStore(tmp_path / "store")
    plenty_of_tokens(instance, store, tmp_path, ["web", "code"])
    assert materialize([mix_candidates_asset(recipe)], resources=resources, instance=instance).success
    [event] = instance.fetch_materializations(candidates_key(), limit=1).records
    candidates = json.loads(store.get_bytes(f"{event.asset_materialization.metadata['prefix'].value}/{RESULT_FILE}"))
    names = sorted(candidates["candidates"])

    def record(name, code_version, loss):
        folder = tmp_path / "swept" / name
        folder.mkdir(parents=True)
        weights = candidates["candidates"][name]
        (folder / RESULT_FILE).write_text(json.dumps({"mixture": name, "weights": weights, "target_loss": loss}))
        commit_folder(store, f"mixing/mix_sweep/{name}/r", folder, {"code_version": code_version})
        instance.report_runless_asset_event(AssetMaterialization(sweep_key(), partition=name,
                                                                 metadata={"prefix": f"mixing/mix_sweep/{name}/r"}))

    current = mix_sweep_spec(recipe).code_version
    record(names[0], current, 3.0)
    record(names[1], "mix_sweep:older-proxy:0", 9.0)  # a run of another proxy: not comparable
    assert not materialize([mixture_weights_asset(recipe)], resources=resources, instance=instance,
                           raise_on_error=False).success  # one comparable run: nothing to fit
    record(names[2], current, 3.5)
    record(names[3], current, 3.2)
    result = materialize([mixture_weights_asset(recipe)], resources=resources, instance=instance)
    assert result.success
    [event] = instance.fetch_materializations(weights_key(), limit=1).records
    meta = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    assert set(meta["swept"]) == {names[0], names[2], names[3]} and meta["fit_runs"] == 3
    assert meta["pending"] == [names[4], names[1]]  # one not run yet, and another proxy's run
    assert meta["runs_per_draw"] == {"base": 3}
    # 3 runs over 2 sources: fewer than the quadratic model's 6 features, enough for the linear model's 2.
    assert (meta["fit_model"], meta["fit_features"]) == ("linear", 2) and "still fewer" not in meta["fit_warning"]
    warnings = [e.message for e in instance.all_logs(result.run_id) if e.level == 30]  # logging.WARNING
    assert any(f"left out: not run yet ['{names[4]}'], run with another proxy ['{names[1]}']" in m for m in warnings)
    instance.dispose()
