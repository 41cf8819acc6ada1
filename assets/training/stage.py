"""`training/<stage>`: the recipe's training stages, each a long-running trainer process.

training/main: the main stage on the chosen mixture (mixing/mixture_weights; the prior when the recipe
    has no mixing section), from scratch.
training/<later stage>: each starts from an earlier stage's final checkpoint (assets/recipe/training.py): continue_from
    continues that run (weights, optimizer state, step and token count: a long-context stage at its own low
    LR, an anneal decaying the WSD schedule from the branch point on its own mixture), init_from takes its
    weights only (a fresh optimizer and schedule). Its own mixture, sequence length, RoPE base, length filter.

Every stage runs through the launcher resource (Dagster Pipes) and checkpoints to the object store
under checkpoints/<stage>/<version key>/: the version key is fixed by the stage's settings and inputs,
so a retried or re-materialized asset resumes from that run's latest checkpoint instead of starting
over, and a changed input starts a new run. A trainer that dies is restarted by the launcher itself (up to
its max_restarts, resuming each time; the restarts go into the metadata); the RetryPolicy below covers
the rest (the store, the inputs). A stage's `launch:` settings (assets/recipe/training.py) override the launcher
resource's defaults for that stage and are not part of its version. The lineage of every input goes
into the run config and so into every checkpoint manifest. This module never imports torch.
"""

import json
import shutil
from pathlib import Path

from dagster import AssetKey, Backoff, Failure, Field, Int, MetadataValue, RetryPolicy

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.lineage import record_of
from assets.core.upstream import Output
from assets.mixing.budget import max_epochs_of, stage_budget
from assets.mixing.section import RESULT_FILE, mixture_prediction, mixture_prediction_metadata, weights_key
from assets.plots import line_chart
from assets.recipe import Recipe
from assets.scaling.predict import predicted, prediction_metadata
from assets.recipe.training import check_stage, merge, split_launch
from assets.tokenization.tokenizer import TOKENIZER_FILE
from assets.training.inputs import packed_keys, training_inputs
from trainer.config import BatchConfig

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"


def stage_key(name: str) -> AssetKey:
    return AssetKey(["training", name])


def training_assets(recipe: Recipe) -> list:
    if recipe.training is None:
        return []
    starts = recipe.training.starts()  # {stage: (continue_from or init_from, the stage it starts from)}
    return [_stage_asset(recipe, name, settings, starts.get(name))
            for name, settings in recipe.training.stage_settings()]


def _stage_weights(recipe: Recipe, name: str) -> tuple[dict[str, float] | None, bool]:
    """(fixed weights, or None to read mixing/mixture_weights; whether the stage depends on the mixture)."""
    stage = recipe.training.stage(name)
    if stage is not None and stage.weights:
        return dict(stage.weights), False
    if recipe.mixing is not None:
        return None, True
    return {s.name: 1.0 for s in recipe.sources}, False


def _stage_asset(recipe: Recipe, name: str, settings: dict, start_from: tuple[str, str] | None):
    settings, launch = split_launch(f"training.{name}", settings)  # the trainer's fields; how it is started
    fixed, uses_mixture = _stage_weights(recipe, name)
    min_doc_tokens = getattr(recipe.training.stage(name), "min_doc_tokens", 0)
    how_start, previous = start_from or (None, None)  # continue_from / init_from, and the stage it starts from
    sources = sorted(fixed) if fixed is not None else sorted(recipe.mixing.prior)
    deps = packed_keys(sources) + ([weights_key()] if uses_mixture else []) + ([stage_key(previous)] if previous else [])
    start = ("from scratch" if previous is None else
             f"continuing the run of training/{previous} (weights, optimizer state, step, tokens; its schedule goes on)"
             if how_start == "continue_from" else f"from the weights of training/{previous} (a fresh optimizer)")
    if min_doc_tokens:
        start += f", on documents of {min_doc_tokens} tokens or more"
    how = ", ".join(f"{k} {v}" for k, v in launch.overrides().items())
    mixture = (f"its own mixture {fixed}" if fixed is not None and recipe.training.stage(name) is not None else
               "the chosen mixture (mixing/mixture_weights)" if uses_mixture else "equal weights over every source")

    batch = settings.get("batch", {})
    launchpad = {  # the Launchpad starts from the recipe's values; a changed one overrides it for that run
        "train_tokens": Field(Int, default_value=settings["train_tokens"], description="tokens to train on"),
        "seq_len": Field(Int, default_value=batch.get("seq_len", BatchConfig().seq_len), description="batch.seq_len"),
        "global_batch": Field(Int, default_value=batch.get("global_batch", BatchConfig().global_batch),
                              description="batch.global_batch (sequences per optimizer step)"),
    }

    def prepare(inputs: Inputs) -> Inputs:
        context, store = inputs.context, inputs.store
        run_settings, overrides = _with_overrides(name, settings, context.op_config or {})
        if overrides:
            context.log.info(f"launchpad overrides for this run: {overrides}")
        found = training_inputs(context, store, inputs.resources.scratch, sources, recipe)
        upstream, lineage = dict(found.upstream), list(found.lineage)
        weights, mixture = fixed, None
        if uses_mixture:
            chosen = inputs.read(weights_key())
            fit = json.loads(store.get_bytes(f"{chosen.prefix}/{RESULT_FILE}"))
            weights, mixture = fit["weights"], mixture_prediction(fit, chosen.prefix, recipe)
            upstream[weights_key().to_user_string()] = chosen.data_version
            lineage.insert(0, record_of(chosen))
        begin = {"init_from": None}  # the run config's init_from / continue_from: the previous stage's final step
        if previous is not None:
            before = inputs.read(stage_key(previous))
            begin = {"init_from": None, how_start: before.manifest["checkpoint"]["uri"]}
            upstream[stage_key(previous).to_user_string()] = before.data_version
            lineage = [record_of(before), *[r for r in before.manifest.get("lineage", []) if r not in lineage], *lineage]
        # A run with Launchpad overrides is another output (and another checkpoint run) than the recipe's.
        return inputs.but(upstream=upstream, fingerprints=[json.dumps(overrides, sort_keys=True)] if overrides else None,
                          manifest={"lineage": lineage, "weights": weights},
                          extra={"settings": run_settings, "found": found, "begin": begin,
                                 # the latest scaling fit's loss for this stage: metadata, not part of its version
                                 "prediction": predicted(inputs, recipe, name, weights),
                                 "mixture_prediction": mixture})

    def build(inputs: Inputs, out: Path) -> dict:
        context, work, vkey, found = inputs.context, inputs.work, inputs.version_key, inputs.extra["found"]
        run_settings = inputs.extra["settings"]
        # Each source's epochs in this stage (assets/mixing/budget.py); over mixing.max_epochs, nothing is launched.
        budget = stage_budget(f"training/{name}", found.folders, inputs.manifest["weights"], run_settings,
                              min_doc_tokens=min_doc_tokens, max_epochs=max_epochs_of(recipe))
        run = {**run_settings, "stage": name, "output_dir": str(work / "out"),
               "data": {"shards": {k: str(v) for k, v in found.folders.items()}, "weights": inputs.manifest["weights"],
                        "min_doc_tokens": min_doc_tokens},
               "checkpoint": checkpoint_section(run_settings.get("checkpoint", {}), remote=inputs.resources.store.url,
                                                run_name=vkey, stage=name, default_dir=work / "checkpoints"),
               "tokenizer_sha256": found.tokenizer_sha256, "lineage": inputs.manifest["lineage"],
               **inputs.extra["begin"]}
        if run_settings.get("metrics", {}).get("downstream_interval"):
            # Zero-shot tasks during training (trainer.evaluation.evaluate): the recipe's benchmark folder, this tokenizer.
            [tokenizer] = found.tokenizer.download(inputs.store, work / "tokenizer", TOKENIZER_FILE)
            run["metrics"] = {**run_settings["metrics"],
                              "downstream_benchmarks": str(recipe.input_root / recipe.evaluation.benchmarks)}
            run["data"]["tokenizer"] = str(tokenizer)
        if context.retry_number:
            context.log.info(f"retry {context.retry_number}: the trainer resumes from its latest checkpoint")
        # Written while it trains (metrics.tensorboard, on by default): look at it now, not only at the end.
        tensorboard = work / "out" / "tensorboard" if run.get("metrics", {}).get("tensorboard", True) else None
        if tensorboard is not None:
            context.log.info(f"watch it train: tensorboard --logdir {tensorboard} (or `make tensorboard` for every "
                             "run), `pretrain jobs`")
        result = inputs.resources.launcher.launch(context, run, work, settings=launch.overrides())
        saved = [r["step"] for r in result.events("checkpoint_saved")]
        if not saved:
            # Killed after its final checkpoint was committed but before this asset was: the retry resumed at
            # the end, trained nothing and saved nothing; the step it resumed from is the final one.
            summary = json.loads((work / "out" / SUMMARY_FILE).read_text())  # tokens count on from a continued run
            done = summary["tokens"] >= summary.get("start_tokens", 0) + run["train_tokens"]
            saved = [r["step"] for r in result.events("resumed")] if done else []
        if not saved:
            raise Failure(description=f"training/{name} finished without a final checkpoint "
                                      "(checkpoint.save_final must stay on for a training stage)")
        final = saved[-1]
        checkpoint_prefix = f"checkpoints/{name}/{vkey}/step-{final:08d}"
        shutil.copyfile(work / "out" / SUMMARY_FILE, out / SUMMARY_FILE)
        shutil.copyfile(work / "out" / METRICS_FILE, out / METRICS_FILE)
        return {"checkpoint": {"prefix": checkpoint_prefix, "uri": inputs.store.uri(checkpoint_prefix), "step": final},
                "resumed": [e for e in result.events("resumed")], "restarts": result.restarts,
                "tensorboard": tensorboard and str(tensorboard), **budget}

    def metadata(inputs: Inputs, output: Output) -> dict:
        store, prefix, manifest = inputs.store, output.prefix, output.manifest
        summary = json.loads(store.get_bytes(f"{prefix}/{SUMMARY_FILE}"))
        records = [json.loads(line) for line in store.get_bytes(f"{prefix}/{METRICS_FILE}").splitlines()]
        train = [r for r in records if r.get("event") == "train"]
        evals = [r for r in records if r.get("event") == "eval"]
        # bf16 or fp32 as the trainer resolved it (deepspeed.bf16: auto picks by the hardware); every restart
        # logs it again and keeps the first one's, so the last record is the run's.
        precision = [r for r in records if r.get("event") == "precision"]
        lineage = inputs.manifest["lineage"]  # as this run found it
        # The run's TensorBoard events (on the machine that trained it); `make tensorboard` shows every run.
        tensorboard = {"tensorboard_logdir": MetadataValue.path(manifest["tensorboard"]),
                       "tensorboard_command": MetadataValue.text(f"tensorboard --logdir {manifest['tensorboard']}")
                       } if manifest.get("tensorboard") else {}
        return {
            **tensorboard,
            "checkpoint": MetadataValue.path(manifest["checkpoint"]["uri"]),
            "checkpoint_step": manifest["checkpoint"]["step"],
            "precision": precision[-1]["dtype"] if precision else "unknown",
            "precision_reason": precision[-1]["reason"] if precision else "not recorded",
            "tokens": summary["tokens"], "steps": summary["steps"],
            "final_loss": train[-1]["loss"] if train else float("nan"),
            "mfu": train[-1]["mfu"] if train else 0.0,
            "tokens_per_s": train[-1]["tokens_per_s"] if train else 0.0,
            "val_loss": MetadataValue.json(summary.get("val_loss") or {}),
            "skipped_steps": len(summary.get("skipped") or []),
            # The spike guard's rollbacks: to a checkpoint, or to the initial state before the first one; each leaves
            # a window of global samples out of the data (the checkpoints' manifests carry the windows too).
            "rollbacks": MetadataValue.json([{k: r.get(k) for k in ("step", "to_step", "to", "skip_window")}
                                             for r in records if r.get("event") == "rollback"]),
            "weights": MetadataValue.json(manifest["weights"]),
            **prediction_metadata(inputs.extra.get("prediction"), summary.get("val_loss") or {}, manifest["weights"]),
            **mixture_prediction_metadata(inputs.extra.get("mixture_prediction"), summary.get("val_loss") or {},
                                          summary["tokens"]),
            "epochs": MetadataValue.json(manifest.get("epochs") or {}),  # this stage's draws ÷ each source's tokens
            "loss_curve": _curve([(r["step"], r["loss"]) for r in train], "training loss", "loss"),
            "lr_curve": _curve([(r["step"], r["lr"]) for r in train], "learning rate", "lr"),
            "val_loss_curve": _curve([(r["step"], sum(r["val_loss"].values()) / len(r["val_loss"])) for r in evals
                                      if r["val_loss"]], "mean validation loss", "loss"),
            # Zero-shot accuracy during training (metrics.downstream_interval): capabilities, not only the loss.
            "zero_shot_curve": line_chart(_zero_shot_series(records), title="zero-shot accuracy during training",
                                          xlabel="tokens", ylabel="accuracy"),
            "lineage": MetadataValue.json([{k: r.get(k) for k in ("asset", "data_version", "run_id")} for r in lineage]),
            # How the run that made this output went: each restart of the trainer, why, and where it resumed.
            "restarts": len(manifest.get("restarts", [])),
            "restart_log": MetadataValue.json(manifest.get("restarts", [])),
        }

    return output_asset(OutputSpec(
        key=stage_key(name), group="training", stage=f"training-{name}", code=("trainer",),
        section={"stage": name, "settings": settings, "weights": fixed, "min_doc_tokens": min_doc_tokens,
                 **({how_start: previous} if previous else {})},
        description=(f"Training stage `{name}` ({settings['train_tokens']:,} tokens, seq "
                     f"{settings.get('batch', {}).get('seq_len', '?')}), {start}, on {mixture}. DeepSpeed through the "
                     f"launcher resource{f' ({how})' if how else ''}; checkpoints to the object store, and a "
                     "restart or retry resumes from the latest one. "
                     f"Driven by the recipe's `training` section."),
        deps=deps, prepare=prepare, build=build, metadata=metadata, resources=frozenset({"launcher"}),
        # Stable folders per version: a retry finds the same local checkpoints (and the same remote ones).
        work_dir=lambda inputs: Path(inputs.resources.scratch.root) / "training" / name / inputs.version_key,
        out_name="result", kinds=frozenset({"python", "pytorch"}),
        asset_args={"config_schema": launchpad, "retry_policy": RetryPolicy(max_retries=2, delay=5, backoff=Backoff.LINEAR),
                    "metadata": {"launch": MetadataValue.json(launch.overrides())}},  # over the launcher's defaults
    ))


def checkpoint_section(checkpoint: dict, *, remote: str, run_name: str, stage: str, default_dir: Path) -> dict:
    """A stage's run.json checkpoint section: the recipe's settings, the store as the remote, the version key as
    the run's name, and the local folder: the stage's work folder (stable per version, so a retry finds it), or,
    when the recipe names a local_dir (a node-local disk with checkpoint.shared_local_dir false, `$VARS` expanded
    on each node), <local_dir>/<stage>/<version key> under it."""
    local = checkpoint.get("local_dir")
    local = f"{local.rstrip('/')}/{stage}/{run_name}" if local else str(default_dir)
    return {**checkpoint, "remote": remote, "run_name": run_name, "local_dir": local}


def _with_overrides(name: str, settings: dict, chosen: dict) -> tuple[dict, dict]:
    """The stage's settings with the Launchpad's changed values; a bad one fails naming the field."""
    batch = settings.get("batch", {})
    recipe_values = {"train_tokens": settings["train_tokens"], "seq_len": batch.get("seq_len", BatchConfig().seq_len),
                     "global_batch": batch.get("global_batch", BatchConfig().global_batch)}
    overrides = {k: v for k, v in chosen.items() if k in recipe_values and v != recipe_values[k]}
    change: dict = {}
    if "train_tokens" in overrides:
        change["train_tokens"] = overrides["train_tokens"]
    for field in ("seq_len", "global_batch"):
        if field in overrides:
            change.setdefault("batch", {})[field] = overrides[field]
    merged = merge(settings, change)
    try:
        check_stage(f"launchpad config of training/{name}", merged)
    except ValueError as exc:
        raise Failure(description=str(exc)) from None
    return merged, overrides


def _zero_shot_series(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """{"task metric": [(tokens, score), ...]} from the trainer's downstream records."""
    series: dict[str, list[tuple[int, float]]] = {}
    for r in (r for r in records if r.get("event") == "downstream"):
        for task, figures in r["tasks"].items():
            series.setdefault(f"{task} {figures['metric']}", []).append((r["tokens"], figures[figures["metric"]]))
    return series


def _curve(points: list[tuple[int, float]], title: str, ylabel: str) -> MetadataValue:
    return line_chart(points, title=title, xlabel="step", ylabel=ylabel)
