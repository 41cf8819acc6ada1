"""What every `pretrain` command needs: the recipe in force, its Definitions and the persistent Dagster instance
(Factory), and the error a command line that names something missing raises (UsageError)."""

from __future__ import annotations

import fnmatch
import sys

from assets.core.startup import built_to_keep
from assets.home import ensure_dagster_home


class UsageError(ValueError):
    """A command line that names something that does not exist."""


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
