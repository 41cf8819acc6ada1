"""Orchestration cost at many sources: `pretrain status`, the load of the code location and the planning of
`pretrain materialize --stale`, each beside Dagster's floor (issue 33).

    .venv/bin/python bench/orchestration.py [--sizes 100,1000] [--rounds 2] [--smoke]

The recipes: N copies of the demo's c4 source (c4_0 ... c4_<N-1>) with the demo's global stages (dedup,
decontamination, the tokenizer, the mix sweep over the N sources, the main training stage and its evaluation); the
quality classifier, the ablation and the later training stages, which name the demo's other sources, are left out.
Each size gets a fresh PRETRAIN_HOME, and nothing is materialized: every asset's state is computed all the same.

Each figure is one new process, start to exit, as a user waits for it (interpreter, imports, recipe, definitions,
instance, queries):
    status   `python -m assets.cli status`, its second run (the first, printed too, also records an observation
             of each source's inputs: what a fresh home costs once)
    load     the code location as the UI and the daemon load it: assets.definitions:defs through Dagster's
             InProcessCodeLocation (the definitions, then the snapshot it serves)
    plan     `materialize --stale` up to its first run: the Factory (recipe, definitions, instance), the selection
             and the first round (Factory.stale_round)
Dagster's floor is a bare graph of as many plain @asset definitions, with the same keys and dependencies (the
observed inputs as observable source assets), built and queried the same way: its status builds it, opens the
instance and computes every state with assets/core/states.py (one batch of records, one of observations, Dagster's
resolver); its load is the same InProcessCodeLocation; its plan is its status and the same pass over the graph.
Ours and the floor run in turns, best of --rounds, so a shared machine's load falls on both; CPU seconds are
printed beside the wall seconds. Then the definitions alone, built in this process: CPU milliseconds per asset, ours
(a second build, so without the code digests' parsing, printed apart: once a process) and the floor's, and so how
much of the definitions' cost is ours.

Targets: each figure <= 5 s at 1,000 sources and <= 2 s at 100 on 2 cores, or <= 1.5x the floor where the floor
is above 3 s; the first status too (measured once, before the rounds), against the floor's status. The last line is `ratio: X.XX` = our `pretrain status` seconds / the floor's, at the largest size
(1,000; 10 with --smoke, one round, whose figures mean nothing: it checks that the bench runs).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Not bench/ itself on the path: a bench script named like a stdlib module (bench/tokenize.py) would shadow it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))
SMOKE_SOURCES = 10

# Dagster's floor: the same keys and dependencies, plain definitions (written next to the shape, loaded by path).
FLOOR_MODULE = '''"""Dagster's floor for bench/orchestration.py: plain @asset definitions, the shape in $ORCH_SHAPE."""
import json
import os
import warnings

from dagster import AssetKey, BetaWarning, DataVersion, Definitions, asset, observable_source_asset

warnings.filterwarnings("ignore", category=BetaWarning)  # as assets/curation/raw_crawl.py: not one a source


def _plain(key, deps):
    @asset(key=key, deps=deps)
    def _asset():
        return None

    return _asset


def _observed(key):
    @observable_source_asset(key=key)
    def _source():
        return DataVersion("0")

    return _source


def build():
    shape = json.loads(open(os.environ["ORCH_SHAPE"]).read())
    return Definitions(assets=[
        _observed(AssetKey.from_user_string(name)) if node["observed"]
        else _plain(AssetKey.from_user_string(name), [AssetKey.from_user_string(d) for d in node["deps"]])
        for name, node in shape.items()])


defs = build()
'''


def write_recipe(sources: int, path: Path) -> Path:
    import yaml

    from assets.recipe import DEMO_RECIPE

    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    c4 = next(s for s in raw["sources"] if s["name"] == "c4")
    raw["sources"] = [{**c4, "name": f"c4_{i}"} for i in range(sources)]
    for section in ("quality_classifier", "ablation"):
        raw.pop(section, None)
    raw["mixing"]["prior"] = {f"c4_{i}": 1.0 / sources for i in range(sources)}
    raw["training"] = {"main": raw["training"]["main"]}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def graph_shape(graph) -> dict:
    """{asset key: {"deps": [...], "observed": bool}} of every asset of `graph`: what the floor rebuilds."""
    return {key.to_user_string(): {"deps": sorted(k.to_user_string() for k in graph.get(key).parent_keys),
                                   "observed": not graph.get(key).is_materializable}
            for key in graph.get_all_asset_keys()}


def timed(args: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one process, start to exit; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def child(kind: str, target: str) -> None:
    """One measured process (run by the parent as `--child KIND TARGET`)."""
    if kind in ("load-ours", "load-floor"):
        from dagster import DagsterInstance
        from dagster._core.remote_origin import InProcessCodeLocationOrigin
        from dagster._core.remote_representation.code_location import InProcessCodeLocation
        from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

        origin = (LoadableTargetOrigin(module_name="assets.definitions", attribute="defs", working_directory=str(REPO))
                  if kind == "load-ours" else LoadableTargetOrigin(python_file=target, attribute="defs"))
        with DagsterInstance.ephemeral() as instance:
            location = InProcessCodeLocation(InProcessCodeLocationOrigin(origin), instance=instance)
            assert location.get_repositories(), "the code location has no repository"
    elif kind == "plan-ours":
        from assets.cli.factory import Factory
        from assets.core.startup import own_process

        own_process()  # as `pretrain materialize`'s main does: the process is the command's
        factory = Factory(target)
        factory.stale_round(set(factory.select(None)))
    elif kind in ("status-floor", "plan-floor"):
        import importlib.util

        from dagster import DagsterInstance

        from assets.core.states import asset_states

        spec = importlib.util.spec_from_file_location("floor_defs", target)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        graph = module.defs.resolve_asset_graph()
        keys = sorted((k for k in graph.get_all_asset_keys() if graph.get(k).is_materializable),
                      key=lambda k: k.to_user_string())
        rows = asset_states(DagsterInstance.get(), graph, keys)
        if kind == "plan-floor":
            pending = {key for key, state, _ in rows if state != "fresh"}
            waiting: set = set()
            for key in graph.toposorted_asset_keys:
                if any(parent != key and (parent in pending or parent in waiting)
                       for parent in graph.get(key).parent_keys):
                    waiting.add(key)
    else:
        sys.exit(f"unknown child {kind!r}")


def measure(sources: int, rounds: int, work: Path) -> dict:
    """Our figures and the floor's at `sources` sources: {name: (wall, cpu)}, best wall of `rounds` runs each."""
    from dagster import DagsterInstance  # noqa: F401  (imported before the timed build below, as in a process)

    from assets.definitions import build_defs
    from assets.home import dagster_yaml
    from assets.recipe import load_recipe

    folder = work / f"n{sources}"
    folder.mkdir()
    recipe = write_recipe(sources, folder / "recipe.yaml")
    home, floor_home = folder / "home", folder / "floor-dagster"
    floor_home.mkdir()
    (floor_home / "dagster.yaml").write_text(dagster_yaml())

    # The definitions alone, in this process: ours, then the floor's of the same shape.
    loaded = load_recipe(recipe)
    start = time.process_time()
    ours = build_defs(loaded)
    first_cpu = time.process_time() - start
    start = time.process_time()
    ours = build_defs(loaded)  # again: what each asset costs, without the code digests' parsing (once a process)
    ours_cpu = time.process_time() - start
    graph = ours.resolve_asset_graph()
    shape = folder / "shape.json"
    shape.write_text(json.dumps(graph_shape(graph)))
    floor_file = folder / "floor_defs.py"
    floor_file.write_text(FLOOR_MODULE)
    os.environ["ORCH_SHAPE"] = str(shape)
    start = time.process_time()
    import importlib.util

    spec = importlib.util.spec_from_file_location("floor_defs", floor_file)
    floor_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor_module)
    floor_cpu = time.process_time() - start
    assets = len(graph.get_all_asset_keys())

    # Without PYTHONDONTWRITEBYTECODE (our machines set it; `make` unsets it): a user's Python caches bytecode, and
    # compiling every module again in each process added about 1 s to each side of every figure.
    base = {k: v for k, v in os.environ.items()
            if k not in ("DAGSTER_HOME", "PRETRAIN_RECIPE", "PRETRAIN_STORE", "PYTHONDONTWRITEBYTECODE")}
    ours_env = {**base, "PRETRAIN_HOME": str(home)}
    floor_env = {**base, "DAGSTER_HOME": str(floor_home), "ORCH_SHAPE": str(shape)}
    me = [sys.executable, str(Path(__file__).relative_to(REPO)), "--child"]
    runs = {
        "status": ([sys.executable, "-m", "assets.cli", "status", "--recipe", str(recipe)], ours_env,
                   me + ["status-floor", str(floor_file)], floor_env),
        "load": (me + ["load-ours", "-"], {**ours_env, "PRETRAIN_RECIPE": str(recipe)},
                 me + ["load-floor", str(floor_file)], floor_env),
        "plan": (me + ["plan-ours", str(recipe)], ours_env, me + ["plan-floor", str(floor_file)], floor_env),
    }
    if sources <= SMOKE_SOURCES:
        del runs["plan"]  # --smoke: within 20 s (the plan is the status and one pass over the graph)
    # A fresh home: the first status records every source's inputs observation (once); the figures are later runs.
    # (--smoke: its one round is that first run.)
    first = timed(runs["status"][0], ours_env) if rounds > 1 or sources > SMOKE_SOURCES else None
    figures: dict = {}
    for _ in range(rounds):
        for name, (ours_args, env, floor_args, fenv) in runs.items():
            for label, args, environment in (("ours", ours_args, env), ("floor", floor_args, fenv)):
                wall, cpu = timed(args, environment)
                best = figures.get((name, label))
                if best is None or wall < best[0]:
                    figures[(name, label)] = (wall, cpu)
    return {"assets": assets, "first_status": first, "figures": figures, "parsing": first_cpu - ours_cpu,
            "defs_ms": (1000 * ours_cpu / assets, 1000 * floor_cpu / assets)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000", help="source counts, comma-separated (default 100,1000)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each figure, the best kept (default 2)")
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_SOURCES} sources, one round: the bench runs")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "TARGET"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    sizes = [SMOKE_SOURCES] if args.smoke else [int(s) for s in args.sizes.split(",")]
    rounds = 1 if args.smoke else args.rounds
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; best of {rounds} round(s)")
    print(f"{'sources':>7} {'assets':>6}  {'figure':<7} {'ours s':>7} {'(cpu)':>7}  {'floor s':>7} {'(cpu)':>7}  "
          f"{'ours/floor':>10}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-orchestration-") as tmp:
        for sources in sizes:
            result = measure(sources, rounds, Path(tmp))
            results[sources] = result
            for name in (n for n in ("status", "load", "plan") if (n, "ours") in result["figures"]):
                (wall, cpu), (fwall, fcpu) = result["figures"][(name, "ours")], result["figures"][(name, "floor")]
                print(f"{sources:>7} {result['assets']:>6}  {name:<7} {wall:>7.2f} {cpu:>7.2f}  {fwall:>7.2f} "
                      f"{fcpu:>7.2f}  {wall / fwall:>10.2f}")
            if result["first_status"]:
                wall, cpu = result["first_status"]
                fwall = result["figures"][("status", "floor")][0]
                print(f"{sources:>7} {'':>6}  first `pretrain status` on a fresh home (an observation per source, "
                      f"recorded in one batch): {wall:.2f} s ({cpu:.2f} s CPU), {wall / fwall:.2f}x the floor's status")
            ours_ms, floor_ms = result["defs_ms"]
            # The code digests are parsed once a process: by the first size's first build.
            parsing = (f"; once a process, the code digests' parsing: {result['parsing']:.2f} s"
                       if len(results) == 1 else "")
            print(f"{sources:>7} {'':>6}  definitions: {ours_ms:.2f} ms CPU per asset, the floor's {floor_ms:.2f} "
                  f"(ours beyond Dagster's plain @asset: {ours_ms - floor_ms:.2f} ms, {1 - floor_ms / ours_ms:.0%})"
                  f"{parsing}")
            sys.stdout.flush()
    largest = results[max(results)]
    wall, fwall = largest["figures"][("status", "ours")][0], largest["figures"][("status", "floor")][0]
    print(f"ratio: {wall / fwall:.2f}")


if __name__ == "__main__":
    main()
