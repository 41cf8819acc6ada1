"""The index a sequential dedup leaves for the parts after it, checked file by file against the kept documents of
a run on real C4/Dolma pages (their signatures, band keys and text hashes recomputed here from minhash.py's
primitives), and how an earlier part's index is opened."""

import dataclasses
import gzip
import json
import shutil

import numpy as np
import orjson
import pytest
import xxhash

from pipelines.dedup.index import IndexPart, open_earlier
from pipelines.dedup.config import DedupConfig
from pipelines.dedup.minhash import MinHasher, WordHasher, ngram_hashes, normalized_words
from pipelines.dedup.sequential import deduplicate_sequential
from pipelines.runner import LocalRunner
from storage.factory import open_store
from storage.manifest import commit_folder
from tests.conftest import SHARED_DATA
from tests.pipelines.dedup.test_minhash import edit_words, write_part

CONFIG = DedupConfig(rule="sequential")


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """One part of two sources: real pages, an exact and an edited copy, a document without words."""
    root = tmp_path_factory.mktemp("indexed")
    paths = sorted((SHARED_DATA / "jsonl").glob("*.json*.gz"))
    pages = [json.loads(line) for path in paths for line in gzip.open(path)]
    docs = [{"text": p["text"], "id": f"p{i:02d}", "metadata": {}} for i, p in enumerate(pages[:30])]
    long_page = next(d for d in docs if len(d["text"].split()) > 300)
    docs += [{**long_page, "id": "exact-copy"}, {"text": edit_words(long_page["text"], 2, seed=1), "id": "edited"},
             {"text": "... !!!", "id": "no-words", "metadata": {}}]
    sources = [("web", [write_part(root / "in" / "web" / "part-0.jsonl.gz", docs[:18])]),
               ("news", [write_part(root / "in" / "news" / "part-0.jsonl.gz", docs[18:26]),
                         write_part(root / "in" / "news" / "part-1.jsonl.gz", docs[26:])])]
    stats = deduplicate_sequential(sources=sources, earlier=[], config=CONFIG, work_dir=root / "work",
                                   out_dir=root / "out", executor=LocalRunner(workers=1, tasks=2))
    kept = [(source, orjson.loads(line)) for source, paths in sources for path in paths
            for line in gzip.open(root / "out" / source / path.name)]
    return {"root": root, "out": root / "out", "stats": stats, "kept": kept}


def recomputed(text: str):
    minhasher = MinHasher(CONFIG)
    words = normalized_words(text)
    text_hash = np.frombuffer(xxhash.xxh3_128_digest(" ".join(words)), dtype=">u8").astype(np.uint64)
    if not words:
        return text_hash, np.zeros(CONFIG.permutations, dtype=np.uint32), None
    sig = minhasher.signatures([np.unique(ngram_hashes(WordHasher()(words), CONFIG.ngram))])
    return text_hash, sig[0], minhasher.band_keys(sig)[0]


def test_the_index_holds_every_kept_document_by_row(indexed):
    index, kept = indexed["out"] / "index", indexed["kept"]
    assert len(kept) == sum(indexed["stats"].kept.values())
    assert indexed["stats"].removed == {"exact_duplicate": 1, "near_duplicate": 1}  # the two copies
    assert "no-words" in {doc["id"] for _, doc in kept}
    meta = json.loads((index / "meta.json").read_text())
    assert meta["kept"] == len(kept) and meta["rule"] == "sequential"
    assert meta["settings"] == {name: getattr(CONFIG, name) for name in
                                ("ngram", "bands", "rows", "seed", "exact", "near", "verify_threshold")}
    described = [recomputed(doc["text"]) for _, doc in kept]
    signatures = np.fromfile(index / "signatures.u32", dtype=np.uint32).reshape(len(kept), CONFIG.permutations)
    assert np.array_equal(signatures, np.stack([sig for _, sig, _ in described]))
    # Labels by row, each line found through the offsets.
    labels, offsets = (index / "labels.jsonl").read_bytes(), np.fromfile(index / "labels.offsets", dtype=np.uint64)
    assert [orjson.loads(labels[offsets[r] : offsets[r + 1]]) for r in range(len(kept))] == [
        f"{source}/{doc['id']}" for source, doc in kept]
    # Text hashes sorted by (hash, row); each row's hash its document's.
    hashes = np.fromfile(index / "exact.keys", dtype=np.uint64).reshape(-1, 2)
    rows = np.fromfile(index / "exact.rows", dtype=np.uint32)
    assert sorted(rows.tolist()) == list(range(len(kept)))
    assert [tuple(h) for h in hashes.tolist()] == sorted(tuple(h) for h in hashes.tolist())
    assert all(np.array_equal(hashes[i], described[r][0]) for i, r in enumerate(rows.tolist()))
    # Band keys of the documents with words only, sorted by (key, row).
    with_words = [r for r, (_, _, keys) in enumerate(described) if keys is not None]
    assert len(with_words) == len(kept) - 1
    for band in range(CONFIG.bands):
        keys = np.fromfile(index / f"band-{band:02d}.keys", dtype=np.uint64)
        rows = np.fromfile(index / f"band-{band:02d}.rows", dtype=np.uint32)
        assert list(zip(keys.tolist(), rows.tolist())) == sorted((int(described[r][2][band]), r) for r in with_words)


def test_an_earlier_index_is_opened_in_place_with_its_offset_and_labels(indexed, tmp_path):
    store = open_store(str(tmp_path / "store"))
    for name in ("one", "two"):
        commit_folder(store, f"dedup/{name}", indexed["out"], {"asset": "dedup"})
    parts = open_earlier([IndexPart(store, "dedup/one", "crawl/1"), IndexPart(store, "dedup/two", "crawl/2")], CONFIG,
                         tmp_path / "work")
    kept = len(indexed["kept"])
    assert [(p.name, p.kept, p.offset) for p in parts] == [("crawl/1", kept, 0), ("crawl/2", kept, kept)]
    assert parts[1].dir == str(tmp_path / "store" / "dedup" / "two" / "index")  # read where it is, not copied
    (first_source, first), (last_source, last) = indexed["kept"][0], indexed["kept"][-1]
    assert parts[1].labels([kept - 1, 0]) == [f"{last_source}/{last['id']}", f"{first_source}/{first['id']}"]
    assert not (tmp_path / "work" / "earlier").exists()


def test_an_index_of_another_format_or_settings_is_refused(indexed, tmp_path):
    copy = tmp_path / "store" / "dedup" / "old"
    shutil.copytree(indexed["out"], copy)
    meta = json.loads((copy / "index" / "meta.json").read_text())
    (copy / "index" / "meta.json").write_text(json.dumps({**meta, "format": 0}))
    part = IndexPart(open_store(str(tmp_path / "store")), "dedup/old", "crawl/old")
    with pytest.raises(ValueError, match="earlier part 'crawl/old': index format 0"):
        open_earlier([part], CONFIG, tmp_path / "work")
    (copy / "index" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"crawl/old.*dedup\.verify_threshold=.*this part with dedup\.verify_thr"):
        open_earlier([part], dataclasses.replace(CONFIG, verify_threshold=CONFIG.verify_threshold / 2), tmp_path / "w")
