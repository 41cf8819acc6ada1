"""`mixing/mixture_weights`: fits loss ~ weights over every completed proxy run of every draw so far (RegMix)
and picks the mixture with the lowest predicted target loss. The mixing sensor refits it once a tick's sweep
runs have finished; a training stage reads the chosen weights, with their data version, from the store.

A candidate whose run has not finished (or failed) is left out and named ("pending"), as is one whose latest
result came from another proxy (a changed `mixing.proxy` until the sweep reruns): runs of different proxies
are not comparable. With fewer runs than the quadratic model's features the fit falls back to the linear
model (trainer/data/mixture_search.py choose_model): a warning in the log and `fit_warning` in the metadata say so. How
well the fit predicts is measured on runs it did not see: each run left out in turn (`fit_loo_rmse`, beside
`fit_loo_baseline_rmse` for predicting the mean of the others, and `fit_loo_rank_correlation`, Spearman's, over
the runs).

The data budget: the search discards every mixture that would read a source more than mixing.max_epochs times
in training.main's tokens, by the packed token counts main reads (assets/mixing/budget.py); the metadata gives
how many it discarded and the chosen mixture's epochs per source on main's budget."""

from pathlib import Path

from dagster import AssetRecordsFilter, Failure, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output, output_at
from assets.mixing.budget import max_weights, mixture_epochs, packed_tokens
from assets.mixing.mix_sweep import mix_sweep_spec
from assets.mixing.section import (
    candidates_key,
    read_result,
    sweep_key,
    weights_key,
    weights_section,
    write_result,
)
from assets.plots import bar_chart
from assets.recipe import Recipe
from assets.tokenization.packed import packed_key, source_packed


def mixture_weights_asset(recipe: Recipe):
    cfg = recipe.mixing.engine_config()
    sweep_version = mix_sweep_spec(recipe).code_version  # the current proxy's runs only
    main_tokens, max_epochs = recipe.training.main["train_tokens"], recipe.mixing.max_epochs

    def prepare(inputs: Inputs) -> Inputs:
        drawn = read_result(inputs.store, inputs.read(candidates_key()).prefix)
        results, swept, pending, other = [], {}, [], []  # swept: each partition's data version (the version key's)
        for name in sorted(drawn["candidates"]):
            record = _latest_partition(inputs.context.instance, name)
            if record is None:
                pending.append(name)
                continue
            output = output_at(inputs.store, sweep_key(), record.asset_materialization.metadata["prefix"].value)
            if output.manifest.get("code_version") != sweep_version:
                other.append(name)
                continue
            swept[f"mixing/mix_sweep[{name}]"] = output.data_version
            results.append(read_result(inputs.store, output.prefix))
        if len(results) < 2:
            raise Failure(description=f"{len(results)} of the {len(drawn['candidates'])} candidates have a proxy run "
                                      "of the current sweep: the fit needs 2 or more; materialize the partitions of "
                                      "mixing/mix_sweep first")
        if pending or other:
            inputs.log.warning(f"fitting {len(results)} proxy runs; left out: not run yet {pending}, run with "
                               f"another proxy {other}")
        # The tokens main will read of each source: a new packing is another budget, so another fit.
        # A crawl of dumps: every dump's tokens, so the mixture sees the source grow.
        packed = {name: source_packed(inputs.context.instance, inputs.store, recipe.source(name))
                  for name in sorted(recipe.mixing.prior)}
        available = {name: sum(packed_tokens(out.manifest) for out in outs) for name, outs in packed.items()}
        versions = {out.key.to_user_string() + (f"[{out.partition}]" if out.partition else ""): out.data_version
                    for outs in packed.values() for out in outs}
        return inputs.but(key_upstream={**swept, **versions}, manifest={"swept": swept, "packed": versions},
                          extra={"results": results, "pending": pending + other, "draws": drawn.get("draws", {}),
                                 "available": available})

    def build(inputs: Inputs, out_dir: Path) -> dict:
        from trainer.data.mixture_search import best_mixture, fit_mixture_regression
        results = inputs.extra["results"]
        model = fit_mixture_regression([r["weights"] for r in results], [r["target_loss"] for r in results],
                                       ridge=cfg.ridge)
        if model.warning:
            inputs.log.warning(f"mixture fit: {model.warning}")
        available = inputs.extra["available"]
        try:
            choice = best_mixture(model, cfg, max_weights(available, train_tokens=main_tokens, max_epochs=max_epochs))
        except ValueError as exc:
            raise Failure(description=f"{exc}: mixing.max_epochs {max_epochs:g} on training.main's {main_tokens:,} "
                                      f"tokens, packed tokens {available}; raise max_epochs, lower the prior of "
                                      "that source or train main on fewer tokens") from None
        if choice.discarded:
            inputs.log.info(f"data budget: {choice.discarded} of {choice.scored} mixtures scored would read a source "
                            f"more than {max_epochs:g} times in main's {main_tokens:,} tokens; discarded")
        best, predicted = choice
        fitted = {r["mixture"] for r in results}
        loo = {r["mixture"]: {"target_loss": r["target_loss"], "predicted_without_it": p}
               for r, p in zip(results, model.loo_predictions)}
        loo_warning = None
        if model.loo_rmse >= model.loo_baseline_rmse:
            loo_warning = (f"the fit predicts a run it did not see no better than the mean of the others (leave-one-out "
                           f"error {model.loo_rmse:.4f}, the mean's {model.loo_baseline_rmse:.4f}): the chosen mixture "
                           "is a guess; more candidates or ticks give the fit evidence")
            inputs.log.warning(f"mixture fit: {loo_warning}")
        else:
            inputs.log.info(f"mixture fit ({model.model}, {len(results)} runs): leave-one-out error "
                            f"{model.loo_rmse:.4f} against {model.loo_baseline_rmse:.4f} for the mean of the other runs, "
                            f"rank correlation {model.loo_rank_correlation}")
        write_result(out_dir, {"weights": best, "predicted_target_loss": predicted, "r2": model.r2,
                               "loo_rmse": model.loo_rmse, "loo_baseline_rmse": model.loo_baseline_rmse,
                               "loo_rank_correlation": model.loo_rank_correlation, "loo": loo,
                               "loo_warning": loo_warning,
                               "target": recipe.mixing.target,
                               "model": model.model, "features": model.features, "fit_warning": model.warning,
                               "candidates": {r["mixture"]: r["target_loss"] for r in results},
                               "runs_per_draw": {d: len(fitted & set(names))
                                                 for d, names in inputs.extra["draws"].items()},
                               "pending": inputs.extra["pending"],
                               "epochs": mixture_epochs(best, available, train_tokens=main_tokens),
                               "max_epochs": max_epochs, "tokens_available": available,
                               "draws_scored": choice.scored, "draws_discarded": choice.discarded})
        return {}

    def metadata(inputs: Inputs, output: Output) -> dict:
        payload = read_result(inputs.store, output.prefix)
        return {
            "weights": MetadataValue.json(payload["weights"]),
            "weights_plot": bar_chart(payload["weights"], title="chosen mixture", ylabel="weight"),
            "predicted_target_loss": payload["predicted_target_loss"],
            "best_swept_loss": min(payload["candidates"].values()),
            "fit_r2": payload["r2"],
            # Held out: each run's loss predicted by the fit over the other runs. The baseline predicts the mean
            # of the others; a fit that does not beat it, or ranks the runs wrongly, is no guide to the choice.
            "fit_loo_rmse": payload["loo_rmse"], "fit_loo_baseline_rmse": payload["loo_baseline_rmse"],
            "fit_loo_rank_correlation": payload["loo_rank_correlation"],
            "fit_loo": MetadataValue.json(payload["loo"]),
            "fit_loo_warning": payload["loo_warning"] or "none: the fit beats the mean of the other runs",
            "fit_model": payload["model"], "fit_features": payload["features"],
            "fit_runs": len(payload["candidates"]),
            "fit_warning": payload["fit_warning"] or "none: at least as many runs as the model's features",
            "runs_per_draw": MetadataValue.json(payload["runs_per_draw"]),
            "pending": MetadataValue.json(payload["pending"]),
            "swept": MetadataValue.json(payload["candidates"]),
            # The data budget: the chosen mixture's epochs per source on main's tokens, and the draws it ruled out.
            "epochs": MetadataValue.json(payload["epochs"]), "max_epochs": payload["max_epochs"],
            "tokens_available": MetadataValue.json(payload["tokens_available"]),
            "draws_discarded": payload["draws_discarded"], "draws_scored": payload["draws_scored"],
        }

    return output_asset(OutputSpec(
        key=weights_key(), group="mixing", stage="mixture_weights",
        section=weights_section(recipe),
        description=("The chosen mixture: a regression of the target loss on the weights, fitted over every "
                     "completed proxy run of every draw (RegMix; the linear model while runs are fewer than the "
                     "quadratic model's features), minimised over fresh mixtures around the prior that read no source "
                     "more than mixing.max_epochs times in training.main's tokens."),
        deps=[sweep_key(), *(packed_key(name) for name in sorted(recipe.mixing.prior))],
        prepare=prepare, build=build, metadata=metadata,
    ))


def _latest_partition(instance, partition: str):
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=sweep_key(), asset_partitions=[partition]),
                                              limit=1).records
    return records[0] if records else None
