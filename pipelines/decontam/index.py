"""Decontamination: remove benchmark text from training documents by n-gram overlap.

    index = BenchmarkIndex.build([Path("benchmarks/gsm8k_test.jsonl"), ...], ngram=13, min_letter_words=0.5)
    stats = decontaminate(inputs=[Path("dedup/web/part-00000.jsonl.gz")], index=index,
                          config=DecontamConfig(action="drop"), out_dir=Path("out"))
    # as datatrove tasks over store parts (the asset's way, pipelines/decontam/steps.py): the index built once
    # and saved, each task maps it
    index.save(work / "benchmarks.index")
    steps = [DecontamShards(store=store, keys=keys, index_path=work / "benchmarks.index", config=config, output_dir=out)]

Every benchmark item is turned into the texts a web page would contain (question with each choice and with all
choices together, context with its continuation, prompt with its solution, ...: pipelines/decontam/items.py),
normalized like dedup does (NFKC, case-folded, words of \\w+), and each run of `ngram` words is hashed to uint64
into one sorted array, with the benchmark and the item (one uint32 into the index's item ids) it came from. A
document's n-grams are hashed the same way and looked up with one vectorized searchsorted.
Every hit is reported (`DecontamStats.report`, `report_line`): the part, the document's id, what was done to it
(dropped or cut), the benchmark, the item's id and the matched text of each run of matching n-grams.
A document with any hit is dropped (action "drop", written to removed-NNNNN.jsonl.gz with its benchmarks) or has
the character spans of its matching n-grams cut out (action "cut"; a document left with no words is dropped).
Each input part gives its own outputs, named after it (part-00003.jsonl.gz -> part-00003.jsonl.gz and
removed-00003.jsonl.gz; none when it has no such document), documents in input order: the files do not depend
on how many tasks share the parts. A task's counts go to datatrove's stats (pipelines/decontam/steps.py).
Items shorter than `ngram` words cannot be matched by n-grams and are counted in `index.short_items`; n-grams
mostly of numbers are not indexed (`min_letter_words`): number runs are common to MATH and to all code.

Long because the index (its build, the file its tasks map, its lookups) and the scan of one part are one piece:
the scan's hashing, spans and hit reports read the index's arrays and item ids as they are laid out here.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterable, Sequence

import numpy as np
import orjson

from pipelines.decontam.config import DecontamConfig
from pipelines.decontam.items import benchmark_items, benchmark_name
from pipelines.dedup.minhash import WORD, WordHasher, ngram_hashes, normalized_words
from pipelines.shards import GzipLines, iter_documents

SHARD_COMPRESSLEVEL = 1  # as dedup's: intermediate data, speed over size (changing it changes every output byte)


# The prefilter: one bit per value of an n-gram hash's top PREFILTER_BITS bits, set where some benchmark n-gram has
# them (2**26 bits = 8 MiB, about 5% set by 3.7M benchmark n-grams). A document's n-grams are looked up in the sorted
# hashes only where their bit is set: a binary search over tens of MB misses the caches at each of its last ~10
# levels, and with every core scanning, memory, not arithmetic, set the pace (measured: half a task's time, and
# each of 2 concurrent tasks ~12% slower than one alone).
PREFILTER_BITS = 26
# Of the saved index (2: with its prefilter; 3: each n-gram's item, multiple-choice items also with their choices
# together; 4: one file whose arrays are mapped, not read: BenchmarkIndex.save); a cache of the index keys on it.
INDEX_FORMAT = 4
INDEX_MAGIC = b"DCIDX\x00\x00" + bytes([INDEX_FORMAT])  # a file of another format is refused by its start
INDEX_ARRAYS = ("hashes", "owners", "item_of", "prefilter")
INDEX_ALIGN = 64  # bytes: each array starts on a cache line


def _aligned(n: int) -> int:
    return -(-n // INDEX_ALIGN) * INDEX_ALIGN


@dataclass
class BenchmarkIndex:
    names: list[str]  # benchmark names, by index
    hashes: np.ndarray  # (M,) uint64 n-gram hashes, sorted
    owners: np.ndarray  # (M,) uint16 benchmark index of each hash (a hash in two benchmarks appears twice)
    ngram: int
    items: dict[str, int] = field(default_factory=dict)  # texts indexed per benchmark
    short_items: dict[str, int] = field(default_factory=dict)  # texts shorter than ngram words, not indexed
    prefilter: np.ndarray | None = None  # (2**PREFILTER_BITS / 8,) uint8 bitmap over the hashes' top bits
    # (M,) uint32 per hash: the first item (in file order) of its benchmark with that n-gram, an index into item_ids.
    # One int per hash, not a list of every item with it: the report names one item per matching run.
    item_of: np.ndarray | None = None
    item_ids: list[str] = field(default_factory=list)  # each indexed item's id in its file ("line=12", "ind=24")

    def __post_init__(self) -> None:
        if self.prefilter is None:
            mask = np.zeros(1 << PREFILTER_BITS, dtype=bool)
            mask[self.hashes >> np.uint64(64 - PREFILTER_BITS)] = True
            self.prefilter = np.packbits(mask, bitorder="little")
        if self.item_of is None:  # an index made by hand, without items: every hash names an unknown item
            self.item_of = np.zeros(len(self.hashes), dtype=np.uint32)
            self.item_ids = self.item_ids or ["unknown"]

    @classmethod
    def build(cls, paths: Sequence[Path], ngram: int, min_letter_words: float = 0.5) -> "BenchmarkIndex":
        hasher, letters = WordHasher(), _LetterCache()
        need = math.ceil(min_letter_words * ngram)
        names, chunks, owners, item_chunks, items, short = [], [], [], [], {}, {}
        item_ids: list[str] = []
        for number, path in enumerate(paths):
            name = benchmark_name(path)
            if name in names:
                raise ValueError(f"decontamination: two benchmark files are named {name!r}: {list(paths)}")
            names.append(name)
            items[name] = short[name] = 0
            hashes, of = [], []
            words: list[str] = []  # the words of many texts, hashed in one vectorized pass per batch
            lengths: list[int] = []
            text_items: list[int] = []  # the item number of each text of the batch

            def flush():
                grams, text = _batch_ngrams(words, lengths, ngram, need, hasher, letters)
                hashes.append(grams)
                of.append(np.asarray(text_items, dtype=np.uint32)[text])

            for item, texts in benchmark_items(path):
                item_number, indexed = len(item_ids), False
                pieces: dict[str, list[str]] = {}  # an item's question comes in each of its texts: normalized once
                for text in texts:
                    text_words = []
                    for piece in text:
                        if piece not in pieces:
                            pieces[piece] = normalized_words(piece)
                        text_words += pieces[piece]
                    if len(text_words) < ngram:
                        short[name] += 1
                        continue
                    items[name] += 1
                    words += text_words
                    lengths.append(len(text_words))
                    text_items.append(item_number)
                    indexed = True
                    if len(words) >= INDEX_BATCH_WORDS:
                        flush()
                        words, lengths, text_items = [], [], []
                if indexed:
                    item_ids.append(item)
            if words:
                flush()
            if hashes:
                unique, first = _first_per_hash(np.concatenate(hashes), np.concatenate(of))
            else:
                unique, first = np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.uint32)
            chunks.append(unique)
            item_chunks.append(first)
            owners.append(np.full(len(unique), number, dtype=np.uint16))
        all_hashes = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.uint64)
        all_owners = np.concatenate(owners) if owners else np.empty(0, dtype=np.uint16)
        all_items = np.concatenate(item_chunks) if item_chunks else np.empty(0, dtype=np.uint32)
        order = np.argsort(all_hashes, kind="stable")
        return cls(names=names, hashes=all_hashes[order], owners=all_owners[order], ngram=ngram, items=items,
                   short_items=short, item_of=all_items[order], item_ids=item_ids)

    def save(self, path: Path) -> None:
        """One file: INDEX_MAGIC, the header's length (uint64), the header (JSON: ngram, names, item counts,
        item ids, and each array's dtype, shape and offset), then the arrays, each at a multiple of INDEX_ALIGN
        bytes from where the header ends, so `load` maps them in place."""
        arrays = {name: np.ascontiguousarray(getattr(self, name)) for name in INDEX_ARRAYS}
        layout, offset = {}, 0
        for name, array in arrays.items():
            layout[name] = {"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}
            offset += _aligned(array.nbytes)
        header = orjson.dumps({"ngram": self.ngram, "names": self.names, "items": self.items,
                               "short": self.short_items, "item_ids": self.item_ids, "arrays": layout})
        start = _aligned(len(INDEX_MAGIC) + 8 + len(header))
        with open(path, "wb") as f:
            f.write(INDEX_MAGIC + struct.pack("<Q", len(header)) + header)
            for name, array in arrays.items():
                f.seek(start + layout[name]["offset"])
                array.tofile(f)
            f.truncate(start + offset)

    @classmethod
    def load(cls, path: Path) -> "BenchmarkIndex":
        """The index saved at `path`, its arrays mapped from the file, not read: a task's load costs no copy of
        the index's tens of MB, and the processes of a machine share one copy in the page cache (read, each task
        copied 84 MB for the demo's benchmarks: half a 1,000-document task's time, and memory-bound, so 2 workers
        barely sped it up)."""
        with open(path, "rb") as f:
            magic = f.read(len(INDEX_MAGIC))
            if magic != INDEX_MAGIC:
                raise ValueError(f"{path}: not a decontamination index of format {INDEX_FORMAT} (it starts "
                                 f"{magic!r}); build it again")
            (length,) = struct.unpack("<Q", f.read(8))
            header = orjson.loads(f.read(length))
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        start = _aligned(len(INDEX_MAGIC) + 8 + length)
        arrays = {}
        for name, spec in header["arrays"].items():
            shape = tuple(spec["shape"])
            arrays[name] = np.frombuffer(mapped, dtype=np.dtype(spec["dtype"]), count=math.prod(shape),
                                         offset=start + spec["offset"]).reshape(shape)
        return cls(names=header["names"], ngram=int(header["ngram"]), items=header["items"],
                   short_items=header["short"], item_ids=header["item_ids"], **arrays)

    def matches(self, ngram_hashes_: np.ndarray) -> tuple[np.ndarray, set[str]]:
        """(positions of the n-grams found in the index, names of the benchmarks they belong to)."""
        if not len(self.hashes) or not len(ngram_hashes_):
            return np.empty(0, dtype=np.int64), set()
        top = ngram_hashes_ >> np.uint64(64 - PREFILTER_BITS)
        maybe = np.flatnonzero((self.prefilter[top >> np.uint64(3)] >> (top & np.uint64(7)).astype(np.uint8)) & 1)
        if not len(maybe):
            return maybe, set()
        left = np.searchsorted(self.hashes, ngram_hashes_[maybe], side="left")
        found = self.hashes[np.minimum(left, len(self.hashes) - 1)] == ngram_hashes_[maybe]
        positions, left = maybe[found], left[found]
        if not len(positions):
            return positions, set()
        right = np.searchsorted(self.hashes, ngram_hashes_[positions], side="right")
        owners = set()
        for lo, hi in zip(left.tolist(), right.tolist()):
            owners.update(self.owners[lo:hi].tolist())
        return positions, {self.names[o] for o in owners}

    def sources(self, found: np.ndarray) -> list[list[tuple[int, int]]]:
        """For each hash of `found` (all in the index): its (benchmark number, item number) pairs, one per
        benchmark that has the n-gram. Called on hits only, which are rare."""
        left = np.searchsorted(self.hashes, found, side="left").tolist()
        right = np.searchsorted(self.hashes, found, side="right").tolist()
        return [list(zip(self.owners[lo:hi].tolist(), self.item_of[lo:hi].tolist())) for lo, hi in zip(left, right)]


INDEX_BATCH_WORDS = 1 << 20  # benchmark words hashed per vectorized pass (bounds memory at ~50 MB)


class _LetterCache(dict):
    """word -> 1 if it is not all digits (a word, not a number), cached like the word hashes."""

    def __missing__(self, word: str) -> int:
        value = self[word] = 0 if word.isdigit() else 1
        return value


def _batch_ngrams(words: list[str], lengths: list[int], n: int, need: int, hasher: WordHasher,
                  letters: _LetterCache) -> tuple[np.ndarray, np.ndarray]:
    """n-gram hashes of consecutive texts (their words concatenated), none crossing from one text into the next,
    and the number (in the batch) of the text each comes from."""
    grams = ngram_hashes(hasher(words), n)  # (W - n + 1,) over the concatenation
    ends = np.cumsum(lengths)
    starts = ends - np.asarray(lengths)
    # Valid n-gram starts: s .. s + length - n of each text.
    counts = np.asarray(lengths) - n + 1
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    valid = np.repeat(starts, counts) + offsets
    text = np.repeat(np.arange(len(lengths)), counts)
    grams = grams[valid]
    if need:
        flags = np.fromiter(map(letters.__getitem__, words), dtype=np.int64, count=len(words))
        csum = np.concatenate([[0], np.cumsum(flags)])
        keep = csum[valid + n] - csum[valid] >= need
        grams, text = grams[keep], text[keep]
    return grams, text


def _first_per_hash(values: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted unique hashes and, for each, the first item (items come in file order) that has it."""
    order = np.argsort(values, kind="stable")
    values, items = values[order], items[order]
    first = np.concatenate([[True], values[1:] != values[:-1]]) if len(values) else np.empty(0, dtype=bool)
    return values[first], items[first]


@dataclass
class DecontamStats:
    documents_in: int = 0
    kept: int = 0  # written to the parts (cut documents included)
    dropped: int = 0
    cut: int = 0  # documents with spans cut out and kept
    chars_cut: int = 0
    spans_cut: int = 0  # merged spans cut out of the kept documents
    hits: dict[str, int] = field(default_factory=dict)  # documents matching each benchmark
    files: list[dict] = field(default_factory=list)
    report: list[dict] = field(default_factory=list)  # one line per hit (report_line), in document order

    def add(self, other: "DecontamStats") -> None:
        for name in ("documents_in", "kept", "dropped", "cut", "chars_cut", "spans_cut"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name, n in other.hits.items():
            self.hits[name] = self.hits.get(name, 0) + n
        self.files += other.files
        self.report += other.report


@dataclass(frozen=True)
class Hit:
    """One benchmark's item found in one run of a document's matching n-grams (overlapping n-grams merged)."""

    benchmark: str
    item: str  # the item's id in its benchmark file (pipelines/decontam/items.py: "line=12", "ind=24")
    start: int  # the run's character span in the document
    end: int
    ngrams: int  # n-grams of the run that this item has (the item named is the one with most)


REPORT_SPAN_CHARS = 400  # of the matched text kept in a report line; `span_chars` says how long the run was


def report_line(part: str, doc: dict, action: str, text: str, hit: Hit) -> dict:
    """The report's record of one hit: which document, what was done to it, which item, and the matched text."""
    span = text[hit.start:hit.end]
    return {"part": part, "id": doc.get("id"), "action": action, "benchmark": hit.benchmark, "item": hit.item,
            "span": span[:REPORT_SPAN_CHARS], "span_chars": len(span), "start": hit.start, "end": hit.end,
            "ngrams": hit.ngrams}


class Decontaminator:
    """Checks one document at a time against an index; word positions are kept for cutting."""

    def __init__(self, index: BenchmarkIndex):
        self.index = index
        self.hasher = WordHasher()

    def find(self, text: str) -> tuple[list[tuple[int, int]], set[str]]:
        """Merged character spans of the text covered by benchmark n-grams, and the benchmarks hit."""
        spans, names, _ = self.scan(text)
        return spans, names

    def scan(self, text: str) -> tuple[list[tuple[int, int]], set[str], list[Hit]]:
        """find(), and the hits: per merged span and benchmark, the item most of the span's n-grams come from."""
        n = self.index.ngram
        words = normalized_words(text)
        if len(words) < n:
            return [], set(), []
        grams = ngram_hashes(self.hasher(words), n)
        positions, names = self.index.matches(grams)
        if not len(positions):
            return [], set(), []  # the common case: no word positions needed
        # Character positions come from the text itself; NFKC can split or join words, and then the
        # words are normalized one by one so that they line up with the spans.
        spans = [m.span() for m in WORD.finditer(text)]
        if len(spans) != len(words):
            words = [unicodedata.normalize("NFKC", text[a:b]).casefold() for a, b in spans]
            grams = ngram_hashes(self.hasher(words), n)
            positions, names = self.index.matches(grams)
        merged: list[tuple[int, int]] = []
        runs: list[list[int]] = []  # the n-gram positions of each merged span
        for p in positions.tolist():
            start, end = spans[p][0], spans[p + n - 1][1]
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
                runs[-1].append(p)
            else:
                merged.append((start, end))
                runs.append([p])
        sources = iter(self.index.sources(grams[positions]))
        hits = []
        for (start, end), run in zip(merged, runs):
            votes: Counter = Counter()
            for _ in run:
                votes.update(next(sources))
            best: dict[int, tuple[int, int]] = {}  # benchmark -> (votes, item): most n-grams, then first in file
            for (owner, item), count in sorted(votes.items()):
                if owner not in best or count > best[owner][0]:
                    best[owner] = (count, item)
            hits += [Hit(self.index.names[owner], self.index.item_ids[item], start, end, count)
                     for owner, (count, item) in sorted(best.items())]
        return merged, names, hits


def output_names(shard: str) -> tuple[str, str]:
    """(kept part, removed file) named after an input part: 'part-00003.jsonl.gz' -> part-00003.jsonl.gz and
    removed-00003.jsonl.gz."""
    name = PurePosixPath(shard).name.removesuffix(".gz").removesuffix(".jsonl")
    return f"{name}.jsonl.gz", f"removed-{name.removeprefix('part-')}.jsonl.gz"


class _LazyLines:
    """A GzipLines opened by its first record under a temporary name, renamed on close: no record, no file."""

    def __init__(self, path: Path):
        self.path, self.records, self._out = path, 0, None

    def write(self, record: dict) -> None:
        if self._out is None:
            self._out = GzipLines(self.path.with_name(f".{self.path.name}.tmp"), compresslevel=SHARD_COMPRESSLEVEL)
        self._out.write(record)
        self.records += 1

    def close(self, keep: bool = True) -> None:
        if self._out is not None:
            self._out.close()
            os.replace(self._out.path, self.path) if keep else self._out.path.unlink(missing_ok=True)
            self._out = None


def decontaminate_part(docs: Iterable[dict], checker: "Decontaminator", config: DecontamConfig, out_dir: Path,
                       shard: str) -> DecontamStats:
    """Check the documents of one input part (in order) -> out_dir/<its kept part> and <its removed file>."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stats = DecontamStats(hits={name: 0 for name in checker.index.names})
    kept_name, removed_name = output_names(shard)
    kept, removed = _LazyLines(out_dir / kept_name), _LazyLines(out_dir / removed_name)
    hits: Counter = Counter()
    try:
        for doc in docs:
            stats.documents_in += 1
            text = doc.get("text") or ""
            spans, names, found = checker.scan(text)
            if spans:
                hits.update(names)
                metadata = doc.setdefault("metadata", {})
                metadata["contaminated_by"] = sorted(names)
                action = "dropped"
                if config.action == "cut":
                    kept_text = _cut(text, spans)
                    metadata["decontam_chars_cut"] = len(text) - len(kept_text)
                    metadata["decontam_spans_cut"] = len(spans)
                    if normalized_words(kept_text):
                        doc["text"] = kept_text
                        stats.cut += 1
                        stats.chars_cut += len(text) - len(kept_text)
                        stats.spans_cut += len(spans)
                        action = "cut"
                stats.report += [report_line(kept_name, doc, action, text, hit) for hit in found]
                if action == "dropped":
                    removed.write(doc)
                    stats.dropped += 1
                    continue
            kept.write(doc)
            stats.kept += 1
    except BaseException:
        kept.close(keep=False)
        removed.close(keep=False)
        raise
    kept.close()
    removed.close()
    stats.files = [{"path": w.path.name, "records": w.records} for w in (kept, removed) if w.records]
    stats.hits.update(hits)
    return stats


def decontaminate(*, inputs: Sequence[Path], index: BenchmarkIndex, config: DecontamConfig, out_dir: Path) -> DecontamStats:
    """Check every document of local `inputs` (part files), each part into its own outputs under out_dir."""
    check_ngram(index, config)
    checker = Decontaminator(index)
    total = DecontamStats(hits={name: 0 for name in index.names})
    for path in inputs:
        total.add(decontaminate_part(iter_documents(path), checker, config, out_dir, Path(path).name))
    return total


def check_ngram(index: BenchmarkIndex, config: DecontamConfig) -> None:
    if index.ngram != config.ngram:
        raise ValueError(f"decontamination: the index was built with ngram={index.ngram}, the config says {config.ngram}")


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    """The text without the spans; the pieces around a cut are joined by a newline so no words fuse."""
    pieces, last = [], 0
    for start, end in spans:
        pieces.append(text[last:start].rstrip())
        last = end
    pieces.append(text[last:].lstrip())
    return "\n".join(p for p in pieces if p.strip())
