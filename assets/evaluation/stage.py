"""`evaluation/<stage>`: one per training stage, on its final checkpoint.

Per-domain validation loss on every source's held-out packed split and the loss of a fixed canary text (comparable
across stages and runs), then lm-evaluation-harness's zero-shot tasks on the checkpoint exported to Hugging Face
format (trainer/evaluation/harness.py): lm-eval's results JSON is the asset's metadata, with lm-eval's markdown table and a
plot of each task's headline metric (with its standard error) over the stages this one descends from, read from
their evaluations (main -> anneal: what the anneal changed). It runs `python -m trainer.evaluation.evaluate` through the
launcher resource, so this module never imports torch. Driven by the recipe's `evaluation` section.
"""

import json
from pathlib import Path

from dagster import AssetKey, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.plots import bar_chart, grouped_bar_chart
from assets.recipe import Recipe
from assets.tokenization.tokenizer import TOKENIZER_FILE
from assets.training.inputs import packed_keys, training_inputs
from assets.training.stage import stage_key
from trainer.checkpoint.store import local_copy

RESULTS_FILE = "results.json"
HF_CACHE = "hf-datasets"  # in the scratch root: the benchmark files' datasets cache, shared by every evaluation


def evaluation_key(stage: str) -> AssetKey:
    return AssetKey(["evaluation", stage])


def evaluation_assets(recipe: Recipe) -> list:
    if recipe.training is None:
        return []
    return [_evaluation_asset(recipe, name) for name, _ in recipe.training.stage_settings()]


def lineage_of(recipe: Recipe, stage: str) -> list[str]:
    """The stages `stage` descends from, main first, then itself (main -> long_512; main -> anneal)."""
    starts = recipe.training.starts()
    chain = [stage]
    while chain[0] in starts:
        chain.insert(0, starts[chain[0]][1])
    return chain


def headline(results: dict) -> dict[str, tuple[str, float, float]]:
    """{task: (headline metric, value, stderr)} from an evaluation's results.json (lm-eval's keys: "acc,none")."""
    out = {}
    for task, metric in results["lm_eval"]["headline"].items():
        figures = results["lm_eval"]["results"][task]
        stderr = figures.get(f"{metric}_stderr,none")
        out[task] = (metric, float(figures[f"{metric},none"]), float(stderr) if isinstance(stderr, (int, float)) else 0.0)
    return out


def _evaluation_asset(recipe: Recipe, stage: str):
    sources = [s.name for s in recipe.sources]
    config = recipe.evaluation
    earlier = lineage_of(recipe, stage)[:-1]

    def prepare(inputs: Inputs) -> Inputs:
        found = training_inputs(inputs.context, inputs.store, inputs.resources.scratch, sources, recipe)
        trained = inputs.outputs["trained"]
        # The earlier stages' evaluations are read for the plot only: they are not part of this output's version.
        return inputs.but(upstream={**found.upstream, stage_key(stage).to_user_string(): trained.data_version},
                          manifest={"checkpoint": trained.manifest["checkpoint"]}, extra={"found": found})

    def build(inputs: Inputs, out: Path) -> dict:
        store, work, found = inputs.store, inputs.work, inputs.extra["found"]
        checkpoint = inputs.outputs["trained"].manifest["checkpoint"]["prefix"]
        scratch = Path(inputs.resources.scratch.root)
        step_folder = local_copy(store, checkpoint, scratch / "checkpoint-cache" / checkpoint.rpartition("/")[0])
        [tokenizer] = found.tokenizer.download(store, work / "tokenizer", TOKENIZER_FILE)
        args = ["-m", "trainer.evaluation.evaluate", "--checkpoint", str(step_folder), "--tokenizer", str(tokenizer),
                "--benchmarks", str(recipe.input_root / config.benchmarks), "--tasks", ",".join(config.tasks),
                "--val-sequences", str(config.val_sequences), "--canary-sequences", str(config.canary_sequences),
                "--work", str(work / "lm-eval"), "--hf-cache", str(scratch / HF_CACHE),
                "--out", str(out / RESULTS_FILE)]
        args += ["--limit", str(config.limit)] if config.limit else []
        args += ["--canary", str(recipe.input_root / config.canary)] if config.canary else []
        for name, folder in found.folders.items():
            args += ["--val", f"{name}={folder}"]
        inputs.resources.launcher.run_python(inputs.context, args, work)
        return {}

    def metadata(inputs: Inputs, output: Output) -> dict:
        def results_of(out: Output) -> dict:
            return json.loads(inputs.store.get_bytes(f"{out.prefix}/{RESULTS_FILE}"))

        results = results_of(output)
        trained = inputs.outputs["trained"]
        meta = {
            "val_loss": MetadataValue.json(results["val_loss"]),
            "val_loss_plot": bar_chart(results["val_loss"], title=f"{stage}: validation loss per domain", ylabel="loss"),
            "canary_loss": results.get("canary_loss", float("nan")),
            "checkpoint": MetadataValue.path(trained.manifest["checkpoint"]["uri"]),
            "step": results["step"],
        }
        if "lm_eval" not in results:  # evaluation.tasks is empty
            return meta
        lm_eval = results["lm_eval"]
        per_stage = {name: headline(r) for name in earlier if "lm_eval" in (r := results_of(inputs.outputs[f"evaluation {name}"]))}
        per_stage[stage] = headline(results)
        tasks = list(per_stage[stage])
        return {
            **meta,
            "lm_eval": MetadataValue.json({k: lm_eval[k] for k in ("results", "n-samples", "higher_is_better", "versions",
                                                                    "n-shot") if k in lm_eval}),
            "lm_eval_table": MetadataValue.md(lm_eval["table"]),
            **{f"{task}_{metric}": value for task, (metric, value, _) in per_stage[stage].items()},
            "lm_eval_across_stages": grouped_bar_chart(
                {f"{task} {per_stage[stage][task][0]}": {name: scores[task][1] for name, scores in per_stage.items()
                                                         if task in scores} for task in tasks},
                errors={f"{task} {per_stage[stage][task][0]}": {name: scores[task][2] for name, scores
                                                                in per_stage.items() if task in scores} for task in tasks},
                title=f"lm-eval, {' -> '.join(per_stage)} (± stderr)", ylabel="score"),
        }

    return output_asset(OutputSpec(
        key=evaluation_key(stage), group="evaluation", stage=f"evaluation-{stage}",
        code=("trainer",), section=config.model_dump(mode="json"),
        description=(f"training/{stage}'s final checkpoint measured: per-domain validation loss, the canary's loss, and "
                     f"lm-evaluation-harness on it exported to Hugging Face format ({', '.join(config.tasks)}; every "
                     "metric with its stderr), plotted against the evaluations of the stages it descends from. "
                     "Driven by the recipe's `evaluation` section."),
        reads={"trained": stage_key(stage), **{f"evaluation {name}": evaluation_key(name) for name in earlier}},
        deps=packed_keys(sources), prepare=prepare, build=build,
        metadata=metadata, resources=frozenset({"launcher"}), kinds=frozenset({"python", "pytorch"}),
    ))
