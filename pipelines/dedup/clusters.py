"""The dedup stage's last two datatrove steps: clusters (one task, over document ids only) and removal (per task).

DedupClusters is the one step that sees the whole corpus, so it holds only numbers: a union-find parent per
document over the pairs of the bucket phase (exact and verified), then a cluster size per root; texts stay on
disk, and only cluster members' keys ((id, text hash), for the keep rule) are read, one unit at a time, into
a dict per duplicate cluster. The bytes it holds at its peak (the arrays' nbytes and the dict's sys.getsizeof,
counted where they are alive together: a figure every run gives alike) are its `held_bytes` stat, and the
manifest's counts.cluster_bytes_per_document. On 200,000 documents in 20 shards
(tests/pipelines/dedup/test_clusters.py): 17.0 bytes a document with no duplicates (the int64 parent array and
its pointer-jumping copy), 27.3 with a tenth of the documents in clusters of 2-4 (tracemalloc's peak: 28.5), 48.6
with three tenths: the keep rule's dict takes ~300 bytes per duplicate cluster. So 10^9 documents with a tenth of
them in clusters need about 30 GB in this one task.

DedupRemoval (a ShardRemoval, the rewrite the sequential rule's removal shares) rewrites each unit's shard: documents outside any cluster pass through as the same bytes, cluster
members get `metadata.dup_cluster` ("<source>/<id>" of the kept document) and `metadata.dup_cluster_size`, and
the removed ones `metadata.dedup_reason` (exact_duplicate when their text hash equals the kept document's, else
near_duplicate) and go to the removed file. File layout: pipelines/dedup/steps.py.
"""

from __future__ import annotations

import gzip
import json
import mmap
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import orjson
from datatrove.pipeline.base import PipelineStep

from storage.objects import write_atomic
from pipelines.dedup.steps import SHARD_COMPRESSLEVEL, Shard, output_names, read_unit_index, unit_file

PAIR_CHUNK = 1 << 22  # pairs merged at once (64 MB of int64 pairs)
KEEP = "keep"


class DedupClusters(PipelineStep):
    """Union-find over the pairs -> per unit clusters/UUUUU.jsonl: [line, label, size, "keep" | reason] for
    every member of a cluster of two or more, the kept one being the smallest (source position, id, text hash)."""

    type = "🫂 - DEDUP"
    name = "🎯 clusters"

    def __init__(self, sources: Sequence[str], buckets: Sequence[str], work_dir: Path):
        super().__init__()
        self.sources, self.buckets, self.work_dir = list(sources), list(buckets), Path(work_dir)

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        if world_size != 1:
            raise ValueError(f"dedup clusters: one task holds the union-find, got {world_size} tasks")
        with self.track_time("stage"):
            held = self._clusters()
        self.stat_update("held_bytes", value=held, unit="stage")
        return iter(())

    def _clusters(self) -> int:
        """Writes the plans; returns the bytes held at the step's peak: the arrays and the dict alive together
        (nbytes, sys.getsizeof), a count that is the same on every run, unlike an allocator's."""
        index = read_unit_index(self.work_dir)
        total, units = index["documents"], index["units"]
        parent = np.arange(total, dtype=np.int64)
        held = parent.nbytes
        for name in self.buckets:
            path = self.work_dir / "pairs" / f"{name}.npy"
            if not path.is_file():
                raise FileNotFoundError(f"dedup clusters: {path} is missing: the bucket phase has not completed")
            pairs = np.load(path, mmap_mode="r")
            for start in range(0, len(pairs), PAIR_CHUNK):
                chunk = np.array(pairs[start : start + PAIR_CHUNK], dtype=np.int64)
                held = max(held, parent.nbytes + chunk.nbytes)
                _union(parent, chunk[:, 0], chunk[:, 1])
        root = _roots(parent)
        held = max(held, 2 * root.nbytes + total)  # the pointer-jumping copy and its comparison
        del parent
        size = np.bincount(root, minlength=total)  # documents per root (0 for non-roots)
        held = max(held, root.nbytes + size.nbytes + total)
        clusters = np.bincount(size[size > 1])
        for n_docs in np.flatnonzero(clusters):
            self.stat_update(f"clusters_of_size_{n_docs}", value=int(clusters[n_docs]))
        self.stat_update("documents", value=total)

        # Pass 1: the keep rule, over cluster members only, one unit at a time.
        best: dict[int, tuple] = {}  # root -> (source index, id, text hash, global index) of the smallest member
        for unit, info in enumerate(units):
            source = self.sources.index(info["source"])
            offset = info["offset"]
            for line, doc_id, text_hash in self._members(unit, info, root, size):
                r = int(root[offset + line])
                candidate = (source, doc_id, text_hash, offset + line)
                if r not in best or candidate < best[r]:
                    best[r] = candidate
        held = max(held, root.nbytes + size.nbytes + _deep_size(best))
        # Pass 2: what happens to each member, written per unit (an empty file where a unit has none).
        (self.work_dir / "clusters").mkdir(parents=True, exist_ok=True)
        for unit, info in enumerate(units):
            members = 0
            tmp = unit_file(self.work_dir, "clusters", unit, ".jsonl.tmp")
            with open(tmp, "wb") as f:
                for line, _, text_hash in self._members(unit, info, root, size):
                    g = info["offset"] + line
                    r = int(root[g])
                    source, keeper_id, keeper_hash, keeper = best[r]
                    action = KEEP if g == keeper else "exact_duplicate" if text_hash == keeper_hash else "near_duplicate"
                    f.write(orjson.dumps([line, f"{self.sources[source]}/{keeper_id}", int(size[r]), action]) + b"\n")
                    members += 1
            tmp.replace(unit_file(self.work_dir, "clusters", unit, ".jsonl"))
            self.stat_update("cluster_members", value=members)
        return held

    def _members(self, unit: int, info: dict, root: np.ndarray, size: np.ndarray) -> Iterator[tuple[int, str, str]]:
        """(line, id, text hash) of the unit's documents in clusters of two or more, in line order: only their
        lines of the keys file are read (its index gives their byte offsets)."""
        offset, n = info["offset"], info["documents"]
        lines = np.flatnonzero(size[root[offset : offset + n]] > 1)
        if not len(lines):
            return
        bounds = np.memmap(unit_file(self.work_dir, "signatures", unit, ".keys_index"), dtype=np.uint64, mode="r")
        with open(unit_file(self.work_dir, "signatures", unit, ".keys.jsonl"), "rb") as f:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as keys:
                for line, start, stop in zip(lines.tolist(), bounds[lines].tolist(), bounds[lines + 1].tolist()):
                    doc_id, text_hash = orjson.loads(keys[start:stop])
                    yield line, doc_id, text_hash


def _deep_size(best: dict) -> int:
    """sys.getsizeof of the dict, its keys, its tuples and their items."""
    return sys.getsizeof(best) + sum(sys.getsizeof(r) + sys.getsizeof(t) + sum(map(sys.getsizeof, t))
                                     for r, t in best.items())


def _find(parent: np.ndarray, x: np.ndarray) -> np.ndarray:
    r = parent[x]
    while True:
        up = parent[r]
        if np.array_equal(up, r):
            return r
        r = up


def _union(parent: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Merge the sets of a[i] and b[i], vectorized: each round hooks the larger root of every differing pair
    under the smallest root proposed for it, until all pairs share a root. Roots only ever decrease, so the
    result (every set's root = its smallest member) does not depend on the order of the pairs."""
    while len(a):
        ra, rb = _find(parent, a), _find(parent, b)
        parent[a], parent[b] = ra, rb  # path compression for the nodes touched
        differ = ra != rb
        a, b = np.minimum(ra[differ], rb[differ]), np.maximum(ra[differ], rb[differ])
        np.minimum.at(parent, b, a)


def _roots(parent: np.ndarray) -> np.ndarray:
    """Every document's root, by pointer jumping (in place: parent becomes the roots)."""
    while True:
        up = parent[parent]
        if np.array_equal(up, parent):
            return parent
        parent = up


class ShardRemoval(PipelineStep):
    """Per unit: the shard rewritten to <source>/part-<shard>.jsonl.gz (kept) and <source>/removed-<shard>.jsonl.gz
    (removed), as its phase's plan says (work/<plan_phase>/UUUUU.jsonl: [line, *entry] per document it names);
    a document the plan does not name passes through as the same bytes. removal/UUUUU.json lists the files and
    their records. A rule's own removal says what an entry does to its document (`apply`)."""

    type = "🫂 - DEDUP"
    name = "🎯 removal"
    plan_phase = ""

    def __init__(self, units: Sequence[Shard], work_dir: Path, out_dir: Path):
        super().__init__()
        self.units, self.work_dir, self.out_dir = list(units), Path(work_dir), Path(out_dir)

    def apply(self, doc: dict, entry: list) -> str | None:
        """Sets the entry's metadata on `doc`; returns the removal reason, or None when the document is kept."""
        raise NotImplementedError

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        (self.work_dir / "removal").mkdir(parents=True, exist_ok=True)
        for unit in range(rank, len(self.units), world_size):
            with self.track_time("unit"):
                self._unit(unit)
        return iter(())

    def _unit(self, unit: int) -> None:
        shard = self.units[unit]
        plan_path = unit_file(self.work_dir, self.plan_phase, unit, ".jsonl")
        if not plan_path.is_file():
            raise FileNotFoundError(f"dedup removal: {plan_path} is missing: the {self.plan_phase} phase has not "
                                    "completed")
        plan = {row[0]: row[1:] for row in map(orjson.loads, plan_path.read_bytes().splitlines())}
        kept_name, removed_name = output_names(shard)
        kept, removed = _LazyGzip(self.out_dir / kept_name), _LazyGzip(self.out_dir / removed_name)
        reasons: Counter = Counter()
        try:
            for line, raw in enumerate(shard.lines()):
                entry = plan.get(line)
                if entry is None:
                    kept.write(raw.rstrip(b"\r\n") + b"\n")  # named by no plan: the same bytes
                    continue
                doc = orjson.loads(raw)
                doc.setdefault("metadata", {})
                reason = self.apply(doc, entry)
                if reason is None:
                    kept.write(orjson.dumps(doc) + b"\n")
                else:
                    removed.write(orjson.dumps(doc) + b"\n")
                    reasons[reason] += 1
        finally:
            kept.close()
            removed.close()
        self.stat_update(f"documents_in:{shard.source}", value=kept.records + removed.records)
        self.stat_update(f"kept:{shard.source}", value=kept.records)
        self.stat_update(f"removed:{shard.source}", value=removed.records)
        for reason, n in sorted(reasons.items()):
            self.stat_update(f"removed_{reason}", value=n)
        files = [{"path": name, "records": w.records}
                 for name, w in ((kept_name, kept), (removed_name, removed)) if w.records]
        write_atomic(unit_file(self.work_dir, "removal", unit, ".json"), [json.dumps({"files": files}).encode()])


class DedupRemoval(ShardRemoval):
    """The transitive rule's removal: cluster members get metadata.dup_cluster ("<source>/<id>" of the kept one) and
    dup_cluster_size; the removed ones metadata.dedup_reason."""

    plan_phase = "clusters"

    def apply(self, doc: dict, entry: list) -> str | None:
        label, size, action = entry
        doc["metadata"]["dup_cluster"] = label
        doc["metadata"]["dup_cluster_size"] = size
        if action == KEEP:
            return None
        doc["metadata"]["dedup_reason"] = action
        return action


class _LazyGzip:
    """A reproducible gzip file (no name, mtime 0, as pipelines/shards.py writes) created by its first line: a
    shard with no removed document gets no removed file. A file left by a killed task is overwritten."""

    def __init__(self, path: Path):
        self.path, self.records = path, 0
        self._raw = self._gzip = None

    def write(self, line: bytes) -> None:
        if self._gzip is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._raw = open(self.path, "wb")
            self._gzip = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, compresslevel=SHARD_COMPRESSLEVEL,
                                       mtime=0)
        self._gzip.write(line)
        self.records += 1

    def close(self) -> None:
        if self._gzip is not None:
            self._gzip.close()
            self._raw.close()
            self._gzip = self._raw = None
