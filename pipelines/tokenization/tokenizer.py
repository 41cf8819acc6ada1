"""Tokenizer and packing: documents -> token streams per split, with the document offsets.

    tokenizer = train_tokenizer(sample_texts({"web": docs_a, "code": docs_b}, config), config)   # or:
    tokenizer = adopt_tokenizer("tokenizers/gpt2/tokenizer.json", config)
    stats = pack_documents(iter_documents(part), tokenizer, eos_id=0, out_dir=Path("out"), config=PackingConfig(),
                           shard="part-00003")

writes, per split ("train", "val"), the shard's files in the layout pipelines/tokenization/packed_format.py defines:
    out/train/part-00003.tokens.bin    the token stream, uint16 when the vocabulary fits, else uint32; EOS after every document
    out/train/part-00003.offsets.bin   int64, documents + 1 values: document d is tokens[offsets[d]:offsets[d+1]] (its EOS last)
A split with no document of the shard gets no files. `stats.manifest_section()` is the index of the shard (what
a reader needs to open it); pipelines/tokenization/pack.py packs many input shards as datatrove tasks and indexes them all.

A document goes to "val" when a hash of its id (and the split seed) falls under `val_fraction`: the split
depends on the document alone, never on the order, the batch size or the task count. Text is encoded in
batches with `encode_batch_fast` (no character offsets: the packer never needs them); memory is bounded by the
batch. Special-token strings inside a document's text are encoded as plain text, so EOS appears only between
documents, and decoding a document's tokens gives back its text exactly (byte-level BPE, no normalizer).
"""

from __future__ import annotations

import hashlib
import heapq
import os
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pipelines.tokenization.config import PackingConfig, TokenizerConfig
from pipelines.tokenization.packed_format import SPLITS, build_index, shard_files
UINT16_VOCAB = 1 << 16  # token ids 0..65535 fit uint16


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer


def sample_texts(sources: dict[str, Iterable[dict]], config: TokenizerConfig) -> list[str]:
    """A deterministic sample of every source, `sample_bytes // len(sources)` bytes of text each.

    Per source, the documents with the smallest `sample_key` (a hash of seed, source and document id) are kept,
    up to the budget (`bottom_sample`): spread over the whole source rather than its first files, in one pass
    with memory bounded by the budget, and the same whichever way the source is split into shards or tasks
    (pipelines/tokenization/pack.py samples each shard in a task, then merges). Texts longer than the budget are cut to it.
    """
    if not sources:
        raise ValueError("sample_texts: no sources to sample from")
    budget = source_budget(config, len(sources))
    sample: list[str] = []
    for name in sorted(sources):
        keyed = ((sample_key(config, name, doc.get("id"), f"#{ordinal}"), doc["text"]) for ordinal, doc in enumerate(sources[name]))
        sample += [text for _, text in bottom_sample(keyed, budget)]
    return sample


def source_budget(config: TokenizerConfig, sources: int) -> int:
    return max(1, config.sample_bytes // sources)


def sample_key(config: TokenizerConfig, source: str, doc_id, where: str) -> int:
    """The sampling hash of a document: of its id, or of `where` it is (shard and line) when it has none."""
    return _hash64(f"{config.seed}\0{source}\0{doc_id if doc_id is not None else where}")


def bottom_sample(keyed: Iterable[tuple[int, str]], budget: int) -> list[tuple[int, str]]:
    """The (key, text) pairs with the smallest keys whose texts (each cut to `budget` UTF-8 bytes) fit in `budget`
    bytes together, in key order: the longest such prefix of the key order, found in one pass with a max-heap.

    The prefix of a union is the prefix of the union of its parts' prefixes, so shards are sampled apart and
    their samples merged by calling this again on them."""
    heap: list[tuple[int, str, int]] = []  # (-key, text, bytes): a max-heap on the key
    total = 0
    cutoff = None  # a key at or above a dropped one can never be in the sample
    for key, text in keyed:
        if cutoff is not None and key >= cutoff:
            continue
        size = len(text.encode("utf-8"))
        if size > budget:
            text = text.encode("utf-8")[:budget].decode("utf-8", errors="ignore")
            size = len(text.encode("utf-8"))
        heapq.heappush(heap, (-key, text, size))
        total += size
        while total > budget:
            neg, _, dropped = heapq.heappop(heap)
            total -= dropped
            cutoff = -neg if cutoff is None else min(cutoff, -neg)
    return sorted((-neg, text) for neg, text, _ in heap)


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig) -> Tokenizer:
    """A byte-level BPE (GPT-2 style: every byte is a token, so any text encodes and decodes exactly)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=[config.eos, config.pad],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def adopt_tokenizer(path, config: TokenizerConfig) -> Tokenizer:
    """A tokenizer.json made elsewhere, with the recipe's EOS and PAD added as special tokens if it lacks them."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"tokenizer.path {path} does not exist")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises a bare Exception for a malformed file
        raise ValueError(f"tokenizer.path {path} is not a tokenizer.json the `tokenizers` library reads: {exc}") from None
    missing = [t for t in (config.eos, config.pad) if tokenizer.token_to_id(t) is None]
    if missing:
        tokenizer.add_special_tokens(missing)
    return tokenizer


def round_trip_failures(tokenizer: Tokenizer, texts: list[str]) -> list[int]:
    """Positions of the texts that do not decode back exactly after encoding for packing."""
    encoder = for_packing(tokenizer)
    encodings = encoder.encode_batch_fast(texts, add_special_tokens=False)
    return [i for i, (text, enc) in enumerate(zip(texts, encodings)) if encoder.decode(enc.ids, skip_special_tokens=False) != text]


def special_ids(tokenizer: Tokenizer, config: TokenizerConfig) -> dict[str, int]:
    ids = {"eos": tokenizer.token_to_id(config.eos), "pad": tokenizer.token_to_id(config.pad)}
    for role, token_id in ids.items():
        if token_id is None:
            raise ValueError(f"the tokenizer has no {role} token {getattr(config, role)!r}")
    return ids


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= UINT16_VOCAB else np.dtype(np.uint32)


def for_packing(tokenizer: Tokenizer) -> Tokenizer:
    """A copy that encodes special-token strings found in text as plain text and adds nothing around a text."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.encode_special_tokens = True
    copy.no_truncation()
    copy.no_padding()
    return copy


# ---------------------------------------------------------------------------------------------------------------
# Packing


@dataclass
class SplitStats:
    tokens: int = 0
    documents: int = 0


@dataclass
class PackStats:
    dtype: str
    eos_id: int
    vocab_size: int
    out_dir: Path
    shard: str
    splits: dict[str, SplitStats] = field(default_factory=dict)

    def manifest_section(self) -> dict:
        """The manifest's "packing" section for this one shard: its index (pipelines/tokenization/packed_format.py)."""
        return build_index(self.out_dir, [self.shard], dtype=self.dtype, eos_id=self.eos_id, vocab_size=self.vocab_size)

    def counts(self) -> dict:
        return {name: {"tokens": s.tokens, "documents": s.documents} for name, s in self.splits.items()}


def is_val(doc_id, ordinal: int, config: PackingConfig) -> bool:
    """Whether a document is held out: a hash of its id (its ordinal when it has none) under val_fraction."""
    if config.val_fraction <= 0.0:
        return False
    key = doc_id if doc_id is not None else f"#{ordinal}"
    return _hash64(f"{config.split_seed}\0{key}") < config.val_fraction * 2**64


def pack_documents(
    docs: Iterable[dict], tokenizer: Tokenizer, *, eos_id: int, out_dir, config: PackingConfig, shard: str = "part-00000"
) -> PackStats:
    """Encode documents in batches and append them, EOS after each, to the shard's train / val streams in out_dir.

    A shard's files are written under temporary names and renamed when complete, replacing any earlier copy (a
    task that was killed and runs again writes them anew)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab_size)
    if not 0 <= eos_id < vocab_size:
        raise ValueError(f"eos_id {eos_id} is outside the vocabulary (size {vocab_size})")
    encoder = for_packing(tokenizer)
    stats = PackStats(dtype=dtype.name, eos_id=eos_id, vocab_size=vocab_size, out_dir=out_dir, shard=shard)
    writers = {name: _SplitWriter(out_dir, name, shard, dtype) for name in SPLITS}
    try:
        for texts, held_out in _batches(docs, config):
            ids = [e.ids for e in encoder.encode_batch_fast(texts, add_special_tokens=False)]
            stream, lengths = _concat_with_eos(ids, eos_id, dtype)
            if not held_out.any():
                writers["train"].append(stream, lengths)
                continue
            token_is_val = np.repeat(held_out, lengths)
            writers["train"].append(stream[~token_is_val], lengths[~held_out])
            writers["val"].append(stream[token_is_val], lengths[held_out])
    except BaseException:
        for writer in writers.values():
            writer.discard()
        raise
    for name, writer in writers.items():
        writer.close()
        stats.splits[name] = SplitStats(tokens=writer.tokens, documents=writer.documents)
    return stats


def _batches(docs: Iterable[dict], config: PackingConfig) -> Iterator[tuple[list[str], np.ndarray]]:
    texts: list[str] = []
    held_out: list[bool] = []
    size = 0
    for ordinal, doc in enumerate(docs):
        text = doc["text"]
        texts.append(text)
        held_out.append(is_val(doc.get("id"), ordinal, config))
        size += len(text)
        if len(texts) >= config.batch_documents or size >= config.batch_bytes:
            yield texts, np.array(held_out, dtype=bool)
            texts, held_out, size = [], [], 0
    if texts:
        yield texts, np.array(held_out, dtype=bool)


def _concat_with_eos(ids: list[list[int]], eos_id: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """[[5, 6], [7]] -> ([5, 6, EOS, 7, EOS], [3, 2]): one C-level pass over the ids, no per-document arrays."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)) + 1
    total = int(lengths.sum())
    eos = [eos_id]
    stream = np.fromiter(chain.from_iterable(chain.from_iterable(zip(ids, [eos] * len(ids)))), dtype=dtype, count=total)
    return stream, lengths


class _SplitWriter:
    """Appends to <split>/<shard>.tokens.bin and .offsets.bin (which starts with 0), opened by the first document:
    no document, no files. Written under temporary names, renamed by close()."""

    def __init__(self, out_dir: Path, split: str, shard: str, dtype: np.dtype):
        tokens_file, offsets_file = shard_files(split, shard)
        self.tokens_path, self.offsets_path = out_dir / tokens_file, out_dir / offsets_file
        self.dtype = dtype
        self.tokens = 0
        self.documents = 0
        self._tokens = self._offsets = None

    def _temp(self, path: Path) -> Path:
        return path.with_name(f".{path.name}.tmp")

    def append(self, stream: np.ndarray, lengths: np.ndarray) -> None:
        if not len(lengths):
            return
        assert stream.dtype == self.dtype and len(stream) == lengths.sum()
        if self._tokens is None:
            self.tokens_path.parent.mkdir(parents=True, exist_ok=True)
            self._tokens = open(self._temp(self.tokens_path), "wb")
            self._offsets = open(self._temp(self.offsets_path), "wb")
            np.zeros(1, dtype=np.int64).tofile(self._offsets)
        self._tokens.write(memoryview(stream))
        (self.tokens + np.cumsum(lengths)).astype(np.int64).tofile(self._offsets)
        self.tokens += len(stream)
        self.documents += len(lengths)

    def close(self) -> None:
        if self._tokens is None:
            return
        for handle, path in ((self._tokens, self.tokens_path), (self._offsets, self.offsets_path)):
            handle.close()
            os.replace(handle.name, path)
        self._tokens = self._offsets = None

    def discard(self) -> None:
        if self._tokens is None:
            return
        for handle in (self._tokens, self._offsets):
            handle.close()
            Path(handle.name).unlink(missing_ok=True)
        self._tokens = self._offsets = None


def _hash64(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", errors="surrogatepass"), digest_size=8).digest(), "little")
