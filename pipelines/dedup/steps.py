"""The dedup stage's four datatrove steps (pipelines/dedup/stage.py runs them in order) and the files they pass on.

The input units are the upstream shards of every source, in recipe order (`Shard`). In the per-unit phases
(signatures, removal) task `rank` handles units rank, rank + world_size, ...; the bucket phase splits its bucket
units the same way. Every file is named after its unit, never after a rank, and a document's identity is (unit,
line), its global index the unit's offset (the documents of the units before it) plus its line: so every file,
intermediate or output, holds the same bytes whatever the task count, and a killed phase run again redoes only
the units of the tasks that did not complete.

work_dir/
  signatures/UUUUU.sig          (n, bands*rows) uint32 MinHash signatures, in line order
  signatures/UUUUU.bands        (bands, n) uint64 band keys, each band sorted; .band_lines: (bands, n) uint32 lines
  signatures/UUUUU.exact        (n, 2) uint64 text hashes, sorted; .exact_lines: (n,) uint32 their lines
  signatures/UUUUU.keys.jsonl   [id, text hash hex] per line: what the keep rule and the removal reason read;
                                .keys_index: (n + 1,) uint64 byte offsets of its lines, so members are read alone
  signatures/UUUUU.json         {"source", "shard", "documents"}, written last: the unit is complete
  units.json                    every unit with its documents and offset (dedup_stage writes it after phase 1)
  pairs/<bucket>.npy            (K, 2) int64 pairs of global indices: exact-KKK, band-BB-KKK (verified)
  clusters/UUUUU.jsonl          [line, cluster label, cluster size, "keep" | reason] per cluster member
  removal/UUUUU.json            the unit's output files and their records
out_dir/<source>/part-<shard>.jsonl.gz (kept) and <source>/removed-<shard>.jsonl.gz (removed), where <shard> is
the input file's name without "part-" and ".jsonl.gz"; a file with no document is not written.
"""

from __future__ import annotations

import gzip
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterator, Sequence

import numpy as np
import orjson
import xxhash
from datatrove.pipeline.base import PipelineStep

from storage.objects import write_atomic
from pipelines.dedup.config import DedupConfig
from pipelines.dedup.minhash import MinHasher, WordHasher, estimated_jaccard, ngram_hashes, normalized_words, run_pairs
from pipelines.inputs import as_input, open_input
from storage.objects import ObjectStore

SHARD_COMPRESSLEVEL = 1  # dedup's outputs are rewritten by decontamination: speed over size
_EMPTY_KEY = np.uint64(1 << 63)  # band keys of documents without words: unique, so they never collide
_SUFFIXES = (".jsonl.gz", ".json.gz", ".jsonl", ".json")


@dataclass(frozen=True)
class Shard:
    """One input unit: a JSON-lines file (gzip if its name ends in .gz) of one source's documents, read from the
    object store (`store` and its key) or else from a local path or fsspec URL. Picklable (S3 stores rebuild
    their client), so Ray and Slurm tasks stream their own shards straight from the store."""

    source: str
    path: str
    store: ObjectStore | None = None

    @property
    def stem(self) -> str:
        """The name the outputs take: part-00003.jsonl.gz -> 00003."""
        name = PurePosixPath(str(self.path)).name
        for suffix in _SUFFIXES:
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        return name.removeprefix("part-")

    @contextmanager
    def open(self) -> Iterator[BinaryIO]:
        # From the store, or a path or URL as raw ingest reads them (S3 settings from the AWS_* variables).
        raw = self.store.open_read(self.path) if self.store is not None else open_input(as_input(self.path))
        try:
            if str(self.path).endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                    yield f
            else:
                yield raw
        finally:
            raw.close()

    def lines(self) -> Iterator[bytes]:
        """The shard's documents as raw JSON lines; blank lines are not documents (as pipelines/shards.py reads)."""
        with self.open() as f:
            for line in f:
                if line.strip():
                    yield line


def output_names(shard: Shard) -> tuple[str, str]:
    """(kept file, removed file) under out_dir for the documents of `shard`."""
    return f"{shard.source}/part-{shard.stem}.jsonl.gz", f"{shard.source}/removed-{shard.stem}.jsonl.gz"


def unit_file(work_dir: Path, folder: str, unit: int, suffix: str) -> Path:
    return Path(work_dir) / folder / f"{unit:05d}{suffix}"


def read_unit_index(work_dir: Path) -> dict:
    """units.json: {"documents": N, "partitions": P, "units": [{"source", "shard", "documents", "offset"}]}."""
    path = Path(work_dir) / "units.json"
    if not path.is_file():
        raise FileNotFoundError(f"dedup: {path} is missing: the signature phase has not completed")
    return json.loads(path.read_text())


def _my_units(count: int, rank: int, world_size: int) -> range:
    return range(rank, count, world_size)


def no_words_key(unit: int, lines: np.ndarray) -> np.ndarray:
    """The band key (the same in every band) of the documents without words at these lines of the unit: unique
    within one run, so they never collide there. Sequential dedup, which compares keys across runs, leaves them out."""
    return _EMPTY_KEY | (np.uint64(unit) << np.uint64(32)) | np.asarray(lines).astype(np.uint64)


def read_signatures(work_dir: Path, offsets: np.ndarray, counts: Sequence[int], permutations: int,
                    ids: np.ndarray) -> np.ndarray:
    """(K, P) signatures of global document indices (`offsets`: each unit's first index, then the total), read
    from the units' signature files."""
    out = np.empty((len(ids), permutations), dtype=np.uint32)
    if not len(ids):
        return out
    units = np.searchsorted(offsets, ids, side="right") - 1
    order = np.argsort(units, kind="stable")
    bounds = np.flatnonzero(np.diff(units[order])) + 1
    for chunk in np.split(order, bounds):
        unit = int(units[chunk[0]])
        # Mapped for this read only: a bucket may touch every shard, and each map holds a file descriptor.
        signatures = np.memmap(unit_file(work_dir, "signatures", unit, ".sig"), dtype=np.uint32, mode="r",
                               shape=(counts[unit], permutations))
        out[chunk] = signatures[ids[chunk] - offsets[unit]]
        del signatures
    return out


# ---------------------------------------------------------------------------------------------------------------
# Phase 1: signatures, per task over its units


class DedupSignatures(PipelineStep):
    """Per unit: signatures, per-band sorted band keys, sorted text hashes and the (id, text hash) keys."""

    type = "🫂 - DEDUP"
    name = "🎯 signatures"

    def __init__(self, units: Sequence[Shard], config: DedupConfig, work_dir: Path):
        super().__init__()
        self.units, self.config, self.work_dir = list(units), config, Path(work_dir)

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        (self.work_dir / "signatures").mkdir(parents=True, exist_ok=True)
        hasher, minhasher = WordHasher(), MinHasher(self.config)  # made here: the step stays small to pickle
        for unit in _my_units(len(self.units), rank, world_size):
            with self.track_time("unit"):
                self._unit(unit, hasher, minhasher)
        return iter(())

    def _unit(self, unit: int, hasher: WordHasher, minhasher: MinHasher) -> None:
        config, shard = self.config, self.units[unit]
        path = lambda suffix: unit_file(self.work_dir, "signatures", unit, suffix)  # noqa: E731
        band_keys: list[np.ndarray] = []
        exact_hashes: list[bytes] = []
        batch: list[np.ndarray] = []  # shingle sets of the batch's documents with words
        batch_rows: list[int] = []  # their line within the batch (documents without words get no signature)
        state = {"lines": 0, "batch_start": 0, "shingles": 0}

        def flush(sig_file):
            start, count = state["batch_start"], state["lines"] - state["batch_start"]
            sigs = np.zeros((count, config.permutations), dtype=np.uint32)
            keys = np.zeros((count, config.bands), dtype=np.uint64)
            if batch:
                sigs[batch_rows] = minhasher.signatures(batch)
                keys[batch_rows] = minhasher.band_keys(sigs[batch_rows])
            empty = np.setdiff1d(np.arange(count), batch_rows)
            keys[empty] = no_words_key(unit, start + empty)[:, None]
            sig_file.write(sigs.tobytes())
            band_keys.append(keys)
            batch.clear()
            batch_rows.clear()
            state["batch_start"], state["shingles"] = state["lines"], 0

        key_offsets = [0]
        with open(path(".sig"), "wb") as sig_file, open(path(".keys.jsonl"), "wb") as key_file:
            for line in shard.lines():
                doc = orjson.loads(line)
                words = normalized_words(doc.get("text") or "")
                exact = xxhash.xxh3_128_digest(" ".join(words))
                exact_hashes.append(exact)
                key = orjson.dumps([str(doc.get("id", "")), exact.hex()]) + b"\n"
                key_offsets.append(key_offsets[-1] + key_file.write(key))
                if words:
                    shingles = np.unique(ngram_hashes(hasher(words), config.ngram))
                    batch.append(shingles)
                    batch_rows.append(state["lines"] - state["batch_start"])
                    state["shingles"] += len(shingles)
                else:
                    self.stat_update("documents_without_words")
                state["lines"] += 1
                if state["shingles"] >= config.batch_shingles:
                    flush(sig_file)
            flush(sig_file)
        n = state["lines"]
        np.array(key_offsets, dtype=np.uint64).tofile(path(".keys_index"))
        if n >= 1 << 32:
            raise ValueError(f"dedup: {shard.path} has {n} documents; a shard may hold at most 2**32 - 1")
        keys = np.concatenate(band_keys).T  # (bands, n)
        order = np.argsort(keys, axis=1, kind="stable")
        np.take_along_axis(keys, order, axis=1).tofile(path(".bands"))
        order.astype(np.uint32).tofile(path(".band_lines"))
        # The 128-bit digests as (high, low) uint64 so they sort as numbers.
        exact = np.frombuffer(b"".join(exact_hashes), dtype=">u8").astype(np.uint64).reshape(n, 2)
        order = np.lexsort((exact[:, 1], exact[:, 0]))
        exact[order].tofile(path(".exact"))
        order.astype(np.uint32).tofile(path(".exact_lines"))
        write_atomic(path(".json"), [json.dumps({"source": shard.source, "shard": str(shard.path), "documents": n}).encode()])
        self.stat_update("documents", value=n)


# ---------------------------------------------------------------------------------------------------------------
# Phase 2: buckets, per band and key range, in parallel


def bucket_units(config: DedupConfig, partitions: int) -> list[str]:
    """The bucket phase's units: exact-KKK (text hashes in key range K), band-BB-KKK (band B's keys in range K)."""
    exact = [f"exact-{k:03d}" for k in range(partitions)] if config.exact else []
    near = [f"band-{b:02d}-{k:03d}" for b in range(config.bands) for k in range(partitions)] if config.near else []
    return exact + near


class DedupBuckets(PipelineStep):
    """Per bucket unit: the keys in its range from every unit's sorted file, sorted together; runs of equal keys
    give pairs (each member to its run's first and to its predecessor). Band pairs are verified with the
    signatures (estimated Jaccard >= verify_threshold) before they are written; exact pairs need none."""

    type = "🫂 - DEDUP"
    name = "🎯 buckets"

    def __init__(self, buckets: Sequence[str], config: DedupConfig, work_dir: Path):
        super().__init__()
        self.buckets, self.config, self.work_dir = list(buckets), config, Path(work_dir)

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        index = read_unit_index(self.work_dir)
        self._offsets = np.array([u["offset"] for u in index["units"]] + [index["documents"]], dtype=np.int64)
        self._counts = [u["documents"] for u in index["units"]]
        (self.work_dir / "pairs").mkdir(parents=True, exist_ok=True)
        for i in _my_units(len(self.buckets), rank, world_size):
            with self.track_time("bucket"):
                name = self.buckets[i]
                pairs = self._bucket(name, index["partitions"])
                np.save(self.work_dir / "pairs" / f"{name}.npy", pairs)
        return iter(())

    def _bucket(self, name: str, partitions: int) -> np.ndarray:
        kind, *numbers = name.split("-")
        band, part = (int(numbers[0]), int(numbers[1])) if kind == "band" else (None, int(numbers[0]))
        low = np.uint64((part << 64) // partitions)
        high = None if part == partitions - 1 else np.uint64(((part + 1) << 64) // partitions)
        keys, keys2, ids = [], [], []
        for unit, n in enumerate(self._counts):
            if n == 0:
                continue
            file = lambda suffix: unit_file(self.work_dir, "signatures", unit, suffix)  # noqa: E731
            if kind == "band":
                sorted_keys = np.memmap(file(".bands"), dtype=np.uint64, mode="r", shape=(self.config.bands, n))[band]
                lines = np.memmap(file(".band_lines"), dtype=np.uint32, mode="r", shape=(self.config.bands, n))[band]
                first = sorted_keys
            else:
                sorted_keys = np.memmap(file(".exact"), dtype=np.uint64, mode="r", shape=(n, 2))
                lines = np.memmap(file(".exact_lines"), dtype=np.uint32, mode="r", shape=(n,))
                first = sorted_keys[:, 0]
            start = np.searchsorted(first, low, side="left")
            stop = n if high is None else np.searchsorted(first, high, side="left")
            if kind == "band":
                keys.append(np.array(sorted_keys[start:stop]))
            else:
                keys.append(np.array(sorted_keys[start:stop, 0]))
                keys2.append(np.array(sorted_keys[start:stop, 1]))
            ids.append(lines[start:stop].astype(np.int64) + self._offsets[unit])
        if not keys:
            return np.empty((0, 2), dtype=np.int64)
        key, ids = np.concatenate(keys), np.concatenate(ids)
        if kind == "band":
            order = np.lexsort((ids, key))  # equal keys by global index: the same order for any task count
            pairs = _unique_pairs(run_pairs(key[order], ids[order]))
            self.stat_update("candidate_pairs", value=len(pairs))
            if len(pairs) and self.config.verify_threshold > 0:
                agree = estimated_jaccard(self._gather(pairs[:, 0]), self._gather(pairs[:, 1]))
                pairs = pairs[agree >= self.config.verify_threshold]
            self.stat_update("verified_pairs", value=len(pairs))
            return pairs
        key2 = np.concatenate(keys2)
        order = np.lexsort((ids, key2, key))
        pairs = _unique_pairs(run_pairs(key[order], ids[order], key2[order]))
        self.stat_update("exact_pairs", value=len(pairs))
        return pairs

    def _gather(self, ids: np.ndarray) -> np.ndarray:
        """(K, P) signatures of global indices, read from the units' signature files."""
        return read_signatures(self.work_dir, self._offsets, self._counts, self.config.permutations, ids)


def _unique_pairs(pairs: np.ndarray) -> np.ndarray:
    """Distinct (a < b) pairs, sorted."""
    if not len(pairs):
        return np.empty((0, 2), dtype=np.int64)
    pairs = np.sort(pairs, axis=1)
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    pairs = pairs[order]
    keep = np.concatenate([[True], np.any(pairs[1:] != pairs[:-1], axis=1)])
    return pairs[keep]
