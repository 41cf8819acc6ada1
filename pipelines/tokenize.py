"""Tokenizer and packing: documents -> one flat token stream per split, with the document offsets.

    tokenizer = train_tokenizer(sample_texts({"web": docs_a, "code": docs_b}, config), config)   # or:
    tokenizer = adopt_tokenizer("tokenizers/gpt2/tokenizer.json", config)
    stats = pack_documents(iter_documents(part), tokenizer, out_dir=Path("out/web"), config=PackingConfig())

writes, per split ("train", "val"):
    out/web/train.tokens.bin    the token stream, uint16 when the vocabulary fits, else uint32; EOS after every document
    out/web/train.offsets.bin   int64, documents + 1 values: document d is tokens[offsets[d]:offsets[d+1]] (its EOS last)
`stats.manifest_section()` is what a reader needs to open them (dtype, EOS id, file names, counts); the
trainer (trainer/data.py) memory-maps the files and cuts sequences of any length at load time.

A document goes to "val" when a hash of its id (and the split seed) falls under `val_fraction`: the split
depends on the document alone, never on the order or the batch size. Text is encoded in batches with
`encode_batch_fast` (no character offsets: the packer never needs them); memory is bounded by the batch.
Special-token strings inside a document's text are encoded as plain text, so EOS appears only between
documents, and decoding a document's tokens gives back its text exactly (byte-level BPE, no normalizer).
"""

from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPLITS = ("train", "val")
UINT16_VOCAB = 1 << 16  # token ids 0..65535 fit uint16


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    """The recipe's `tokenizer` section: train a byte-level BPE on a sample of every source, or adopt a file."""

    path: str | None = None  # adopt this tokenizer.json (relative to the recipe's base_dir) instead of training
    vocab_size: int = 8192  # training: the vocabulary, special tokens included
    min_frequency: int = 2  # training: a merge needs at least this many occurrences
    sample_bytes: int = 4 << 20  # training: UTF-8 bytes of text sampled, split evenly between the sources
    seed: int = 0  # training: which documents are sampled
    eos: str = "<|endoftext|>"  # appended after every document; added to an adopted tokenizer that lacks it
    pad: str = "<|pad|>"

    def __post_init__(self):
        if self.vocab_size < 256 + 2:
            raise ValueError(f"vocab_size must be >= 258 (256 bytes + EOS + PAD), got {self.vocab_size}")
        if self.min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {self.min_frequency}")
        if self.sample_bytes < 1:
            raise ValueError(f"sample_bytes must be >= 1, got {self.sample_bytes}")
        if not self.eos or not self.pad or self.eos == self.pad:
            raise ValueError(f"eos and pad must be two different non-empty strings, got {self.eos!r} and {self.pad!r}")


@dataclass(frozen=True, kw_only=True)
class PackingConfig:
    """The recipe's `packing` section."""

    val_fraction: float = 0.01  # share of documents held out for validation (chosen by a hash of the id)
    split_seed: int = 0
    batch_documents: int = 1024  # documents per encode call: bounds memory, gives the tokenizer's threads work
    batch_bytes: int = 16 << 20  # ... or fewer when they are large

    def __post_init__(self):
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be within [0, 1), got {self.val_fraction}")
        if self.batch_documents < 1 or self.batch_bytes < 1:
            raise ValueError(f"batch_documents and batch_bytes must be >= 1, got {self.batch_documents}, {self.batch_bytes}")


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer


def sample_texts(sources: dict[str, Iterable[dict]], config: TokenizerConfig) -> list[str]:
    """A deterministic sample of every source, `sample_bytes // len(sources)` bytes of text each.

    Per source, the documents with the smallest hash of (seed, source, id, ordinal) are kept, up to the
    budget: a bottom-k sample, spread over the whole source rather than its first files, in one pass with
    memory bounded by the budget. Texts longer than the budget are cut to it.
    """
    if not sources:
        raise ValueError("sample_texts: no sources to sample from")
    budget = max(1, config.sample_bytes // len(sources))
    sample: list[str] = []
    for name in sorted(sources):
        heap: list[tuple[int, int, str, int]] = []  # (-hash, ordinal, text, bytes): a max-heap on the hash
        total = 0
        cutoff = None  # a document hashing at or above a dropped one can never be in the sample
        for ordinal, doc in enumerate(sources[name]):
            text = doc["text"]
            h = _hash64(f"{config.seed}\0{name}\0{doc.get('id')}\0{ordinal}")
            if cutoff is not None and h >= cutoff:
                continue
            size = len(text.encode("utf-8"))
            if size > budget:
                text = text.encode("utf-8")[:budget].decode("utf-8", errors="ignore")
                size = len(text.encode("utf-8"))
            heapq.heappush(heap, (-h, ordinal, text, size))
            total += size
            while total > budget:
                neg, _, _, dropped = heapq.heappop(heap)
                total -= dropped
                cutoff = -neg if cutoff is None else min(cutoff, -neg)
        sample += [text for _, _, text, _ in sorted(heap, key=lambda item: item[1])]  # source order, for reading
    return sample


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
    tokens_file: str = ""
    offsets_file: str = ""


@dataclass
class PackStats:
    dtype: str
    eos_id: int
    vocab_size: int
    splits: dict[str, SplitStats] = field(default_factory=dict)

    def manifest_section(self) -> dict:
        """The manifest's "packing" section: everything a reader needs besides the files' hashes."""
        return {
            "dtype": self.dtype,
            "eos_id": self.eos_id,
            "vocab_size": self.vocab_size,
            "splits": {name: vars(split).copy() for name, split in self.splits.items()},
        }

    def counts(self) -> dict:
        return {name: {"tokens": s.tokens, "documents": s.documents} for name, s in self.splits.items()}


def is_val(doc_id, ordinal: int, config: PackingConfig) -> bool:
    """Whether a document is held out: a hash of its id (its ordinal when it has none) under val_fraction."""
    if config.val_fraction <= 0.0:
        return False
    key = doc_id if doc_id is not None else f"#{ordinal}"
    return _hash64(f"{config.split_seed}\0{key}") < config.val_fraction * 2**64


def pack_documents(
    docs: Iterable[dict], tokenizer: Tokenizer, *, eos_id: int, out_dir, config: PackingConfig
) -> PackStats:
    """Encode documents in batches and append them, EOS after each, to the train / val streams in out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab_size)
    if not 0 <= eos_id < vocab_size:
        raise ValueError(f"eos_id {eos_id} is outside the vocabulary (size {vocab_size})")
    encoder = for_packing(tokenizer)
    stats = PackStats(dtype=dtype.name, eos_id=eos_id, vocab_size=vocab_size)
    writers = {name: _SplitWriter(out_dir, name, dtype) for name in SPLITS}
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
    finally:
        for writer in writers.values():
            writer.close()
    for name, writer in writers.items():
        stats.splits[name] = SplitStats(
            tokens=writer.tokens,
            documents=writer.documents,
            tokens_file=writer.tokens_path.name,
            offsets_file=writer.offsets_path.name,
        )
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
    """Appends to <split>.tokens.bin and <split>.offsets.bin (which starts with 0)."""

    def __init__(self, out_dir: Path, split: str, dtype: np.dtype):
        self.tokens_path = out_dir / f"{split}.tokens.bin"
        self.offsets_path = out_dir / f"{split}.offsets.bin"
        for path in (self.tokens_path, self.offsets_path):
            if path.exists():
                raise ValueError(f"{path} already exists; pack into an empty folder")
        self.dtype = dtype
        self.tokens = 0
        self.documents = 0
        self._tokens = open(self.tokens_path, "wb")
        self._offsets = open(self.offsets_path, "wb")
        np.zeros(1, dtype=np.int64).tofile(self._offsets)

    def append(self, stream: np.ndarray, lengths: np.ndarray) -> None:
        if not len(lengths):
            return
        assert stream.dtype == self.dtype and len(stream) == lengths.sum()
        self._tokens.write(memoryview(stream))
        (self.tokens + np.cumsum(lengths)).astype(np.int64).tofile(self._offsets)
        self.tokens += len(stream)
        self.documents += len(lengths)

    def close(self) -> None:
        self._tokens.close()
        self._offsets.close()


def _hash64(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", errors="surrogatepass"), digest_size=8).digest(), "little")
