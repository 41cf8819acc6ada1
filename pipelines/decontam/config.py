"""The recipe's `decontamination` section (DecontamConfig), apart from the index and its scan (index.py).

Kept apart so that reading a recipe and loading the code location (assets/recipe/) import neither numpy nor
datatrove: every `pretrain` command and every load of the code location by the UI or the daemon reads the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


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
