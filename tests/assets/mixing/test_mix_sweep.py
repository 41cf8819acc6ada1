"""assets/mixing/mix_sweep.py: the spec for the demo recipe (partitioned by candidate, deps, section, launch
metadata), a partition left from an older sweep, and the proxy run config and target loss its build computes,
with a launcher that records the run and reports per-domain validation losses instead of training."""

import json
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, Failure

import assets.mixing.mix_sweep as mix_sweep
from assets.core.factory import Inputs
from assets.core.versioning import code_version
from assets.mixing.budget import packed_tokens
from assets.mixing.section import CANDIDATES, mixing_section, proxy_settings
from assets.recipe import DEMO_RECIPE, load_recipe
from resources.launcher import LaunchResult
from storage.local import LocalStore
from tests.assets.training.real_packed import real_packed
from tests.assets.training.test_inputs import committed, context_for

PRIOR = ["books", "c4", "code", "math", "web"]
CANDIDATE = {"books": 0.2, "c4": 0.2, "code": 0.2, "math": 0.2, "web": 0.2}


def spec_of(monkeypatch, recipe):
    monkeypatch.setattr(mix_sweep, "output_asset", lambda spec: spec)
    return mix_sweep.mix_sweep_asset(recipe)


def test_demo_spec(monkeypatch):
    recipe = load_recipe(DEMO_RECIPE)
    spec = spec_of(monkeypatch, recipe)
    assert spec.key == AssetKey(["mixing", "mix_sweep"]) and spec.group == "mixing"
    assert dict(spec.reads) == {}
    assert list(spec.deps) == [AssetKey(["mixing", "mix_candidates"])] + [
        AssetKey(["tokenization", s, "packed"]) for s in PRIOR] + [AssetKey(["tokenization", "tokenizer"])]
    assert spec.section == mixing_section(recipe)
    assert spec.code_version == code_version("mix_sweep", spec.code_sha256, mixing_section(recipe))
    assert spec.asset_args["partitions_def"] == CANDIDATES
    assert "automation_condition" not in spec.asset_args  # the mixing sensor runs new partitions (test_schedule.py)
    assert spec.asset_args["metadata"]["launch"].value == {"max_restarts": 2, "threads": 1}
    assert spec.resources == frozenset({"launcher"}) and spec.out_name == "result"


class Launcher:
    def __init__(self, val_loss):
        self.val_loss, self.runs = val_loss, []

    def launch(self, context, run, work, settings):
        self.runs.append((run, settings))
        return LaunchResult(summary={"val_loss": self.val_loss, "tokens": 65536, "losses": [3.0]},
                            records=[{"event": "precision", "dtype": "fp32"}])


def setup(monkeypatch, tmp_path, partition, val_loss, pack=True):
    recipe = load_recipe(DEMO_RECIPE)
    spec = spec_of(monkeypatch, recipe)
    instance = DagsterInstance.ephemeral()
    store = LocalStore(tmp_path / "store")
    # Real packed text: the build counts each source's tokens before it launches (a failing prepare reads none).
    outs, _ = real_packed(instance, store, tmp_path, {s: 50_000 for s in PRIOR}) if pack else ({}, None)
    committed(instance, store, tmp_path, AssetKey(["mixing", "mix_candidates"]),
              {"result.json": json.dumps({"candidates": {"mix-a": CANDIDATE}})})
    launcher = Launcher(val_loss)
    context = context_for(instance, tmp_path, launcher=launcher)
    context.partition_key = partition
    return recipe, spec, Inputs(context=context, store=store, outputs={}), launcher, outs


def test_a_partition_that_is_not_a_current_candidate_fails(monkeypatch, tmp_path):
    _, spec, inputs, _, _ = setup(monkeypatch, tmp_path, "mix-old", {}, pack=False)
    with pytest.raises(Failure, match=r"partition mix-old is not a candidate .*\(candidates: mix-a\)"):
        spec.prepare(inputs)


def test_the_proxy_run_and_the_average_target_loss(monkeypatch, tmp_path):
    val = {"books": 2.0, "c4": 3.0, "code": 1.0, "math": 2.5, "web": 4.0}
    recipe, spec, inputs, launcher, outs = setup(monkeypatch, tmp_path, "mix-a", val)
    inputs = spec.prepare(inputs)
    assert inputs.fingerprints == ["mix-a"]
    assert inputs.upstream == inputs.extra["training"].upstream
    work = tmp_path / "w"
    (work / "result").mkdir(parents=True)
    assert spec.build(inputs.but(work=work), work / "result") == {}
    [(run, settings)] = launcher.runs
    assert settings == {"max_restarts": 2, "threads": 1}  # a proxy's fixed threads
    assert {k: v for k, v in run.items() if k in proxy_settings(recipe)} == proxy_settings(recipe)
    assert run["stage"] == "proxy-mix-a" and run["output_dir"] == str(work / "out")
    assert run["data"] == {"shards": {s: str(tmp_path / "store" / outs[s].prefix) for s in PRIOR}, "weights": CANDIDATE}
    assert run["lineage"] == inputs.manifest["lineage"] and run["tokenizer_sha256"] == "t" * 64
    result = json.loads((work / "result" / "result.json").read_text())
    assert result["target_loss"] == pytest.approx(12.5 / 5) and result["target"] == "average"
    assert (result["mixture"], result["weights"], result["val_loss"]) == ("mix-a", CANDIDATE, val)
    assert (result["precision"], result["tokens"]) == ("fp32", 65536)
    # Each source's epochs in the proxy run: its share of the proxy's 65,536 tokens over its packed tokens.
    assert result["tokens_available"] == {s: packed_tokens(outs[s].manifest) for s in PRIOR}
    assert result["epochs"] == pytest.approx({s: 65536 * 0.2 / result["tokens_available"][s] for s in PRIOR}, rel=0.01)


def test_no_validation_loss_for_the_target_fails(monkeypatch, tmp_path):
    _, spec, inputs, _, _ = setup(monkeypatch, tmp_path, "mix-a", {})
    inputs = spec.prepare(inputs)
    (Path(tmp_path) / "w" / "result").mkdir(parents=True)
    with pytest.raises(Failure, match=r"nothing for the target \(average\)"):
        spec.build(inputs.but(work=tmp_path / "w"), tmp_path / "w" / "result")
