"""assets/mixing/mix_candidates.py: the spec for the demo recipe, and its prepare, build and metadata hooks run
directly: the base sweep's candidates are the prior then Dirichlet draws, deterministic for a seed, each a mixture
of the prior's sources summing to 1, named by the digest of its rounded weights, one dynamic partition each; a
run tagged with a scheduled tick adds that tick's draws to those before it. (The schedule and sensor on a real
instance: test_schedule.py.)"""

import copy
import hashlib
import json
import logging
from types import SimpleNamespace

import pytest
import yaml
from dagster import AssetKey, AssetMaterialization, DagsterInstance, Failure

import assets.mixing.mix_candidates as mix_candidates
from assets.core.factory import Inputs
from assets.core.upstream import Output
from assets.core.versioning import code_version
from assets.mixing.section import draw_section
from assets.recipe import DEMO_RECIPE, Recipe, load_recipe
from storage.local import LocalStore
from storage.manifest import commit_folder

RAW = yaml.safe_load(DEMO_RECIPE.read_text())


def spec_of(monkeypatch, recipe):
    monkeypatch.setattr(mix_candidates, "output_asset", lambda spec: spec)
    return mix_candidates.mix_candidates_asset(recipe)


def drawn(monkeypatch, tmp_path, recipe, draws=("base",)) -> dict:
    spec = spec_of(monkeypatch, recipe)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    inputs = Inputs(context=None, store=None, outputs={}, extra={"draws": list(draws)})
    assert spec.build(inputs, out) == {}
    return json.loads((out / "result.json").read_text())


def candidates(monkeypatch, tmp_path, recipe) -> dict:
    return drawn(monkeypatch, tmp_path, recipe)["candidates"]


def test_demo_spec(monkeypatch):
    recipe = load_recipe(DEMO_RECIPE)
    spec = spec_of(monkeypatch, recipe)
    assert spec.key == AssetKey(["mixing", "mix_candidates"])
    assert (spec.group, spec.stage) == ("mixing", "mix_candidates")
    assert dict(spec.reads) == {} and list(spec.deps) == []
    assert spec.section == draw_section(recipe)
    assert spec.code_version == code_version("mix_candidates", spec.code_sha256, draw_section(recipe))


def test_candidates_are_the_prior_then_draws_deterministic_for_a_seed(monkeypatch, tmp_path):
    recipe = load_recipe(DEMO_RECIPE)
    got = candidates(monkeypatch, tmp_path, recipe)
    prior = RAW["mixing"]["prior"]
    total = sum(prior.values())
    assert len(got) == RAW["mixing"]["candidates"] == 4
    normalized = {k: v / total for k, v in prior.items()}
    # The prior itself is a candidate (the file lists them by name, sorted).
    assert [w for w in got.values() if w == pytest.approx(normalized)] != []
    for name, weights in got.items():
        assert set(weights) == set(prior)
        assert sum(weights.values()) == pytest.approx(1.0)
        assert all(0.0 <= w <= 1.0 for w in weights.values())
        text = json.dumps({k: round(v, 6) for k, v in sorted(weights.items())})
        assert name == "mix-" + hashlib.sha256(text.encode()).hexdigest()[:10]
    assert len({json.dumps(w, sort_keys=True) for w in got.values()}) == 4  # no two alike
    (tmp_path / "again").mkdir()
    assert candidates(monkeypatch, tmp_path / "again", recipe) == got
    raw = copy.deepcopy(RAW)
    raw["mixing"]["seed"] = 7
    (tmp_path / "seed7").mkdir()
    other = candidates(monkeypatch, tmp_path / "seed7", Recipe.model_validate({**raw, "path": DEMO_RECIPE}))
    assert len(other) == 4 and set(other) & set(got) == {n for n, w in got.items() if w == pytest.approx(normalized)}


def test_metadata_registers_each_new_candidate_as_a_partition_once(monkeypatch, tmp_path):
    recipe = load_recipe(DEMO_RECIPE)
    spec = spec_of(monkeypatch, recipe)
    got = candidates(monkeypatch, tmp_path, recipe)
    store = LocalStore(tmp_path / "store")
    manifest = commit_folder(store, "mixing/mix_candidates/v", tmp_path / "out", {})
    instance = DagsterInstance.ephemeral()
    inputs = Inputs(context=SimpleNamespace(instance=instance, log=logging.getLogger("t")), store=store, outputs={},
                    extra={"draw": "base"})
    output = Output(spec.key, "mixing/mix_candidates/v", manifest)
    meta = spec.metadata(inputs, output)
    assert meta["new_partitions"] == 4 and meta["candidates"].value == got
    assert sorted(instance.get_dynamic_partitions("mix_candidates")) == sorted(got)
    assert spec.metadata(inputs, output)["new_partitions"] == 0
    instance.dispose()


def test_a_tick_adds_its_own_draws_to_those_before_it(monkeypatch, tmp_path):
    recipe = load_recipe(DEMO_RECIPE)
    spec = spec_of(monkeypatch, recipe)
    store = LocalStore(tmp_path / "store")
    instance = DagsterInstance.ephemeral()

    def prepare(tags):
        context = SimpleNamespace(instance=instance, run=SimpleNamespace(tags=tags), log=logging.getLogger("t"))
        return spec.prepare(Inputs(context=context, store=store, outputs={}))

    # Nothing drawn yet: an untagged run draws the base sweep, a tick's run the base sweep and the tick.
    assert prepare({}).extra == {"draw": "base", "draws": ["base"]}
    first = prepare({"pretrain/mix_tick": "2026-12-06T03:00Z"})
    assert first.extra["draws"] == first.fingerprints == ["2026-12-06T03:00Z", "base"]
    (tmp_path / "a").mkdir()
    payload = drawn(monkeypatch, tmp_path / "a", recipe, first.extra["draws"])
    assert sorted(payload["draws"]) == ["2026-12-06T03:00Z", "base"]
    base, tick = set(payload["draws"]["base"]), set(payload["draws"]["2026-12-06T03:00Z"])
    assert len(base) == len(tick) == 4 and not base & tick and set(payload["candidates"]) == base | tick
    # Committed (as the factory does, with this code version), the next tick adds its draws to those.
    commit_folder(store, "mixing/mix_candidates/a", tmp_path / "a" / "out", {"code_version": spec.code_version})
    instance.report_runless_asset_event(AssetMaterialization(spec.key, metadata={"prefix": "mixing/mix_candidates/a"}))
    assert prepare({"pretrain/mix_tick": "2026-12-13T03:00Z"}).extra["draws"] == [
        "2026-12-06T03:00Z", "2026-12-13T03:00Z", "base"]
    assert prepare({"pretrain/mix_tick": "2026-12-06T03:00Z"}).fingerprints == first.fingerprints  # same tick
    # Drawn with other settings (another code version), the earlier draws are not these settings' candidates.
    commit_folder(store, "mixing/mix_candidates/b", tmp_path / "a" / "out", {"code_version": "mix_candidates:x:y"})
    instance.report_runless_asset_event(AssetMaterialization(spec.key, metadata={"prefix": "mixing/mix_candidates/b"}))
    assert prepare({"pretrain/mix_tick": "2026-12-13T03:00Z"}).extra["draws"] == ["2026-12-13T03:00Z", "base"]
    with pytest.raises(Failure, match=r"pretrain/mix_tick='next sunday': expected a UTC time like"):
        prepare({"pretrain/mix_tick": "next sunday"})
    instance.dispose()
