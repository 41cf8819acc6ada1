"""`pretrain`: materialize, inspect and read the factory's assets from a terminal.

    pretrain materialize [--recipe R] [--select SEL] [--stale] [--refresh] [--jobs N] [--verbose]
    pretrain status      [--recipe R] [--check]
    pretrain where ASSET [--recipe R] [--source S]
    pretrain docs ASSET  [--recipe R] [--source S] [--limit N]
    pretrain plan        [--recipe R] [--model JSON_OR_PATH] [--tokens N] [--device h100] [--mfu 0.4]
                         [--tp 1] [--pp 1] [--dp 8] [--zero 3] [--micro-batches M] [--micro-batch B]
                         [--recompute none|full|selective] [--sequence-parallel K] [--price USD] [--no-attention]
    pretrain plan --params 1B,7B --tokens 20B,2T [--tflops 400] [--price 2]   (a cost table by N and D)
    pretrain plan --budget 1.2e20 [--fit PATH_OR_URI]                          (compute-optimal N and D)
    pretrain jobs [--json]
    pretrain lineage CHECKPOINT_URI [--json] [--no-check]
    pretrain export CHECKPOINT_URI DIR [--tokenizer tokenizer.json]
    pretrain eval CHECKPOINT_URI [--recipe R] [--tasks T1,T2] [--limit N] [--tokenizer tokenizer.json] [--out results.json]
    pretrain schema                  (the recipe's JSON Schema, as docs/recipe.schema.json holds it)

ASSET is an asset key path (`curation/web/raw_crawl`) or, with --source, the stage name (`raw_crawl`).
SEL is a comma-separated list of asset key paths or fnmatch patterns (`curation/*/raw_crawl`); a leading
`+` adds everything the matched assets depend on (`+tokenization/math/packed`).
Runs go to the persistent Dagster instance under PRETRAIN_HOME, so `make ui` shows them.
`materialize` shows a line per asset and a live progress line; the rest of its output (Dagster's event log,
datatrove, DeepSpeed, the trainers) goes to $PRETRAIN_HOME/logs/<id>.log, unless --verbose.
Errors go to stderr with a non-zero exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from assets.cli.checkpoints import evaluate, export, lineage
from assets.cli.factory import UsageError
from assets.cli.materialize import materialize, start_local_helpers
from assets.cli.plan import plan
from assets.cli.reference import schema
from assets.cli.status import docs, jobs, status, where
from assets.core.startup import built_to_keep, own_process


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the command line of this process, which ends with the command (assets/core/startup.py)
        own_process()
    parser = build_parser()
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.command is materialize:
            from assets.runs.output import materialize_output

            # First: the helpers below, and every process started from here, write where this process does.
            args.report = stack.enter_context(materialize_output(verbose=args.verbose))
            start_local_helpers(args)
        # Imported here, not at the top: it loads Dagster (~1 s), which the helpers above need not wait for.
        with built_to_keep(only_in_own_process=True):  # they live as long as the process (core/startup.py)
            from assets.recipe import RecipeError

        try:
            return args.command(args)
        except (RecipeError, UsageError) as exc:
            error = f"pretrain: {exc}"
        except BrokenPipeError:  # `pretrain docs … | head` closed the pipe: not an error
            return 0
    print(error, file=sys.stderr)  # after the block: on the terminal, whatever the command did with its output
    return 2


def build_parser() -> argparse.ArgumentParser:
    """Every command's arguments, in one place: what the command line offers (docs/reference/cli.md is made from it)."""
    parser = argparse.ArgumentParser(prog="pretrain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    def add(name: str, func, help_: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_)
        cmd.add_argument("--recipe", help="recipe YAML (default: $PRETRAIN_RECIPE, else recipes/demo.yaml)")
        cmd.set_defaults(command=func)
        return cmd

    cmd = add("materialize", materialize, "materialize assets into the store and the Dagster instance")
    cmd.add_argument("--select", help="comma-separated asset keys or patterns, '+' prefix to add their upstream (default: all)")
    cmd.add_argument("--stale", action="store_true", help="only what is stale or missing, looping until nothing is")
    cmd.add_argument("--refresh", action="store_true",
                     help="train again what is trained once and kept (the tokenizer, on the sources' current outputs) "
                          "though its recipe section did not change")
    cmd.add_argument("--jobs", "-j", type=int, metavar="N",
                     help="independent steps run N at a time (default: $PRETRAIN_JOBS, else the number of CPUs)")
    cmd.add_argument("--verbose", "-v", action="store_true",
                     help="stream everything (Dagster's event log, datatrove, DeepSpeed, the trainers) to stderr, "
                          "instead of a line per asset and a progress line, the rest in $PRETRAIN_HOME/logs/<id>.log")

    cmd = add("status", status, "each asset: fresh, stale or missing, with the cause")
    cmd.add_argument("--check", action="store_true",
                     help="exit 1 unless every asset is fresh (CI after `make demo`, scripts)")

    for name, func, help_ in (("where", where, "an asset's current output URI, then its manifest"), ("docs", docs, "stream an asset's documents as JSONL")):
        cmd = add(name, func, help_)
        cmd.add_argument("asset", help="asset key path, or a stage name with --source; a crawl's asset takes a dump "
                                       "as status prints it (curation/crawl/filtered[2024-10]), else every dump")
        cmd.add_argument("--source", help="source name, when ASSET is a stage name")
        if name == "docs":
            cmd.add_argument("--limit", type=int, default=None, help="stop after N documents")

    cmd = sub.add_parser("jobs", help="the training jobs under PRETRAIN_HOME, live and recent, read from their own files")
    cmd.add_argument("--json", action="store_true", help="print one JSON object per job")
    cmd.set_defaults(command=jobs)

    cmd = sub.add_parser("lineage", help="what a checkpoint was made from, read from the checkpoint alone")
    cmd.add_argument("checkpoint", help="a checkpoint step folder or a run folder (its `latest`): path, file:// or s3://")
    cmd.add_argument("--json", action="store_true", help="print the lineage records as JSON")
    cmd.add_argument("--no-check", action="store_true", help="do not cross-check with the Dagster instance")
    cmd.set_defaults(command=lineage)

    cmd = sub.add_parser("export", help="write a checkpoint as a Hugging Face Llama model (config, safetensors, tokenizer)")
    cmd.add_argument("checkpoint", help="a committed checkpoint step folder: path, file:// or s3://")
    cmd.add_argument("out_dir", help="the folder to write")
    cmd.add_argument("--tokenizer", help="tokenizer.json (default: the tokenizer output its lineage names, from the store)")
    cmd.set_defaults(command=export)

    cmd = add("eval", evaluate, "lm-evaluation-harness on a checkpoint (exported to Hugging Face format): every metric "
                             "with its standard error")
    cmd.add_argument("checkpoint", help="a committed checkpoint step folder: path, file:// or s3://")
    cmd.add_argument("--tasks", help="comma-separated lm-eval tasks (default: the recipe's evaluation.tasks)")
    cmd.add_argument("--limit", type=int, help="items per task (default: the recipe's evaluation.limit; 0: all)")
    cmd.add_argument("--tokenizer", help="tokenizer.json (default: the tokenizer output its lineage names, from the store)")
    cmd.add_argument("--out", help="also write lm-eval's results JSON here")

    cmd = add("plan", plan, "parameters, FLOPs, GPU-hours and memory per GPU of each training stage")
    cmd.add_argument("--model", help="model config as inline JSON, or a JSON file (a model config or a run.json)")
    cmd.add_argument("--tokens", help="token budget, e.g. 2e12 or 2T (default: the run config's train_tokens)")
    cmd.add_argument("--seq-len", type=int, help="sequence length (default: the run config's batch.seq_len)")
    cmd.add_argument("--device", default="h100", help="h100, h200, a100 or a100-40gb (default h100)")
    cmd.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilization (default 0.4)")
    for flag, default in (("--tp", 1), ("--pp", 1), ("--dp", 8), ("--zero", 3), ("--micro-batches", 1)):
        cmd.add_argument(flag, type=int, default=default, help=f"default {default}")
    cmd.add_argument("--checkpoint-minutes", type=float, help="time to write one checkpoint (with --mtbf-hours)")
    cmd.add_argument("--mtbf-hours", type=float, help="mean time between failures of the whole job")
    cmd.add_argument("--micro-batch", type=int, help="sequences per GPU per forward (default: the stage's)")
    cmd.add_argument("--recompute", choices=["none", "full", "selective"],
                     help="activation recomputation (default: the stage's model.activation_checkpointing)")
    cmd.add_argument("--sequence-parallel", type=int, help="Ulysses degree: the sequence split over K GPUs (default 1)")
    cmd.add_argument("--price", type=float, help="dollars per GPU-hour: adds the cost")
    cmd.add_argument("--no-attention", action="store_true", help="FLOPs as 6·N·D, without the attention term")
    cmd.add_argument("--params", help="comma-separated parameter counts (1B,7B): a cost table by N and --tokens")
    cmd.add_argument("--tflops", type=float, default=400.0, help="achieved TFLOP/s per GPU of --params (default 400)")
    cmd.add_argument("--budget", help="a FLOP budget (1.2e20): the compute-optimal parameters and tokens, by the "
                                      "recipe's latest scaling/fit if there is one, else 20 tokens per parameter")
    cmd.add_argument("--fit", metavar="PATH_OR_URI",
                     help="with --budget: a scaling fit's fit.json, or the scaling/fit output folder holding it "
                          "(a path, file:// or s3://), instead of the recipe's latest")

    cmd = sub.add_parser("schema", help="print the recipe's JSON Schema (docs/recipe.schema.json: what editors "
                                        "validate a recipe with)")
    cmd.set_defaults(command=schema)
    return parser
