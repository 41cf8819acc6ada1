"""`mixing/mixture_weights`: fits loss ~ weights over every swept candidate (RegMix) and picks the mixture with
the lowest predicted target loss. Kept fresh by the automation sensor once the sweep reruns; a training stage
reads the chosen weights, with their data version, from the store."""

from pathlib import Path

from dagster import AssetRecordsFilter, AutomationCondition, Failure, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output, output_at
from assets.mixing.section import (
    MIXING_IMPLEMENTATION,
    candidates_key,
    read_result,
    sweep_key,
    weights_key,
    weights_section,
    write_result,
)
from assets.plots import bar_chart
from assets.recipe import Recipe
from trainer.mixing import best_mixture, fit_mixture_regression


def mixture_weights_asset(recipe: Recipe):
    cfg = recipe.mixing.engine_config()

    def prepare(inputs: Inputs) -> Inputs:
        candidates = read_result(inputs.store, inputs.read(candidates_key()).prefix)["candidates"]
        results, swept = [], {}  # swept: each partition's data version (the version key's upstream)
        for name in sorted(candidates):
            record = _latest_partition(inputs.context.instance, name)
            if record is None:
                raise Failure(description=f"mix_sweep partition {name} has not run: materialize every partition "
                                          "of mixing/mix_sweep first")
            prefix = record.asset_materialization.metadata["prefix"].value
            swept[f"mixing/mix_sweep[{name}]"] = output_at(inputs.store, sweep_key(), prefix).data_version
            results.append(read_result(inputs.store, prefix))
        return inputs.but(key_upstream=swept, manifest={"swept": swept}, extra={"results": results})

    def build(inputs: Inputs, out_dir: Path) -> dict:
        results = inputs.extra["results"]
        model = fit_mixture_regression([r["weights"] for r in results], [r["target_loss"] for r in results],
                                       ridge=cfg.ridge)
        best, predicted = best_mixture(model, cfg)
        write_result(out_dir, {"weights": best, "predicted_target_loss": predicted, "r2": model.r2,
                               "loo_rmse": model.loo_rmse, "target": recipe.mixing.target,
                               "candidates": {r["mixture"]: r["target_loss"] for r in results}})
        return {}

    def metadata(inputs: Inputs, output: Output) -> dict:
        payload = read_result(inputs.store, output.prefix)
        return {
            "weights": MetadataValue.json(payload["weights"]),
            "weights_plot": bar_chart(payload["weights"], title="chosen mixture", ylabel="weight"),
            "predicted_target_loss": payload["predicted_target_loss"],
            "best_swept_loss": min(payload["candidates"].values()),
            "fit_r2": payload["r2"], "fit_loo_rmse": payload["loo_rmse"],
            "swept": MetadataValue.json(payload["candidates"]),
        }

    return output_asset(OutputSpec(
        key=weights_key(), group="mixing", stage="mixture_weights", implementation=MIXING_IMPLEMENTATION,
        section=weights_section(recipe),
        description=("The chosen mixture: a regression of the target loss on the weights, fitted over every "
                     "swept candidate (RegMix), minimised over fresh mixtures around the prior."),
        deps=[sweep_key()], prepare=prepare, build=build, metadata=metadata,
        asset_args={"automation_condition": AutomationCondition.eager()},
    ))


def _latest_partition(instance, partition: str):
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=sweep_key(), asset_partitions=[partition]),
                                              limit=1).records
    return records[0] if records else None
