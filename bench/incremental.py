"""Incremental dedup: adding a dump to a deduplicated crawl against deduplicating that dump alone.

    .venv/bin/python bench/incremental.py [--docs-per-dump 10000] [--workers 1] [--repeats 3] [--seed 0] [--smoke]

The corpus: k + 1 = 4 dumps of documents made from real text in ../shared/data (DCLM and C4/Dolma web pages,
WikiText-2 validation articles, NLTK webtext), each document two windows of 150-250 words cut at random from two
texts, so the documents are distinct pages of real prose; then copies as a crawl has them: every dump after the
first holds near copies (a few words edited, a line appended) of 8% of the documents of the dumps before it and
exact copies of 3%, and every dump near copies of 3% of its own documents. Two sources (crawl, news), two shards
each per dump.
Setup (untimed): dumps 1..3 deduplicated one after another by deduplicate_sequential, each committed to a local
object store (storage.manifest.commit_folder) as the asset layer commits it.
Timed, --repeats times each, alternating, the fastest run counting (the machine may be shared; outputs are the same):
  (a) dump 4 added: deduplicate_sequential(earlier=[dump 1, 2, 3]);
  (b) dump 4 alone: deduplicate_sequential(earlier=[]);
both with LocalRunner(workers=--workers) and the stage's own task counts, each in a fresh work folder.
Printed: the corpus, both times and kept counts; then figure 2, `pretrain status` seconds at 100 and 1,000 sources of
generated recipes beside Dagster's floor (bench/orchestration.py's measure, one round), and at 1,000 dump partitions
of one crawl (listed in its recipe, not materialized); then `ratio: X.XX` = (a) /
(b): what the index of the earlier dumps adds to a dump's dedup (target <= 1.2). `--smoke` runs 150 documents a dump, one repeat: it checks the paths
work, its figures mean nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))  # the repository root, so the packages import when run as a script

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import zipfile  # noqa: E402

import orjson  # noqa: E402

from pipelines.dedup.config import DedupConfig  # noqa: E402
from pipelines.dedup.sequential import IndexPart, deduplicate_sequential  # noqa: E402
from pipelines.runner import LocalRunner  # noqa: E402
from storage.factory import open_store  # noqa: E402
from storage.manifest import commit_folder  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DUMPS = 4
SOURCES = ("crawl", "news")
SHARDS = 2  # per source and dump
NEAR_EARLIER, EXACT_EARLIER, NEAR_WITHIN = 0.08, 0.03, 0.03  # copies, as fractions of a dump's documents


# ---------------------------------------------------------------------------------------------------------------
# The corpus


def real_texts() -> list[list[str]]:
    """Real texts of at least 300 words, as word lists."""
    texts = [json.loads(line)["text"] for name in ("dclm_majority_data.jsonl", "dclm_agreement_data.jsonl")
             for line in open(DATA / "quality" / name)]
    texts += [json.loads(line)["text"] for path in sorted((DATA / "jsonl").glob("*.json*.gz"))
              for line in gzip.open(path)]
    texts += re.split(r"\n = [^=\n]+ = \n", (DATA / "wiki" / "wikitext-2-valid.txt").read_text())  # its articles
    with zipfile.ZipFile(DATA / "misc" / "webtext.zip") as z:
        texts += [z.read(n).decode("utf-8", "replace") for n in z.namelist() if n.endswith(".txt")]
    return [words for words in (text.split() for text in sorted(set(texts))) if len(words) >= 300]


def window(words: list[str], rng: random.Random) -> list[str]:
    size = rng.randint(150, 250)
    start = rng.randrange(len(words) - size + 1)
    return words[start : start + size]


def edited(text: str, rng: random.Random) -> str:
    """A near copy: a few words replaced and a line appended, as a re-crawl or a mirror has it."""
    words = text.split(" ")
    for _ in range(rng.randint(1, 4)):
        words[rng.randrange(len(words))] = rng.choice(["lorem", "copyright", "updated", "share", "menu"])
    return " ".join(words) + "\nShare this page with your friends."


def build_dumps(docs_per_dump: int, seed: int) -> list[list[str]]:
    """DUMPS lists of texts, copies included, each list in its corpus order."""
    rng = random.Random(seed)
    texts = real_texts()
    dumps: list[list[str]] = []
    for _ in range(DUMPS):
        fresh = [" ".join(window(rng.choice(texts), rng) + window(rng.choice(texts), rng))
                 for _ in range(docs_per_dump)]
        earlier = [text for dump in dumps for text in dump]
        copies = [edited(rng.choice(earlier), rng) for _ in range(int(NEAR_EARLIER * docs_per_dump))] if earlier else []
        copies += [rng.choice(earlier) for _ in range(int(EXACT_EARLIER * docs_per_dump))] if earlier else []
        copies += [edited(rng.choice(fresh), rng) for _ in range(int(NEAR_WITHIN * docs_per_dump))]
        dump = fresh + copies
        rng.shuffle(dump)
        dumps.append(dump)
    return dumps


def write_dump(root: Path, number: int, texts: list[str]) -> list[tuple[str, list[Path]]]:
    """The dump's texts dealt round-robin to the sources' shards: [(source, [shard paths])]."""
    shards = [(source, k) for source in SOURCES for k in range(SHARDS)]
    lines: dict[tuple[str, int], list[bytes]] = {shard: [] for shard in shards}
    for i, text in enumerate(texts):
        doc = {"text": text, "id": f"d{number}-{i:06d}", "metadata": {"dump": number}}
        lines[shards[i % len(shards)]].append(orjson.dumps(doc) + b"\n")
    sources = []
    for source in SOURCES:
        paths = []
        for k in range(SHARDS):
            path = root / "in" / source / f"part-d{number}-{k}.jsonl.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(path, "wb", compresslevel=1) as f:
                f.write(b"".join(lines[(source, k)]))
            paths.append(path)
        sources.append((source, paths))
    return sources


# ---------------------------------------------------------------------------------------------------------------
# The runs


def dedup(sources, earlier: list[IndexPart], config: DedupConfig, work: Path, workers: int) -> tuple[float, int]:
    """(seconds, kept documents) of one sequential dedup of `sources` in a fresh work and output folder."""
    start = time.perf_counter()
    stats = deduplicate_sequential(sources=sources, earlier=earlier, config=config, work_dir=work / "work",
                                   out_dir=work / "out", executor=LocalRunner(workers=workers))
    return time.perf_counter() - start, sum(stats.kept.values())


def _sibling(name: str):
    """bench/<name>.py as a module, loaded by its path (bench/ is scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", _HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def partitions_status(dumps: int, work: Path) -> float:
    """Seconds of `pretrain status` (the second of two runs: the first adds the partitions) on a recipe of one crawl of
    `dumps` dumps, in a fresh home."""
    import os
    import subprocess

    import yaml

    work.mkdir()
    recipe = work / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "partitions", "dedup": {"rule": "sequential"}, "sources": [
        {"name": "crawl", "format": "jsonl", "inputs": [str(work / "crawl" / "{dump}" / "*.jsonl")],
         "dumps": [f"d{i:05d}" for i in range(dumps)]}]}))
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "PRETRAIN_RECIPE", "PRETRAIN_STORE")}
    env["PRETRAIN_HOME"] = str(work / "home")
    command = [sys.executable, "-m", "assets.cli", "status", "--recipe", str(recipe)]
    for _ in range(2):
        start = time.perf_counter()
        subprocess.run(command, cwd=_HERE.parent, env=env, check=True, capture_output=True)
        seconds = time.perf_counter() - start
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs-per-dump", type=int, default=10000, help="fresh documents a dump, before its copies")
    parser.add_argument("--workers", type=int, default=1, help="processes of the LocalRunner, both sides")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side; the fastest counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--status-sizes", default="100,1000",
                        help="source counts of figure 2, comma-separated; empty: no figure 2 (default 100,1000)")
    parser.add_argument("--smoke", action="store_true", help="150 documents a dump, one repeat: the paths run")
    args = parser.parse_args()
    if args.smoke:
        args.docs_per_dump, args.repeats = 150, 1
    config = DedupConfig(rule="sequential")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # --- The corpus: four dumps of shards -----------------------------------------------------------------
        dumps = [write_dump(root / f"dump-{n}", n, texts)
                 for n, texts in enumerate(build_dumps(args.docs_per_dump, args.seed), start=1)]
        print(f"{DUMPS} dumps of real text, {args.docs_per_dump:,} fresh documents each plus copies "
              f"({len(SOURCES)} sources x {SHARDS} shards a dump); dedup {config.bands}x{config.rows}, verify "
              f"{config.verify_threshold}, {args.workers} worker(s)")

        # --- Setup: dumps 1..3 deduplicated in turn, each committed to the store ------------------------------
        store = open_store(f"file://{root / 'store'}")
        earlier: list[IndexPart] = []
        for n, sources in enumerate(dumps[:-1], start=1):
            seconds, kept = dedup(sources, list(earlier), config, root / f"setup-{n}", args.workers)
            commit_folder(store, f"dedup/dump-{n}", root / f"setup-{n}" / "out", {"asset": "bench"})
            earlier.append(IndexPart(store, f"dedup/dump-{n}", f"crawl/dump-{n}"))
            print(f"  dump {n}: kept {kept:,} ({seconds:.2f} s, untimed setup)")
        indexed = sum(json.loads((root / "store" / "dedup" / f"dump-{n}" / "index" / "meta.json").read_text())["kept"]
                      for n in range(1, DUMPS))

        # --- Figure 1: dump 4 added against the index of dumps 1..3, and dump 4 alone ------------------------
        best = {"added": (float("inf"), 0), "alone": (float("inf"), 0)}
        for repeat in range(args.repeats):
            for side, parts in (("added", earlier), ("alone", [])):
                seconds, kept = dedup(dumps[-1], parts, config, root / f"{side}-{repeat}", args.workers)
                best[side] = min(best[side], (seconds, kept))
        documents = sum(1 for _, paths in dumps[-1] for path in paths for _ in gzip.open(path))
        print(f"dump {DUMPS}: {documents:,} documents; the earlier dumps' index: {indexed:,} kept documents")
        print(f"(a) dump {DUMPS} added to dumps 1-{DUMPS - 1}: {best['added'][0]:.2f} s, kept {best['added'][1]:,} "
              f"({documents / best['added'][0]:,.0f} docs/s)")
        print(f"(b) dump {DUMPS} alone: {best['alone'][0]:.2f} s, kept {best['alone'][1]:,} "
              f"({documents / best['alone'][0]:,.0f} docs/s)")
        ratio = best["added"][0] / best["alone"][0]

        # --- Figure 2: `pretrain status` at 100 and 1,000 sources beside Dagster's floor (bench/orchestration.py's
        # generated recipes and floor, one round each) -------------------------------------------------------------
        if args.status_sizes:
            orchestration = _sibling("orchestration")

            sizes = [orchestration.SMOKE_SOURCES] if args.smoke else [int(n) for n in args.status_sizes.split(",")]
            for sources in sizes:
                (root / "status").mkdir(exist_ok=True)
                found = orchestration.measure(sources, 1, root / "status")
                ours, floor = found["figures"][("status", "ours")][0], found["figures"][("status", "floor")][0]
                print(f"pretrain status at {sources:,} sources ({found['assets']:,} assets): {ours:.2f} s; Dagster's "
                      f"floor {floor:.2f} s ({ours / floor:.2f}x)")
            # The same command on one crawl of 1,000 dumps (5 partitioned assets, a line per dump each; listed in the
            # recipe, nothing materialized: the partitions' states, not the data).
            dumps = 10 if args.smoke else 1000
            seconds = partitions_status(dumps, root / "partitions")
            print(f"pretrain status at {dumps:,} dump partitions of one crawl: {seconds:.2f} s")
        print(f"ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()
