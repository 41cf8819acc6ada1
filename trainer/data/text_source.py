"""A packed-sequence source cut from one plain text file, for demos and tests without packed shards.

    ds = TextSource(TextSourceConfig(path="tinyshakespeare.txt", tokenizer="gpt2/tokenizer.json", seq_len=128))
    batch = ds.batch([0, 1, 2])   # same dict as trainer.data.mixture.MixtureDataset.batch

Documents are the blank-line-separated paragraphs; each is followed by EOS in one flat token stream
(the packed-shard layout). Sample i is a window of seq_len + 1 tokens at a seeded permutation of the
window starts, so the source's only state is the global sample index.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True, kw_only=True)
class TextSourceConfig:
    path: str
    tokenizer: str  # tokenizer.json (the `tokenizers` library); its EOS separates documents
    seq_len: int
    seed: int = 0
    split: str = "train"  # "train" or "val": the last val_fraction of the documents are held out
    val_fraction: float = 0.1
    name: str = "text"
    # Renumber to top_tokens ids: the top_tokens - 2 most frequent tokens of the whole file by rank, then
    # EOS, then one "other" id for the rest, so a tiny CPU model needs no 50k-row head (demos, tests).
    # None keeps the tokenizer's ids.
    top_tokens: int | None = None

    def __post_init__(self):
        if self.split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {self.split!r}")
        if self.top_tokens is not None and self.top_tokens < 2:
            raise ValueError(f"top_tokens must be >= 2, got {self.top_tokens}")


EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")  # the EOS of a tokenizer, by the names in use


def _tokenize(path: str, tokenizer_path: str) -> tuple[np.ndarray, int, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    eos = next((tok.token_to_id(n) for n in EOS_NAMES if tok.token_to_id(n) is not None), None)
    if eos is None:
        raise ValueError(f"{tokenizer_path}: no EOS token among {EOS_NAMES}")
    docs = [d.strip() for d in Path(path).read_text(encoding="utf-8").split("\n\n") if d.strip()]
    if not docs:
        raise ValueError(f"{path}: no documents (paragraphs separated by blank lines)")
    ids = [e.ids + [eos] for e in tok.encode_batch(docs)]
    return ids, eos, tok.get_vocab_size()


def _compact(docs: list[list[int]], eos: int, top: int) -> tuple[list[np.ndarray], int, np.ndarray]:
    counts = np.bincount(np.fromiter((t for d in docs for t in d), dtype=np.int64))
    order = [t for t in np.argsort(-counts, kind="stable") if counts[t] > 0 and t != eos][: top - 2]
    mapping = np.full(len(counts), top - 1, dtype=np.int64)  # everything else -> the "other" id
    mapping[order] = np.arange(len(order))
    mapping[eos] = top - 2
    return [mapping[np.asarray(d)] for d in docs], top - 2, mapping


class TextSource:
    _cache: dict = {}

    def __init__(self, cfg: TextSourceConfig):
        self.cfg = cfg
        key = (str(Path(cfg.path).resolve()), str(Path(cfg.tokenizer).resolve()))
        if key not in self._cache:
            self._cache[key] = _tokenize(cfg.path, cfg.tokenizer)
        docs, self.eos, self.vocab_size = self._cache[key]
        self.mapping = None  # tokenizer id -> this source's id, when renumbered
        if cfg.top_tokens is not None:
            docs, self.eos, self.mapping = _compact(docs, self.eos, cfg.top_tokens)
            self.vocab_size = cfg.top_tokens
        n_val = max(1, int(len(docs) * cfg.val_fraction))
        docs = docs[-n_val:] if cfg.split == "val" else docs[:-n_val]
        self.tokens = np.fromiter((t for d in docs for t in d), dtype=np.int64)
        # doc id of every token: the EOS closing a document belongs to it.
        lengths = np.array([len(d) for d in docs])
        self.doc_ids = np.repeat(np.arange(len(docs)), lengths)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        self.positions = np.arange(len(self.tokens)) - np.repeat(starts, lengths)
        T = cfg.seq_len
        self.n_windows = (len(self.tokens) - 1) // T
        if self.n_windows < 1:
            raise ValueError(f"{cfg.path}: {len(self.tokens)} tokens in the {cfg.split} split, fewer than seq_len + 1")

    def encoder(self):
        """What encodes text into this source's ids (zero-shot evaluation during training): the tokenizer, and
        the renumbering after it when top_tokens is set (a token absent from the file is "other")."""
        from types import SimpleNamespace

        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(self.cfg.tokenizer)
        if self.mapping is None:
            return tok
        mapping, other = self.mapping, self.cfg.top_tokens - 1

        class Renumbered:
            def encode(self, text: str, add_special_tokens: bool = False):
                ids = tok.encode(text, add_special_tokens=add_special_tokens).ids
                return SimpleNamespace(ids=[int(mapping[i]) if i < len(mapping) else other for i in ids])

        return Renumbered()

    def _window(self, index: int) -> int:
        # A fresh permutation of the windows each epoch, from (seed, epoch) alone.
        epoch, i = divmod(index, self.n_windows)
        perm = np.random.default_rng([self.cfg.seed, epoch]).permutation(self.n_windows)
        return int(perm[i])

    def batch(self, indices) -> dict:
        T = self.cfg.seq_len
        starts = [self._window(int(i)) * T for i in indices]
        cut = lambda a: torch.from_numpy(np.stack([a[s : s + T + 1] for s in starts]))  # (B, T+1)
        doc_ids = cut(self.doc_ids)
        # Positions count from each document's start, also for a document begun before the window.
        positions = cut(self.positions)
        return {"tokens": cut(self.tokens), "doc_ids": doc_ids, "positions": positions,
                "sources": [self.cfg.name] * len(starts), "indices": [int(i) for i in indices]}

    def unigram_entropy(self) -> float:
        """Entropy (nats) of the token frequencies: the loss of the best context-free model."""
        counts = np.bincount(self.tokens)
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log(p)).sum())
