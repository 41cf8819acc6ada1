"""Near-dedup quality and speed: our staged MinHash LSH (pipelines/dedup/stage.py) against datasketch's MinHashLSH.

    .venv/bin/python bench/dedup.py [--pairs-per-level 150] [--seed 0] [--repeats 3] [--smoke]
                                    [--bands B --rows R --verify-threshold T]   (default: DedupConfig's)

Pairs at known Jaccard similarity are built from real text in ../shared/data, in two groups of the same size:
  - English: DCLM and C4/Dolma web documents, NLTK webtext, WikiText-2 validation, State of the Union and
    inaugural addresses;
  - non-English: the main text (trafilatura, as ingest extracts it) of the crawl/web-pages.warc.gz pages that
    lid.176 does not label English (~700 German, then Spanish, French, Polish, Portuguese, Russian, ...; pages
    declaring <html lang="en"> are not extracted, to save time), Genesis in Finnish, French, German, Portuguese
    and Swedish, and the Universal Declaration of Human Rights in 327 languages (one translation per language;
    English and Scots left out).
Texts are cut into distinct 250-word passages (words: whitespace-separated). A text is left out when it has more
than 1.5 normalized_words (the words dedup compares) per whitespace-separated word, i.e. when those are not its
words: languages written without spaces between words (Chinese, Japanese, Tibetan, Dzongkha, Yi; Amharic separates
them with U+1361), where a whitespace-separated "word" is a phrase: 9 UDHR translations. Deduplicating those needs
other words (or character shingles), a question apart from the banding measured here. Scripts whose vowel signs are
combining marks (Devanagari, Bengali, Tamil, Thai, pointed Hebrew, ...) are in: normalized_words keeps a mark in its
word (before, `re`'s \w cut their words into letters, and 30 translations were left out).
Each passage is paired with a copy whose words are replaced (by words that occur nowhere else) until the exact
Jaccard of the two 5-word-shingle sets hits a target level. Every passage and copy goes through both systems in
one corpus:
  - ours: deduplicate() end to end through its four datatrove pipelines (part files in, signatures -> buckets
    with verified pairs -> clusters -> removal -> part files out), run by LocalPipelineExecutor with one worker,
    one task per phase, in this process as datasketch runs in it; a pair is found when both documents land in
    the same cluster.
  - datasketch: MinHash(num_perm=112) over the same shingles + MinHashLSH(threshold=0.75, 112 perms); each
    passage inserted, each copy queried; a pair is found when the query returns its passage.
Each side runs --repeats times (alternating; the fastest run counts, since the machine may be shared).
Printed, per group: recall over pairs at J >= 0.8, recall over pairs at J 0.7-0.8, false-positive rate over
pairs at J 0.3-0.5; documents/s; then per target level our settings' theoretical S-curve (P(candidate) =
1 - (1 - J^rows)^bands; P(merged): a candidate whose signatures also agree on >= verify_threshold of the
bands*rows positions, each position agreeing with probability J independently; both averaged over the level's
pairs at their exact J) beside the fraction found; last `ratio: X.XX` = our documents/s / datasketch's
documents/s over the whole corpus. Targets: in both groups recall >= 0.98 at J >= 0.8 and >= 0.85 at J 0.7-0.8,
FP <= 0.3% at J 0.3-0.5; ratio >= 1.
Measured with the defaults (28x4, verify 0.65), 150 pairs a level in each group (9,000 documents), 2 shared
cores, ~50 s in all (~30 s of it building the pairs, two thirds of that extracting the crawl's pages):
English / non-English recall 1.000 / 1.000 at J >= 0.8, 0.975 / 0.975 at J 0.7-0.8 (0.92 at J ~0.70, 0.94 at
~0.72, 0.99 at ~0.75, 1.0 at ~0.78), no false positive at J 0.3-0.5 (0.15 of the pairs at J ~0.60 merged), ratio
1.4-1.7. FineWeb's 14x8 verified at 0.7, the defaults before: 0.993 / 0.991, 0.68 / 0.68, no false positive.
datasketch: 0.96 / 0.96, 0.47 / 0.50, 0.0% / 0.16%.
`--smoke` runs the same paths on 5 pairs per level and the first 40 crawl records: it checks that the bench
works, its figures mean nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))  # the repository root, so the packages import when run as a script

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import zipfile  # noqa: E402

import numpy as np  # noqa: E402
import orjson  # noqa: E402

from pipelines.dedup.config import DedupConfig  # noqa: E402
from pipelines.dedup.minhash import normalized_words  # noqa: E402
from pipelines.dedup.stage import deduplicate  # noqa: E402
from pipelines.runner import LocalRunner  # noqa: E402
from pipelines.shards import iter_documents  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PASSAGE_WORDS = 250
NGRAM = 5
# 0.72-0.78: the band just above where FineWeb's 14x8 banding starts to lose pairs (issue 33).
LEVELS = [0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.72, 0.75, 0.78, 0.8, 0.85, 0.9, 0.95, 1.0]
GROUPS = ("English", "non-English")
MAX_WORDS_PER_TOKEN = 1.5  # normalized words per whitespace-separated word above which a text is left out
GENESIS = ("finnish", "french", "german", "portuguese", "swedish")
UDHR_SKIPPED = ("eng", "sco")  # English, and Scots (close to it)
_DECLARED_LANG = re.compile(rb"""<html[^>]{0,500}?\blang\s*=\s*["']?([A-Za-z]{2,3})""", re.I)


def english_texts() -> dict[str, list[str]]:
    texts = {"web": [], "wiki": [], "speeches": []}
    for name in ("dclm_majority_data.jsonl", "dclm_agreement_data.jsonl"):
        texts["web"] += [json.loads(line)["text"] for line in open(DATA / "quality" / name)]
    for path in sorted((DATA / "jsonl").glob("*.json*.gz")):
        texts["web"] += [json.loads(line)["text"] for line in gzip.open(path)]
    texts["wiki"].append((DATA / "wiki" / "wikitext-2-valid.txt").read_text())
    texts["web"] += zip_texts(DATA / "misc" / "webtext.zip")
    texts["speeches"] += zip_texts(DATA / "misc" / "state_union.zip") + zip_texts(DATA / "misc" / "inaugural.zip")
    return texts


def non_english_texts(crawl_records: int | None) -> dict[str, list[str]]:
    genesis = zip_texts(DATA / "lid" / "nltk_genesis.zip", lambda n: n.rsplit("/", 1)[-1][:-4] in GENESIS)
    seen = set()  # one translation per language: deu, not also deu_1901 (near-duplicates of each other)

    def first_of_language(name: str) -> bool:
        code = name.rsplit("/", 1)[-1][:-4].split("_")[0]
        new = code not in seen and code not in UDHR_SKIPPED
        seen.add(code)
        return new

    udhr = zip_texts(DATA / "lid" / "nltk_udhr2.zip", first_of_language)
    return {"crawl": crawl_texts(crawl_records), "genesis": genesis, "udhr": udhr}


def zip_texts(path: Path, wanted=lambda name: True) -> list[str]:
    with zipfile.ZipFile(path) as z:
        return [z.read(n).decode("utf-8", "replace") for n in sorted(z.namelist()) if n.endswith(".txt") and wanted(n)]


def crawl_texts(max_records: int | None) -> list[str]:
    """Main texts of the crawl's pages that lid.176 labels other than English (as ingest reads and extracts)."""
    import fasttext

    from pipelines.filters.language import lid176_path
    from pipelines.ingest.extraction import decode_text, extract_main_text
    from pipelines.ingest.config import ReaderConfig
    from pipelines.ingest.readers import read_inputs

    model = fasttext.load_model(str(lid176_path()))
    records = read_inputs("crawl", [DATA / "crawl" / "web-pages.warc.gz"], "warc", ReaderConfig(), count_bytes=lambda n: None)
    texts = []
    for count, record in enumerate(records):
        if max_records is not None and count >= max_records:
            break
        declared = _DECLARED_LANG.search(record.body[:8192]) if record.kind == "html" else None
        if record.kind != "html" or (declared and declared.group(1).lower() in (b"en", b"eng")):
            continue  # trafilatura takes ~20 ms a page: the third of the file declared English is not extracted
        html, _ = decode_text(record.body, record.charset, html=True)
        text = extract_main_text(html) if html else None
        if text and model.predict(text.replace("\n", " "))[0][0] != "__label__en":
            texts.append(text)
    return texts


def passages(texts_by_source: dict[str, list[str]]) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """(source, passage): distinct passages of PASSAGE_WORDS words (space-joined, original punctuation and case);
    and per source the number of texts left out because normalized_words does not find their words."""
    out, seen, left_out = [], set(), {}
    for source, texts in texts_by_source.items():
        for text in texts:
            words = text.split()
            if not words or len(normalized_words(text)) > MAX_WORDS_PER_TOKEN * len(words):
                left_out[source] = left_out.get(source, 0) + bool(words)
                continue
            for start in range(0, len(words) - PASSAGE_WORDS + 1, PASSAGE_WORDS):
                passage = " ".join(words[start : start + PASSAGE_WORDS])
                key = " ".join(normalized_words(passage))
                if key not in seen and len(set(shingles(passage))) > PASSAGE_WORDS * 0.9:
                    seen.add(key)
                    out.append((source, passage))
    return out, left_out


def shingles(text: str) -> list[tuple]:
    words = normalized_words(text)
    return [tuple(words[i : i + NGRAM]) for i in range(len(words) - NGRAM + 1)]


def mutate_to(passage: str, target: float, rng: random.Random, fresh) -> tuple[str, float]:
    """A copy with a random set of words replaced, the fraction bisected until the Jaccard is near target."""
    words = passage.split(" ")
    original = set(shingles(passage))
    order = list(range(len(words)))
    rng.shuffle(order)
    lo, hi = 0, len(words)
    best = (passage, 1.0)
    for _ in range(12):
        k = (lo + hi) // 2
        changed = set(order[:k])
        copy = " ".join(next(fresh) if i in changed else w for i, w in enumerate(words))
        other = set(shingles(copy))
        j = len(original & other) / len(original | other)
        if abs(j - target) < abs(best[1] - target):
            best = (copy, j)
        if j > target:
            lo = k + 1
        else:
            hi = k
        if lo >= hi:
            break
    return best


def build_pairs(pool: list[tuple[str, str]], group: str, per_level: int, rng: random.Random, fresh) -> list[tuple]:
    """(passage, copy, exact Jaccard, group, source, target level) for per_level pairs at each of LEVELS."""
    pool = list(pool)
    rng.shuffle(pool)
    needed = per_level * len(LEVELS)
    if len(pool) < needed:
        raise SystemExit(f"only {len(pool)} distinct {group} passages for {needed} pairs; lower --pairs-per-level")
    pairs = []
    for i, (source, passage) in enumerate(pool[:needed]):
        target = LEVELS[i % len(LEVELS)]
        copy, j = mutate_to(passage, target, rng, fresh)
        pairs.append((passage, copy, j, group, source, target))
    return pairs


def s_curve(j: np.ndarray, bands: int, rows: int, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(P(candidate), P(merged)) per Jaccard in j: each of the bands*rows positions agrees with probability J, a
    candidate has one band all agreeing, a merged pair is a candidate agreeing on >= threshold of all positions."""
    j = np.asarray(j, dtype=float)[:, None]
    positions = bands * rows
    k = np.arange(rows + 1)
    row_k = np.array([math.comb(rows, n) for n in k]) * j**k * (1 - j) ** (rows - k)  # (len(j), rows + 1)
    # Distribution of the agreeing positions so far, split by whether some band has agreed whole yet.
    none_full = np.zeros((len(j), positions + 1))
    none_full[:, 0] = 1
    some_full = np.zeros_like(none_full)
    for _ in range(bands):
        next_none, next_some = np.zeros_like(none_full), np.zeros_like(none_full)
        for n in range(rows + 1):  # n of this band's positions agree
            p = row_k[:, n : n + 1]
            next_some[:, n:] += some_full[:, : positions + 1 - n] * p
            (next_some if n == rows else next_none)[:, n:] += none_full[:, : positions + 1 - n] * p
        none_full, some_full = next_none, next_some
    enough = np.arange(positions + 1) / positions >= threshold  # the comparison the bucket phase makes
    candidate = 1 - (1 - j[:, 0] ** rows) ** bands
    return candidate, some_full[:, enough].sum(axis=1)


def run_ours(pairs, work: Path, config: DedupConfig) -> tuple[set[int], float, object]:
    originals = [{"text": a, "id": f"p{i:06d}", "metadata": {}} for i, (a, *_) in enumerate(pairs)]
    copies = [{"text": b, "id": f"q{i:06d}", "metadata": {}} for i, (_, b, *_) in enumerate(pairs)]
    inputs = []
    for name, docs in (("originals", originals), ("copies", copies)):
        path = work / "in" / name / "part-00000.jsonl.gz"
        path.parent.mkdir(parents=True)
        with gzip.open(path, "wb", compresslevel=3) as f:
            f.write(b"".join(orjson.dumps(d) + b"\n" for d in docs))
        inputs.append((name, [path]))
    start = time.perf_counter()
    # One worker running one task per phase: the same one process as datasketch's side (the timing includes
    # datatrove's executor start-up and task logging, four times).
    stats = deduplicate(sources=inputs, config=config, work_dir=work / "stages", out_dir=work / "out",
                        executor=LocalRunner(workers=1, tasks=1))
    elapsed = time.perf_counter() - start
    cluster = {}
    for name in ("originals", "copies"):
        for path in sorted((work / "out" / name).glob("*.jsonl.gz")):
            for doc in iter_documents(path):
                if "dup_cluster" in doc["metadata"]:
                    cluster[doc["id"]] = doc["metadata"]["dup_cluster"]
    found = {i for i in range(len(pairs)) if f"p{i:06d}" in cluster and cluster[f"p{i:06d}"] == cluster.get(f"q{i:06d}")}
    return found, elapsed, stats


def run_datasketch(pairs) -> tuple[set[int], float]:
    from datasketch import MinHash, MinHashLSH

    start = time.perf_counter()
    lsh = MinHashLSH(threshold=0.75, num_perm=112)

    def minhash(text):
        m = MinHash(num_perm=112)
        m.update_batch([" ".join(s).encode() for s in set(shingles(text))])
        return m

    for i, (a, *_) in enumerate(pairs):
        lsh.insert(f"p{i}", minhash(a))
    found = {i for i, (_, b, *_) in enumerate(pairs) if f"p{i}" in lsh.query(minhash(b))}
    return found, time.perf_counter() - start


def rate(found: set[int], ids: list[int]) -> str:
    return f"{sum(i in found for i in ids) / len(ids):.4f}" if ids else "  -   "


def main() -> None:
    defaults = DedupConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs-per-level", type=int, default=150, help="in each group (English, non-English)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bands", type=int, default=defaults.bands)
    parser.add_argument("--rows", type=int, default=defaults.rows)
    parser.add_argument("--verify-threshold", type=float, default=defaults.verify_threshold)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side; the fastest counts")
    parser.add_argument("--smoke", action="store_true",
                        help="5 pairs per level, the first 40 crawl records: the bench runs, no figure means anything")
    args = parser.parse_args()
    if args.smoke:
        args.pairs_per_level, args.repeats = 5, 1
    config = DedupConfig(bands=args.bands, rows=args.rows, verify_threshold=args.verify_threshold)

    start = time.perf_counter()
    rng = random.Random(args.seed)
    fresh = (f"zq{n}" for n in range(10**9))  # words no real text has
    texts = {"English": english_texts(), "non-English": non_english_texts(40 if args.smoke else None)}
    pools = {group: passages(texts[group]) for group in GROUPS}
    pairs = [p for group in GROUPS for p in build_pairs(pools[group][0], group, args.pairs_per_level, rng, fresh)]
    documents = 2 * len(pairs)
    print(f"{len(pairs)} pairs from real text ({documents} documents, built in {time.perf_counter() - start:.1f} s):")
    for group in GROUPS:
        used = {source: sum(p[3] == group and p[4] == source for p in pairs) for source in texts[group]}
        left_out = ", ".join(f"{source} {n}" for source, n in pools[group][1].items() if n) or "none"
        print(f"  {group}: {len(pools[group][0])} distinct passages; pairs by source: "
              + ", ".join(f"{source} {n}" for source, n in used.items())
              + f"; texts left out (words not space-separated for normalized_words): {left_out}")

    # Each side runs --repeats times, alternating, and keeps its fastest run: on a shared machine the other
    # processes' load comes and goes, and the minimum is the run it disturbed least (results are identical).
    ours_s = theirs_s = float("inf")
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            ours, seconds, stats = run_ours(pairs, Path(tmp), config)
        ours_s = min(ours_s, seconds)
        theirs, seconds = run_datasketch(pairs)
        theirs_s = min(theirs_s, seconds)

    label = f"ours ({config.bands}x{config.rows}, verify {config.verify_threshold})"
    print(f"{label}: {documents / ours_s:,.0f} docs/s ({ours_s:.2f} s); LSH candidate pairs {stats.candidate_pairs:,} "
          f"(counted per band), {stats.verified_pairs:,} verified")
    print(f"datasketch MinHashLSH (112 perms, threshold 0.75): {documents / theirs_s:,.0f} docs/s ({theirs_s:.2f} s)")
    print(f"{'':38} recall J>=0.8  recall J0.7-0.8  FP J0.3-0.5")
    for name, found in ((label, ours), ("datasketch", theirs)):
        for group in GROUPS:
            ids = [i for i, p in enumerate(pairs) if p[3] == group]
            high = [i for i in ids if pairs[i][2] >= 0.8]
            band = [i for i in ids if 0.7 <= pairs[i][2] < 0.8]
            low = [i for i in ids if 0.3 <= pairs[i][2] <= 0.5]
            fp = sum(i in found for i in low) / len(low)
            print(f"  {name:<24} {group:<11}    {rate(found, high)}         {rate(found, band)}        {fp:.2%}"
                  f"   (n = {len(high)} / {len(band)} / {len(low)})")
    print("ours, recall J0.7-0.8 by source: " + ", ".join(
        f"{group} {source} {rate(ours, ids)} (n = {len(ids)})"
        for group in GROUPS for source in dict.fromkeys(p[4] for p in pairs if p[3] == group)
        if (ids := [i for i, p in enumerate(pairs) if p[3] == group and p[4] == source and 0.7 <= p[2] < 0.8])))

    candidate, merged = s_curve([p[2] for p in pairs], config.bands, config.rows, config.verify_threshold)
    by_level = {}
    for i, p in enumerate(pairs):
        by_level.setdefault(p[5], []).append(i)
    print(f"per target level: theory for {config.bands}x{config.rows}, verify {config.verify_threshold} "
          "(averaged over the level's pairs at their exact J) and found (English / non-English):")
    print("  level    n   mean J  P(cand)  P(merged) |    ours en / non-en | datasketch en / non-en")
    for level in sorted(by_level):
        ids = by_level[level]
        en, xx = ([i for i in ids if pairs[i][3] == g] for g in GROUPS)
        print(f"  J~{level:.2f} {len(ids):4d}  {np.mean([pairs[i][2] for i in ids]):.3f}   {candidate[ids].mean():.3f}    "
              f"{merged[ids].mean():.3f}    |  {rate(ours, en)} / {rate(ours, xx)}  |  {rate(theirs, en)} / {rate(theirs, xx)}")
    print(f"ratio: {(documents / ours_s) / (documents / theirs_s):.2f}")


if __name__ == "__main__":
    main()
