"""Sequential dedup, dump by dump against the index of what the earlier dumps kept, on real web documents (DCLM's
and C4/Dolma's pages from ../shared/data): four incremental runs, each committed to a local object store, keep
exactly what one brute-force pass over all four dumps in corpus order keeps (the oracle below, written from
minhash.py's primitives only); the output does not depend on the task count; earlier dumps are never written."""

import dataclasses
import gzip
import hashlib
import json
import random
from pathlib import Path

import numpy as np
import orjson
import pytest
import xxhash

from pipelines.dedup.config import DedupConfig
from pipelines.dedup.minhash import MinHasher, WordHasher, ngram_hashes, normalized_words
from pipelines.dedup.sequential import IndexPart, deduplicate_sequential
from pipelines.dedup.stage import deduplicate
from pipelines.runner import LocalRunner
from storage.factory import open_store
from storage.manifest import commit_folder
from tests.conftest import SHARED_DATA
from tests.pipelines.dedup.test_minhash import edit_words, write_part
from tests.pipelines.dedup.test_stage import KillingRunner, files

CONFIG = DedupConfig(rule="sequential")
SOURCES = ("crawl", "news")
DUMPS = 4
SHARDS = 2  # per source and dump


# ---------------------------------------------------------------------------------------------------------------
# The oracle: every document against every kept one before it, in corpus order (no index, no runs, no phases)


class Oracle:
    def __init__(self, config: DedupConfig):
        self.config, self.minhasher, self.words = config, MinHasher(config), WordHasher()

    def describe(self, text: str) -> tuple[bytes, np.ndarray | None, np.ndarray | None]:
        """(exact text hash, signature, band keys); no signature for a text without words (no shingles)."""
        words = normalized_words(text)
        text_hash = xxhash.xxh3_128_digest(" ".join(words))
        if not words:
            return text_hash, None, None
        signature = self.minhasher.signatures([np.unique(ngram_hashes(self.words(words), self.config.ngram))])
        return text_hash, signature[0], self.minhasher.band_keys(signature)[0]

    def near(self, a, b) -> bool:
        (_, sig_a, keys_a), (_, sig_b, keys_b) = a, b
        if sig_a is None or sig_b is None or not (keys_a == keys_b).any():
            return False
        return self.config.verify_threshold == 0 or (sig_a == sig_b).mean() >= self.config.verify_threshold

    def walk(self, labelled_texts: list[tuple[str, str]]) -> dict[str, tuple[str, str] | None]:
        """{label: None (kept) or (label of the earliest kept document it matches, reason)}."""
        config, p = self.config, self.config.permutations
        n = len(labelled_texts)
        sigs, keys = np.zeros((n, p), dtype=np.uint32), np.zeros((n, config.bands), dtype=np.uint64)
        has_words, hashes, labels = np.zeros(n, dtype=bool), [], []
        out = {}
        for label, text in labelled_texts:
            text_hash, sig, band_keys = self.describe(text)
            k = len(labels)
            match = np.zeros(k, dtype=bool)
            if config.exact:
                match |= np.array([h == text_hash for h in hashes], dtype=bool)
            if config.near and sig is not None:
                near = has_words[:k] & (keys[:k] == band_keys).any(axis=1)
                if config.verify_threshold > 0:
                    near &= (sigs[:k] == sig).mean(axis=1) >= config.verify_threshold
                match |= near
            if match.any():
                first = int(np.flatnonzero(match)[0])
                out[label] = (labels[first], "exact_duplicate" if hashes[first] == text_hash else "near_duplicate")
                continue
            out[label] = None
            if sig is not None:
                sigs[k], keys[k], has_words[k] = sig, band_keys, True
            hashes.append(text_hash)
            labels.append(label)
        return out


# ---------------------------------------------------------------------------------------------------------------
# The corpus: real pages in four dumps of two sources, with copies across dumps and within them


def real_texts() -> tuple[list[str], list[str]]:
    """(distinct real pages, DCLM's agreement pages: each an exact copy of one of its majority pages)."""
    majority = [json.loads(line)["text"] for line in open(SHARED_DATA / "quality" / "dclm_majority_data.jsonl")]
    agreement = [json.loads(line)["text"] for line in open(SHARED_DATA / "quality" / "dclm_agreement_data.jsonl")]
    c4 = [json.loads(line)["text"] for path in sorted((SHARED_DATA / "jsonl").glob("*.json*.gz"))
          for line in gzip.open(path)]
    seen, distinct = set(), []
    for text in c4 + majority:
        key = " ".join(normalized_words(text))
        if key and key not in seen and len(text.split()) >= 60:
            seen.add(key)
            distinct.append(text)
    return distinct, [t for t in agreement if " ".join(normalized_words(t)) in seen]


def chain(texts: list[str], oracle: Oracle) -> tuple[str, str, str]:
    """Real page A, B = A with one block of words replaced, C = B with another: B matches A, C matches B, C does
    not match A (found by trying pages and block sizes under the configured bands and threshold)."""
    fresh = (f"zq{n}" for n in range(10**6))  # words no page has
    for text in texts:
        words = text.split(" ")
        if len(words) < 300:
            continue
        for fraction in (0.06, 0.08, 0.1, 0.12, 0.14):
            k = int(len(words) * fraction)
            b = words[:k] + [next(fresh) for _ in range(k)] + words[2 * k :]
            c = b[: 3 * k] + [next(fresh) for _ in range(k)] + b[4 * k :]
            a, b, c = text, " ".join(b), " ".join(c)
            da, db, dc = oracle.describe(a), oracle.describe(b), oracle.describe(c)
            if oracle.near(da, db) and oracle.near(db, dc) and not oracle.near(da, dc):
                return a, b, c
    raise AssertionError("no real page gave a chain A ~ B ~ C with A !~ C under these settings")


def build_dumps(seed: int = 5) -> tuple[list[dict[str, list[list[dict]]]], dict[str, str]]:
    """Four dumps {source: [shard documents]} and the labels of the chains' documents (A ~ B ~ C, A !~ C): a, b, c
    in crawl's dumps 1, 2, 3; a2, b2, c2 in this order at the end of dump 4's last news shard; and forks, where B
    comes last and matches two kept documents: fc, fa, fb in dumps 1, 2, 3; fc2, fa2, fb2 ending dump 4's crawl."""
    rng = random.Random(seed)
    distinct, agreement = real_texts()
    rng.shuffle(distinct)
    oracle = Oracle(CONFIG)
    chains = [chain(distinct[k : k + 40], oracle) for k in range(0, 160, 40)]
    pool = [t for t in distinct[160:] if not any(t in texts for texts in chains)]
    placed: list[list[tuple[str, int, str, str]]] = [[] for _ in range(DUMPS)]  # per dump: (source, shard, text, tag)

    def put(dump: int, text: str, tag: str = "", source: str = "") -> None:
        spot = (source or rng.choice(SOURCES), rng.randrange(SHARDS), text, tag)
        placed[dump].insert(rng.randrange(len(placed[dump]) + 1), spot)

    base = pool[: 60 * DUMPS]
    for i, text in enumerate(base):
        put(i % DUMPS, text)
    for i in range(30):  # exact and edited copies, most in a later dump, some in the same one
        origin = rng.randrange(DUMPS - 1)
        text = base[origin + DUMPS * rng.randrange(60)]
        copy = text if i % 3 == 0 else edit_words(text, edits=rng.randint(1, 4), seed=i)
        put(rng.randrange(origin + 1, DUMPS) if i % 5 else origin, copy)
    for text in agreement[:12]:  # DCLM's own exact copies of its pages
        put(rng.randrange(DUMPS), text)
    for dump, text in ((0, "!!! ..."), (2, ""), (2, "* * *")):  # no words: exact copies of each other
        put(dump, text)
    for dump, tag, text in zip((0, 1, 2), "abc", chains[0]):
        put(dump, text, tag, source="crawl")  # one source: the transitive rule keeps its smallest id, a's
    placed[3] += [("news", SHARDS - 1, text, tag) for tag, text in zip(("a2", "b2", "c2"), chains[1])]
    a, b, c = chains[2]
    for dump, tag, text in ((0, "fc", c), (1, "fa", a), (2, "fb", b)):
        put(dump, text, tag)
    a, b, c = chains[3]
    placed[3] += [("crawl", SHARDS - 1, text, tag) for tag, text in (("fc2", c), ("fa2", a), ("fb2", b))]
    dumps, labels = [], {}
    for dump, spots in enumerate(placed):
        shards = {source: [[] for _ in range(SHARDS)] for source in SOURCES}
        for k, (source, shard, text, tag) in enumerate(spots):
            doc = {"text": text, "id": f"d{dump + 1}-{k:03d}", "metadata": {"dump": dump + 1}}
            shards[source][shard].append(doc)
            if tag:
                labels[tag] = f"{source}/{doc['id']}"
        dumps.append(shards)
    return dumps, labels


def write_dump(root: Path, dump: int, shards: dict[str, list[list[dict]]]) -> list[tuple[str, list[Path]]]:
    return [(source, [write_part(root / "in" / source / f"part-d{dump}-{k}.jsonl.gz", docs)
                      for k, docs in enumerate(shards[source])]) for source in SOURCES]


def read_out(out: Path, sources) -> tuple[list[str], dict[str, dict]]:
    """(kept labels in corpus order, {removed label: its metadata})."""
    kept, removed = [], {}
    for source, paths in sources:
        for path in paths:
            stem = path.name.removeprefix("part-").removesuffix(".jsonl.gz")
            for kind in ("part", "removed"):
                if (out / source / f"{kind}-{stem}.jsonl.gz").is_file():
                    for line in gzip.open(out / source / f"{kind}-{stem}.jsonl.gz"):
                        doc = orjson.loads(line)
                        if kind == "part":
                            kept.append(f"{source}/{doc['id']}")
                        else:
                            removed[f"{source}/{doc['id']}"] = doc["metadata"]
    return kept, removed


def removed_sequentially(incremental) -> dict[str, tuple[str, str]]:
    """{removed label: (dup_of, reason)} over the four dumps."""
    removed = {}
    for run in incremental["runs"]:
        removed.update({label: (meta["dup_of"], meta["dedup_reason"])
                        for label, meta in read_out(run["out"], run["sources"])[1].items()})
    return removed


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    return {p.relative_to(root).as_posix(): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def incremental(tmp_path_factory):
    """The four dumps deduplicated one after another, each committed to a local store before the next."""
    root = tmp_path_factory.mktemp("incremental")
    dumps, ids = build_dumps()
    store = open_store(f"file://{root / 'store'}")
    runs, earlier, snapshots = [], [], []
    for dump, shards in enumerate(dumps, start=1):
        sources = write_dump(root, dump, shards)
        out = root / f"out-{dump}"
        stats = deduplicate_sequential(sources=sources, earlier=list(earlier), config=CONFIG,
                                       work_dir=root / f"work-{dump}", out_dir=out,
                                       executor=LocalRunner(workers=1, tasks=1))
        commit_folder(store, f"dedup/dump-{dump}", out, {"asset": "dedup", "files": stats.files})
        snapshots.append(snapshot(root / "store" / "dedup" / f"dump-{dump}"))
        earlier.append(IndexPart(store, f"dedup/dump-{dump}", f"crawl/dump-{dump}"))
        runs.append({"sources": sources, "out": out, "stats": stats, "earlier": list(earlier[:-1])})
    return {"root": root, "dumps": dumps, "ids": ids, "runs": runs, "store": store, "earlier": earlier,
            "snapshots": snapshots}


def corpus_order(incremental) -> list[tuple[str, str, int]]:
    """(label, text, dump) of every document of the four dumps in corpus order."""
    return [(f"{source}/{doc['id']}", doc["text"], dump) for dump, shards in enumerate(incremental["dumps"], start=1)
            for source in SOURCES for shard in shards[source] for doc in shard]


@pytest.mark.slow  # ~5 s: the module's four runs and the oracle's signatures
def test_four_incremental_dumps_keep_exactly_what_one_sequential_pass_keeps(incremental):
    documents = corpus_order(incremental)
    expected = Oracle(CONFIG).walk([(label, text) for label, text, _ in documents])
    kept = [label for run in incremental["runs"] for label in read_out(run["out"], run["sources"])[0]]
    removed = removed_sequentially(incremental)
    assert kept == [label for label, verdict in expected.items() if verdict is None]
    assert removed == {label: verdict for label, verdict in expected.items() if verdict is not None}
    # A document matching two kept ones names the earliest (the oracle's choice too), across dumps and within one.
    ids = incremental["ids"]
    assert removed[ids["fb"]] == (ids["fc"], "near_duplicate") and removed[ids["fb2"]] == (ids["fc2"], "near_duplicate")
    assert ids["fa"] in kept and ids["fa2"] in kept
    # Each path removed something: an earlier dump's index and the dump's own documents, exact and near copies.
    dump_of = {label: dump for label, _, dump in documents}
    paths = {("index" if dump_of[dup_of] < dump_of[label] else "within", reason)
             for label, (dup_of, reason) in removed.items()}
    assert paths == {("index", "exact_duplicate"), ("index", "near_duplicate"), ("within", "exact_duplicate"),
                     ("within", "near_duplicate")}
    for run in incremental["runs"]:  # a kept document passes through as its input bytes
        for source, paths in run["sources"]:
            for path in paths:
                kept_file = run["out"] / source / path.name
                if kept_file.is_file():
                    assert set(gzip.open(kept_file).read().splitlines()) <= set(gzip.open(path).read().splitlines())
    stats = [run["stats"] for run in incremental["runs"]]
    assert sum(sum(s.documents_in.values()) for s in stats) == len(documents)
    assert sum(sum(s.kept.values()) for s in stats) == len(kept) and sum(s.removed_total for s in stats) == len(removed)
    last = incremental["runs"][-1]
    assert json.loads((last["out"] / "index" / "meta.json").read_text())["kept"] == sum(last["stats"].kept.values())


@pytest.mark.slow  # ~4 s: the transitive stage over all four dumps
def test_the_sequential_rule_keeps_what_the_transitive_rule_removes(incremental, tmp_path):
    """A ~ B ~ C, A !~ C: sequentially B goes (it matches A) and C stays (it matches only B, which went); the
    transitive rule clusters the three and keeps one. Across dumps 1-3 and within dump 4."""
    ids, runs = incremental["ids"], incremental["runs"]
    sequential = removed_sequentially(incremental)
    for a, b, c in (("a", "b", "c"), ("a2", "b2", "c2")):
        assert sequential[ids[b]] == (ids[a], "near_duplicate") and ids[c] not in sequential
    everything = [(source, [p for run in runs for name, paths in run["sources"] if name == source for p in paths])
                  for source in SOURCES]
    out = tmp_path / "transitive"
    deduplicate(sources=everything, config=dataclasses.replace(CONFIG, rule="transitive"), work_dir=tmp_path / "work",
                out_dir=out)
    transitive = read_out(out, everything)[1]
    for a, c in (("a", "c"), ("a2", "c2")):
        assert transitive[ids[c]]["dup_cluster"] == ids[a]


def test_one_task_or_three_write_the_same_bytes(incremental, tmp_path):
    run = incremental["runs"][2]  # dump 3, against dumps 1 and 2
    stats = deduplicate_sequential(sources=run["sources"], earlier=run["earlier"], config=CONFIG,
                                   work_dir=tmp_path / "work", out_dir=tmp_path / "out",
                                   executor=LocalRunner(workers=1, tasks=3))
    assert files(tmp_path / "out") == files(run["out"])
    assert stats == run["stats"]
    assert len(list((tmp_path / "work" / "logs" / "match" / "completions").iterdir())) == 3


def test_earlier_dumps_are_never_written(incremental):
    for dump, before in enumerate(incremental["snapshots"], start=1):
        assert snapshot(incremental["root"] / "store" / "dedup" / f"dump-{dump}") == before, dump


def test_an_earlier_dump_with_other_settings_or_no_index_is_refused_by_name(incremental, tmp_path):
    run = incremental["runs"][1]
    for setting, value in (("seed", CONFIG.seed + 1), ("bands", CONFIG.bands + 1), ("exact", not CONFIG.exact)):
        with pytest.raises(ValueError, match=rf"earlier part 'crawl/dump-1' .* dedup\.{setting}="):
            deduplicate_sequential(sources=run["sources"], earlier=run["earlier"], work_dir=tmp_path / setting,
                                   config=dataclasses.replace(CONFIG, **{setting: value}), out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    missing = IndexPart(incremental["store"], "dedup/not-there", "crawl/2024-01")
    with pytest.raises(ValueError, match="earlier part 'crawl/2024-01' has no .*index/meta.json"):
        deduplicate_sequential(sources=run["sources"], earlier=[missing], config=CONFIG, work_dir=tmp_path / "w",
                               out_dir=tmp_path / "o")


def test_an_empty_dump_keeps_nothing_and_changes_nothing_after_it(incremental, tmp_path):
    empty_shard = write_part(tmp_path / "in" / "news" / "part-empty.jsonl.gz", [])
    stats = deduplicate_sequential(sources=[("crawl", []), ("news", [empty_shard])], earlier=incremental["earlier"][:1],
                                   config=CONFIG, work_dir=tmp_path / "work-empty", out_dir=tmp_path / "empty")
    assert stats.documents_in == {"crawl": 0, "news": 0} and stats.files == []
    assert json.loads((tmp_path / "empty" / "index" / "meta.json").read_text())["kept"] == 0
    commit_folder(incremental["store"], "dedup/empty", tmp_path / "empty", {"asset": "dedup"})
    # Dump 2 after dump 1 and the empty dump: the same output as after dump 1 alone.
    run = incremental["runs"][1]
    earlier = [incremental["earlier"][0], IndexPart(incremental["store"], "dedup/empty", "crawl/empty")]
    deduplicate_sequential(sources=run["sources"], earlier=earlier, config=CONFIG, work_dir=tmp_path / "work",
                           out_dir=tmp_path / "out")
    assert files(tmp_path / "out") == files(run["out"])


@pytest.mark.slow  # ~3 s on S3: moto serves the earlier index
def test_an_earlier_dump_is_read_from_its_store_where_it_is(incremental, tmp_path, store):
    """In place from a local store; from S3, downloaded once into the work folder."""
    first, second = incremental["runs"][:2]
    commit_folder(store, "dedup/dump-1", first["out"], {"asset": "dedup"})
    deduplicate_sequential(sources=second["sources"], earlier=[IndexPart(store, "dedup/dump-1", "crawl/dump-1")],
                           config=CONFIG, work_dir=tmp_path / "work", out_dir=tmp_path / "out",
                           executor=LocalRunner(workers=1, tasks=2))
    assert files(tmp_path / "out") == files(second["out"])
    downloaded = tmp_path / "work" / "earlier" / "00" / "signatures.u32"
    assert downloaded.is_file() == (store.local_path("dedup") is None)


def test_documents_without_words_are_nobodys_near_duplicate_across_dumps(tmp_path):
    """Their band keys are unique within one run only (unit and line): another dump's at the same place must not
    match them. With exact matching off, two dumps of one wordless document keep both."""
    config = dataclasses.replace(CONFIG, exact=False)
    store = open_store(str(tmp_path / "store"))
    earlier = []
    for dump in (1, 2):
        shard = write_part(tmp_path / "in" / f"part-{dump}.jsonl.gz", [{"text": "...", "id": f"empty-{dump}"}])
        stats = deduplicate_sequential(sources=[("crawl", [shard])], earlier=earlier, config=config,
                                       work_dir=tmp_path / f"work-{dump}", out_dir=tmp_path / f"out-{dump}")
        assert stats.kept == {"crawl": 1}, dump
        commit_folder(store, f"dump-{dump}", tmp_path / f"out-{dump}", {"asset": "dedup"})
        earlier.append(IndexPart(store, f"dump-{dump}", f"crawl/dump-{dump}"))


@pytest.mark.parametrize("phase", ["match", "removal"])
def test_a_killed_phase_resumes_with_the_same_output(incremental, tmp_path, phase):
    run = incremental["runs"][3]
    executor = KillingRunner(phase, rank=1, marker=tmp_path / "killed.marker", workers=1, tasks=3)
    kwargs = dict(sources=run["sources"], earlier=run["earlier"], config=CONFIG, work_dir=tmp_path / "work",
                  out_dir=tmp_path / "out", executor=executor)
    with pytest.raises(RuntimeError, match="task 1 killed"):
        deduplicate_sequential(**kwargs)
    done = sorted(p.name for p in (tmp_path / "work" / "logs" / phase / "completions").iterdir())
    assert done == ["00000"]
    stats = deduplicate_sequential(**kwargs)
    assert files(tmp_path / "out") == files(run["out"]) and stats == run["stats"]
