"""Filter-stage throughput: the `filtered` asset (Dagster run, store download, executor resource, commit) against
the same datatrove steps run bare (LocalPipelineExecutor on the same local parts), in the same run.

    .venv/bin/python bench/curation.py [--source web] [--smoke]

Uses the demo recipe's settings for the source (in a private PRETRAIN_HOME), cut to that source and the ones its
filter reads (the classifier's negatives): the sections about the other sources (dedup, decontamination, mixing,
training, evaluation) go, as the recipe validator refuses a mixing prior or anneal weights naming a dropped
source. Both sides are warmed up first (spaCy and the models load once per process), then run interleaved,
best of three. `--smoke` runs the same paths on the first 20 pages of each WARC input, once, with a reference
model of 16 steps: it checks that the bench works (a few seconds of filtering), its figures mean nothing. The executor is `local`
with one worker, so both sides run entirely in this process and their CPU time is comparable even on a
shared machine where wall time swings (measured: the same bare run took 23 to 45 s as other jobs came and
went). Prints wall and CPU documents/s of each, then `ratio: X.XX` = asset / bare documents per CPU second
(target >= 0.9: the Dagster layer adds almost nothing).

The demo's web rules include the perplexity step (curation/reference_lm is trained first, ~20 s), so both sides
run the whole filter stack. Before the ratio it prints perplexity scoring in tokens/s per core (the filter's
ReferenceModel.perplexities on the source's documents, tokenization included, one thread) beside the trainer's
evaluation forward pass at the same model size (CausalLM's forward and loss under no_grad on full windows of the
same token count, one thread), with their quotient (target >= 0.8).
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
SMOKE_PAGES = 20  # --smoke: records kept of each WARC input


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="web", help="demo source to filter (default web: the prose rules)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"the first {SMOKE_PAGES} pages of each WARC input, one round: the bench runs, no figure")
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
    # Only the filter stage and its inputs are measured; these sections name sources that were just dropped
    # (the validator refuses a mixing prior or anneal weights naming an unknown source) or add assets.
    for key in ("dedup", "decontamination", "mixing", "training", "evaluation", "ablation"):
        raw.pop(key, None)
    try:
        if args.smoke:
            for source in raw["sources"]:
                source["inputs"] = smoke_inputs(source, Path(raw["base_dir"]), home / "smoke-inputs")
            if raw.get("reference"):  # a reference model of 16 steps, not 128: it scores, its figures mean nothing
                raw["reference"]["train_tokens"] = 16 * raw["reference"].get("global_batch", 16) * \
                    raw["reference"].get("seq_len", 64)
        recipe_path = home / "recipe.yaml"
        recipe_path.write_text(yaml.safe_dump(raw, sort_keys=False))
        run(recipe_path, args.source, home, rounds=1 if args.smoke else 3)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def smoke_inputs(source: dict, base_dir: Path, out: Path) -> list[str]:
    """The source's WARC inputs cut to their first SMOKE_PAGES records (absolute paths, for the recipe)."""
    from pipelines.inputs import expand_inputs

    if source["format"] not in ("warc", "wet"):
        raise SystemExit(f"bench/curation.py --smoke: source {source['name']!r} is {source['format']}; "
                         "--smoke cuts WARC/WET inputs only")
    return [cut_warc(Path(path), out / source["name"] / Path(path).name)
            for path in expand_inputs(source["inputs"], base_dir)]


def cut_warc(path: Path, cut: Path, pages: int = SMOKE_PAGES) -> str:
    """The WARC's first `pages` records written to `cut` (its path returned): with one gzip member per record (the
    WARC norm), the bytes before a record are a valid WARC. bench/filters.py's --smoke cuts its inputs here too."""
    from warcio.archiveiterator import ArchiveIterator

    with open(path, "rb") as f:
        records, end = ArchiveIterator(f), None
        for i, _ in enumerate(records):
            if i == pages:
                end = records.get_record_offset()
                break
        f.seek(0)
        head = f.read(end if end is not None else -1)
    cut.parent.mkdir(parents=True, exist_ok=True)
    cut.write_bytes(head)
    return str(cut)


def run(recipe_path: Path, name: str, home: Path, rounds: int) -> None:
    from dagster import AssetKey
    from datatrove.executor import LocalPipelineExecutor

    from assets.cli.factory import Factory
    from assets.core.upstream import latest_output
    from assets.curation.filtered import filtered_key, resolved_filter
    from assets.curation.quality_classifier import CLASSIFIER_KEY, MODEL_FILE
    from assets.curation.reference_lm import REFERENCE_KEY
    from pipelines.filters.pipeline import filter_counts, filter_pipeline

    factory = Factory(str(recipe_path))
    source = factory.recipe.source(name)
    config, _ = resolved_filter(factory.recipe, source)  # exactly the settings the asset runs
    upstream = [k for k in factory.keys if k.path[-1] in ("raw_crawl", "quality_classifier", "reference_lm")]
    assert factory.materialize(upstream), "materializing the inputs failed"
    store = factory.defs.resources["store"].open()

    # The same input for both sides: the raw parts and the classifier model, as local files.
    data = home / "bench"
    raw_out = latest_output(factory.instance, store, AssetKey(["curation", name, "raw_crawl"]))
    raw_out.download(store, data / "input")
    model = None
    if source.filter.quality_model:
        model = latest_output(factory.instance, store, CLASSIFIER_KEY).download(store, data / "model", pattern_prefix=MODEL_FILE)[0]
    reference = None
    if source.filter.perplexity:
        reference = data / "reference"
        latest_output(factory.instance, store, REFERENCE_KEY).download(store, reference, pattern_prefix="")

    def bare(tag: str, limit: int = -1) -> tuple[int, float, float]:
        steps = filter_pipeline(config, input_dir=data / "input", output_dir=data / f"out-{tag}",
                                lists_root=Path("/"), model_path=model, reference_dir=reference)
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
    for i in range(rounds):  # interleaved, so drifting load on a shared machine hits both alike
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
    if reference is not None:
        perplexity_throughput(reference, data / "input", source.filter.perplexity.max_tokens)
    print(f"ratio: {cpu_rates['asset'] / cpu_rates['bare']:.2f}")


def perplexity_throughput(reference: Path, parts: Path, max_tokens: int) -> None:
    """Tokens/s per core of perplexity scoring and of the trainer's evaluation forward pass, same model, one thread."""
    import torch

    from pipelines.filters.perplexity import ReferenceModel
    from pipelines.shards import iter_documents
    from trainer.model.transformer import CausalLM

    torch.set_num_threads(1)
    model = ReferenceModel(reference, device="cpu")
    texts = [doc["text"] for part in sorted(parts.glob("part-*.jsonl.gz")) for doc in iter_documents(part)]
    tokens = sum(min(len(e.ids), max_tokens) for e in model.tokenizer.encode_batch_fast(texts))
    model.perplexities(texts[:20], max_tokens)  # warm-up
    started = time.perf_counter()
    model.perplexities(texts, max_tokens)
    scoring = tokens / (time.perf_counter() - started)
    # The trainer's evaluation step: CausalLM (model and loss) on (batch, seq_len) windows, gradients off.
    lm = CausalLM(model.model.cfg).eval()
    T, batch = model.seq_len, 64
    ids = torch.randint(0, model.model.cfg.vocab_size, (batch, T + 1))
    steps = max(1, tokens // (batch * T))
    with torch.no_grad():
        lm(ids[:, :-1], ids[:, 1:])  # warm-up
        started = time.perf_counter()
        for _ in range(steps):
            lm(ids[:, :-1], ids[:, 1:])
    forward = steps * batch * T / (time.perf_counter() - started)
    print(f"perplexity scoring: {scoring:,.0f} tokens/s per core ({len(texts)} documents, {tokens:,} tokens); "
          f"the trainer's evaluation forward pass at the same size: {forward:,.0f} tokens/s per core; "
          f"scoring / forward: {scoring / forward:.2f} (target >= 0.8)")


if __name__ == "__main__":  # LocalPipelineExecutor's forkserver workers re-import this module
    main()
