"""`mixing/mix_sweep` (one partition per candidate mixture): trains the proxy model (training.main with
mixing.proxy merged over it) on one candidate's mixture of the packed sources through the launcher resource;
records each domain's validation loss, the target loss and each source's epochs (assets/mixing/budget.py: the
proxy's tokens drawn from it ÷ its tokens). Every partition drawn so far is kept: the mixing
sensor (assets/mixing/__init__.py) runs each new one once, and a rerun of an unchanged one reuses its result."""

from pathlib import Path

from dagster import Failure, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.mixing.budget import run_epochs
from assets.mixing.section import (
    CANDIDATES,
    candidates_key,
    mixing_section,
    proxy_launch,
    proxy_settings,
    read_result,
    sweep_key,
    target_loss,
    write_result,
)
from assets.plots import bar_chart
from assets.recipe import Recipe
from assets.training.inputs import packed_keys, training_inputs


def mix_sweep_asset(recipe: Recipe):
    return output_asset(mix_sweep_spec(recipe))


def mix_sweep_spec(recipe: Recipe) -> OutputSpec:
    """The sweep's spec (mixture_weights fits only the runs of its current code version: the same proxy)."""
    sources = sorted(recipe.mixing.prior)
    launch = proxy_launch(recipe).overrides()
    target_name = recipe.mixing.target

    def prepare(inputs: Inputs) -> Inputs:
        name = inputs.context.partition_key
        candidates = read_result(inputs.store, inputs.read(candidates_key()).prefix)["candidates"]
        if name not in candidates:
            raise Failure(description=f"partition {name} is not a candidate of the current recipe's mixing section "
                                      f"(candidates: {', '.join(sorted(candidates))}); it is left from an older sweep")
        found = training_inputs(inputs.context, inputs.store, inputs.resources.scratch, sources, recipe)
        return inputs.but(upstream=found.upstream, fingerprints=[name], manifest={"lineage": found.lineage},
                          extra={"name": name, "weights": candidates[name], "training": found})

    def build(inputs: Inputs, out_dir: Path) -> dict:
        name, weights, found, work = inputs.extra["name"], inputs.extra["weights"], inputs.extra["training"], inputs.work
        run = {**proxy_settings(recipe), "stage": f"proxy-{name}", "output_dir": str(work / "out"),
               "data": {"shards": {k: str(v) for k, v in found.folders.items()}, "weights": weights},
               "tokenizer_sha256": found.tokenizer_sha256, "lineage": found.lineage}
        budget = run_epochs(f"mixing/mix_sweep[{name}]", found.folders, weights, run)
        result = inputs.resources.launcher.launch(inputs.context, run, work, settings=launch)
        val = result.summary.get("val_loss") or {}
        if not val or (target_name != "average" and target_name not in val):
            raise Failure(description=f"the proxy run reported validation loss for {sorted(val)}: nothing for the "
                                      f"target ({target_name}); does that source hold out any document?")
        if set(val) != set(sources):
            inputs.log.warning(f"no held-out documents for {sorted(set(sources) - set(val))}: the average "
                               f"is over {sorted(val)}")
        target = target_loss(val, target_name)
        precision = result.events("precision")
        write_result(out_dir, {"mixture": name, "weights": weights, "val_loss": val, "target_loss": target,
                               "target": target_name, "tokens": result.summary.get("tokens"),
                               "losses": result.summary.get("losses"),
                               "precision": precision[-1]["dtype"] if precision else None,
                               "threads": precision[-1].get("threads") if precision else None, **budget})
        return {}

    def metadata(inputs: Inputs, output: Output) -> dict:
        payload = read_result(inputs.store, output.prefix)
        return {
            "target_loss": payload["target_loss"], "val_loss": MetadataValue.json(payload["val_loss"]),
            "weights": MetadataValue.json(payload["weights"]), "precision": payload.get("precision") or "unknown",
            "threads": payload.get("threads") or 0,  # the proxy trainer's CPU threads (launch settings; 0: unknown)
            "epochs": MetadataValue.json(payload.get("epochs") or {}),  # the proxy's draws ÷ each source's tokens
            "weights_plot": bar_chart(payload["weights"], title=f"mixture {inputs.extra['name']}", ylabel="weight"),
            "val_loss_plot": bar_chart(payload["val_loss"], title="validation loss per domain", ylabel="loss"),
        }

    return OutputSpec(
        key=sweep_key(), group="mixing", stage="mix_sweep", code=("trainer",),
        section=mixing_section(recipe),
        description=("One proxy run per candidate mixture (a partition): the proxy model (training.main with "
                     "mixing.proxy over it) trained on that mixture of the packed sources; records each domain's "
                     f"validation loss and the target ({target_name}). Driven by `mixing` and `training`."),
        deps=[candidates_key(), *packed_keys(sources)], prepare=prepare, build=build, metadata=metadata,
        resources=frozenset({"launcher"}), out_name="result",
        asset_args={"partitions_def": CANDIDATES,
                    "metadata": {"launch": MetadataValue.json(launch)}},  # over the launcher resource's defaults
    )
