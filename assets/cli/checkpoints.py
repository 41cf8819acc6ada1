"""A checkpoint from a terminal: `pretrain lineage` (what made it), `export` (a Hugging Face model) and `eval`
(lm-evaluation-harness on it)."""

from __future__ import annotations

import json
import sys

from assets.cli.factory import UsageError, open_instance


def lineage(args) -> int:
    # The checkpoint alone is enough; the Dagster instance, when PRETRAIN_HOME has one, only cross-checks.
    import os
    from pathlib import Path

    from storage.manifest import read_manifest
    from storage.objects import StoreError
    from storage.factory import open_store

    uri = args.checkpoint.rstrip("/")
    try:
        store = open_store(uri)
        manifest = read_manifest(store, "")
        if manifest is None and store.exists("latest"):
            step = int(store.get_bytes("latest").decode().strip())
            manifest = read_manifest(store, f"step-{step:08d}")
            uri = f"{uri}/step-{step:08d}"
    except (StoreError, ValueError, OSError) as exc:
        raise UsageError(f"{args.checkpoint}: cannot read the checkpoint: {exc}") from None
    if manifest is None:
        raise UsageError(f"{args.checkpoint}: no committed checkpoint (no manifest.json, no `latest`)")
    records = manifest.get("lineage") or []
    if args.json:
        print(json.dumps({"checkpoint": uri, "step": manifest.get("step"), "lineage": records}, indent=2))
    else:
        print(f"checkpoint {uri}: stage {manifest.get('config', {}).get('stage', '?')}, step {manifest.get('step')}, "
              f"{manifest.get('tokens')} tokens, tokenizer sha256 {str(manifest.get('tokenizer_sha256'))[:12]}")
        if not records:
            print("  no lineage recorded (trained outside the Dagster layer)")
        for entry in records:
            print(f"  {entry.get('asset')}  data {str(entry.get('data_version'))[:12]}  code {entry.get('code_version')}"
                  f"  run {entry.get('run_id')}")
    home = os.environ.get("DAGSTER_HOME")
    if args.no_check or not records or not home or not Path(home, "dagster.yaml").exists():
        return 0
    from assets.core.lineage import cross_check

    problems = cross_check(open_instance(), records)
    for problem in problems:
        print(f"pretrain: lineage differs from the Dagster instance: {problem}", file=sys.stderr)
    if not problems:
        print(f"  cross-checked against the Dagster instance at {home}: every output is there", file=sys.stderr)
    return 1 if problems else 0


def export(args) -> int:
    import tempfile
    from pathlib import Path

    from storage.objects import StoreError
    from trainer.checkpoint.store import CorruptCheckpoint

    with tempfile.TemporaryDirectory(prefix="pretrain-export-") as tmp:
        try:
            from trainer.evaluation.export import export_checkpoint

            step_folder, tokenizer = checkpoint_and_tokenizer(args, Path(tmp))
            out = export_checkpoint(step_folder, args.out_dir, tokenizer=tokenizer)
        except (StoreError, ValueError, OSError, CorruptCheckpoint) as exc:  # ExportError is a ValueError
            raise UsageError(f"{args.checkpoint}: {exc}") from None
    print(out)
    return 0


def evaluate(args) -> int:
    """lm-evaluation-harness on a checkpoint, as the evaluation assets run it: the recipe's benchmark folder, tasks
    and limit unless given."""
    import tempfile
    from pathlib import Path

    from assets.recipe import load_recipe
    from storage.objects import StoreError
    from trainer.checkpoint.store import CorruptCheckpoint

    from assets.evaluation.stage import HF_CACHE
    from assets.home import pretrain_home
    from trainer.evaluation.harness import HarnessUnavailable, lm_eval_checkpoint

    recipe = load_recipe(args.recipe)
    tasks = args.tasks.split(",") if args.tasks else recipe.evaluation.tasks
    limit = args.limit if args.limit is not None else recipe.evaluation.limit
    with tempfile.TemporaryDirectory(prefix="pretrain-eval-") as tmp:
        try:
            step_folder, tokenizer = checkpoint_and_tokenizer(args, Path(tmp))
            results = lm_eval_checkpoint(step_folder, tokenizer=tokenizer,
                                         benchmarks=recipe.input_root / recipe.evaluation.benchmarks, tasks=tasks,
                                         limit=limit or None, work=Path(tmp) / "lm-eval",
                                         hf_cache=pretrain_home() / "work" / HF_CACHE)  # the assets' cache
        except (StoreError, ValueError, OSError, CorruptCheckpoint, HarnessUnavailable) as exc:
            raise UsageError(f"{args.checkpoint}: {exc}") from None
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(results["table"])
    return 0


def checkpoint_and_tokenizer(args, tmp) -> tuple:
    """(a local copy of the checkpoint step args.checkpoint names, args.tokenizer or the tokenizer its lineage names,
    downloaded from the store)."""
    from trainer.checkpoint.store import local_step

    step_folder = local_step(args.checkpoint, tmp / "steps")
    if args.tokenizer:
        return step_folder, args.tokenizer
    manifest = json.loads((step_folder / "manifest.json").read_text())
    return step_folder, lineage_tokenizer(manifest, tmp)


def lineage_tokenizer(manifest: dict, tmp):
    from assets.home import store_url
    from storage.factory import open_store

    entry = next((e for e in manifest.get("lineage") or [] if e.get("asset") == "tokenization/tokenizer"), None)
    if entry is None:
        raise ValueError("its lineage names no tokenizer output; give --tokenizer tokenizer.json")
    path = tmp / "tokenizer.json"
    open_store(store_url()).download(f"{entry['prefix']}/tokenizer.json", path)
    return path
