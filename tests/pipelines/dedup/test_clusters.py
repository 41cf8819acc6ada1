"""The clusters step (union-find over document ids, the keep rule, what it holds per document) and the removal step."""

import gzip
import json
import random
import tracemalloc
from pathlib import Path

import numpy as np
import orjson
import pytest

from pipelines.dedup.clusters import DedupClusters, DedupRemoval, _roots, _union
from pipelines.dedup.steps import Shard, unit_file
from tests.pipelines.dedup.test_minhash import c4_docs, write_part  # noqa: F401  (c4_docs: a fixture)


def reference_components(n: int, pairs: list[tuple[int, int]]) -> list[int]:
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = find(a), find(b)
        parent[max(ra, rb)] = min(ra, rb)
    return [find(x) for x in range(n)]


def test_the_vectorized_union_find_gives_each_set_its_smallest_member_in_any_pair_order():
    rng = random.Random(0)
    n = 5000
    pairs = [(rng.randrange(n), rng.randrange(n)) for _ in range(3000)]
    pairs += [(i, i + 1) for i in range(100, 400)]  # a long chain
    pairs += [(4000, j) for j in range(4001, 4200)]  # a star
    expected = reference_components(n, pairs)
    for seed in range(3):
        shuffled = pairs[:]
        random.Random(seed).shuffle(shuffled)
        parent = np.arange(n, dtype=np.int32)
        for start in range(0, len(shuffled), 700):  # in chunks, as the step reads pair files
            chunk = np.array(shuffled[start : start + 700], dtype=np.int32)
            _union(parent, chunk[:, 0], chunk[:, 1])
        assert _roots(parent).tolist() == expected


def write_work(work: Path, units: list[tuple[str, list[tuple[str, str]]]], pairs: np.ndarray) -> None:
    """The files the clusters step reads: units.json, each unit's keys (id, text hash) and one pairs file."""
    (work / "signatures").mkdir(parents=True)
    (work / "pairs").mkdir()
    rows, offset = [], 0
    for unit, (source, keys) in enumerate(units):
        lines = [orjson.dumps(list(k)) + b"\n" for k in keys]
        unit_file(work, "signatures", unit, ".keys.jsonl").write_bytes(b"".join(lines))
        np.cumsum([0] + [len(x) for x in lines], dtype=np.uint64).tofile(unit_file(work, "signatures", unit, ".keys_index"))
        rows.append({"source": source, "shard": f"{source}-{unit}", "documents": len(keys), "offset": offset})
        offset += len(keys)
    (work / "units.json").write_text(json.dumps({"documents": offset, "partitions": 1, "units": rows}))
    np.save(work / "pairs" / "exact-000.npy", pairs.astype(np.int64))


def totals(step) -> dict:
    """{stat: total} of a step's stats (datatrove writes a lone value as a number, else a summary)."""
    return {k: v["total"] if isinstance(v, dict) else v for k, v in step.stats.to_dict()["stats"].items()}


def plans(work: Path, count: int) -> list[list]:
    return [[orjson.loads(x) for x in unit_file(work, "clusters", u, ".jsonl").read_bytes().splitlines()]
            for u in range(count)]


def test_the_smallest_source_position_then_id_then_text_hash_is_kept(tmp_path):
    # Sources in recipe order: a, b. Global indices: unit 0 (b) 0-2, unit 1 (a) 3-5, unit 2 (b) 6-7.
    units = [("b", [("x9", "01"), ("solo", "02"), ("m", "05")]),
             ("a", [("z", "03"), ("y", "04"), ("k", "05")]),
             ("b", [("x1", "01"), ("x1", "00")])]
    write_work(tmp_path, units, np.array([[0, 4], [4, 3], [6, 7], [0, 6], [2, 5]]))
    step = DedupClusters(["a", "b"], ["exact-000"], tmp_path)
    step.run()
    rows = plans(tmp_path, 3)
    # {0, 3, 4, 6, 7}: source a wins, then id "y" < "z"; {2, 5}: a/k; "solo" is in no cluster.
    assert rows[0] == [[0, "a/y", 5, "near_duplicate"], [2, "a/k", 2, "exact_duplicate"]]
    assert rows[1] == [[0, "a/y", 5, "near_duplicate"], [1, "a/y", 5, "keep"], [2, "a/k", 2, "keep"]]
    assert rows[2] == [[0, "a/y", 5, "near_duplicate"], [1, "a/y", 5, "near_duplicate"]]
    stats = totals(step)
    assert stats["clusters_of_size_5"] == 1 and stats["clusters_of_size_2"] == 1
    assert stats["documents"] == 8 and stats["cluster_members"] == 7
    # Ties on (source, id) go to the text hash: the two "x1" of source b, alone in their cluster.
    write_work(tmp_path / "tie", units, np.array([[6, 7]]))
    DedupClusters(["a", "b"], ["exact-000"], tmp_path / "tie").run()
    assert plans(tmp_path / "tie", 3)[2] == [[0, "b/x1", 2, "near_duplicate"], [1, "b/x1", 2, "keep"]]


def test_what_the_clusters_step_holds_per_document(tmp_path):
    """200,000 documents in 20 shards, a tenth of them in clusters of 2-4: the bytes the step counts as held per
    document are what pipelines/dedup/clusters.py states, and near what tracemalloc sees at its peak."""
    rng = np.random.default_rng(0)
    n_units, per_unit = 20, 10_000
    total = n_units * per_unit
    units = [("web", [(f"doc-{u}-{i}", f"{rng.integers(1 << 60):032x}") for i in range(per_unit)]) for u in range(n_units)]
    members = rng.choice(total, size=total // 10, replace=False)
    groups = np.split(members, np.cumsum(rng.integers(2, 5, size=len(members) // 3)))
    pairs = np.array([[g[0], x] for g in groups if len(g) > 1 for x in g[1:]])
    write_work(tmp_path, units, pairs)
    step = DedupClusters(["web"], ["exact-000"], tmp_path)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        step.run()
        peak = (tracemalloc.get_traced_memory()[1] - base) / total
    finally:
        tracemalloc.stop()
    held = totals(step)["held_bytes"] / total
    assert 25 <= held <= 30, held
    assert 0.6 * peak <= held <= 1.05 * peak, (held, peak)
    print(f"clusters step: {held:.1f} bytes per document held (tracemalloc's peak: {peak:.1f})")


def test_the_clusters_step_is_one_task(tmp_path):
    with pytest.raises(ValueError, match="one task holds the union-find"):
        DedupClusters(["a"], [], tmp_path).run(rank=0, world_size=2)


def test_a_missing_pairs_file_is_named(tmp_path):
    write_work(tmp_path / "w", [("a", [("x", "00")])], np.empty((0, 2)))
    with pytest.raises(FileNotFoundError, match="band-00-000.npy is missing"):
        DedupClusters(["a"], ["exact-000", "band-00-000"], tmp_path / "w").run()


def test_removal_adds_the_cluster_metadata_and_passes_the_rest_through_unchanged(tmp_path, c4_docs):  # noqa: F811
    shard = Shard("web", str(write_part(tmp_path / "in" / "part-00003.jsonl.gz", c4_docs[:5])))
    (tmp_path / "clusters").mkdir()
    unit_file(tmp_path, "clusters", 0, ".jsonl").write_bytes(
        b'[1,"web/a",3,"keep"]\n[4,"web/a",3,"exact_duplicate"]\n')
    step = DedupRemoval([shard], tmp_path, tmp_path / "out")
    step.run()
    kept = gzip.decompress((tmp_path / "out" / "web" / "part-00003.jsonl.gz").read_bytes()).splitlines(keepends=True)
    source = gzip.decompress(Path(shard.path).read_bytes()).splitlines(keepends=True)
    assert kept[0] == source[0] and kept[2:] == source[2:4]  # byte for byte
    assert orjson.loads(kept[1])["metadata"] == {**c4_docs[1]["metadata"], "dup_cluster": "web/a", "dup_cluster_size": 3}
    removed = [orjson.loads(x) for x in gzip.decompress((tmp_path / "out" / "web" / "removed-00003.jsonl.gz").read_bytes()).splitlines()]
    assert [d["id"] for d in removed] == [c4_docs[4]["id"]]
    assert removed[0]["metadata"]["dedup_reason"] == "exact_duplicate"
    assert json.loads(unit_file(tmp_path, "removal", 0, ".json").read_text()) == {"files": [
        {"path": "web/part-00003.jsonl.gz", "records": 4}, {"path": "web/removed-00003.jsonl.gz", "records": 1}]}
    stats = totals(step)
    assert stats["documents_in:web"] == 5 and stats["kept:web"] == 4 and stats["removed_exact_duplicate"] == 1


def test_removal_without_the_clusters_phase_names_the_file(tmp_path, c4_docs):  # noqa: F811
    shard = Shard("web", str(write_part(tmp_path / "in" / "part-00000.jsonl.gz", c4_docs[:2])))
    with pytest.raises(FileNotFoundError, match="clusters/00000.jsonl is missing"):
        DedupRemoval([shard], tmp_path, tmp_path / "out").run()
