"""Training data: packed token streams, memory-mapped, cut into sequences, mixed by weight.

    data = MixtureDataset(DataConfig(shards={"web": "/data/web", "code": "/data/code"},
                                     weights={"web": 0.7, "code": 0.3}, seq_len=256, seed=0))
    batch = data.batch(rank_indices(step * global_batch, global_batch, rank, world_size))
    inputs, targets = batch["tokens"][:, :-1], batch["tokens"][:, 1:]          # (B, T) each

A shard folder is one `tokenization/<source>/packed` output (pipelines/tokenization/pack.py writes it, in the layout of
pipelines/tokenization/packed_format.py): manifest.json whose "packing" section is the index, plus, per split, shard files
(a token stream with EOS after every document, and the document offsets) read as one stream in index order.
Files are memory-mapped, never read whole; start-up checks sizes and sampled hashes, a few MiB per file.
Sequences are cut at load time, so the same shards serve every sequence length.

- A source's stream is read as a cycle: window i is tokens [i*T, i*T + T] (T + 1 tokens, so inputs and
  targets overlap by one) taken modulo the stream length. Nothing is truncated: a source smaller than its
  share repeats, and `epochs()` reports how many times each was read. Document ids count on across
  repeats (epoch * documents + document), so a window that wraps never joins two documents into one.
- The mixture: a global sample index -> (source, the k-th draw from that source) through a precomputed blend
  index (Megatron's BlendedDataset: each sample goes to the source whose realized share lags its weight
  most), computed once for a block of BLEND_BLOCK samples and repeated. Within a source, draw k reads window
  perm_e(k mod n) with n = windows in one pass and e = k // n, perm_e a seeded permutation: each pass reads
  every window once, in an order fixed by the seed.
- The loader's whole state is the global sample index. Rank r of W reads the contiguous slice
  `rank_indices(...)` of each global batch, so the samples of a step do not depend on the world size.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from storage.manifest import sampled_sha256

BLEND_BLOCK = 1 << 16  # samples in the precomputed blend index; weights are realized exactly to 1/65,536 per block
MANIFEST = "manifest.json"


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    shards: dict[str, str]  # source name -> local folder of a packed output (manifest.json, train/val files)
    weights: dict[str, float]  # source name -> mixture weight (>= 0, sum > 0)
    seq_len: int
    seed: int = 0
    split: str = "train"  # "train" | "val"
    verify: bool = True  # check each file's size and sampled sha256 against the packed index on open
    # Long-context stages: only documents at least this many tokens long (0 = all). A source without one is
    # left out of the mixture (listed in MixtureDataset.left_out); a mixture left with none is an error.
    min_doc_tokens: int = 0
    shuffle: bool = True  # read a source's windows in a seeded order per pass (else in stream order)

    def __post_init__(self):
        if self.seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {self.seq_len}")
        if self.split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {self.split!r}")
        if not self.weights:
            raise ValueError("weights is empty: give every source a weight")
        for name, weight in self.weights.items():
            if name not in self.shards:
                raise ValueError(f"source {name!r} has a weight but no shards (shards has {sorted(self.shards)})")
            if not np.isfinite(weight) or weight < 0:
                raise ValueError(f"source {name!r}: weight must be a finite number >= 0, got {weight}")
        missing = sorted(set(self.shards) - set(self.weights))
        if missing:
            raise ValueError(f"source(s) {missing} have shards but no weight")
        if sum(self.weights.values()) <= 0:
            raise ValueError(f"the weights sum to zero: {self.weights}")


class NoDocuments(ValueError):
    """A source's split with no document to read: empty, or none as long as a long-context stage asks for."""


class PackedSource:
    """One source's split: its shards' token streams and document offsets, memory-mapped, read as one stream.

    The split is the concatenation of the shards the index lists (pipelines/tokenization/packed_format.py): document d of
    the stream and window i are what they would be in one pair of files holding the shards one after another.
    On open each file is checked against the index by its size and a hash of a few sampled blocks (bounded
    reads whatever the data's size; the store verified the full sha256 when the file was fetched), never read
    whole. A long-context filter (min_doc_tokens) keeps the kept documents' positions, not a copy of them.
    """

    def __init__(self, name: str, folder, split: str, verify: bool = True, min_doc_tokens: int = 0):
        self.name = name
        self.folder = Path(folder)
        manifest_path = self.folder / MANIFEST
        if not manifest_path.is_file():
            raise ValueError(f"source {name!r}: {manifest_path} not found (is {self.folder} a packed output?)")
        manifest = json.loads(manifest_path.read_text())
        section = manifest.get("packing")
        if not section or split not in section.get("splits", {}):
            raise ValueError(f"source {name!r}: {manifest_path} describes no packed split {split!r}")
        info = section["splits"][split]
        if "shards" not in info:
            raise ValueError(f"source {name!r}: {manifest_path} is a packed output of an older layout (one file "
                             "per split, no shard list): materialize its packed asset again")
        self.manifest = manifest
        self.eos_id = int(section["eos_id"])
        self.vocab_size = int(section["vocab_size"])
        listed = {entry["path"] for entry in manifest.get("files", [])}
        dtype = np.dtype(section["dtype"])
        self._shard_tokens: list[np.ndarray] = []
        self._shard_offsets: list[np.ndarray] = []
        for shard in info["shards"]:
            for role in ("tokens", "offsets"):
                relative = shard[f"{role}_file"]
                path = self.folder / relative
                if relative not in listed:
                    raise ValueError(f"source {name!r}: {relative} is not listed in {manifest_path}")
                if not path.is_file():
                    raise ValueError(f"source {name!r}: {path} is missing")
                size = path.stat().st_size
                if size != shard[f"{role}_bytes"]:
                    raise ValueError(f"source {name!r}: {path} has {size} bytes, the index records {shard[f'{role}_bytes']}")
                if verify:
                    actual = sampled_sha256(path)
                    if actual != shard[f"{role}_sampled_sha256"]:
                        raise ValueError(f"source {name!r}: {path} has sampled sha256 {actual}, but the index "
                                         f"records {shard[f'{role}_sampled_sha256']}")
            tokens = _map(self.folder / shard["tokens_file"], dtype)
            offsets = _map(self.folder / shard["offsets_file"], np.dtype(np.int64))
            if len(tokens) != shard["tokens"] or len(offsets) - 1 != shard["documents"]:
                raise ValueError(f"source {name!r}: {shard['tokens_file']} has {len(tokens)} tokens / "
                                 f"{len(offsets) - 1} documents on disk, the index says {shard['tokens']} / "
                                 f"{shard['documents']}")
            if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != len(tokens):
                raise ValueError(f"source {name!r}: {shard['offsets_file']} does not span its token stream")
            self._shard_tokens.append(tokens)
            self._shard_offsets.append(offsets)
        # Where each shard starts in the split's stream, in tokens and in documents (shards + 1 values each).
        self._token_starts = np.concatenate([[0], np.cumsum([len(t) for t in self._shard_tokens])]).astype(np.int64)
        self._doc_starts = np.concatenate([[0], np.cumsum([len(o) - 1 for o in self._shard_offsets])]).astype(np.int64)
        self.tokens = int(self._token_starts[-1])
        self.documents = int(self._doc_starts[-1])
        if self.tokens != info["tokens"] or self.documents != info["documents"]:
            raise ValueError(
                f"source {name!r}: {split} has {self.tokens} tokens / {self.documents} documents on disk, "
                f"the manifest says {info['tokens']} / {info['documents']}"
            )
        if self.tokens == 0:
            raise NoDocuments(f"source {name!r}: the {split} split of {self.folder} has no tokens")
        # Long-context filter: the kept documents' starts in the stream, and their offsets in the filtered stream.
        self._kept_starts: np.ndarray | None = None
        self._kept_offsets: np.ndarray | None = None
        if min_doc_tokens > 0:
            self._keep_long_documents(min_doc_tokens, split)

    def _keep_long_documents(self, min_tokens: int, split: str) -> None:
        # Shard by shard from the mapped offsets: memory holds one shard's lengths and the kept documents' positions
        # (two int64 per kept document), never their tokens.
        starts, lengths, longest = [], [], 0
        for j, offsets in enumerate(self._shard_offsets):
            shard_lengths = np.diff(offsets)
            longest = max(longest, int(shard_lengths.max()))
            keep = np.flatnonzero(shard_lengths >= min_tokens)
            starts.append(self._token_starts[j] + offsets[keep])
            lengths.append(shard_lengths[keep])
        lengths = np.concatenate(lengths).astype(np.int64)
        if len(lengths) == 0:
            raise NoDocuments(f"source {self.name!r}: no document of the {split} split has {min_tokens} tokens or "
                              f"more (the longest has {longest})")
        self._kept_starts = np.concatenate(starts).astype(np.int64)
        self._kept_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.tokens, self.documents = int(self._kept_offsets[-1]), len(lengths)

    def windows(self, seq_len: int) -> int:
        """Windows in one pass over the stream (the last one wraps into the start)."""
        return -(-self.tokens // seq_len)

    def document_lengths(self) -> np.ndarray:
        """(documents,) int64: the length of every document of the stream (the filtered one, if filtered), EOS included."""
        if self._kept_offsets is not None:
            return np.diff(self._kept_offsets)
        return np.concatenate([np.diff(o) for o in self._shard_offsets]).astype(np.int64)

    def document(self, d: int) -> np.ndarray:
        """Document d's tokens, its EOS last."""
        if self._kept_offsets is not None:
            start = int(self._kept_starts[d])
            return self._gather(np.arange(start, start + int(self._kept_offsets[d + 1] - self._kept_offsets[d])))
        j = int(np.searchsorted(self._doc_starts, d, side="right")) - 1
        offsets = self._shard_offsets[j]
        local = d - int(self._doc_starts[j])
        return np.asarray(self._shard_tokens[j][offsets[local] : offsets[local + 1]])

    def sequence(self, i: int, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, doc_ids, positions) of window i, each (seq_len + 1,) int64: inputs [:-1], targets [1:]."""
        start = i * seq_len
        local = start % self.tokens
        if local + seq_len + 1 <= self.tokens:  # the common case: no wrap
            where = np.arange(local, local + seq_len + 1, dtype=np.int64)
            epoch = np.full(seq_len + 1, start // self.tokens, dtype=np.int64)
        else:
            epoch, where = np.divmod(start + np.arange(seq_len + 1, dtype=np.int64), self.tokens)
        if self._kept_offsets is not None:
            doc = np.searchsorted(self._kept_offsets, where, side="right") - 1  # (T+1,)
            positions = where - self._kept_offsets[doc]
            tokens = self._gather(self._kept_starts[doc] + positions)
        else:
            tokens = self._gather(where)
            doc, positions = self._locate(where)
        return tokens, epoch * self.documents + doc, positions.astype(np.int64)

    def _gather(self, where: np.ndarray) -> np.ndarray:
        """The tokens at stream positions `where` (int64), read from the shards' maps."""
        first = int(np.searchsorted(self._token_starts, where[0], side="right")) - 1
        base = int(self._token_starts[first])
        lo, hi = int(where[0]) - base, int(where[-1]) - base
        if len(where) and hi == lo + len(where) - 1 and hi < len(self._shard_tokens[first]):
            return np.asarray(self._shard_tokens[first][lo : hi + 1], dtype=np.int64)  # one slice of one shard
        shard = np.searchsorted(self._token_starts, where, side="right") - 1
        out = np.empty(len(where), dtype=np.int64)
        for j in np.unique(shard).tolist():
            mask = shard == j
            out[mask] = self._shard_tokens[j][where[mask] - self._token_starts[j]]
        return out

    def _locate(self, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(document of the stream, position in it) of each stream position."""
        shard = np.searchsorted(self._token_starts, where, side="right") - 1
        doc = np.empty(len(where), dtype=np.int64)
        positions = np.empty(len(where), dtype=np.int64)
        for j in np.unique(shard).tolist():
            mask = shard == j
            local = where[mask] - self._token_starts[j]
            offsets = self._shard_offsets[j]
            d = np.searchsorted(offsets, local, side="right") - 1
            doc[mask] = d + self._doc_starts[j]
            positions[mask] = local - offsets[d]
        return doc, positions


class MixtureDataset:
    """Global sample index -> a sequence of one source, deterministic from the weights and the seed."""

    def __init__(self, config: DataConfig):
        self.config = config
        # Sources with weight 0 are never drawn, so they are not opened (nor required to be non-empty).
        self.names, self.sources, self.left_out = [], [], []
        for name in sorted(config.weights):
            if config.weights[name] <= 0:
                continue
            try:
                self.sources.append(PackedSource(name, config.shards[name], config.split, verify=config.verify,
                                                 min_doc_tokens=config.min_doc_tokens))
            except NoDocuments:
                if not config.min_doc_tokens:
                    raise  # an empty source with a weight is a mistake, named by the error
                self.left_out.append(name)  # a long-context stage: this source has no document that long
                continue
            self.names.append(name)
        if not self.sources:
            raise NoDocuments(f"no source of {sorted(config.weights)} has a {config.split} document"
                              + (f" of {config.min_doc_tokens} tokens or more (data.min_doc_tokens)"
                                 if config.min_doc_tokens else ""))
        weights = np.array([config.weights[name] for name in self.names], dtype=np.float64)
        self.weights = weights / weights.sum()
        self.vocab_size = max(source.vocab_size for source in self.sources)  # the model's embedding must cover it
        self._blend_source, self._blend_draw = blend_index(self.weights, BLEND_BLOCK)
        self._per_block = np.bincount(self._blend_source, minlength=len(self.names))  # draws per source per block
        self._windows = [s.windows(config.seq_len) for s in self.sources]
        self._perm_cache: dict[tuple[int, int], np.ndarray] = {}

    def locate(self, index: int) -> tuple[int, int]:
        """(source position in self.names, window index) of global sample `index`."""
        if index < 0:
            raise ValueError(f"a global sample index is >= 0, got {index}")
        block, offset = divmod(index, BLEND_BLOCK)
        j = int(self._blend_source[offset])
        draw = block * int(self._per_block[j]) + int(self._blend_draw[offset])
        return j, self._window(j, draw)

    def batch(self, global_indices: Sequence[int]) -> dict:
        seq_len = self.config.seq_len
        n = len(global_indices)
        tokens = np.empty((n, seq_len + 1), dtype=np.int64)  # (B, T+1)
        doc_ids = np.empty((n, seq_len + 1), dtype=np.int64)
        positions = np.empty((n, seq_len + 1), dtype=np.int64)
        sources = []
        for row, index in enumerate(global_indices):
            j, window = self.locate(int(index))
            tokens[row], doc_ids[row], positions[row] = self.sources[j].sequence(window, seq_len)
            sources.append(self.names[j])
        return {
            "tokens": tokens,
            "doc_ids": doc_ids,
            "positions": positions,
            "sources": sources,
            "indices": [int(i) for i in global_indices],
        }

    def draws(self, upto_index: int) -> dict[str, int]:
        """Samples drawn from each source by global indices [0, upto_index)."""
        blocks, rest = divmod(max(0, upto_index), BLEND_BLOCK)
        partial = np.bincount(self._blend_source[:rest], minlength=len(self.names))
        return {name: int(blocks * self._per_block[j] + partial[j]) for j, name in enumerate(self.names)}

    def epochs(self, upto_index: int) -> dict[str, float]:
        """Passes over each source's stream consumed by global indices [0, upto_index)."""
        seq_len = self.config.seq_len
        epochs = {name: 0.0 for name in sorted(self.config.weights)}  # weight 0: never read
        for j, (name, count) in enumerate(self.draws(upto_index).items()):
            epochs[name] = count * seq_len / self.sources[j].tokens
        return epochs

    def _window(self, j: int, draw: int) -> int:
        n = self._windows[j]
        epoch, k = divmod(draw, n)
        if not self.config.shuffle:
            return draw
        key = (j, epoch)
        perm = self._perm_cache.get(key)
        if perm is None:
            if len(self._perm_cache) > 4 * len(self.names):  # one or two passes per source are live at a time
                self._perm_cache.clear()
            seed = [self.config.seed, _stable_int(self.names[j]), epoch]
            perm = self._perm_cache[key] = np.random.default_rng(seed).permutation(n)
        return epoch * n + int(perm[k])


def blend_index(weights: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Megatron's greedy blend: sample i goes to the source whose count lags weight * (i + 1) the most.

    Returns (source of each sample, how many earlier samples that source had), both (size,). Ties go to
    the lower source position, so the result depends on the weights alone.
    """
    weights = np.asarray(weights, dtype=np.float64)
    counts = [0] * len(weights)
    w = weights.tolist()
    source = np.empty(size, dtype=np.int32)
    draw = np.empty(size, dtype=np.int64)
    for i in range(size):
        target = i + 1
        best, best_error = 0, -float("inf")
        for j, weight in enumerate(w):
            error = weight * target - counts[j]
            if error > best_error:
                best, best_error = j, error
        source[i] = best
        draw[i] = counts[best]
        counts[best] += 1
    return source, draw


def rank_indices(step_start: int, global_batch: int, rank: int, world_size: int) -> list[int]:
    """Rank `rank`'s contiguous share of the global sample indices [step_start, step_start + global_batch)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not within a world of size {world_size}")
    if global_batch < 1 or global_batch % world_size:
        raise ValueError(f"global_batch {global_batch} must be a positive multiple of world_size {world_size}")
    per_rank = global_batch // world_size
    first = step_start + rank * per_rank
    return list(range(first, first + per_rank))


def _map(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:  # np.memmap refuses empty files
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def _stable_int(name: str) -> int:
    # Python's hash() of a str changes per process; the permutation must not.
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
