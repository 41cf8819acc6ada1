"""The recipe's `tokenizer` and `packing` sections (TokenizerConfig, PackingConfig).

Kept apart from the tokenizer and the packer (tokenizer.py) so that reading a recipe and loading the code location
(assets/recipe/) import neither numpy nor the tokenizers library.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig:
    """The recipe's `tokenizer` section: train a byte-level BPE on a sample of every source, or adopt a file."""

    # A misspelt or retired setting in the recipe is refused by name when pydantic reads it, not ignored.
    __pydantic_config__ = {"extra": "forbid"}

    path: str | None = None  # adopt this tokenizer.json (relative to the recipe's base_dir) instead of training
    vocab_size: int = 8192  # training: the vocabulary, special tokens included
    min_frequency: int = 2  # training: a merge needs at least this many occurrences
    sample_bytes: int = 4 << 20  # training: UTF-8 bytes of text sampled, split evenly between the sources
    seed: int = 0  # training: which documents are sampled
    eos: str = "<|endoftext|>"  # appended after every document; added to an adopted tokenizer that lacks it
    pad: str = "<|pad|>"

    def __post_init__(self):
        if self.vocab_size < 256 + 2:
            raise ValueError(f"tokenizer.vocab_size must be >= 258 (256 bytes + EOS + PAD), got {self.vocab_size}")
        if self.min_frequency < 1:
            raise ValueError(f"tokenizer.min_frequency must be >= 1, got {self.min_frequency}")
        if self.sample_bytes < 1:
            raise ValueError(f"tokenizer.sample_bytes must be >= 1, got {self.sample_bytes}")
        if not self.eos or not self.pad or self.eos == self.pad:
            raise ValueError(f"tokenizer.eos and tokenizer.pad must be two different non-empty strings, got {self.eos!r} and {self.pad!r}")


@dataclass(frozen=True, kw_only=True)
class PackingConfig:
    """The recipe's `packing` section."""

    # A misspelt or retired setting in the recipe is refused by name when pydantic reads it, not ignored.
    __pydantic_config__ = {"extra": "forbid"}

    val_fraction: float = 0.01  # share of documents held out for validation (chosen by a hash of the id)
    split_seed: int = 0
    batch_documents: int = 1024  # documents per encode call: bounds memory, gives the tokenizer's threads work
    batch_bytes: int = 16 << 20  # ... or fewer when they are large

    def __post_init__(self):
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"packing.val_fraction must be within [0, 1), got {self.val_fraction}")
        if self.batch_documents < 1 or self.batch_bytes < 1:
            raise ValueError(f"packing.batch_documents and packing.batch_bytes must be >= 1, got {self.batch_documents}, {self.batch_bytes}")
