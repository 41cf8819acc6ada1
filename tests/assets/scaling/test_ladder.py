"""assets/scaling/ladder.py: the ladder recipe's spec (a partition per rung, on the chosen mixture, the demo's curation
reused), and a small real ladder end to end: every rung a proxy run through the launcher, the fit with its held-out
rung, then training/main with its predicted and achieved loss in its metadata."""

import pytest
import yaml
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from assets.cli import main
from assets.recipe import DEMO_RECIPE, load_recipe
from assets.scaling.section import ladder_key, proxy_settings, rungs
from tests.assets.curated import two_small_sources
from tests.assets.curation.test_ablation import launches
from tests.assets.scaling.test_section import LADDER

FIT = AssetKey(["scaling", "fit"])
MAIN = AssetKey(["training", "main"])


def test_the_ladder_spec_has_a_partition_per_rung_on_the_chosen_mixture():
    from assets.scaling.ladder import ladder_spec

    recipe = load_recipe(LADDER)
    spec = ladder_spec(recipe)
    assert spec.key == ladder_key() and spec.group == "scaling" and spec.resources == frozenset({"launcher"})
    assert spec.asset_args["partitions_def"].get_partition_keys() == [r.name for r in rungs(recipe)]
    assert AssetKey(["mixing", "mixture_weights"]) in spec.deps
    assert {AssetKey(["tokenization", s, "packed"]) for s in recipe.mixing.prior} <= set(spec.deps)
    # A rung's own size and budget are its partition's version, not the section: adding a rung retrains no other.
    assert "train_tokens" not in spec.section["proxy"]
    assert spec.section["proxy"]["model"] == proxy_settings(recipe)["model"]
    assert proxy_settings(recipe)["checkpoint"]["save_final"] is False


def test_the_ladder_recipe_reuses_the_demos_curation_and_draw():
    """Every curation and tokenization asset, and the mixture draw, has the demo's code version: in one PRETRAIN_HOME
    the ladder reuses what the demo made. The demo has no scaling assets."""
    from assets.definitions import build_defs

    def versions(path):
        graph = build_defs(load_recipe(path)).resolve_asset_graph()
        return {k.to_user_string(): graph.get(k).code_version for k in graph.get_all_asset_keys()}

    demo, ladder = versions(DEMO_RECIPE), versions(LADDER)
    shared = [k for k in demo if k.startswith(("curation/", "tokenization/")) and "ablation" not in k]
    assert len(shared) > 20 and {k: ladder.get(k) for k in shared} == {k: demo[k] for k in shared}
    assert ladder["mixing/mix_candidates"] == demo["mixing/mix_candidates"]
    assert {"scaling/ladder", "scaling/fit"} <= set(ladder) and not any(k.startswith("scaling/") for k in demo)


SIZES = [{"d_model": 16, "n_layers": 1, "n_heads": 2}, {"d_model": 24, "n_layers": 1, "n_heads": 2},
         {"d_model": 32, "n_layers": 1, "n_heads": 2}, {"d_model": 32, "n_layers": 2, "n_heads": 2},
         {"d_model": 48, "n_layers": 2, "n_heads": 2}]
BUDGETS = [4096, 8192, 16384]  # 8, 16 and 32 steps of 8 sequences of 64 tokens


def write_recipe(path):
    """The curated home's two sources (tests/assets/curated.py), equal weights (no sweep), a tiny ladder, and a main of
    the largest size at 24 steps: between the ladder's budgets, so its prediction is the law's, not a rung's loss."""
    raw = two_small_sources()
    raw.pop("mixing")
    raw["training"] = {"main": {
        "train_tokens": 12288, "model": {"vocab_size": 1024, "d_model": 48, "n_layers": 2, "n_heads": 2},
        "optim": {"lr": 3.0e-3}, "schedule": {"kind": "wsd", "warmup_tokens": 1024, "decay_fraction": 0.25},
        "batch": {"global_batch": 8, "micro_batch": 8, "seq_len": 64, "ramp_start": None},
        "deepspeed": {"zero_stage": 0}, "checkpoint": {"interval_steps": 0},
        "metrics": {"log_interval": 8, "eval_batches": 4, "tensorboard": False}}}
    raw["scaling"] = {"sizes": SIZES, "tokens": BUDGETS, "bootstrap": 10}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def metadata(instance, key, partition=None) -> tuple[dict, str]:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None), limit=1).records
    event = records[0]
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}, event.run_id


@pytest.mark.slow  # ~1.5 min on 2 busy cores: 15 proxy runs and main on the session's curated home
def test_a_small_ladder_fits_and_predicts_main(tmp_path, monkeypatch, curated_home):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    assert main(["materialize", "--stale", "--jobs", "2", "--select", "+scaling/fit"]) == 0
    assert main(["materialize", "--stale", "--select", "training/main"]) == 0

    instance = DagsterInstance.get()
    ladder = rungs(load_recipe(recipe))
    assert len(ladder) == 15
    runs = []
    for rung in ladder:
        meta, run_id = metadata(instance, ladder_key(), rung.name)
        runs.append(run_id)
        assert (meta["n_params"], meta["tokens"]) == (rung.n_params, rung.tokens)
        assert meta["loss"] == pytest.approx(sum(meta["val_loss"].values()) / 2)  # equal weights over c4 and math
        assert meta["flops"] == 6 * rung.n_params * rung.tokens
    assert launches(instance, runs) == 15  # each rung a trainer launched by the launcher resource

    fit, _ = metadata(instance, FIT)
    assert fit["fit_points"] == 15
    assert all(fit["intervals"][name][0] <= fit["intervals"][name][1] for name in ("E", "A", "B", "alpha", "beta"))
    assert "data:image/png;base64," in fit["loss_vs_compute"]
    assert fit["main_flops"] == 6 * fit["main_n_params"] * 12288 and fit["optimal_n_params"] > 0
    # Held out: the largest size's three rungs predicted by a fit of the other four sizes, and each size's largest
    # budget by a fit of its shorter runs.
    assert fit["held_out_size"] == ladder[-1].size.name and fit["held_out_budget"] == [BUDGETS[-1]]
    assert sorted(fit["held_out_size_rungs"]) == sorted(r.name for r in ladder[-3:])
    assert sorted(fit["held_out_budget_rungs"]) == sorted(r.name for r in ladder if r.tokens == BUDGETS[-1])
    for name in ("size", "budget"):
        errors = fit[f"held_out_{name}_rungs"]
        for rung, e in errors.items():
            assert e["error_pct"] == pytest.approx(100 * abs(e["predicted"] - e["achieved"]) / e["achieved"])
        assert fit[f"held_out_{name}_max_error_pct"] == max(e["error_pct"] for e in errors.values())
    # The check, on this small ladder: the held-out size predicted within 3%.
    assert fit["held_out_size_max_error_pct"] < 3, fit

    trained, _ = metadata(instance, MAIN)
    assert trained["predicted_val_loss"] == pytest.approx(fit["main_predicted_loss"])
    assert trained["achieved_val_loss"] == pytest.approx(sum(trained["val_loss"].values()) / 2)
    assert trained["prediction_error"] == pytest.approx(trained["predicted_val_loss"] - trained["achieved_val_loss"])
    # Before it trained, the prediction was recorded as an observation of training/main.
    [observed] = [e.asset_observation for e in instance.fetch_observations(MAIN, limit=5).records
                  if "predicted_val_loss" in e.asset_observation.metadata] or [None]
    assert observed is not None and observed.metadata["predicted_val_loss"].value == trained["predicted_val_loss"]
