"""The sequential dedup's index (pipelines/dedup/sequential.py): what a part kept, as files that the dedup of a
later part reads; the earlier parts as that dedup opens them; and the two steps that touch the index: IndexMatch
(a part's keys against themselves and against the earlier parts' index) and IndexWrite (the part's own index).

out_dir/index/ (committed with the part's documents, so it lands at <prefix>/index/ in the store); K = kept documents,
a row = a kept document's position among them in corpus order:
  signatures.u32   (K, bands*rows) uint32: every kept document's MinHash signature, by row
  band-BB.keys     (m,) uint64: band B's keys of the kept documents with words, sorted by (key, row), so the first
                   of a run of equal keys is the earliest document; band-BB.rows: (m,) uint32 their rows. A document
                   without words has no band key: it has no shingles, so it is nobody's near duplicate.
  exact.keys       (K, 2) uint64: text hashes (xxh3_128 as (high, low)), sorted by (hash, row); exact.rows (K,) uint32
  labels.jsonl     "<source>/<id>" of every kept document, a JSON string a line, by row; labels.offsets: (K + 1,)
                   uint64 byte offsets of its lines, so one row is read alone
  meta.json        {"format", "rule", "settings": {ngram, bands, rows, seed, exact, near, verify_threshold},
                   "kept"}: written after every other file; a later part refuses an index whose settings differ.
Raw little-endian arrays (numpy tofile): a reader memory-maps them and reads only the pages it touches. All files
are always written (exact hashes and band keys whatever dedup.exact and dedup.near say): a later part reads the
hashes to tell an exact duplicate from a near one, and the settings must agree anyway.

IndexWrite is the stage's last datatrove step: one piece per task unit (the signatures, the exact hashes, the
labels, each band), each written whole from the part's signature files (pipelines/dedup/steps.py) and the rule's
rule/kept.npy, so the bytes do not depend on the task count.
"""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import orjson
from datatrove.pipeline.base import PipelineStep

from pipelines.dedup.config import DedupConfig
from pipelines.dedup.minhash import estimated_jaccard
from pipelines.dedup.steps import no_words_key, read_signatures, read_unit_index, unit_file
from storage.objects import ObjectNotFoundError, ObjectStore, join_key, write_atomic

INDEX_FORMAT = 1
INDEX_DIR = "index"
META = "meta.json"
# The settings two parts must share: they decide signatures, band keys and what counts as a match.
INDEX_SETTINGS = ("ngram", "bands", "rows", "seed", "exact", "near", "verify_threshold")
MAX_KEPT = (1 << 32) - 1  # rows are uint32


@dataclass(frozen=True)
class IndexPart:
    """The committed output of an earlier part, read from the object store: its index is under f"{prefix}/index/"."""

    store: ObjectStore
    prefix: str  # store key prefix of that committed output
    name: str  # e.g. "crawl/2024-10": for messages


def index_settings(config: DedupConfig) -> dict:
    return {name: getattr(config, name) for name in INDEX_SETTINGS}


def index_files(config: DedupConfig) -> list[str]:
    """Every file of an index, meta.json last."""
    bands = [f"band-{b:02d}.{kind}" for b in range(config.bands) for kind in ("keys", "rows")]
    return ["signatures.u32", "exact.keys", "exact.rows", "labels.jsonl", "labels.offsets", *bands, META]


def write_meta(out_dir: Path, config: DedupConfig, kept: int) -> None:
    meta = {"format": INDEX_FORMAT, "rule": "sequential", "settings": index_settings(config), "kept": kept}
    write_atomic(Path(out_dir) / INDEX_DIR / META, [json.dumps(meta, indent=2, sort_keys=True).encode()])


def array(path: Path, dtype, shape: tuple) -> np.ndarray:
    """A read-only memory map of a raw array file (np.memmap refuses an empty file: an empty array then)."""
    if int(np.prod(shape)) == 0:
        return np.empty(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)


# ---------------------------------------------------------------------------------------------------------------
# Earlier parts, as the tasks read them


@dataclass(frozen=True)
class EarlierIndex:
    """An earlier part's index in a local folder (its store's own, or a download in the work folder); `offset` is
    the kept documents of the parts before it, so offset + row numbers every earlier kept document in corpus order."""

    name: str
    dir: str
    kept: int
    offset: int
    permutations: int

    def band(self, band: int) -> tuple[np.ndarray, np.ndarray]:
        keys = np.fromfile(Path(self.dir) / f"band-{band:02d}.keys", dtype=np.uint64)
        rows = array(Path(self.dir) / f"band-{band:02d}.rows", np.uint32, (len(keys),))
        return keys, rows

    def exact(self) -> tuple[np.ndarray, np.ndarray]:
        keys = array(Path(self.dir) / "exact.keys", np.uint64, (self.kept, 2))
        return keys, array(Path(self.dir) / "exact.rows", np.uint32, (self.kept,))

    def signatures(self) -> np.ndarray:
        return array(Path(self.dir) / "signatures.u32", np.uint32, (self.kept, self.permutations))

    def labels(self, rows: Sequence[int]) -> list[str]:
        """The "<source>/<id>" of these rows, each read alone through the offsets file."""
        if not len(rows):
            return []
        bounds = array(Path(self.dir) / "labels.offsets", np.uint64, (self.kept + 1,))
        with open(Path(self.dir) / "labels.jsonl", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return [orjson.loads(m[int(bounds[r]) : int(bounds[r + 1])]) for r in rows]


def open_earlier(earlier: Sequence[IndexPart], config: DedupConfig, work_dir: Path) -> list[EarlierIndex]:
    """Each earlier part's index, its settings checked against `config` (ValueError naming the part and the
    setting). A store with a local folder is read in place (never written); from any other each index is
    downloaded once into work_dir/earlier/NN/."""
    opened, offset = [], 0
    for n, part in enumerate(earlier):
        key = join_key(join_key(part.prefix, INDEX_DIR), META)
        try:
            meta = json.loads(part.store.get_bytes(key))
        except ObjectNotFoundError:
            raise ValueError(f"dedup: earlier part {part.name!r} has no {part.store.uri(key)}: it is not the output "
                             f"of a sequential dedup (dedup.rule: sequential)") from None
        if meta.get("format") != INDEX_FORMAT:
            raise ValueError(f"dedup: earlier part {part.name!r}: index format {meta.get('format')!r}, this code "
                             f"reads {INDEX_FORMAT}")
        ours = index_settings(config)
        for name, value in ours.items():
            if meta["settings"].get(name) != value:
                raise ValueError(f"dedup: earlier part {part.name!r} was deduplicated with dedup.{name}="
                                 f"{meta['settings'].get(name)!r}, this part with dedup.{name}={value!r}: its index "
                                 f"cannot be matched against (deduplicate it again with these settings)")
        folder = part.store.local_path(join_key(part.prefix, INDEX_DIR))
        if folder is None or not (folder / META).is_file():
            folder = Path(work_dir) / "earlier" / f"{n:02d}"
            # Its files, and last a record of where they came from: a resumed run reuses them, another part not.
            record = json.dumps({"uri": part.store.uri(part.prefix), "meta": meta}, sort_keys=True).encode()
            if not (folder / "from.json").is_file() or (folder / "from.json").read_bytes() != record:
                for name in index_files(config)[:-1]:
                    part.store.download(join_key(join_key(part.prefix, INDEX_DIR), name), folder / name)
                write_atomic(folder / "from.json", [record])
        opened.append(EarlierIndex(part.name, str(folder), int(meta["kept"]), offset, config.permutations))
        offset += int(meta["kept"])
    return opened


# ---------------------------------------------------------------------------------------------------------------
# This part's keys, as the match and index steps read them from the signature files


def part_band_keys(work_dir: Path, info: dict, band: int, bands: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys, global document indices) of band `band` over the part's documents with words, unit by unit."""
    keys, docs = [], []
    for unit, u in enumerate(info["units"]):
        n = u["documents"]
        if n == 0:
            continue
        sorted_keys = array(unit_file(work_dir, "signatures", unit, ".bands"), np.uint64, (bands, n))[band]
        lines = array(unit_file(work_dir, "signatures", unit, ".band_lines"), np.uint32, (bands, n))[band]
        words = sorted_keys != no_words_key(unit, lines)
        keys.append(np.array(sorted_keys[words]))
        docs.append(lines[words].astype(np.int64) + u["offset"])
    if not keys:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
    return np.concatenate(keys), np.concatenate(docs)


def part_text_hashes(work_dir: Path, info: dict) -> tuple[np.ndarray, np.ndarray]:
    """((n, 2) text hashes, global document indices) over the part's documents, unit by unit."""
    keys, docs = [np.empty((0, 2), dtype=np.uint64)], [np.empty(0, dtype=np.int64)]
    for unit, u in enumerate(info["units"]):
        n = u["documents"]
        keys.append(np.array(array(unit_file(work_dir, "signatures", unit, ".exact"), np.uint64, (n, 2))))
        lines = array(unit_file(work_dir, "signatures", unit, ".exact_lines"), np.uint32, (n,))
        docs.append(lines.astype(np.int64) + u["offset"])
    return np.concatenate(keys), np.concatenate(docs)


# ---------------------------------------------------------------------------------------------------------------
# The match phase: this part's keys against themselves and against the earlier parts' index


PAIR_CHUNK = 1 << 18  # candidate pairs verified at once: two (chunk, P) uint32 gathers, 117 MB each at P = 112


def match_units(config: DedupConfig) -> list[str]:
    """The match phase's units: the text hashes always (they tell an exact duplicate from a near one), the bands
    when dedup.near."""
    return ["exact"] + ([f"band-{b:02d}" for b in range(config.bands)] if config.near else [])


def _runs(same: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """(M, 2) int64 [run, document] for the members of every run of two or more equal sorted keys (`same[i]`: key
    i + 1 equals key i); runs are numbered by their first position."""
    if not same.any():
        return np.empty((0, 2), dtype=np.int64)
    member = np.zeros(len(docs), dtype=bool)
    member[1:] |= same
    member[:-1] |= same
    run = np.cumsum(np.concatenate([[True], ~same])) - 1
    return np.stack([run[member], docs[member]], axis=1).astype(np.int64)


def _pair_chunks(lo: np.ndarray, hi: np.ndarray, limit: int = PAIR_CHUNK):
    """For queries with candidate ranges [lo, hi): (first query, pair -> query offset, pair -> candidate index), in
    chunks of whole queries of about `limit` pairs, each query's candidates in order."""
    counts = hi - lo
    ends = np.cumsum(counts)
    start = 0
    while start < len(counts):
        base = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + limit, side="right")))
        c = counts[start:stop]
        owner = np.repeat(np.arange(stop - start), c)
        within = np.arange(len(owner)) - np.repeat(np.cumsum(c) - c, c)
        yield start, owner, lo[start:stop][owner] + within
        start = stop


class IndexMatch(PipelineStep):
    """Per unit (exact, band-BB): this part's runs of equal keys (work_dir/match/<unit>.runs.npy: [run, document]),
    and each document's earliest earlier kept match (match/<unit>.npy: its index over the earlier parts, or -1)."""

    type = "🫂 - DEDUP"
    name = "🎯 match"

    def __init__(self, matches: Sequence[str], config: DedupConfig, work_dir: Path, earlier: Sequence[EarlierIndex]):
        super().__init__()
        self.matches, self.config, self.work_dir, self.earlier = list(matches), config, Path(work_dir), list(earlier)

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        info = read_unit_index(self.work_dir)
        self._offsets = np.array([u["offset"] for u in info["units"]] + [info["documents"]], dtype=np.int64)
        self._counts = [u["documents"] for u in info["units"]]
        (self.work_dir / "match").mkdir(parents=True, exist_ok=True)
        for i in range(rank, len(self.matches), world_size):
            with self.track_time("unit"):
                self._match(self.matches[i], info)
        return iter(())

    def _match(self, name: str, info: dict) -> None:
        if name == "exact":
            keys, docs = part_text_hashes(self.work_dir, info)
            order = np.lexsort((docs, keys[:, 1], keys[:, 0]))
            keys, docs = keys[order], docs[order]
            same = np.all(keys[1:] == keys[:-1], axis=1)
        else:
            keys, docs = part_band_keys(self.work_dir, info, int(name.split("-")[1]), self.config.bands)
            order = np.lexsort((docs, keys))
            keys, docs = keys[order], docs[order]
            same = keys[1:] == keys[:-1]
        np.save(self.work_dir / "match" / f"{name}.runs.npy", _runs(same, docs))
        earliest = np.full(info["documents"], -1, dtype=np.int64)
        pending = np.arange(len(docs))  # sorted positions without a match in the parts searched so far
        for part in self.earlier:
            if not len(pending):
                break
            if part.kept:
                found, rows = self._search(part, name, keys, docs, pending)
                earliest[docs[found]] = part.offset + rows  # the first part that matches holds the earliest
                pending = pending[~np.isin(pending, found)]
        np.save(self.work_dir / "match" / f"{name}.npy", earliest)

    def _search(self, part: EarlierIndex, name: str, keys: np.ndarray, docs: np.ndarray,
                pending: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sorted positions among `pending`, the row of their earliest match) in one earlier part. Its keys are
        sorted by (key, row), so a query's candidates come earliest first and the first verified one is the match."""
        exact = name == "exact"
        if exact:
            theirs, rows = part.exact()
            first, needle = np.ascontiguousarray(theirs[:, 0]), keys[pending, 0]  # high halves; low ones checked
        else:
            theirs, rows = part.band(int(name.split("-")[1]))
            first, needle = theirs, keys[pending]
        lo, hi = np.searchsorted(first, needle, side="left"), np.searchsorted(first, needle, side="right")
        hit = hi > lo
        queries, lo, hi = pending[hit], lo[hit], hi[hit]
        found, found_rows = [np.empty(0, dtype=np.int64)], [np.empty(0, dtype=np.int64)]
        verify = not exact and self.config.verify_threshold > 0
        for start, owner, candidate in _pair_chunks(lo, hi):
            query = queries[start:][owner]
            their_rows = np.asarray(rows[candidate]).astype(np.int64)
            if exact:
                ok = theirs[candidate, 1] == keys[query, 1]
                self.stat_update("exact_pairs", value=int(ok.sum()))
            elif verify:
                ours = read_signatures(self.work_dir, self._offsets, self._counts, self.config.permutations,
                                       docs[query])
                ok = estimated_jaccard(np.asarray(part.signatures()[their_rows]), ours) >= self.config.verify_threshold
            else:
                ok = np.ones(len(candidate), dtype=bool)
            if not exact:
                self.stat_update("candidate_pairs", value=len(candidate))
                self.stat_update("verified_pairs", value=int(ok.sum()))
            _, first_ok = np.unique(owner[ok], return_index=True)
            found.append(query[ok][first_ok])
            found_rows.append(their_rows[ok][first_ok])
        return np.concatenate(found), np.concatenate(found_rows)


# ---------------------------------------------------------------------------------------------------------------
# The index phase


def index_pieces(config: DedupConfig) -> list[str]:
    """The index phase's units."""
    return ["signatures", "exact", "labels"] + [f"band-{b:02d}" for b in range(config.bands)]


class IndexWrite(PipelineStep):
    """Per piece: out_dir/index/<piece files> from the kept documents (work_dir/rule/kept.npy), rows in corpus order."""

    type = "🫂 - DEDUP"
    name = "🎯 index"

    def __init__(self, pieces: Sequence[str], config: DedupConfig, work_dir: Path, out_dir: Path):
        super().__init__()
        self.pieces, self.config, self.work_dir, self.out_dir = list(pieces), config, Path(work_dir), Path(out_dir)

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        info = read_unit_index(self.work_dir)
        path = self.work_dir / "rule" / "kept.npy"
        if not path.is_file():
            raise FileNotFoundError(f"dedup index: {path} is missing: the rule phase has not completed")
        kept = np.load(path)
        row = np.cumsum(kept, dtype=np.int64) - 1  # a kept document's row
        (self.out_dir / INDEX_DIR).mkdir(parents=True, exist_ok=True)
        for i in range(rank, len(self.pieces), world_size):
            with self.track_time("piece"):
                self._piece(self.pieces[i], info, kept, row)
        return iter(())

    def _write(self, name: str, *arrays: np.ndarray) -> None:
        write_atomic(self.out_dir / INDEX_DIR / name, [a.tobytes() for a in arrays])

    def _piece(self, piece: str, info: dict, kept: np.ndarray, row: np.ndarray) -> None:
        if piece == "signatures":
            def rows_of_units():  # one unit's kept signatures in memory at a time
                for unit, u in enumerate(info["units"]):
                    sig = array(unit_file(self.work_dir, "signatures", unit, ".sig"), np.uint32,
                                (u["documents"], self.config.permutations))
                    yield sig[kept[u["offset"] : u["offset"] + u["documents"]]].tobytes()
            write_atomic(self.out_dir / INDEX_DIR / "signatures.u32", rows_of_units())
        elif piece == "exact":
            keys, docs = part_text_hashes(self.work_dir, info)
            keys, rows = keys[kept[docs]], row[docs[kept[docs]]]
            order = np.lexsort((rows, keys[:, 1], keys[:, 0]))
            self._write("exact.keys", keys[order])
            self._write("exact.rows", rows[order].astype(np.uint32))
        elif piece == "labels":
            self._labels(info, kept)
        else:
            band = int(piece.split("-")[1])
            keys, docs = part_band_keys(self.work_dir, info, band, self.config.bands)
            keys, rows = keys[kept[docs]], row[docs[kept[docs]]]
            order = np.lexsort((rows, keys))
            self._write(f"band-{band:02d}.keys", keys[order])
            self._write(f"band-{band:02d}.rows", rows[order].astype(np.uint32))
        self.stat_update(f"index_{piece.split('-')[0]}")

    def _labels(self, info: dict, kept: np.ndarray) -> None:
        lines, offsets = [], [0]
        for unit, u in enumerate(info["units"]):
            keys = unit_file(self.work_dir, "signatures", unit, ".keys.jsonl").read_bytes().splitlines()
            for line in np.flatnonzero(kept[u["offset"] : u["offset"] + u["documents"]]).tolist():
                lines.append(orjson.dumps(f"{u['source']}/{orjson.loads(keys[line])[0]}") + b"\n")
                offsets.append(offsets[-1] + len(lines[-1]))
        write_atomic(self.out_dir / INDEX_DIR / "labels.jsonl", lines)
        self._write("labels.offsets", np.array(offsets, dtype=np.uint64))
