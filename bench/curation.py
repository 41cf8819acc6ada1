"""Filter-stage throughput: the `filtered` asset (Dagster run, store download, executor resource, commit) against
the same datatrove steps run bare (LocalPipelineExecutor on the same local parts), in the same run.

    .venv/bin/python bench/curation.py [--source web] [--limit N]

Uses the demo recipe's settings for the source (in a private PRETRAIN_HOME). Both sides are warmed up first
(spaCy and the models load once per process), then run interleaved, best of three. The executor is `local`
with one worker, so both sides run entirely in this process and their CPU time is comparable even on a
shared machine where wall time swings (measured: the same bare run took 23 to 45 s as other jobs came and
went). Prints wall and CPU documents/s of each, then `ratio: X.XX` = asset / bare documents per CPU second
(target >= 0.9: the Dagster layer adds almost nothing).
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Not bench/ itself on the path: a bench script named like a stdlib module (bench/tokenize.py) would shadow it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="web", help="demo source to filter (default web: the prose rules)")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="bench-curation-"))
    os.environ.update(PRETRAIN_HOME=str(home), DAGSTER_HOME=str(home / "dagster"), HF_HUB_OFFLINE="1")
    os.environ.pop("PRETRAIN_STORE", None)
    import yaml

    from assets.recipe import DEMO_RECIPE

    # The demo recipe, cut to the source and what its filter reads (the classifier's negative sources).
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    needed = {args.source} | set((raw.get("quality_classifier") or {}).get("negative_sources", []))
    raw["sources"] = [s for s in raw["sources"] if s["name"] in needed]
    for key in ("dedup", "decontamination"):
        raw.pop(key, None)
    recipe_path = home / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    try:
        run(recipe_path, args.source, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run(recipe_path: Path, name: str, home: Path) -> None:
    from dagster import AssetKey
    from datatrove.executor import LocalPipelineExecutor

    from assets.cli import Factory
    from assets.filtered import CLASSIFIER_KEY, MODEL_FILE, filtered_key, resolved_filter
    from assets.upstream import latest_output
    from pipelines.filters import filter_counts, filter_pipeline

    factory = Factory(str(recipe_path))
    source = factory.recipe.source(name)
    config, _ = resolved_filter(factory.recipe, source)  # exactly the settings the asset runs
    upstream = [k for k in factory.keys if k.path[-1] in ("raw_crawl", "quality_classifier")]
    assert factory.materialize(upstream), "materializing the inputs failed"
    store = factory.defs.resources["store"].open()

    # The same input for both sides: the raw parts and the classifier model, as local files.
    data = home / "bench"
    raw_out = latest_output(factory.instance, store, AssetKey(["curation", name, "raw_crawl"]))
    raw_out.download(store, data / "input")
    model = None
    if source.filter.quality_model:
        model = latest_output(factory.instance, store, CLASSIFIER_KEY).download(store, data / "model", pattern_prefix=MODEL_FILE)[0]

    def bare(tag: str, limit: int = -1) -> tuple[int, float, float]:
        steps = filter_pipeline(config, input_dir=data / "input", output_dir=data / f"out-{tag}",
                                lists_root=Path("/"), model_path=model)
        steps[0].limit = limit
        wall, cpu = time.perf_counter(), time.process_time()
        LocalPipelineExecutor(steps, tasks=1, workers=1, logging_dir=str(data / f"logs-{tag}"), skip_completed=False).run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return filter_counts(data / f"logs-{tag}")["in"], wall, cpu

    def asset() -> tuple[int, float, float]:
        key = filtered_key(name)
        wall, cpu = time.perf_counter(), time.process_time()
        assert factory.materialize([key]), "materializing the filtered asset failed"
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        out = latest_output(factory.instance, store, key)
        # Outputs are immutable and reused: drop this one so the next measurement computes again.
        shutil.rmtree(home / "store" / out.prefix)
        return out.manifest["counts"]["in"], wall, cpu

    bare("warmup", limit=50)
    asset()  # the first materialization also imports great-expectations for the asset check
    results = {"bare": [], "asset": []}
    for i in range(3):  # interleaved, so drifting load on a shared machine hits both alike
        results["bare"].append(bare(f"run{i}"))
        results["asset"].append(asset())
    cpu_rates = {}
    for side, runs in results.items():
        docs = runs[0][0]
        wall = min(r[1] for r in runs)
        cpu = min(r[2] for r in runs)
        cpu_rates[side] = docs / cpu
        print(f"{side:>5}: {docs} documents of {name}, best of {len(runs)}: wall {wall:.2f} s = {docs / wall:.1f} "
              f"documents/s; CPU {cpu:.2f} s = {cpu_rates[side]:.1f} documents per CPU second")
    print(f"ratio: {cpu_rates['asset'] / cpu_rates['bare']:.2f}")


if __name__ == "__main__":  # LocalPipelineExecutor's forkserver workers re-import this module
    main()
