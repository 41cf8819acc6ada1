"""Evaluation assets (group "evaluation"): one per training stage, on its final checkpoint.

evaluation/<stage>: per-domain validation loss on every source's held-out packed split, the loss of a
    fixed canary text (comparable across stages and runs), and zero-shot accuracy on the bundled
    benchmarks by log-likelihood as lm-evaluation-harness computes it (trainer/evaluate.py).

It runs `python -m trainer.evaluate` through the launcher resource, so this module never imports torch.
Driven by the recipe's `evaluation` section.
"""

import json
import shutil
from pathlib import Path

from dagster import (
    AssetExecutionContext,
    AssetKey,
    Failure,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
)

from assets.plots import bar_chart
from assets.recipe import Recipe
from assets.tokenization import TOKENIZER_FILE
from assets.training import stage_key
from assets.training_data import packed_keys, training_inputs
from assets.upstream import OutputNotFound, committed_result, latest_output
from assets.versioning import code_version, manifest_header, version_key
from resources.launcher import LauncherResource
from resources.scratch import ScratchResource
from storage.manifest import commit_folder, read_manifest
from resources.store_resource import StoreResource
from trainer.checkpoint_store import local_copy

EVALUATION_IMPLEMENTATION = "v1"
RESULTS_FILE = "results.json"


def evaluation_key(stage: str) -> AssetKey:
    return AssetKey(["evaluation", stage])


def evaluation_assets(recipe: Recipe) -> list:
    if recipe.training is None:
        return []
    return [_evaluation_asset(recipe, name) for name, _ in recipe.training.stage_settings()]


def _evaluation_asset(recipe: Recipe, stage: str):
    key = evaluation_key(stage)
    section = recipe.evaluation.model_dump(mode="json")
    version = code_version(f"evaluation-{stage}", EVALUATION_IMPLEMENTATION, section)
    sources = [s.name for s in recipe.sources]
    config = recipe.evaluation

    @asset(key=key, group_name="evaluation", code_version=version, kinds={"python", "pytorch"},
           deps=[stage_key(stage), *packed_keys(sources)],
           description=(f"training/{stage}'s final checkpoint measured: per-domain validation loss, the canary's loss, "
                        f"zero-shot {', '.join(config.tasks)} by log-likelihood (lm-evaluation-harness's way). "
                        "Driven by the recipe's `evaluation` section."))
    def evaluation(context: AssetExecutionContext, store: StoreResource, scratch: ScratchResource,
                   launcher: LauncherResource) -> MaterializeResult:
        object_store = store.open()
        try:
            trained = latest_output(context.instance, object_store, stage_key(stage))
        except OutputNotFound as exc:
            raise Failure(description=str(exc)) from exc
        inputs = training_inputs(context, object_store, scratch, sources)
        upstream = {**inputs.upstream, stage_key(stage).to_user_string(): trained.data_version}
        vkey = version_key(version, upstream=upstream)
        prefix = "/".join(key.path + [vkey])
        manifest = read_manifest(object_store, prefix)
        if manifest is None:
            work = scratch.new_dir("/".join(key.path))
            checkpoint = trained.manifest["checkpoint"]["prefix"]
            step_folder = local_copy(object_store, checkpoint,
                                     Path(scratch.root) / "checkpoint-cache" / checkpoint.rpartition("/")[0])
            [tokenizer] = inputs.tokenizer.download(object_store, work / "tokenizer", TOKENIZER_FILE)
            out = work / "out"
            out.mkdir()
            args = ["-m", "trainer.evaluate", "--checkpoint", str(step_folder), "--tokenizer", str(tokenizer),
                    "--benchmarks", str(recipe.input_root / config.benchmarks), "--tasks", ",".join(config.tasks),
                    "--val-sequences", str(config.val_sequences), "--canary-sequences", str(config.canary_sequences),
                    "--out", str(out / RESULTS_FILE)]
            args += ["--limit", str(config.limit)] if config.limit else []
            args += ["--canary", str(recipe.input_root / config.canary)] if config.canary else []
            for name, folder in inputs.folders.items():
                args += ["--val", f"{name}={folder}"]
            launcher.run_python(context, args, work)
            manifest = commit_folder(object_store, prefix, out, {
                **manifest_header(key.path, vkey, version, section, context.run.run_id), "upstream": upstream,
                "checkpoint": trained.manifest["checkpoint"]})
            shutil.rmtree(work, ignore_errors=True)
        results = json.loads(object_store.get_bytes(f"{prefix}/{RESULTS_FILE}"))
        zero_shot = results["zero_shot"]
        table = MetadataValue.table(
            records=[TableRecord({"task": name, "metric": r["metric"], "score": float(r.get(r["metric"], float("nan"))),
                                  "chance": float(r.get("chance", 0.0)), "n": int(r["n"])})
                     for name, r in zero_shot.items()],
            schema=TableSchema(columns=[TableColumn("task", "string"), TableColumn("metric", "string"),
                                        TableColumn("score", "float"), TableColumn("chance", "float"),
                                        TableColumn("n", "int")]))
        return committed_result(object_store, prefix, manifest, metadata={
            "val_loss": MetadataValue.json(results["val_loss"]),
            "val_loss_plot": bar_chart(results["val_loss"], title=f"{stage}: validation loss per domain", ylabel="loss"),
            "canary_loss": results.get("canary_loss", float("nan")),
            "zero_shot": table,
            **{f"{name}_{r['metric']}": float(r.get(r["metric"], float("nan"))) for name, r in zero_shot.items()},
            "checkpoint": MetadataValue.path(results.get("checkpoint") or trained.manifest["checkpoint"]["uri"]),
            "step": results["step"]})

    return evaluation
