"""`curation/reference_lm`: a small causal LM of the recipe's `reference` text, trained by our trainer, which the
perplexity filter (pipelines/filters/perplexity.py) scores documents with. A source whose filter has `perplexity`
reads it, so a retrained model makes stale exactly the filtered assets that use it.

The build: the train files' paragraphs (pipelines/filters/perplexity.py reference_paragraphs, up to
max_train_bytes) -> a byte-level BPE of its own (pipelines/tokenization/tokenizer.py; the corpus tokenizer is trained
after curation, so it cannot be this model's) -> `python -m trainer` through the launcher resource, one process
(a model this size trains on the machine the asset runs on) -> `python -m pipelines.filters.perplexity` exports the
final checkpoint with the loss and perplexity of the val files, scored as the filter scores documents. Committed:
model.pt, reference.json, tokenizer.json (the filter's folder). Not the run's metrics.jsonl: its timings differ from
one run to the next, so the same model would get a new data version each time it is trained, and every filtered
output behind it would turn stale (its final train loss goes into the manifest instead).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pydantic
from dagster import AssetKey, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.recipe import Recipe
from assets.recipe.training import PROXY_THREADS
from pipelines.filters.config import ReferenceConfig
from pipelines.tokenization.config import TokenizerConfig

REFERENCE_KEY = AssetKey(["curation", "reference_lm"])
METRICS_FILE = "metrics.jsonl"
# One process on the asset's own machine, whatever the launcher resource's default for the training stages, with a
# proxy's fixed thread count: its model scores the perplexity filter, so it must not change with what runs beside it.
LAUNCH = {"launcher": "python", "nproc_per_node": 1, "nnodes": 1, "max_restarts": 1, "threads": PROXY_THREADS}


def run_config(config: ReferenceConfig, *, text: Path, tokenizer: Path, output_dir: Path) -> dict:
    """The trainer's run config for the reference model: the text source (trainer/data/text_source.py), a few
    hundred steps of a tiny model, no checkpoint but the final one."""
    return {
        "stage": "reference_lm", "seed": config.seed, "train_tokens": config.train_tokens,
        "output_dir": str(output_dir),
        # The trainer's own held-out share of the text; the reported figures are the val files'.
        "data": {"text": str(text), "tokenizer": str(tokenizer), "val_fraction": 0.01},
        "model": {"vocab_size": config.vocab_size, "d_model": config.d_model, "n_layers": config.n_layers,
                  "n_heads": config.n_heads},
        "optim": {"lr": config.lr},
        "schedule": {"kind": "cosine", "warmup_tokens": config.train_tokens // 8},
        "batch": {"global_batch": config.global_batch, "micro_batch": config.global_batch, "seq_len": config.seq_len},
        "metrics": {"log_interval": 32, "eval_batches": 1, "tensorboard": False},
        "checkpoint": {"interval_steps": 0, "keep_last": 1, "resume": True},
        # A run of seconds without a checkpoint to roll back to: a spike guard stop (seen at steps 18-20 of a
        # tiny model, its grad norm rising with the LR) would only fail the asset; the grad clip bounds a step.
        "guard": {"enabled": False},
    }


def _paragraphs(files: list[Path], budget: int) -> list[str]:
    """The files' paragraphs in order, up to `budget` UTF-8 bytes."""
    from pipelines.filters.perplexity import read_reference_text, reference_paragraphs
    kept, used = [], 0
    for path in files:
        for paragraph in reference_paragraphs(read_reference_text(path)):
            used += len(paragraph.encode()) + 2
            if used > budget:
                return kept
            kept.append(paragraph)
    return kept


def reference_lm_asset(recipe: Recipe, config: ReferenceConfig):
    files = {name: recipe.input_root / name for name in (*config.train_files, *config.val_files)}
    # The texts' contents are part of the code version, hashed when the definitions load (as a source's blocklists
    # are, assets/curation/filtered.py): an edited text shows the model stale at once, in `pretrain status` too,
    # and the same bytes again are the same version. ~10 ms for the demo's 1.3 MB.
    texts = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in files.items() if path.is_file()}
    section = {**pydantic.TypeAdapter(ReferenceConfig).dump_python(config, mode="json"), "texts": texts}

    def prepare(inputs: Inputs) -> Inputs:
        for field in ("train_files", "val_files"):
            for name in getattr(config, field):
                if not files[name].is_file():
                    raise ValueError(f"reference.{field}: file {name!r} not found (looked for {files[name]})")
        return inputs.but(manifest={"texts": texts}, extra={"files": files})

    def build(inputs: Inputs, out_dir: Path) -> dict:
        from pipelines.filters.perplexity import REFERENCE_FILE
        from pipelines.tokenization.tokenizer import train_tokenizer
        files, work = inputs.extra["files"], inputs.work
        train = _paragraphs([files[name] for name in config.train_files], config.max_train_bytes)
        val = _paragraphs([files[name] for name in config.val_files], config.max_val_bytes)
        work.mkdir(parents=True, exist_ok=True)
        text, val_text = work / "train.txt", work / "val.txt"
        text.write_text("\n\n".join(train))  # the text source's documents: blank-line separated
        val_text.write_text("\n".join(val))  # one paragraph a line, as reference_paragraphs reads it back
        tokenizer = work / "tokenizer.json"
        train_tokenizer(train, TokenizerConfig(vocab_size=config.vocab_size)).save(str(tokenizer))
        run = run_config(config, text=text, tokenizer=tokenizer, output_dir=work / "run")  # out_dir is work/out
        launcher = inputs.resources.launcher
        launcher.launch(inputs.context, run, work, settings=LAUNCH)
        launcher.run_python(inputs.context, [
            "-m", "pipelines.filters.perplexity", "--checkpoints", str(work / "run" / "checkpoints"),
            "--tokenizer", str(tokenizer), "--val", str(val_text), "--seq-len", str(config.seq_len),
            "--out", str(out_dir)], work)
        logged = [json.loads(line) for line in (work / "run" / METRICS_FILE).read_text().splitlines()]
        train_logs = [r for r in logged if r.get("event") == "train"]
        info = json.loads((out_dir / REFERENCE_FILE).read_text())
        inputs.log.info(f"reference model: val loss {info['val_loss']} (perplexity {info['val_perplexity']}) on "
                        f"{info['val_paragraphs']} paragraphs")
        return {"counts": {"train_paragraphs": len(train), "val_paragraphs": info["val_paragraphs"],
                           "val_tokens": info["val_tokens"]},
                "val_loss": info["val_loss"], "val_perplexity": info["val_perplexity"],
                "final_train_loss": train_logs[-1]["loss"] if train_logs else None}

    def metadata(inputs: Inputs, output: Output) -> dict:
        from pipelines.filters.perplexity import REFERENCE_FILE
        manifest = output.manifest
        info = json.loads(inputs.store.get_bytes(f"{output.prefix}/{REFERENCE_FILE}"))
        pct = info["val_percentiles"]
        return {
            "val_loss": manifest["val_loss"],
            "val_perplexity": manifest["val_perplexity"],
            "val_paragraphs": manifest["counts"]["val_paragraphs"],
            "val_tokens": manifest["counts"]["val_tokens"],
            "train_paragraphs": manifest["counts"]["train_paragraphs"],
            "final_train_loss": float("nan") if manifest["final_train_loss"] is None else manifest["final_train_loss"],
            "steps": info["step"],
            # The band keep_percentiles picks from: the val paragraphs' perplexities.
            "val_perplexity_percentiles": MetadataValue.json({str(p): pct[p] for p in (5, 30, 50, 60, 95, 99)}),
        }

    return output_asset(OutputSpec(
        key=REFERENCE_KEY, group="curation", stage="reference_lm",
        # The code is this module's closure: pipelines/filters/perplexity.py and the trainer modules it runs (the
        # model, its config, the checkpoint reader), so a changed architecture retrains the model. Not the whole
        # trainer package, though `python -m trainer` trains it: an edit of the training loop would retrain it and
        # make stale every filtered output behind it and all of curation after them, for a reference model that
        # is only a yardstick. A changed `reference` section (another seed, for one) retrains it.
        code=(), section=section,
        description=(
            "A small causal LM of the recipe's reference text (our trainer, a tokenizer of its own): the perplexity "
            "filter's model; loss and perplexity on the val files in the metadata. Driven by the recipe's "
            "`reference` section."
        ),
        prepare=prepare, build=build, metadata=metadata,
        resources=frozenset({"launcher"}), kinds=frozenset({"python", "pytorch"}),
        failures=(ValueError,),  # a reference file the recipe names is missing
        asset_args={"metadata": {"launch": MetadataValue.json(LAUNCH)}},  # its cores, for the scheduler
    ))
