"""`pretrain`: materialize, inspect and read the factory's assets from a terminal.

    pretrain materialize [--recipe R] [--select SEL] [--stale]
    pretrain status      [--recipe R]
    pretrain where ASSET [--recipe R] [--source S]
    pretrain docs ASSET  [--recipe R] [--source S] [--limit N]

ASSET is an asset key path (`curation/web/raw_crawl`) or, with --source, the stage name (`raw_crawl`).
SEL is a comma-separated list of asset key paths or fnmatch patterns (`curation/*/raw_crawl`).
Runs go to the persistent Dagster instance under PRETRAIN_HOME, so `make ui` shows them.
Errors go to stderr with a non-zero exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import gzip
import io
import json
import sys

from assets.home import ensure_dagster_home
from assets.recipe import RecipeError, load_recipe


class UsageError(ValueError):
    """A command line that names something that does not exist."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.command(args)
    except (RecipeError, UsageError) as exc:
        print(f"pretrain: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `pretrain docs … | head` closed the pipe: not an error
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pretrain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    def add(name: str, func, help_: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_)
        cmd.add_argument("--recipe", help="recipe YAML (default: $PRETRAIN_RECIPE, else recipes/demo.yaml)")
        cmd.set_defaults(command=func)
        return cmd

    cmd = add("materialize", _materialize, "materialize assets into the store and the Dagster instance")
    cmd.add_argument("--select", help="comma-separated asset keys or patterns (default: all)")
    cmd.add_argument("--stale", action="store_true", help="only what is stale or missing, looping until nothing is")

    add("status", _status, "each asset: fresh, stale or missing, with the cause")

    for name, func, help_ in (("where", _where, "an asset's current output URI, then its manifest"), ("docs", _docs, "stream an asset's documents as JSONL")):
        cmd = add(name, func, help_)
        cmd.add_argument("asset", help="asset key path, or a stage name with --source")
        cmd.add_argument("--source", help="source name, when ASSET is a stage name")
        if name == "docs":
            cmd.add_argument("--limit", type=int, default=None, help="stop after N documents")
    return parser


class Factory:
    """The recipe in force, its Definitions and the persistent instance: what every command needs."""

    def __init__(self, recipe_arg: str | None):
        self.recipe = load_recipe(recipe_arg)  # validated before Dagster is even imported
        ensure_dagster_home()
        from dagster import DagsterInstance

        from assets.definitions import build_defs

        self.defs = build_defs(self.recipe)
        self.instance = DagsterInstance.get()
        self.keys = sorted(self.defs.resolve_all_asset_keys(), key=lambda k: k.to_user_string())

    def statuses(self) -> list[tuple]:
        """[(key, "fresh" | "stale" | "missing", cause)] for every asset, in key order."""
        from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
        from dagster._core.definitions.data_version import CachingStaleStatusResolver
        from dagster._time import get_current_datetime

        graph = self.defs.resolve_asset_graph()
        view = AssetGraphView(
            temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
            instance=self.instance,
            asset_graph=graph,
        )
        resolver = CachingStaleStatusResolver(instance=self.instance, asset_graph=graph, loading_context=view)
        rows = []
        for key in self.keys:
            state = resolver.get_status(key).value.lower()
            if state == "missing":
                cause = "never materialized"
            elif state == "stale":
                cause = "; ".join(sorted({_describe_cause(c) for c in resolver.get_stale_root_causes(key)}))
            else:
                cause = "-"
            rows.append((key, state, cause))
        return rows

    def select(self, selection: str | None) -> list:
        if not selection:
            return list(self.keys)
        chosen = []
        for pattern in (p.strip() for p in selection.split(",") if p.strip()):
            matches = [k for k in self.keys if fnmatch.fnmatchcase(k.to_user_string(), pattern)]
            if not matches:
                raise UsageError(f"--select {pattern!r} matches no asset; assets are: {', '.join(k.to_user_string() for k in self.keys)}")
            chosen += [k for k in matches if k not in chosen]
        return chosen

    def materialize(self, keys: list) -> bool:
        job = self.defs.resolve_implicit_global_asset_job_def()
        result = job.execute_in_process(instance=self.instance, asset_selection=keys, raise_on_error=False)
        return result.success

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

    def current_output(self, key):
        """The asset's latest committed output in this instance and its store."""
        from assets.upstream import OutputNotFound, latest_output

        store = self.defs.resources["store"].open()
        try:
            return store, latest_output(self.instance, store, key)
        except OutputNotFound as exc:
            raise UsageError(str(exc)) from None


def _describe_cause(cause) -> str:
    reason = cause.reason
    if cause.dependency is not None:
        reason += f" ({cause.dependency.asset_key.to_user_string()})"
    return reason


def _materialize(args) -> int:
    factory = Factory(args.recipe)
    if not args.stale:
        keys = factory.select(args.select)
        print(f"materializing {len(keys)} asset(s) of recipe {factory.recipe.name!r}", file=sys.stderr)
        return 0 if factory.materialize(keys) else 1

    # Dagster shows staleness one step at a time (a child turns stale only after its parent is
    # re-materialized), so loop until nothing in the selection is stale or missing.
    wanted = set(factory.select(args.select))
    done: list = []
    for _ in range(len(factory.keys) + 1):
        todo = [key for key, state, _ in factory.statuses() if state != "fresh" and key in wanted]
        if not todo:
            break
        if any(key in done for key in todo):
            print(f"pretrain: still stale after materializing: {', '.join(k.to_user_string() for k in todo)}", file=sys.stderr)
            return 1
        print(f"materializing {len(todo)} stale or missing asset(s): {', '.join(k.to_user_string() for k in todo)}", file=sys.stderr)
        if not factory.materialize(todo):
            return 1
        done += todo
    if not done:
        print("nothing is stale", file=sys.stderr)
    return 0


def _status(args) -> int:
    factory = Factory(args.recipe)
    rows = [(key.to_user_string(), state, cause) for key, state, cause in factory.statuses()]
    width = max(len(row[0]) for row in rows)
    for name, state, cause in rows:
        print(f"{name:<{width}}  {state:<7}  {cause}")
    return 0


def _where(args) -> int:
    factory = Factory(args.recipe)
    store, output = factory.current_output(factory.resolve(args.asset, args.source))
    print(store.uri(output.prefix))
    print(json.dumps(output.manifest, indent=2))
    return 0


def _docs(args) -> int:
    factory = Factory(args.recipe)
    store, output = factory.current_output(factory.resolve(args.asset, args.source))
    remaining = args.limit
    out = sys.stdout
    for key in output.files():
        if not key.endswith(".jsonl.gz"):
            continue
        with contextlib.closing(store.open_read(key)) as raw, gzip.open(raw) as lines:
            for line in io.TextIOWrapper(lines, encoding="utf-8"):
                if remaining is not None and remaining <= 0:
                    return 0
                out.write(line if line.endswith("\n") else line + "\n")
                if remaining is not None:
                    remaining -= 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
