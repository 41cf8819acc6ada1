"""`scaling/ladder` (one partition per rung: a model size at a token budget): trains the proxy (training.main with
scaling.proxy merged over it, the rung's size and budget) on the chosen mixture (mixing/mixture_weights, as
training/main; equal weights over every source without a mixing section) through the launcher resource, and
records N, D, C = 6·N·D and the final validation loss weighted by the mixture (assets/scaling/section.py says how
each is counted).

A partition's version is its own rung (its size and budget) over the settings every rung shares: a size or a
budget added to the recipe trains the new rungs only, and scaling/fit reads every rung of the current recipe."""

import json
from pathlib import Path

from dagster import Failure, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.lineage import record_of
from assets.core.upstream import Output
from assets.mixing.section import RESULT_FILE as WEIGHTS_FILE
from assets.mixing.section import weights_key
from assets.plots import bar_chart
from assets.recipe import Recipe
from assets.scaling.section import (
    RESULT_FILE,
    compute,
    ladder_key,
    partitions,
    proxy_launch,
    proxy_settings,
    rung_settings,
    rungs,
    train_flops,
    weighted_loss,
    write_result,
)
from assets.training.inputs import packed_keys, training_inputs


def ladder_asset(recipe: Recipe):
    return output_asset(ladder_spec(recipe))


def ladder_sources(recipe: Recipe) -> tuple[list[str], bool]:
    """(the sources the proxies train on, whether the weights are mixing/mixture_weights' choice)."""
    if recipe.mixing is not None:
        return sorted(recipe.mixing.prior), True
    return sorted(s.name for s in recipe.sources), False


def ladder_spec(recipe: Recipe) -> OutputSpec:
    """The ladder's spec (scaling/fit reads only the rungs of its current code version: the same proxy)."""
    by_name = {r.name: r for r in rungs(recipe)}
    sources, uses_mixture = ladder_sources(recipe)
    launch = proxy_launch(recipe)

    def prepare(inputs: Inputs) -> Inputs:
        rung = by_name[inputs.context.partition_key]
        found = training_inputs(inputs.context, inputs.store, inputs.resources.scratch, sources, recipe)
        upstream, lineage = dict(found.upstream), list(found.lineage)
        weights = {name: 1.0 for name in sources}
        if uses_mixture:
            chosen = inputs.read(weights_key())
            weights = json.loads(inputs.store.get_bytes(f"{chosen.prefix}/{WEIGHTS_FILE}"))["weights"]
            upstream[weights_key().to_user_string()] = chosen.data_version
            lineage.insert(0, record_of(chosen))
        return inputs.but(upstream=upstream, fingerprints=[json.dumps(rung.settings, sort_keys=True)],
                          manifest={"lineage": lineage, "weights": weights},
                          extra={"rung": rung, "training": found})

    def build(inputs: Inputs, out_dir: Path) -> dict:
        rung, found, weights = inputs.extra["rung"], inputs.extra["training"], inputs.manifest["weights"]
        settings = rung_settings(recipe, rung)
        run = {**settings, "stage": f"ladder-{rung.name}", "output_dir": str(inputs.work / "out"),
               "data": {"shards": {k: str(v) for k, v in found.folders.items()}, "weights": weights},
               "tokenizer_sha256": found.tokenizer_sha256, "lineage": inputs.manifest["lineage"]}
        result = inputs.resources.launcher.launch(inputs.context, run, inputs.work, settings=launch)
        val = result.summary.get("val_loss") or {}
        loss = weighted_loss(val, weights)
        if loss is None:
            raise Failure(description=f"the proxy run {rung.name} reported validation loss for {sorted(val)}: none "
                                      f"of the mixture's sources {sorted(weights)}; do they hold out documents?")
        tokens = result.summary.get("tokens") or rung.tokens
        precision = result.events("precision")
        write_result(out_dir, {
            "rung": rung.name, "size": rung.size.model(), "n_params": rung.n_params, "tokens": tokens,
            "flops": compute(rung.n_params, tokens), "train_flops": train_flops(settings, tokens),
            "loss": loss, "val_loss": val, "weights": weights, "seq_len": settings.get("batch", {}).get("seq_len"),
            "losses": result.summary.get("losses"), "precision": precision[-1]["dtype"] if precision else None})
        return {}

    def metadata(inputs: Inputs, output: Output) -> dict:
        payload = json.loads(inputs.store.get_bytes(f"{output.prefix}/{RESULT_FILE}"))
        return {
            "loss": payload["loss"], "n_params": payload["n_params"], "tokens": payload["tokens"],
            "flops": payload["flops"], "train_flops": payload["train_flops"],
            "size": MetadataValue.json(payload["size"]), "val_loss": MetadataValue.json(payload["val_loss"]),
            "weights": MetadataValue.json(payload["weights"]), "precision": payload.get("precision") or "unknown",
            "val_loss_plot": bar_chart(payload["val_loss"], title="validation loss per domain", ylabel="loss"),
        }

    mixture = "the chosen mixture (mixing/mixture_weights)" if uses_mixture else "equal weights over every source"
    return OutputSpec(
        key=ladder_key(), group="scaling", stage="scaling_ladder", code=("trainer",),
        section={"proxy": {k: v for k, v in proxy_settings(recipe).items() if k != "train_tokens"},
                 "sources": sources},
        description=(f"The scaling ladder: one proxy run per rung ({len(recipe.scaling.sizes)} sizes × "
                     f"{len(by_name) // len(recipe.scaling.sizes)} token budgets, a partition each), training.main "
                     f"with scaling.proxy over it at the rung's size and budget, on {mixture}; records N "
                     "(every parameter), D, C = 6·N·D and the mixture-weighted validation loss. Driven "
                     "by the recipe's `scaling` and `training` sections."),
        deps=[*packed_keys(sources), *([weights_key()] if uses_mixture else [])],
        prepare=prepare, build=build, metadata=metadata, resources=frozenset({"launcher"}), out_name="result",
        asset_args={"partitions_def": partitions(recipe),
                    "metadata": {"launch": MetadataValue.json(launch)}},  # over the launcher resource's defaults
    )
