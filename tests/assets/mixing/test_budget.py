"""assets/mixing/budget.py: the data budget. The discard rule of the mixture search (a draw above a source's
weight cap is not scored; the caps are max_epochs of its tokens on main's budget); a run's epochs as the trainer's
loader counts them, on real packed text, beside the closed form the search uses; and mixing/mixture_weights
materialized on the curated home's real packed c4 and math, with a fit that wants more of the small source (c4)
than main's tokens can draw from it 4 times: its best draw keeps to max_epochs, and the metadata says so."""

import json

import numpy as np
import pytest
import yaml
from dagster import AssetKey, AssetMaterialization, DagsterInstance, Failure, materialize

from assets.core.upstream import latest_output
from assets.mixing.budget import max_weights, mixture_epochs, packed_tokens, run_epochs, stage_budget
from assets.mixing.mix_candidates import mix_candidates_asset
from assets.mixing.mix_sweep import mix_sweep_spec
from assets.mixing.mixture_weights import mixture_weights_asset
from assets.mixing.section import RESULT_FILE, candidates_key, sweep_key, weights_key
from assets.recipe import load_recipe
from resources.scratch import ScratchResource
from resources.store_resource import StoreResource
from storage.local import LocalStore
from storage.manifest import commit_folder
from tests.assets.curated import two_small_sources
from tests.assets.training.real_packed import real_packed
from trainer.data.config import MixingConfig
from trainer.data.mixture_search import best_mixture, candidate_mixtures, fit_mixture_regression
from trainer.data.mixture import PackedSource

PRIOR = {"books": 0.2, "code": 0.3, "math": 0.5}


def test_the_search_discards_the_draws_over_a_sources_cap_and_its_best_draw_keeps_to_it():
    """A fit that wants math (loss falls with its weight) and a math with few tokens: the unbounded search gives
    math more than main can draw from it 4 times; bounded, no scored draw above the cap is kept, the best is within
    it, and the draws discarded are those above it. A cap no draw meets fails, naming the source."""
    cfg = MixingConfig(prior=PRIOR, candidates=8, concentration=8.0, search_samples=20_000)
    runs = candidate_mixtures(cfg)
    fit = fit_mixture_regression(runs, [3.0 - m["math"] for m in runs])
    free = best_mixture(fit, cfg)
    available = {"books": 10**6, "code": 10**6, "math": 30_000}
    caps = max_weights(available, train_tokens=262_144, max_epochs=4.0)
    assert caps["math"] == pytest.approx(4.0 * 30_000 / 262_144)
    assert min(m["math"] for m in runs) < caps["math"] < free.weights["math"]  # the bound binds, inside the runs' box
    bounded = best_mixture(fit, cfg, caps)
    assert free.discarded == 0 and bounded.scored == free.scored
    # The draws discarded are exactly those above a cap: counted again from the runs (always scored) and the
    # same Dirichlet pool (the fit prefers math, so the best are the draws nearest the cap).
    assert 0 < bounded.discarded < bounded.scored
    assert sum(m["math"] > caps["math"] for m in runs) <= bounded.discarded
    assert bounded.weights["math"] <= caps["math"] + 1e-12
    epochs = mixture_epochs(bounded.weights, available, train_tokens=262_144)
    assert max(epochs.values()) <= 4.0 and epochs["math"] > 3.0  # as near the bound as the fit pushes it
    assert mixture_epochs(free.weights, available, train_tokens=262_144)["math"] > 4.0
    weights, predicted = bounded  # still unpacks as the pair it was
    assert weights == bounded.weights and predicted == bounded.predicted
    with pytest.raises(ValueError, match=r"all \d+ mixtures scored give math more weight than its budget allows"):
        best_mixture(fit, cfg, {**caps, "math": min(m["math"] for m in runs) / 2})


def test_a_runs_epochs_are_the_loaders_count_and_the_search_computes_the_same(tmp_path):
    """On real packed text: each source's epochs are its tokens drawn (train_tokens at its weight) over its tokens,
    as the loader counts them and as the closed form gives them; a length filter counts only the long documents
    (fewer tokens, more epochs); a stage over max_epochs fails naming the source and its epochs."""
    instance = DagsterInstance.ephemeral()
    store = LocalStore(tmp_path / "store")
    outs, _ = real_packed(instance, store, tmp_path, {"c4": 20_000, "math": 120_000})
    folders = {name: store.local_path(out.prefix) for name, out in outs.items()}
    available = {name: packed_tokens(out.manifest) for name, out in outs.items()}
    weights = {"c4": 0.25, "math": 0.75}
    settings = {"train_tokens": 64 * 256, "batch": {"seq_len": 64}}
    budget = run_epochs("a run", folders, weights, settings)
    assert budget["tokens_available"] == available
    closed = mixture_epochs(weights, available, train_tokens=settings["train_tokens"])
    assert budget["epochs"] == pytest.approx(closed, rel=0.01)
    assert budget["epochs"]["c4"] == pytest.approx(64 * 256 * 0.25 / available["c4"], rel=0.01)
    # A long-context stage: only c4's documents longer than its median count, so it runs through them faster.
    lengths = PackedSource("c4", folders["c4"], "train", verify=False).document_lengths()
    longer = int(np.median(lengths)) + 1
    long = run_epochs("a run", folders, weights, settings, min_doc_tokens=longer)
    assert long["tokens_available"]["c4"] == int(lengths[lengths >= longer].sum()) < available["c4"]
    assert long["epochs"]["c4"] > budget["epochs"]["c4"]
    over = budget["epochs"]["c4"]
    assert stage_budget("training/main", folders, weights, settings, min_doc_tokens=0, max_epochs=over + 0.01) == {
        **budget, "max_epochs": over + 0.01}
    with pytest.raises(Failure) as err:
        stage_budget("training/main", folders, weights, settings, min_doc_tokens=0, max_epochs=over - 0.01)
    assert err.value.description.startswith(f"training/main would read source c4 {over:.1f} times (epochs; ")
    assert f"over its {available['c4']:,} training tokens" in err.value.description
    instance.dispose()


@pytest.mark.slow  # ~6 s (and the curated home, once a session): two materializations
def test_the_search_on_the_packed_counts_keeps_the_best_draw_within_max_epochs(tmp_path, monkeypatch, curated_home):
    """mixing/mix_candidates and mixing/mixture_weights materialized on the curated home's real packed c4 and math,
    the sweep's results recorded as its proxy runs would leave them (their losses fall as c4's weight rises, so the
    fit wants the small source). Main's tokens are set so that c4's cap lies inside the weights the runs tried."""
    raw = two_small_sources()
    raw["training"].pop("long_context", None)
    raw["training"].pop("anneal", None)
    raw.pop("evaluation", None)
    raw["mixing"] = {"prior": {"c4": 0.5, "math": 0.5}, "candidates": 6, "concentration": 4.0, "target": "average",
                     "proxy": {"train_tokens": 4096}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    recipe = load_recipe(path)
    instance = DagsterInstance.get()
    store = LocalStore(curated_home / "store")
    c4 = packed_tokens(latest_output(instance, store, AssetKey(["tokenization", "c4", "packed"])).manifest)
    tried = sorted(m["c4"] for m in candidate_mixtures(recipe.mixing.engine_config()))
    cap = (tried[1] + tried[-2]) / 2  # inside the box of the runs: some runs and many draws are above it
    raw["training"]["main"]["train_tokens"] = int(4.0 * c4 / cap)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    recipe = load_recipe(path)
    resources = {"store": StoreResource(url=str(curated_home / "store")),
                 "scratch": ScratchResource(root=str(curated_home / "work"))}

    assert materialize([mix_candidates_asset(recipe)], resources=resources, instance=instance).success
    [event] = instance.fetch_materializations(candidates_key(), limit=1).records
    candidates = json.loads(store.get_bytes(f"{event.asset_materialization.metadata['prefix'].value}/{RESULT_FILE}"))
    for name, weights in candidates["candidates"].items():  # what each proxy run would leave
        folder = tmp_path / "swept" / name
        folder.mkdir(parents=True)
        (folder / RESULT_FILE).write_text(json.dumps({"mixture": name, "weights": weights,
                                                      "target_loss": 3.0 - weights["c4"]}))
        commit_folder(store, f"mixing/mix_sweep/{name}/r", folder, {"code_version": mix_sweep_spec(recipe).code_version})
        instance.report_runless_asset_event(AssetMaterialization(sweep_key(), partition=name,
                                                                 metadata={"prefix": f"mixing/mix_sweep/{name}/r"}))
    assert materialize([mixture_weights_asset(recipe)], resources=resources, instance=instance).success
    [event] = instance.fetch_materializations(weights_key(), limit=1).records
    meta = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    main_tokens = raw["training"]["main"]["train_tokens"]
    assert meta["max_epochs"] == 4.0 and meta["tokens_available"]["c4"] == c4
    assert 0 < meta["draws_discarded"] < meta["draws_scored"]
    assert meta["epochs"]["c4"] == pytest.approx(main_tokens * meta["weights"]["c4"] / c4, rel=1e-3)
    assert meta["epochs"]["c4"] <= 4.0 and meta["weights"]["c4"] <= cap + 1e-9
    assert meta["epochs"]["c4"] > 3.0  # the fit pushes c4 up to its bound, not beyond
    instance.dispose()
