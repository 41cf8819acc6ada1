"""assets/scaling/fit.py: the fit's spec for the ladder recipe (it reads the ladder, not main's run; main's N and D
are in its version), and the loss-against-compute plot of a real fit (the fit's run is in test_ladder.py)."""

from dagster import AssetKey

import assets.scaling.fit as fit_module
from assets.recipe import load_recipe
from assets.recipe.scaling import scaling_params
from tests.assets.scaling.test_section import LADDER
from tests.assets.test_plots import decoded
from trainer.planner.scaling_law import fit_scaling_law


def test_the_fit_reads_the_ladder_and_versions_its_settings_and_mains_size(monkeypatch):
    monkeypatch.setattr(fit_module, "output_asset", lambda spec: spec)
    recipe = load_recipe(LADDER)
    spec = fit_module.fit_asset(recipe)
    assert spec.key == AssetKey(["scaling", "fit"]) and list(spec.deps) == [AssetKey(["scaling", "ladder"])]
    assert "proxy" not in spec.section["fit"] and spec.section["fit"]["held_out"] is True
    assert spec.section["main"] == {"n_params": scaling_params(recipe.training.main),
                                    "tokens": recipe.training.main["train_tokens"]}


def test_the_plot_shows_each_size_the_held_out_predictions_and_the_frontier():
    from trainer.planner.scaling_law import held_out

    law = lambda n, d: 1.8 + 400 / n**0.35 + 900 / d**0.3
    rungs = [{"rung": f"n{n}-t{d}", "n_params": n, "tokens": d, "flops": 6 * n * d, "loss": law(n, d)}
             for n in (2e4, 5e4, 1e5, 2e5, 4e5) for d in (3e4, 6e4, 1.2e5)]
    points = [(r["n_params"], r["tokens"], r["loss"]) for r in rungs]
    fit = fit_scaling_law(points, bootstrap=0)
    _, errors = held_out(points, [n == 4e5 for n, _, _ in points])
    size = {"left_out": "n400000", "max_error_pct": max(e["error_pct"] for e in errors),
            "rungs": [{"rung": r["rung"], "predicted": e["predicted"]} for r, e in zip(rungs[-3:], errors)]}
    payload = {"rungs": rungs, "held_out": {"size": size},
               "main": {"flops": 6 * 4e5 * 2.4e5, "predicted_loss": fit.predict(4e5, 2.4e5)}}
    image = decoded(fit_module._plot(fit, payload))
    assert image.format == "PNG" and image.size == (512, 256)
    # Five sizes and the held-out size's predictions in the default colour cycle's first six colours, the frontier
    # and main's star in black.
    colours = {colour for _, colour in image.convert("RGB").getcolors(maxcolors=1 << 16)}
    assert {(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
            (0, 0, 0)} <= colours
