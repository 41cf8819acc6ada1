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

ASSET is an asset key path (`curation/web/raw_crawl`) or, with --source, the stage name (`raw_crawl`).
SEL is a comma-separated list of asset key paths or fnmatch patterns (`curation/*/raw_crawl`); a leading
`+` adds everything the matched assets depend on (`+tokenization/math/packed`).
Runs go to the persistent Dagster instance under PRETRAIN_HOME, so `make ui` shows them.
`materialize` shows a line per asset and a live progress line; the rest of its output (Dagster's event log,
datatrove, DeepSpeed, the trainers) goes to $PRETRAIN_HOME/logs/<id>.log, unless --verbose.
Errors go to stderr with a non-zero exit status.

Long because it is every `pretrain` command's parser and handler in one file, each handler a thin call into the
asset layer or the planner: one place to read what the command line offers.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import gzip
import io
import json
import os
import sys
import time

from assets.core.startup import built_to_keep, own_process
from assets.home import ensure_dagster_home


class UsageError(ValueError):
    """A command line that names something that does not exist."""


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the command line of this process, which ends with the command (assets/core/startup.py)
        own_process()
    parser = _parser()
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.command is _materialize:
            from assets.runs.output import materialize_output

            # First: the helpers below, and every process started from here, write where this process does.
            args.report = stack.enter_context(materialize_output(verbose=args.verbose))
            _start_local_helpers(args)
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pretrain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    def add(name: str, func, help_: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_)
        cmd.add_argument("--recipe", help="recipe YAML (default: $PRETRAIN_RECIPE, else recipes/demo.yaml)")
        cmd.set_defaults(command=func)
        return cmd

    cmd = add("materialize", _materialize, "materialize assets into the store and the Dagster instance")
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

    cmd = add("status", _status, "each asset: fresh, stale or missing, with the cause")
    cmd.add_argument("--check", action="store_true",
                     help="exit 1 unless every asset is fresh (CI after `make demo`, scripts)")

    for name, func, help_ in (("where", _where, "an asset's current output URI, then its manifest"), ("docs", _docs, "stream an asset's documents as JSONL")):
        cmd = add(name, func, help_)
        cmd.add_argument("asset", help="asset key path, or a stage name with --source; a crawl's asset takes a dump "
                                       "as status prints it (curation/crawl/filtered[2024-10]), else every dump")
        cmd.add_argument("--source", help="source name, when ASSET is a stage name")
        if name == "docs":
            cmd.add_argument("--limit", type=int, default=None, help="stop after N documents")

    cmd = sub.add_parser("jobs", help="the training jobs under PRETRAIN_HOME, live and recent, read from their own files")
    cmd.add_argument("--json", action="store_true", help="print one JSON object per job")
    cmd.set_defaults(command=_jobs)

    cmd = sub.add_parser("lineage", help="what a checkpoint was made from, read from the checkpoint alone")
    cmd.add_argument("checkpoint", help="a checkpoint step folder or a run folder (its `latest`): path, file:// or s3://")
    cmd.add_argument("--json", action="store_true", help="print the lineage records as JSON")
    cmd.add_argument("--no-check", action="store_true", help="do not cross-check with the Dagster instance")
    cmd.set_defaults(command=_lineage)

    cmd = sub.add_parser("export", help="write a checkpoint as a Hugging Face Llama model (config, safetensors, tokenizer)")
    cmd.add_argument("checkpoint", help="a committed checkpoint step folder: path, file:// or s3://")
    cmd.add_argument("out_dir", help="the folder to write")
    cmd.add_argument("--tokenizer", help="tokenizer.json (default: the tokenizer output its lineage names, from the store)")
    cmd.set_defaults(command=_export)

    cmd = add("eval", _eval, "lm-evaluation-harness on a checkpoint (exported to Hugging Face format): every metric "
                             "with its standard error")
    cmd.add_argument("checkpoint", help="a committed checkpoint step folder: path, file:// or s3://")
    cmd.add_argument("--tasks", help="comma-separated lm-eval tasks (default: the recipe's evaluation.tasks)")
    cmd.add_argument("--limit", type=int, help="items per task (default: the recipe's evaluation.limit; 0: all)")
    cmd.add_argument("--tokenizer", help="tokenizer.json (default: the tokenizer output its lineage names, from the store)")
    cmd.add_argument("--out", help="also write lm-eval's results JSON here")

    cmd = add("plan", _plan, "parameters, FLOPs, GPU-hours and memory per GPU of each training stage")
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
    return parser


def say(text: str) -> None:
    """A line for the user, on stderr."""
    print(text, file=sys.stderr)


def open_instance(say=say):
    """The persistent Dagster instance under PRETRAIN_HOME, its runs whose process died marked failed first (a
    `pretrain materialize` killed with SIGKILL leaves them STARTED; assets/runs/dead.py), each said with `say`."""
    ensure_dagster_home()
    from dagster import DagsterInstance

    from assets.runs.dead import fail_dead_runs

    instance = DagsterInstance.get()
    for line in fail_dead_runs(instance):
        say(f"pretrain: {line}")
    return instance


class Factory:
    """The recipe in force, its Definitions and the persistent instance: what every command needs. What it has to
    tell the user (runs found dead, new input files) goes to `say`: `pretrain materialize`'s terminal."""

    def __init__(self, recipe_arg: str | None, say=say):
        # All of it lives as long as the command: built with the collector paused (assets/core/startup.py).
        with built_to_keep(only_in_own_process=True):
            self._build(recipe_arg, say)

    def _build(self, recipe_arg: str | None, say) -> None:
        from assets.recipe import load_recipe

        self.say = say
        self.recipe = load_recipe(recipe_arg)
        self.recipe_arg = str(self.recipe.path)  # the worker processes of a parallel materialize load this one
        ensure_dagster_home()
        from assets.definitions import build_defs

        self.defs = build_defs(self.recipe)
        self.instance = open_instance(say)
        graph = self.defs.resolve_asset_graph()
        # What can be materialized: the observed input sets (curation/<source>/inputs) are source assets.
        self.keys = sorted((k for k in self.defs.resolve_all_asset_keys() if graph.get(k).is_materializable),
                           key=lambda k: k.to_user_string())
        # The assets partitioned by a crawl's dumps: status shows each dump, --stale runs only the dumps not fresh.
        from assets.dumps import dumps_partitions

        dumps = {dumps_partitions(s) for s in self.recipe.sources if s.has_dumps}
        self.dump_keys = {k for k in self.keys if graph.get(k).partitions_def in dumps} if dumps else set()
        self.partition_states: dict = {}  # {key: [(dump, state, cause)]} of the dump keys, from the last statuses()

    def observe_inputs(self) -> None:
        """Observe every source's input files first, so new or replaced ones make their raw_crawl stale here as
        in the UI (assets/curation/raw_crawl.py)."""
        from dagster import Failure

        from assets.dumps import sync_dumps
        from assets.curation.raw_crawl import observe_inputs

        try:
            changed = observe_inputs(self.instance, self.recipe)
            added = sync_dumps(self.instance, self.recipe)
        except Failure as exc:  # an input that cannot be listed
            raise UsageError(exc.description) from None
        except ValueError as exc:  # a crawl's dump folders that cannot be listed
            raise UsageError(str(exc)) from None
        if changed:
            self.say(f"pretrain: new input files observed for {', '.join(changed)}")
        for source, dumps in added.items():
            self.say(f"pretrain: new dump{'s' if len(dumps) > 1 else ''} of {source}: {', '.join(dumps)}")

    def statuses(self) -> list[tuple]:
        """[(key, "fresh" | "stale" | "missing", cause)] for every asset, in key order (assets/core/states.py), after
        observing the inputs."""
        from assets.core.states import asset_states

        self.observe_inputs()
        self.partition_states = {key: [] for key in self.dump_keys}
        return asset_states(self.instance, self.defs.resolve_asset_graph(), self.keys, self.partition_states)

    def select(self, selection: str | None) -> list:
        """Keys for a --select: comma-separated keys or fnmatch patterns; `+PATTERN` adds everything upstream."""
        if not selection:
            return list(self.keys)
        from dagster import AssetSelection

        chosen: set = set()
        for pattern in (p.strip() for p in selection.split(",") if p.strip()):
            with_upstream = pattern.startswith("+")
            pattern = pattern.lstrip("+")
            matches = [k for k in self.keys if fnmatch.fnmatchcase(k.to_user_string(), pattern)]
            if not matches:
                raise UsageError(f"--select {pattern!r} matches no asset; assets are: {', '.join(k.to_user_string() for k in self.keys)}")
            if with_upstream:
                matches = AssetSelection.assets(*matches).upstream().resolve(self.defs.resolve_asset_graph())
            chosen.update(matches)
        return [k for k in self.keys if k in chosen]

    def materialize(self, keys: list, jobs: int | None = None, refresh: bool = False, report=None,
                    partitions: dict | None = None) -> bool:
        """Run `keys` in dependency order, each asset (each partition of the mix sweep) a Dagster run of its own
        once everything it needs from the selection is done, up to `jobs` at once (assets/runs/parallel.py). `refresh`
        tags the runs so that what is trained once and kept is trained again (the tokenizer). The runs are tagged
        with `report`'s session and report to it (assets/runs/progress.py)."""
        from assets.runs.parallel import SESSION_TAG, default_jobs, materialize_parallel
        from assets.tokenization.tokenizer import REFRESH_TAG

        self.observe_inputs()
        tags = {**({REFRESH_TAG: "true"} if refresh else {}), **({SESSION_TAG: report.session} if report else {})}
        return materialize_parallel(self.defs, self.instance, keys, jobs=jobs or default_jobs(),
                                    recipe_arg=self.recipe_arg, run_tags=tags, report=report, partitions=partitions)

    def stale_round(self, wanted: set) -> list:
        """The next round of `materialize --stale`: the assets of `wanted` stale or missing, less those with a stale or
        missing ancestor. They wait for it: rerun first, the ancestor may change what this one reads (a training
        stage waits for the mixture weights its sweep is about to refit), so nothing runs twice."""
        pending = {key for key, state, _ in self.statuses() if state != "fresh" and key in wanted}
        graph = self.defs.resolve_asset_graph()
        waiting: set = set()  # what has an ancestor in `pending`: one pass in dependency order, not one search a key
        for key in graph.toposorted_asset_keys:
            parents = graph.get(key).parent_keys - {key}
            if parents & pending or parents & waiting:
                waiting.add(key)
        return [key for key in self.keys if key in pending and key not in waiting]

    def stale_partitions(self, keys: list) -> dict:
        """{key: its dumps stale or missing} of the dump-partitioned `keys`, from the last statuses(): a new dump
        runs alone, the others stay as they are."""
        from assets.core.factory import IN_ORDER

        graph = self.defs.resolve_asset_graph()
        chosen = {}
        for key in (k for k in keys if k in self.partition_states):
            rows = self.partition_states[key]
            first = next((i for i, (_, state, _) in enumerate(rows) if state != "fresh"), len(rows))
            # Dumps deduplicated in order: one after a rebuilt dump keys on it (Dagster does not know), so it runs
            # too, and is built again only if what it keys on changed.
            chosen[key] = ([p for p, _, _ in rows[first:]] if graph.get(key).metadata.get(IN_ORDER)
                           else [p for p, state, _ in rows if state != "fresh"])
        return chosen

    def resolve(self, asset: str, source: str | None):
        from dagster import AssetKey

        path = asset.strip("/").split("/")
        if source:
            if source not in {s.name for s in self.recipe.sources}:
                raise UsageError(f"recipe {self.recipe.name!r} has no source {source!r}; it has {', '.join(s.name for s in self.recipe.sources)}")
            candidates = [k for k in self.keys if len(k.path) >= 2 and k.path[-2] == source and k.path[-1] == path[-1]]
        else:
            candidates = [k for k in self.keys if k == AssetKey(path)]
        if not candidates:
            raise UsageError(f"no asset {asset!r}{f' for source {source!r}' if source else ''}; assets are: {', '.join(k.to_user_string() for k in self.keys)}")
        return candidates[0]

    def current_outputs(self, asset: str, source: str | None) -> tuple:
        """(store, [(dump or None, the latest committed output)]) of ASSET as `where` and `docs` name it: one output,
        or for an asset of a crawl of dumps, the dump named in brackets (`curation/crawl/filtered[2024-10]`) or
        else every dump built, in order."""
        from assets.core.records import partition_materializations
        from assets.core.upstream import OutputNotFound, latest_output, output_at

        name, bracket, dump = asset.partition("[")
        dump = dump.removesuffix("]") if bracket else None
        key = self.resolve(name, source)
        store = self.defs.resources["store"].open()
        if dump is None and key not in self.dump_keys:
            try:
                return store, [(None, latest_output(self.instance, store, key))]
            except OutputNotFound as exc:
                raise UsageError(str(exc)) from None
        if key not in self.dump_keys:
            raise UsageError(f"{key.to_user_string()} is not partitioned by dump: name it without [{dump}]")
        dumps = sorted(self.instance.get_dynamic_partitions(
            self.defs.resolve_asset_graph().get(key).partitions_def.name))
        if dump is not None and dump not in dumps:
            raise UsageError(f"{key.to_user_string()} has no dump {dump!r}; its dumps are: {', '.join(dumps) or 'none yet'}")
        try:
            if dump is not None:
                return store, [(dump, latest_output(self.instance, store, key, dump))]
            # Every dump built, in order: their newest materializations in two queries, not one per dump.
            records = partition_materializations(self.instance, key)
            outputs = [(each, output_at(store, key, records[each].asset_materialization.metadata["prefix"].value, each))
                       for each in dumps
                       if each in records and "prefix" in records[each].asset_materialization.metadata]
        except OutputNotFound as exc:  # never materialized, or its folder removed from the store
            raise UsageError(str(exc)) from None
        if not outputs:
            raise UsageError(f"no dump of {key.to_user_string()} has been materialized: run `pretrain materialize "
                             f"--stale --select {key.to_user_string()}`")
        return store, outputs


def _start_local_helpers(args) -> None:
    """With the local executor at W > 1 workers, start its W - 1 helper processes now, in the background: they take
    ~0.7 s to import datatrove, which then overlaps the ~2 s of loading Dagster and the code location instead of
    the first stage's tasks. Only when the runs execute in this process (one job); parallel jobs' worker processes
    start their own as their runs begin (ExecutorResource.setup_for_execution). A bad variable is left to the
    resource, which names it when the run starts."""
    from pipelines.runner import LocalRunner
    from resources.executor_env import ExecutorEnvironment

    try:
        env = ExecutorEnvironment.read(os.environ)
        jobs = args.jobs or int(os.environ.get("PRETRAIN_JOBS") or 0)
    except ValueError:
        return
    if env.kind == "local" and (env.workers or 1) > 1 and jobs == 1:
        LocalRunner(workers=env.workers).warm()


def _materialize(args) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: expected 1 or more steps at a time")
    try:
        from assets.runs.parallel import default_jobs

        jobs = args.jobs or default_jobs()
    except ValueError as exc:  # a bad PRETRAIN_JOBS
        raise UsageError(str(exc)) from None
    from assets.runs.progress import StreamReport

    report = getattr(args, "report", None) or StreamReport()  # main() gives the command's (assets/runs/output.py)
    factory = Factory(args.recipe, say=report.say)
    report.watch(factory.instance)
    ok = _materialize_selection(args, factory, jobs, report)
    report.finish(ok)
    return 0 if ok else 1


def _materialize_selection(args, factory: Factory, jobs: int, report) -> bool:
    """--select's assets, or with --stale those of them stale or missing until none is; False if a run failed."""
    log = f"; the full log: {report.log}" if report.log else ""
    if not args.stale:
        keys = factory.select(args.select)
        report.say(f"pretrain: materializing {len(keys)} asset(s) of recipe {factory.recipe.name!r}{log}")
        return factory.materialize(keys, jobs, refresh=args.refresh, report=report)

    # Dagster shows staleness one step at a time (a child turns stale only after its parent is
    # re-materialized), so loop until nothing in the selection is stale or missing.
    wanted = set(factory.select(args.select))
    done: list = []
    for _ in range(len(factory.keys) + 1):
        todo = factory.stale_round(wanted)
        if not todo:
            break
        if any(key in done for key in todo):
            report.say(f"pretrain: still stale after materializing: {', '.join(k.to_user_string() for k in todo)}")
            return False
        report.say(f"pretrain: materializing {len(todo)} stale or missing asset(s): "
                   f"{', '.join(k.to_user_string() for k in todo)}{log}")
        log = ""
        if not factory.materialize(todo, jobs, refresh=args.refresh, report=report,
                                   partitions=factory.stale_partitions(todo)):
            return False
        done += todo
    if not done:
        report.say("pretrain: nothing is stale")
    return True


def _status(args) -> int:
    factory = Factory(args.recipe)
    rows = []
    for key, state, cause in factory.statuses():
        rows.append((key.to_user_string(), state, cause))
        # A crawl's assets: a line per dump under the asset's own (missing or stale if any dump is).
        rows += [(f"{key.to_user_string()}[{dump}]", s, c) for dump, s, c in factory.partition_states.get(key, [])]
    width = max(len(row[0]) for row in rows)
    for name, state, cause in rows:
        print(f"{name:<{width}}  {state:<7}  {cause}")
    # Every restart of a training job and every node it left out, with the reason: read from the jobs' own files,
    # so a job still running (or one whose Dagster run died) shows them too.
    # The same three columns: key, "restart", what happened.
    for job in _training_jobs():
        for r in job["restarts"]:
            left_out = f"; left out {r['excluded']} ({r['why']})" if r.get("excluded") else ""
            print(f"{'training/' + job['stage']:<{width}}  {'restart':<7}  after attempt {r['attempt']} at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r['time']))}: {r['reason']}{left_out}")
    # Each filter ablation's verdict, one line per arm (assets/curation/ablation.py), from its latest materialization.
    ablations = [k for k in factory.keys if k.path[-1] == "ablation"]
    # Each spike-guard rollback of a training stage's latest run: where it went back to and the data it left out.
    stages = [k for k in factory.keys if k.path[0] == "training"]
    events = factory.instance.get_latest_materialization_events(ablations + stages) if ablations + stages else {}
    for key in stages:
        event = events.get(key)
        entry = event.asset_materialization.metadata.get("rollbacks") if event else None
        for r in entry.value if entry else []:
            print(f"{key.to_user_string():<{width}}  {'rollback':<7}  at step {r['step']} back to step {r['to_step']} "
                  f"({r.get('to', 'checkpoint')}), global samples [{r['skip_window'][0]}, {r['skip_window'][1]}) "
                  "left out")
    for key in ablations:
        event = events.get(key)
        entry = event.asset_materialization.metadata.get("verdict_text") if event else None
        for line in entry.value.splitlines() if entry else []:
            print(f"{key.to_user_string():<{width}}  {'verdict':<7}  {line}")
    if args.check and any(state != "fresh" for _, state, _ in rows):
        print(f"pretrain: not fresh: {', '.join(name for name, state, _ in rows if state != 'fresh')}", file=sys.stderr)
        return 1
    return 0


def _training_jobs() -> list[dict]:
    """Every training job started under $PRETRAIN_HOME/work/training (trainer/job/detach.py job_summary), newest first."""
    from assets.home import pretrain_home
    from trainer.job.detach import JOB_FILE, job_summary

    jobs = [job_summary(path.parent) for path in (pretrain_home() / "work" / "training").glob(f"*/*/{JOB_FILE}")]
    return sorted(jobs, key=lambda j: -j["started_at"])


def _jobs(args) -> int:
    """Every training job started under $PRETRAIN_HOME/work/training, newest first. Works without the Dagster
    webserver or instance: the jobs' own files say it all (trainer/job/detach.py job_summary)."""
    from assets.home import pretrain_home

    root = pretrain_home() / "work" / "training"
    jobs = _training_jobs()
    if args.json:
        for job in jobs:
            print(json.dumps(job))
        return 0
    if not jobs:
        print(f"no training job under {root}", file=sys.stderr)
        return 0
    print(f"{'stage':<12} {'state':<12} {'job':<22} {'step':>7} {'tokens':>13} {'loss':>8} {'ETA':>9} {'resumes':>7} "
          f"{'restarts':>8}  {'excluded':<16} started")
    for j in jobs:
        eta = time.strftime("%H:%M:%S", time.gmtime(j["eta_s"])) if j["eta_s"] is not None else "-"
        loss = f"{j['loss']:.4f}" if isinstance(j["loss"], float) else "-"
        where = f"slurm:{j['slurm_job_id']}" if j["slurm_job_id"] else f"{j['host']}:{j['pid']}"
        excluded = ",".join(j["excluded_nodes"]) or "-"
        print(f"{j['stage']:<12} {j['state']:<12} {where:<22} {j['step'] or '-':>7} {j['tokens'] or '-':>13} "
              f"{loss:>8} {eta:>9} {j['resumes']:>7} {len(j['restarts']):>8}  {excluded:<16} {time.ctime(j['started_at'])}")
    return 0


def _where(args) -> int:
    factory = Factory(args.recipe)
    store, outputs = factory.current_outputs(args.asset, args.source)
    if len(outputs) == 1:
        print(store.uri(outputs[0][1].prefix))
        print(json.dumps(outputs[0][1].manifest, indent=2))
        return 0
    # A crawl's asset, every dump: a line each; `where ASSET[DUMP]` prints one with its manifest.
    for dump, output in outputs:
        print(f"{dump}  {store.uri(output.prefix)}")
    return 0


def _docs(args) -> int:
    factory = Factory(args.recipe)
    store, outputs = factory.current_outputs(args.asset, args.source)
    remaining = args.limit
    out = sys.stdout
    for key in (key for _, output in outputs for key in output.files("")):  # a crawl's dumps in order
        # The kept documents' parts: part-* at the top, or under each source's folder (the deduplicated asset's).
        if not (key.endswith(".jsonl.gz") and key.rsplit("/", 1)[-1].startswith("part-")):
            continue
        with contextlib.closing(store.open_read(key)) as raw, gzip.open(raw) as lines:
            for line in io.TextIOWrapper(lines, encoding="utf-8"):
                if remaining is not None and remaining <= 0:
                    return 0
                out.write(line if line.endswith("\n") else line + "\n")
                if remaining is not None:
                    remaining -= 1
    return 0


def _lineage(args) -> int:
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


def _export(args) -> int:
    import tempfile
    from pathlib import Path

    from storage.objects import StoreError
    from trainer.checkpoint.store import CorruptCheckpoint

    with tempfile.TemporaryDirectory(prefix="pretrain-export-") as tmp:
        try:
            from trainer.evaluation.export import export_checkpoint

            step_folder, tokenizer = _checkpoint_and_tokenizer(args, Path(tmp))
            out = export_checkpoint(step_folder, args.out_dir, tokenizer=tokenizer)
        except (StoreError, ValueError, OSError, CorruptCheckpoint) as exc:  # ExportError is a ValueError
            raise UsageError(f"{args.checkpoint}: {exc}") from None
    print(out)
    return 0


def _eval(args) -> int:
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
            step_folder, tokenizer = _checkpoint_and_tokenizer(args, Path(tmp))
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


def _checkpoint_and_tokenizer(args, tmp) -> tuple:
    """(a local copy of the checkpoint step args.checkpoint names, args.tokenizer or the tokenizer its lineage names,
    downloaded from the store)."""
    from trainer.checkpoint.store import local_step

    step_folder = local_step(args.checkpoint, tmp / "steps")
    if args.tokenizer:
        return step_folder, args.tokenizer
    manifest = json.loads((step_folder / "manifest.json").read_text())
    return step_folder, _lineage_tokenizer(manifest, tmp)


def _lineage_tokenizer(manifest: dict, tmp):
    from assets.home import store_url
    from storage.factory import open_store

    entry = next((e for e in manifest.get("lineage") or [] if e.get("asset") == "tokenization/tokenizer"), None)
    if entry is None:
        raise ValueError("its lineage names no tokenizer output; give --tokenizer tokenizer.json")
    path = tmp / "tokenizer.json"
    open_store(store_url()).download(f"{entry['prefix']}/tokenizer.json", path)
    return path


def _plan(args) -> int:
    # Arithmetic: no Dagster instance, but for --budget's scaling fit. A layout that will not fit warns but is no
    # error (exit 0).
    from assets.recipe import RecipeError, load_recipe
    from trainer.planner import plan as planner

    try:
        if args.fit is not None and args.budget is None:
            raise UsageError("--fit: goes with --budget (the compute-optimal N and D by that fit)")
        if args.budget is not None:
            flops = planner.parse_tokens(args.budget)
            fit, source, no_fit = _scaling_fit(args)
            planner.budget_report(flops, fit, fit_source=source, no_fit=no_fit, out=sys.stdout)
            return 0
        if args.params is not None:
            params = [planner.parse_tokens(p) for p in args.params.split(",")]
            budgets = [planner.parse_tokens(t) for t in (args.tokens or "").split(",") if t.strip()]
            if len(budgets) != len(params):
                raise UsageError(f"--tokens: give one token count per --params entry ({len(params)}), comma-separated")
            planner.cost_table(list(zip(params, budgets)), flops_per_s=args.tflops * 1e12, price_per_gpu_hour=args.price,
                               out=sys.stdout)
            return 0
        stage_options: dict = {}
        if args.model:
            name, shape, tokens = planner.load_stage(args.model, seq_len=args.seq_len)
            if args.tokens is not None:
                tokens = planner.parse_tokens(args.tokens)
            if tokens is None:
                raise UsageError("--tokens: required unless --model is a run config with train_tokens (e.g. --tokens 2e12)")
            stages = [(name, shape, tokens)]
        else:
            recipe = load_recipe(args.recipe)
            stages, stage_options = _training_stages(recipe)
            if not stages:
                raise UsageError(f"recipe {recipe.name!r} has no training section; give --model JSON_OR_PATH and --tokens N")
        if (args.checkpoint_minutes is None) != (args.mtbf_hours is None):
            raise UsageError("--checkpoint-minutes and --mtbf-hours go together (Young's interval needs both)")
        layout = planner.Layout(tp=args.tp, pp=args.pp, dp=args.dp, zero=args.zero, micro_batches=args.micro_batches)
        chosen = {"micro_batch": args.micro_batch, "recompute": args.recompute, "sequence_parallel": args.sequence_parallel}
        planner.report(
            stages, layout=layout, device=args.device, mfu=args.mfu, out=sys.stdout, err=sys.stderr,
            checkpoint_seconds=None if args.checkpoint_minutes is None else args.checkpoint_minutes * 60,
            mtbf_seconds=None if args.mtbf_hours is None else args.mtbf_hours * 3600,
            stage_options=stage_options, price_per_gpu_hour=args.price, attention=not args.no_attention,
            **{k: v for k, v in chosen.items() if v is not None},
        )
    except (RecipeError, UsageError):
        raise
    except ValueError as exc:  # the planner's messages name the field
        raise UsageError(str(exc)) from None
    return 0


def _scaling_fit(args) -> tuple:
    """(fit, where it came from, why there is none) for `plan --budget`: --fit's file or folder, else the latest
    scaling/fit output of the recipe's ladder in this instance, else none (the recipe has no ladder, or its fit
    was never materialized)."""
    from assets.recipe import load_recipe, recipe_path
    from assets.scaling.section import FIT_FILE, fit_key
    from storage.factory import open_store
    from storage.objects import ObjectNotFoundError
    from trainer.planner.scaling_law import ScalingFit

    if args.fit is not None:
        uri = args.fit.rstrip("/")
        parent, name = uri.rpartition("/")[::2] if uri.endswith(".json") else (uri, FIT_FILE)
        try:
            data = open_store(parent or ".").get_bytes(name)
        except ObjectNotFoundError:
            raise UsageError(f"--fit: no {name} at {parent or '.'} (give a fit.json or the scaling/fit output "
                             "folder)") from None
        source = f"{parent}/{name}" if parent else name
    else:
        if args.recipe is None and not recipe_path(None).is_file():  # outside a checkout: a budget needs no recipe
            return None, "", f"no recipe at {recipe_path(None)}; give --fit PATH_OR_URI"
        recipe = load_recipe(args.recipe)
        if recipe.scaling is None:
            return None, "", f"recipe {recipe.name!r} has no scaling section; give --fit PATH_OR_URI"
        factory = Factory(args.recipe)
        try:
            store, [(_, output)] = factory.current_outputs(fit_key().to_user_string(), None)
        except UsageError as exc:  # never materialized
            return None, "", str(exc)
        source = store.uri(f"{output.prefix}/{FIT_FILE}")
        data = store.get_bytes(f"{output.prefix}/{FIT_FILE}")
    try:
        return ScalingFit.from_json(json.loads(data), source=source), source, ""
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source}: not valid JSON ({exc})") from None


def _training_stages(recipe) -> tuple[list[tuple], dict[str, dict]]:
    """([(stage name, ModelShape, tokens)], {stage name: its micro-batch and recomputation}) of the recipe's
    training stages, for `pretrain plan`."""
    from trainer.planner.plan import ModelShape

    if recipe.training is None:
        return [], {}
    configs = recipe.training.run_configs()
    stages = [(name, ModelShape.from_model_config(cfg.model, seq_len=cfg.batch.seq_len), float(cfg.train_tokens))
              for name, cfg in configs]
    return stages, {name: {"micro_batch": cfg.batch.micro_batch, "recompute": cfg.model.activation_checkpointing,
                           "sequence_parallel": cfg.batch.sequence_parallel} for name, cfg in configs}


if __name__ == "__main__":
    sys.exit(main())
