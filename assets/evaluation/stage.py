"""`evaluation/<stage>`: one per training stage, on its final checkpoint.

Per-domain validation loss on every source's held-out packed split, the loss of a fixed canary text
(comparable across stages and runs), and zero-shot accuracy on the bundled benchmarks by log-likelihood as
lm-evaluation-harness computes it (trainer/evaluate.py). It runs `python -m trainer.evaluate` through the
launcher resource, so this module never imports torch. Driven by the recipe's `evaluation` section.
"""

import json
from pathlib import Path

from dagster import AssetKey, MetadataValue, TableColumn, TableRecord, TableSchema

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.plots import bar_chart
from assets.recipe import Recipe
from assets.tokenization.tokenizer import TOKENIZER_FILE
from assets.training.inputs import packed_keys, training_inputs
from assets.training.stage import stage_key
from trainer.checkpoint_store import local_copy

RESULTS_FILE = "results.json"


def evaluation_key(stage: str) -> AssetKey:
    return AssetKey(["evaluation", stage])


def evaluation_assets(recipe: Recipe) -> list:
    if recipe.training is None:
        return []
    return [_evaluation_asset(recipe, name) for name, _ in recipe.training.stage_settings()]


def _evaluation_asset(recipe: Recipe, stage: str):
    sources = [s.name for s in recipe.sources]
    config = recipe.evaluation

    def prepare(inputs: Inputs) -> Inputs:
        found = training_inputs(inputs.context, inputs.store, inputs.resources.scratch, sources)
        trained = inputs.outputs["trained"]
        return inputs.but(upstream={**found.upstream, stage_key(stage).to_user_string(): trained.data_version},
                          manifest={"checkpoint": trained.manifest["checkpoint"]}, extra={"found": found})

    def build(inputs: Inputs, out: Path) -> dict:
        store, work, found = inputs.store, inputs.work, inputs.extra["found"]
        checkpoint = inputs.outputs["trained"].manifest["checkpoint"]["prefix"]
        step_folder = local_copy(store, checkpoint, Path(inputs.resources.scratch.root) / "checkpoint-cache"
                                 / checkpoint.rpartition("/")[0])
        [tokenizer] = found.tokenizer.download(store, work / "tokenizer", TOKENIZER_FILE)
        args = ["-m", "trainer.evaluate", "--checkpoint", str(step_folder), "--tokenizer", str(tokenizer),
                "--benchmarks", str(recipe.input_root / config.benchmarks), "--tasks", ",".join(config.tasks),
                "--val-sequences", str(config.val_sequences), "--canary-sequences", str(config.canary_sequences),
                "--out", str(out / RESULTS_FILE)]
        args += ["--limit", str(config.limit)] if config.limit else []
        args += ["--canary", str(recipe.input_root / config.canary)] if config.canary else []
        for name, folder in found.folders.items():
            args += ["--val", f"{name}={folder}"]
        inputs.resources.launcher.run_python(inputs.context, args, work)
        return {}

    def metadata(inputs: Inputs, output: Output) -> dict:
        results = json.loads(inputs.store.get_bytes(f"{output.prefix}/{RESULTS_FILE}"))
        zero_shot = results["zero_shot"]
        table = MetadataValue.table(
            records=[TableRecord({"task": name, "metric": r["metric"], "score": float(r.get(r["metric"], float("nan"))),
                                  "chance": float(r.get("chance", 0.0)), "n": int(r["n"])})
                     for name, r in zero_shot.items()],
            schema=TableSchema(columns=[TableColumn("task", "string"), TableColumn("metric", "string"),
                                        TableColumn("score", "float"), TableColumn("chance", "float"),
                                        TableColumn("n", "int")]))
        trained = inputs.outputs["trained"]
        return {
            "val_loss": MetadataValue.json(results["val_loss"]),
            "val_loss_plot": bar_chart(results["val_loss"], title=f"{stage}: validation loss per domain", ylabel="loss"),
            "canary_loss": results.get("canary_loss", float("nan")),
            "zero_shot": table,
            **{f"{name}_{r['metric']}": float(r.get(r["metric"], float("nan"))) for name, r in zero_shot.items()},
            "checkpoint": MetadataValue.path(results.get("checkpoint") or trained.manifest["checkpoint"]["uri"]),
            "step": results["step"],
        }

    return output_asset(OutputSpec(
        key=evaluation_key(stage), group="evaluation", stage=f"evaluation-{stage}",
        code=("trainer",), section=config.model_dump(mode="json"),
        description=(f"training/{stage}'s final checkpoint measured: per-domain validation loss, the canary's loss, "
                     f"zero-shot {', '.join(config.tasks)} by log-likelihood (lm-evaluation-harness's way). "
                     "Driven by the recipe's `evaluation` section."),
        reads={"trained": stage_key(stage)}, deps=packed_keys(sources), prepare=prepare, build=build,
        metadata=metadata, resources=frozenset({"launcher"}), kinds=frozenset({"python", "pytorch"}),
    ))
