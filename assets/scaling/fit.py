"""`scaling/fit`: L(N, D) = E + A/N^alpha + B/D^beta fitted to every rung of the ladder (Chinchilla's approach 3,
trainer/planner/scaling_law.py), and two held-out checks that say how far the law can be trusted beyond its points:
the law fitted again without every rung of the largest size predicts that size (small models predicting a larger
one, what a ladder is for), and fitted without each size's largest budget predicts those (a longer run than any
fitted). Their errors are measured on losses those fits never saw. Commits fit.json (ScalingFit.to_json() of the
fit on every rung: what `pretrain plan --budget` and the training stages' predictions read) and result.json (the
rungs, the held-out checks, training.main's prediction and compute-optimal N and D).

Every rung of the current recipe must have a run of the current ladder (the same proxy and mixture): runs of
different proxies are not comparable. The training stages read the latest fit for their predicted loss without
depending on this asset (assets/scaling/predict.py), so a refit never makes a trained stage stale."""

import json
from pathlib import Path
from typing import TYPE_CHECKING

from dagster import AssetRecordsFilter, Failure, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output, output_at
from assets.plots import scatter_chart
from assets.recipe import Recipe
from assets.scaling.ladder import ladder_spec
from assets.scaling.section import (
    FIT_FILE,
    RESULT_FILE,
    compute,
    fit_key,
    ladder_key,
    largest_budget,
    largest_size,
    rungs,
    scaling_params,
    smallest,
    write_result,
)

if TYPE_CHECKING:  # the fit (numpy) is imported where the asset runs, not when the code location loads
    from trainer.planner.scaling_law import ScalingFit

FRONTIER_POINTS = 40


def fit_asset(recipe: Recipe):
    ladder_version = ladder_spec(recipe).code_version  # the current proxy's runs only
    section = recipe.scaling
    main = dict(recipe.training.main)
    main_n, main_d = scaling_params(main), int(main["train_tokens"])

    def prepare(inputs: Inputs) -> Inputs:
        results, versions, missing, other = [], {}, [], []
        for rung in rungs(recipe):
            record = _latest_partition(inputs.context.instance, rung.name)
            if record is None:
                missing.append(rung.name)
                continue
            output = output_at(inputs.store, ladder_key(), record.asset_materialization.metadata["prefix"].value)
            if output.manifest.get("code_version") != ladder_version:
                other.append(rung.name)
                continue
            versions[f"scaling/ladder[{rung.name}]"] = output.data_version
            results.append(json.loads(inputs.store.get_bytes(f"{output.prefix}/{RESULT_FILE}")))
        if missing or other:
            raise Failure(description=f"the fit needs a run of every rung of the current ladder: not run yet "
                                      f"{missing}, run with another proxy or mixture {other}; materialize the "
                                      "partitions of scaling/ladder first")
        mixtures = {json.dumps(r["weights"], sort_keys=True) for r in results}
        if len(mixtures) > 1:
            raise Failure(description=f"the rungs trained on {len(mixtures)} different mixtures; rerun scaling/ladder")
        return inputs.but(key_upstream=versions, manifest={"rungs": versions}, extra={"results": results})

    def build(inputs: Inputs, out_dir: Path) -> dict:
        from trainer.planner.scaling_law import fit_scaling_law, held_out
        results = {r["rung"]: r for r in inputs.extra["results"]}
        ladder = rungs(recipe)
        points = [(results[r.name]["n_params"], results[r.name]["tokens"], results[r.name]["loss"]) for r in ladder]
        fit = fit_scaling_law(points, bootstrap=section.bootstrap, seed=section.seed)
        (out_dir / FIT_FILE).write_text(json.dumps(fit.to_json(), indent=1, sort_keys=True))
        spread = results[smallest(ladder).name]["loss"] - min(r["loss"] for r in results.values())
        checks = {}
        if section.held_out:
            for name, left_out in (("size", largest_size(ladder)), ("budget", largest_budget(ladder))):
                names = {r.name for r in left_out}
                _, errors = held_out(points, [r.name in names for r in ladder])
                worst = max(e["error_pct"] for e in errors)
                checks[name] = {
                    "left_out": left_out[0].size.name if name == "size" else sorted({r.tokens for r in left_out}),
                    "rungs": [{"rung": r.name, "achieved": e["loss"], "predicted": e["predicted"], "error": e["error"],
                               "error_pct": e["error_pct"]} for r, e in zip(left_out, errors)],
                    "max_error_pct": worst,
                    "max_error_of_spread": max(abs(e["error"]) for e in errors) / spread if spread > 0 else None}
        main_c = compute(main_n, main_d)
        n_opt, d_opt = fit.optimal(main_c)
        write_result(out_dir, {
            "rungs": list(results.values()), "fitted": [r.name for r in ladder], "held_out": checks,
            "spread": spread, "smallest_rung": smallest(ladder).name,
            "main": {"n_params": main_n, "tokens": main_d, "flops": main_c,
                     "predicted_loss": fit.predict(main_n, main_d), "optimal_n_params": n_opt,
                     "optimal_tokens": d_opt, "optimal_predicted_loss": fit.predict(n_opt, d_opt)},
            "weights": results[ladder[0].name]["weights"], "seq_len": results[ladder[0].name].get("seq_len"),
        })
        return {}

    def metadata(inputs: Inputs, output: Output) -> dict:
        from trainer.planner.scaling_law import ScalingFit
        payload = json.loads(inputs.store.get_bytes(f"{output.prefix}/{RESULT_FILE}"))
        fit = ScalingFit.from_json(json.loads(inputs.store.get_bytes(f"{output.prefix}/{FIT_FILE}")))
        main_run = payload["main"]
        a, b = fit.exponents()
        held = {}
        for name, check in payload["held_out"].items():  # held out: each error on losses its fit never saw
            held.update({
                f"held_out_{name}": MetadataValue.json(check["left_out"]),
                f"held_out_{name}_max_error_pct": check["max_error_pct"],
                f"held_out_{name}_max_error_of_spread": (check["max_error_of_spread"]
                                                         if check["max_error_of_spread"] is not None else float("nan")),
                f"held_out_{name}_rungs": MetadataValue.json({r["rung"]: {k: r[k] for k in ("achieved", "predicted",
                                                                                           "error_pct")}
                                                              for r in check["rungs"]})})
        return {
            "E": fit.E, "A": fit.A, "B": fit.B, "alpha": fit.alpha, "beta": fit.beta,
            "intervals": MetadataValue.json({k: list(v) for k, v in fit.intervals.items()}),
            "exponents": MetadataValue.json({"a (N_opt ∝ C^a)": a, "b (D_opt ∝ C^b)": b, "chinchilla": 0.5}),
            "fit_rule": fit.rule, "fit_points": fit.points, **held, "rung_loss_spread": payload["spread"],
            "main_n_params": main_run["n_params"], "main_tokens": main_run["tokens"], "main_flops": main_run["flops"],
            "main_predicted_loss": main_run["predicted_loss"],
            "optimal_n_params": main_run["optimal_n_params"], "optimal_tokens": main_run["optimal_tokens"],
            "optimal_predicted_loss": main_run["optimal_predicted_loss"],
            "rungs": MetadataValue.json({r["rung"]: {k: r[k] for k in ("n_params", "tokens", "flops", "loss")}
                                         for r in payload["rungs"]}),
            "loss_vs_compute": _plot(fit, payload),
        }

    return output_asset(OutputSpec(
        key=fit_key(), group="scaling", stage="scaling_fit",
        section={"fit": {k: v for k, v in section.model_dump(mode="json").items() if k != "proxy"},
                 "main": {"n_params": main_n, "tokens": main_d}},
        description=("L(N, D) = E + A/N^α + B/D^β fitted to the ladder's rungs by Chinchilla's approach 3 (Huber "
                     "on log-loss, L-BFGS from a grid), bootstrap intervals; held out: the largest size predicted "
                     "by a fit without it, each size's largest budget by a fit without those; training.main's "
                     "predicted loss and the compute-optimal N and D for its FLOPs (6·N·D). Driven by the "
                     "recipe's `scaling` section."),
        deps=[ladder_key()], prepare=prepare, build=build, metadata=metadata,
    ))


def _plot(fit: "ScalingFit", payload: dict) -> MetadataValue:
    """Loss against C = 6·N·D: each size's rungs, the held-out checks' predictions, the law's compute frontier."""
    series: dict[str, list] = {}
    for r in sorted(payload["rungs"], key=lambda r: (r["n_params"], r["tokens"])):
        series.setdefault(f"N={r['n_params']:,}", []).append((r["flops"], r["loss"]))
    flops = {r["rung"]: r["flops"] for r in payload["rungs"]}
    for name, check in payload["held_out"].items():
        series[f"largest {name} held out, predicted (≤{check['max_error_pct']:.1f}% off)"] = [
            (flops[r["rung"]], r["predicted"]) for r in check["rungs"]]
    every = list(flops.values()) + [payload["main"]["flops"]]
    lo, hi = min(every) / 2, max(every) * 2
    grid = [lo * (hi / lo) ** (i / (FRONTIER_POINTS - 1)) for i in range(FRONTIER_POINTS)]
    frontier = [(c, fit.predict(*fit.optimal(c))) for c in grid]
    main_point = (payload["main"]["flops"], payload["main"]["predicted_loss"])
    return scatter_chart(series, lines={"fitted frontier (compute-optimal)": frontier,
                                        "training/main, predicted": [main_point]},
                         title="loss against compute", xlabel="C = 6·N·D (FLOPs)", ylabel="validation loss",
                         logx=True)


def _latest_partition(instance, partition: str):
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=ladder_key(), asset_partitions=[partition]),
                                              limit=1).records
    return records[0] if records else None
