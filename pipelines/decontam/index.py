"""Decontamination: remove benchmark text from training documents by n-gram overlap.

    index = BenchmarkIndex.build([Path("benchmarks/gsm8k_test.jsonl"), ...], ngram=13, min_letter_words=0.5)
    stats = decontaminate(inputs=[Path("dedup/web/part-00000.jsonl.gz")], index=index,
                          config=DecontamConfig(action="drop"), out_dir=Path("out"))
    # as datatrove tasks over store parts (the asset's way, pipelines/decontam/steps.py): the index built once
    # and saved, each task loads it
    index.save(work / "index.npz")
    steps = [DecontamShards(store=store, keys=keys, index_path=work / "index.npz", config=config, output_dir=out)]

Every benchmark item is turned into the texts a web page would contain (question with each choice, context with
its continuation, prompt with its solution, ...: see ITEM_TEXTS), normalized like dedup does (NFKC, case-folded,
words of \\w+), and each run of `ngram` words is hashed to uint64 into one sorted array (plus the benchmark it
came from). A document's n-grams are hashed the same way and looked up with one vectorized searchsorted.
A document with any hit is dropped (action "drop", written to removed-NNNNN.jsonl.gz with its benchmarks) or has
the character spans of its matching n-grams cut out (action "cut"; a document left with no words is dropped).
Each input part gives its own outputs, named after it (part-00003.jsonl.gz -> part-00003.jsonl.gz and
removed-00003.jsonl.gz; none when it has no such document), documents in input order: the files do not depend
on how many tasks share the parts. A task's counts go to datatrove's stats (pipelines/decontam/steps.py).
Items shorter than `ngram` words cannot be matched by n-grams and are counted in `index.short_items`; n-grams
mostly of numbers are not indexed (`min_letter_words`): number runs are common to MATH and to all code.
"""

from __future__ import annotations

import gzip
import math
import re
import unicodedata
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator, Literal, Sequence

import numpy as np
import orjson

from pipelines.dedup.minhash import WordHasher, ngram_hashes, normalized_words
from pipelines.shards import GzipLines, iter_documents

SHARD_COMPRESSLEVEL = 1  # as dedup's: intermediate data, speed over size (changing it changes every output byte)
_WORD = re.compile(r"\w+")


@dataclass(frozen=True, kw_only=True)
class DecontamConfig:
    """The recipe's `decontamination` section. Benchmark paths are relative to the recipe's base_dir."""

    # A misspelt or retired setting in the recipe is refused by name when pydantic reads it, not ignored.
    __pydantic_config__ = {"extra": "forbid"}

    benchmarks: tuple[str, ...] = ()  # JSONL (.gz or not) or plain-text files; none = nothing to remove
    ngram: int = 13  # words per n-gram (GPT-3 / OLMo use 13)
    action: Literal["drop", "cut"] = "drop"  # drop the whole document, or cut the matching spans out
    # An n-gram is indexed only if at least this fraction of its words contain a letter: runs of numbers
    # ("1 2 3 ... 13", the primes, matrix rows) are in MATH and in any code, and say nothing about leakage.
    min_letter_words: float = 0.5

    def __post_init__(self):
        value = (self.benchmarks,) if isinstance(self.benchmarks, str) else tuple(self.benchmarks)
        if not all(isinstance(v, str) and v for v in value):
            raise ValueError(f"decontamination.benchmarks must be a list of file paths, got {value!r}")
        object.__setattr__(self, "benchmarks", value)
        if self.ngram < 1:
            raise ValueError(f"decontamination.ngram must be >= 1, got {self.ngram}")
        if not 0.0 <= self.min_letter_words <= 1.0:
            raise ValueError(f"decontamination.min_letter_words must be within [0, 1], got {self.min_letter_words}")
        if self.action not in ("drop", "cut"):
            raise ValueError(f"decontamination.action must be 'drop' or 'cut', got {self.action!r}")


def _join(*parts) -> str:
    return " ".join(str(p) for p in parts if p)


# Benchmark layouts (../shared/data/README.md), recognized by their fields: item -> the texts to index.
ITEM_TEXTS: list[tuple[frozenset, Callable[[dict], list[str]]]] = [
    (frozenset({"ctx", "endings"}), lambda r: [_join(r["ctx"], e) for e in r["endings"]]),  # HellaSwag
    (frozenset({"context_options", "continuation"}), lambda r: [_join(o, r["continuation"]) for o in r["context_options"]]),  # Winogrande
    (frozenset({"query", "choices"}), lambda r: [_join(r["query"], c) for c in r["choices"]]),  # ARC, PIQA, OBQA, SIQA, CSQA, BoolQ
    (frozenset({"question", "choices"}), lambda r: [_join(r["question"], c) for c in r["choices"]]),  # MMLU
    (frozenset({"prompt", "canonical_solution"}), lambda r: [r["prompt"] + r["canonical_solution"]]),  # HumanEval
    (frozenset({"context", "continuation"}), lambda r: [_join(r["context"], r["continuation"])]),  # LAMBADA
    (frozenset({"question", "answer"}), lambda r: [_join(r["question"], r["answer"])]),  # GSM8K
    (frozenset({"context", "answer"}), lambda r: [_join(r["context"], r.get("chain_of_thought"), r["answer"])]),  # MATH
]


def benchmark_name(path: Path) -> str:
    name = Path(path).name
    for suffix in (".gz", ".jsonl", ".json", ".txt"):
        name = name.removesuffix(suffix)
    return name


def benchmark_texts(path: Path) -> Iterator[str]:
    """The texts of one benchmark file to index. Plain text (.txt): one text per non-blank line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"decontamination: benchmark file {path} does not exist")
    opener = gzip.open if path.name.endswith(".gz") else open
    plain = path.name.removesuffix(".gz").endswith(".txt")
    with opener(path, "rb") as f:
        if plain:
            for line in f:
                if line.strip():
                    yield line.decode("utf-8", errors="replace")
            return
        extract = None
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"decontamination: {path} line {number} is not JSON: {exc}") from None
            if extract is None:
                extract = next((fn for keys, fn in ITEM_TEXTS if keys <= record.keys()), None)
                if extract is None:
                    raise ValueError(
                        f"decontamination: {path}: unknown benchmark layout, fields {sorted(record)}; known layouts "
                        f"have fields {[sorted(keys) for keys, _ in ITEM_TEXTS]}"
                    )
            yield from extract(record)


# The prefilter: one bit per value of an n-gram hash's top PREFILTER_BITS bits, set where some benchmark n-gram has
# them (2**26 bits = 8 MiB, about 5% set by 3.7M benchmark n-grams). A document's n-grams are looked up in the sorted
# hashes only where their bit is set: a binary search over tens of MB misses the caches at each of its last ~10
# levels, and with every core scanning, memory, not arithmetic, set the pace (measured: half a task's time, and
# each of 2 concurrent tasks ~12% slower than one alone).
PREFILTER_BITS = 26
INDEX_FORMAT = 2  # of the saved index (2: with its prefilter); a cache of the index keys on it


@dataclass
class BenchmarkIndex:
    names: list[str]  # benchmark names, by index
    hashes: np.ndarray  # (M,) uint64 n-gram hashes, sorted
    owners: np.ndarray  # (M,) uint16 benchmark index of each hash (a hash in two benchmarks appears twice)
    ngram: int
    items: dict[str, int] = field(default_factory=dict)  # texts indexed per benchmark
    short_items: dict[str, int] = field(default_factory=dict)  # texts shorter than ngram words, not indexed
    prefilter: np.ndarray | None = None  # (2**PREFILTER_BITS / 8,) uint8 bitmap over the hashes' top bits

    def __post_init__(self) -> None:
        if self.prefilter is None:
            mask = np.zeros(1 << PREFILTER_BITS, dtype=bool)
            mask[self.hashes >> np.uint64(64 - PREFILTER_BITS)] = True
            self.prefilter = np.packbits(mask, bitorder="little")

    @classmethod
    def build(cls, paths: Sequence[Path], ngram: int, min_letter_words: float = 0.5) -> "BenchmarkIndex":
        hasher, letters = WordHasher(), _LetterCache()
        need = math.ceil(min_letter_words * ngram)
        names, chunks, owners, items, short = [], [], [], {}, {}
        for number, path in enumerate(paths):
            name = benchmark_name(path)
            if name in names:
                raise ValueError(f"decontamination: two benchmark files are named {name!r}: {list(paths)}")
            names.append(name)
            items[name] = short[name] = 0
            hashes = []
            words: list[str] = []  # the words of many texts, hashed in one vectorized pass per batch
            lengths: list[int] = []
            for text in benchmark_texts(path):
                text_words = normalized_words(text)
                if len(text_words) < ngram:
                    short[name] += 1
                    continue
                items[name] += 1
                words += text_words
                lengths.append(len(text_words))
                if len(words) >= INDEX_BATCH_WORDS:
                    hashes.append(_batch_ngrams(words, lengths, ngram, need, hasher, letters))
                    words, lengths = [], []
            if words:
                hashes.append(_batch_ngrams(words, lengths, ngram, need, hasher, letters))
            unique = _sorted_unique(np.concatenate(hashes)) if hashes else np.empty(0, dtype=np.uint64)
            chunks.append(unique)
            owners.append(np.full(len(unique), number, dtype=np.uint16))
        all_hashes = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.uint64)
        all_owners = np.concatenate(owners) if owners else np.empty(0, dtype=np.uint16)
        order = np.argsort(all_hashes, kind="stable")
        return cls(names=names, hashes=all_hashes[order], owners=all_owners[order], ngram=ngram, items=items, short_items=short)

    def save(self, path: Path) -> None:
        np.savez(path, hashes=self.hashes, owners=self.owners, ngram=self.ngram, prefilter=self.prefilter,
                 meta=np.frombuffer(orjson.dumps({"names": self.names, "items": self.items, "short": self.short_items}), dtype=np.uint8))

    @classmethod
    def load(cls, path: Path) -> "BenchmarkIndex":
        with np.load(path) as z:
            meta = orjson.loads(z["meta"].tobytes())
            return cls(names=meta["names"], hashes=z["hashes"], owners=z["owners"], ngram=int(z["ngram"]),
                       items=meta["items"], short_items=meta["short"],
                       prefilter=z["prefilter"] if "prefilter" in z.files else None)

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


INDEX_BATCH_WORDS = 1 << 20  # benchmark words hashed per vectorized pass (bounds memory at ~50 MB)


class _LetterCache(dict):
    """word -> 1 if it is not all digits (a word, not a number), cached like the word hashes."""

    def __missing__(self, word: str) -> int:
        value = self[word] = 0 if word.isdigit() else 1
        return value


def _batch_ngrams(words: list[str], lengths: list[int], n: int, need: int, hasher: WordHasher, letters: _LetterCache) -> np.ndarray:
    """n-gram hashes of consecutive texts (their words concatenated), none crossing from one text into the next."""
    grams = ngram_hashes(hasher(words), n)  # (W - n + 1,) over the concatenation
    ends = np.cumsum(lengths)
    starts = ends - np.asarray(lengths)
    # Valid n-gram starts: s .. s + length - n of each text.
    counts = np.asarray(lengths) - n + 1
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    valid = np.repeat(starts, counts) + offsets
    grams = grams[valid]
    if need:
        flags = np.fromiter(map(letters.__getitem__, words), dtype=np.int64, count=len(words))
        csum = np.concatenate([[0], np.cumsum(flags)])
        grams = grams[csum[valid + n] - csum[valid] >= need]
    return grams


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique by sorting: for uint64 it beats numpy 2's hash-based unique several times over."""
    values = np.sort(values)
    return values[np.concatenate([[True], values[1:] != values[:-1]])] if len(values) else values


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

    def add(self, other: "DecontamStats") -> None:
        for name in ("documents_in", "kept", "dropped", "cut", "chars_cut", "spans_cut"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name, n in other.hits.items():
            self.hits[name] = self.hits.get(name, 0) + n
        self.files += other.files


class Decontaminator:
    """Checks one document at a time against an index; word positions are kept for cutting."""

    def __init__(self, index: BenchmarkIndex):
        self.index = index
        self.hasher = WordHasher()

    def find(self, text: str) -> tuple[list[tuple[int, int]], set[str]]:
        """Merged character spans of the text covered by benchmark n-grams, and the benchmarks hit."""
        n = self.index.ngram
        words = normalized_words(text)
        if len(words) < n:
            return [], set()
        positions, names = self.index.matches(ngram_hashes(self.hasher(words), n))
        if not len(positions):
            return [], set()  # the common case: no word positions needed
        # Character positions come from the text itself; NFKC can split or join words, and then the
        # words are normalized one by one so that they line up with the spans.
        spans = [m.span() for m in _WORD.finditer(text)]
        if len(spans) != len(words):
            words = [unicodedata.normalize("NFKC", text[a:b]).casefold() for a, b in spans]
            positions, names = self.index.matches(ngram_hashes(self.hasher(words), n))
        merged: list[tuple[int, int]] = []
        for p in positions.tolist():
            start, end = spans[p][0], spans[p + n - 1][1]
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged, names


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
            spans, names = checker.find(text)
            if spans:
                hits.update(names)
                metadata = doc.setdefault("metadata", {})
                metadata["contaminated_by"] = sorted(names)
                if config.action == "cut":
                    kept_text = _cut(text, spans)
                    metadata["decontam_chars_cut"] = len(text) - len(kept_text)
                    metadata["decontam_spans_cut"] = len(spans)
                    if normalized_words(kept_text):
                        doc["text"] = kept_text
                        stats.cut += 1
                        stats.chars_cut += len(text) - len(kept_text)
                        stats.spans_cut += len(spans)
                    else:
                        removed.write(doc)
                        stats.dropped += 1
                        continue
                else:
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
