"""Mixing assets (group "mixing"): the proxy-model sweep over candidate mixtures, and the chosen weights.

mixing/mix_candidates: the sweep's candidate mixtures, drawn around the recipe's prior (trainer/mixing.py);
    registers one dynamic partition of mix_sweep per candidate (partition key = the mixture's name).
mixing/mix_sweep (partitioned): trains the proxy model (training.main with mixing.proxy merged over it)
    on one candidate's mixture of the packed sources through the launcher resource; records each
    domain's validation loss and the target loss.
mixing/mixture_weights: fits loss ~ weights over every swept candidate (RegMix) and picks the mixture
    with the lowest predicted target loss. Kept fresh by the automation sensor once the sweep reruns.

Each output is committed to the store like every other (manifest last), so a training stage reads the
chosen weights, with their data version, from the store.
"""


import json
import shutil

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetSelection,
    AutomationCondition,
    DefaultScheduleStatus,
    DynamicPartitionsDefinition,
    ScheduleDefinition,
    define_asset_job,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets.plots import bar_chart
from assets.recipe import Recipe
from assets.stages import LaunchSettings, merge, split_launch
from assets.training_data import packed_keys, training_inputs
from assets.upstream import OutputNotFound, committed_result, latest_output
from assets.versioning import code_version, manifest_header, version_key
from resources.launcher import LauncherResource
from resources.scratch import ScratchResource
from storage.manifest import commit_folder, read_manifest
from resources.store_resource import StoreResource
from trainer.mixing import best_mixture, candidate_mixtures, fit_mixture_regression, mixture_name

MIXING_IMPLEMENTATION = "v1"
CANDIDATES = DynamicPartitionsDefinition(name="mix_candidates")
RESULT_FILE = "result.json"


def candidates_key() -> AssetKey:
    return AssetKey(["mixing", "mix_candidates"])


def sweep_key() -> AssetKey:
    return AssetKey(["mixing", "mix_sweep"])


def weights_key() -> AssetKey:
    return AssetKey(["mixing", "mixture_weights"])


def proxy_settings(recipe: Recipe) -> dict:
    """The proxy's run-config fields: training.main with mixing.proxy merged over it, no checkpoints."""
    settings, _ = split_launch("mixing.proxy", merge(recipe.training.main, recipe.mixing.proxy))
    return merge(settings, {"checkpoint": {"interval_steps": 0, "save_final": False, "resume": False}})


def proxy_launch(recipe: Recipe) -> LaunchSettings:
    """How a proxy run is started: training.main's `launch` with mixing.proxy's over it (not versioned)."""
    return split_launch("mixing.proxy", merge(recipe.training.main, recipe.mixing.proxy))[1]


def mixing_section(recipe: Recipe) -> dict:
    m = recipe.mixing.model_dump(mode="json", exclude={"schedule", "status"})  # when it runs is not what it makes
    m["proxy"] = {k: v for k, v in m["proxy"].items() if k != "launch"}  # nor how its processes start
    return {"mixing": m, "proxy": proxy_settings(recipe)}


def _commit_json(context, store, key: AssetKey, vkey: str, version: str, section, payload: dict, extra: dict):
    prefix = "/".join(key.path + [vkey])
    manifest = read_manifest(store, prefix)
    if manifest is None:
        work = context.resources.scratch.new_dir("/".join(key.path))
        (work / RESULT_FILE).write_text(json.dumps(payload, indent=1, sort_keys=True))
        manifest = commit_folder(store, prefix, work, {
            **manifest_header(key.path, vkey, version, section, context.run.run_id), **extra})
        shutil.rmtree(work, ignore_errors=True)
    else:
        context.log.info(f"{store.uri(prefix)} is already committed for this version; reusing it")
    return prefix, manifest, json.loads(store.get_bytes(f"{prefix}/{RESULT_FILE}"))


def mixing_assets(recipe: Recipe) -> list:
    if recipe.mixing is None or recipe.training is None:
        return []
    section = mixing_section(recipe)
    # Each asset's code version hashes what decides its own output: the candidates only the draw, the sweep
    # also the proxy, the weights also the target (a new proxy reruns the sweep, not the draw).
    draw = {k: section["mixing"][k] for k in ("prior", "candidates", "concentration", "seed")}
    version = code_version("mix_sweep", MIXING_IMPLEMENTATION, section)
    candidates_version = code_version("mix_candidates", MIXING_IMPLEMENTATION, draw)
    fit = {k: v for k, v in section["mixing"].items() if k != "proxy"}
    weights_version = code_version("mixture_weights", MIXING_IMPLEMENTATION, fit)
    sources = sorted(recipe.mixing.prior)
    cfg = recipe.mixing.engine_config()
    launch = proxy_launch(recipe).overrides()

    @asset(key=candidates_key(), group_name="mixing", code_version=candidates_version, kinds={"python"},
           description=(f"{cfg.candidates} candidate mixtures of {', '.join(sources)} drawn from a Dirichlet around "
                        "the prior (the prior itself first); one mix_sweep partition each. Driven by the recipe's "
                        "`mixing` section."))
    def mix_candidates(context: AssetExecutionContext, store: StoreResource, scratch: ScratchResource) -> MaterializeResult:
        mixtures = {mixture_name(m): m for m in candidate_mixtures(cfg)}
        object_store = store.open()
        prefix, manifest, payload = _commit_json(context, object_store, candidates_key(), version_key(candidates_version),
                                                 candidates_version, draw, {"candidates": mixtures}, {})
        known = set(context.instance.get_dynamic_partitions(CANDIDATES.name))
        new = [name for name in payload["candidates"] if name not in known]
        if new:
            context.instance.add_dynamic_partitions(CANDIDATES.name, new)
        return committed_result(object_store, prefix, manifest, metadata={
            "candidates": MetadataValue.json(payload["candidates"]), "new_partitions": len(new)})

    @asset(key=sweep_key(), group_name="mixing", code_version=version, kinds={"python"},
           partitions_def=CANDIDATES, deps=[candidates_key(), *packed_keys(sources)],
           metadata={"launch": MetadataValue.json(launch)},  # over the launcher resource's defaults
           automation_condition=AutomationCondition.eager(),
           description=("One proxy run per candidate mixture (a partition): the proxy model (training.main with "
                        "mixing.proxy over it) trained on that mixture of the packed sources; records each domain's "
                        f"validation loss and the target ({recipe.mixing.target}). Driven by `mixing` and `training`."))
    def mix_sweep(context: AssetExecutionContext, store: StoreResource, scratch: ScratchResource,
                  launcher: LauncherResource) -> MaterializeResult:
        object_store = store.open()
        name = context.partition_key
        try:
            candidates = json.loads(object_store.get_bytes(
                f"{latest_output(context.instance, object_store, candidates_key()).prefix}/{RESULT_FILE}"))["candidates"]
        except OutputNotFound as exc:
            raise Failure(description=str(exc)) from exc
        if name not in candidates:
            raise Failure(description=f"partition {name} is not a candidate of the current recipe's mixing section "
                                      f"(candidates: {', '.join(sorted(candidates))}); it is left from an older sweep")
        weights = candidates[name]
        inputs = training_inputs(context, object_store, scratch, sources)
        vkey = version_key(version, upstream=inputs.upstream, inputs=[name])
        prefix = "/".join(sweep_key().path + [name, vkey])
        manifest = read_manifest(object_store, prefix)
        if manifest is None:
            work = scratch.new_dir(f"mix_sweep-{name}")
            run = {**proxy_settings(recipe), "stage": f"proxy-{name}", "output_dir": str(work / "out"),
                   "data": {"shards": {k: str(v) for k, v in inputs.folders.items()}, "weights": weights},
                   "tokenizer_sha256": inputs.tokenizer_sha256, "lineage": inputs.lineage}
            result = launcher.launch(context, run, work, settings=launch)
            val = result.summary.get("val_loss") or {}
            if not val or (recipe.mixing.target != "average" and recipe.mixing.target not in val):
                raise Failure(description=f"the proxy run reported validation loss for {sorted(val)}: nothing for the "
                                          f"target ({recipe.mixing.target}); does that source hold out any document?")
            if set(val) != set(sources):
                context.log.warning(f"no held-out documents for {sorted(set(sources) - set(val))}: the average "
                                    f"is over {sorted(val)}")
            target = sum(val.values()) / len(val) if recipe.mixing.target == "average" else val[recipe.mixing.target]
            precision = result.events("precision")
            payload = {"mixture": name, "weights": weights, "val_loss": val, "target_loss": target,
                       "target": recipe.mixing.target, "tokens": result.summary.get("tokens"),
                       "losses": result.summary.get("losses"),
                       "precision": precision[-1]["dtype"] if precision else None}
            (work / "result").mkdir()
            (work / "result" / RESULT_FILE).write_text(json.dumps(payload, indent=1, sort_keys=True))
            manifest = commit_folder(object_store, prefix, work / "result", {
                **manifest_header(sweep_key().path + [name], vkey, version, section, context.run.run_id),
                "upstream": inputs.upstream, "lineage": inputs.lineage})
            shutil.rmtree(work, ignore_errors=True)
        payload = json.loads(object_store.get_bytes(f"{prefix}/{RESULT_FILE}"))
        return committed_result(object_store, prefix, manifest, metadata={
            "target_loss": payload["target_loss"], "val_loss": MetadataValue.json(payload["val_loss"]),
            "weights": MetadataValue.json(payload["weights"]), "precision": payload.get("precision") or "unknown",
            "weights_plot": bar_chart(payload["weights"], title=f"mixture {name}", ylabel="weight"),
            "val_loss_plot": bar_chart(payload["val_loss"], title="validation loss per domain", ylabel="loss")})

    @asset(key=weights_key(), group_name="mixing", code_version=weights_version, kinds={"python"}, deps=[sweep_key()],
           automation_condition=AutomationCondition.eager(),
           description=("The chosen mixture: a regression of the target loss on the weights, fitted over every "
                        "swept candidate (RegMix), minimised over fresh mixtures around the prior."))
    def mixture_weights(context: AssetExecutionContext, store: StoreResource, scratch: ScratchResource) -> MaterializeResult:
        object_store = store.open()
        candidates = json.loads(object_store.get_bytes(
            f"{latest_output(context.instance, object_store, candidates_key()).prefix}/{RESULT_FILE}"))["candidates"]
        results, upstream = [], {}  # upstream: each swept partition's data version
        for name in sorted(candidates):
            record = _latest_partition(context.instance, name)
            if record is None:
                raise Failure(description=f"mix_sweep partition {name} has not run: materialize every partition "
                                          "of mixing/mix_sweep first")
            prefix = record.asset_materialization.metadata["prefix"].value
            results.append(json.loads(object_store.get_bytes(f"{prefix}/{RESULT_FILE}")))
            upstream[f"mixing/mix_sweep[{name}]"] = read_manifest(object_store, prefix)["data_version"]
        fit = fit_mixture_regression([r["weights"] for r in results], [r["target_loss"] for r in results],
                                     ridge=cfg.ridge)
        best, predicted = best_mixture(fit, cfg)
        payload = {"weights": best, "predicted_target_loss": predicted, "r2": fit.r2, "loo_rmse": fit.loo_rmse,
                   "candidates": {r["mixture"]: r["target_loss"] for r in results}, "target": recipe.mixing.target}
        vkey = version_key(weights_version, upstream=upstream)
        prefix, manifest, payload = _commit_json(context, object_store, weights_key(), vkey, weights_version,
                                                 fit, payload,
                                                 {"swept": upstream})
        observed = min(payload["candidates"].values())
        return committed_result(object_store, prefix, manifest, metadata={
            "weights": MetadataValue.json(payload["weights"]),
            "weights_plot": bar_chart(payload["weights"], title="chosen mixture", ylabel="weight"),
            "predicted_target_loss": payload["predicted_target_loss"], "best_swept_loss": observed,
            "fit_r2": payload["r2"], "fit_loo_rmse": payload["loo_rmse"],
            "swept": MetadataValue.json(payload["candidates"])})

    return [mix_candidates, mix_sweep, mixture_weights]


def mixing_schedules(recipe: Recipe) -> list:
    """The recipe's cron re-draws the candidates; the automation sensor then runs every new or changed
    sweep partition (eager) and refits the weights (eager). Unchanged partitions reuse their results."""
    if recipe.mixing is None or recipe.training is None or not recipe.mixing.schedule:
        return []
    job = define_asset_job("mix_sweep_schedule_job", selection=AssetSelection.assets(candidates_key()),
                           description="Re-draw the sweep's candidates; the automation sensor runs the rest.")
    status = DefaultScheduleStatus.RUNNING if recipe.mixing.status == "running" else DefaultScheduleStatus.STOPPED
    return [ScheduleDefinition(name="mix_sweep_schedule", job=job, cron_schedule=recipe.mixing.schedule,
                               default_status=status)]


def _latest_partition(instance, partition: str):
    from dagster import AssetRecordsFilter

    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=sweep_key(), asset_partitions=[partition]),
                                              limit=1).records
    return records[0] if records else None
