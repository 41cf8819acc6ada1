"""Gopher's two rule sets (Rae et al. 2021, one paper): repetition (GopherRepetition) and quality (GopherQuality,
and LanguageAwareGopherQuality, the step the pipeline runs: its stop-word rule per document language). Each is
datatrove's step, its settings, attributes, reasons and stats, with datatrove's verdicts, several times faster: the
words are found once and shared (words.py), repetition is counted on hashes, each word's tests are cached.
tests/pipelines/filters/test_gopher.py runs both over every document of the demo's sources and compares each verdict.

- **Repetition.** An n-gram is compared as datatrove compares it, by the string its words make ("".join for the
  duplicated n-grams, " ".join for the top ones), through a polynomial hash of that string computed with numpy for
  every window at once; a hash shared by two windows is checked on the strings themselves, and any collision
  falls back to datatrove's own code for that document, so the verdicts are exact, not probable.
- **Stop words.** Gopher's stop-word rule is English (it drops most German pages), so LanguageAwareGopherQuality takes
  the stop words from a per-language table (config.py DEFAULT_STOP_WORDS, or the recipe's) by metadata.language, and
  a document whose language has no list skips that one rule, never the others.
"""

from __future__ import annotations

import re

import numpy as np
from datatrove.data import Document
from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
from datatrove.pipeline.filters.gopher_repetition_filter import (
    find_all_duplicate,
    find_duplicates,
    find_top_duplicate,
    get_n_grams,
)
from datatrove.utils.text import PUNCTUATION_SET

from pipelines.filters.config import DEFAULT_STOP_WORDS, GopherQualityConfig
from pipelines.filters.words import _WORD_FLAGS, view

_WORD = re.compile(r"\w+")


# ---------------------------------------------------------------------------------------------------------------
# Hashing the strings n consecutive words make

_P = (1 << 31) - 1  # a Mersenne prime: products of two residues fit in int64
_B = 1_000_003
_pow = np.ones(1, dtype=np.int64)  # _B ** k mod _P
_inv = np.ones(1, dtype=np.int64)  # _B ** -k mod _P


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """B^k and B^-k mod P for k < n (grown by doubling, kept for the process)."""
    global _pow, _inv
    while len(_pow) < n:
        size = len(_pow)
        step, inv_step = pow(_B, size, _P), pow(_B, -size, _P)
        _pow = np.concatenate([_pow, _pow * step % _P])
        _inv = np.concatenate([_inv, _inv * inv_step % _P])
    return _pow, _inv


class _Windows:
    """Every window of n consecutive words of a word list, as the string `sep.join(window)`: its hash and length."""

    def __init__(self, words: list[str], sep: str):
        self.string = sep.join(words)
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        ends = np.cumsum(lengths + len(sep)) - len(sep)  # where each word ends in self.string
        self.starts, self.ends = ends - lengths, ends
        codes = np.frombuffer(self.string.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.int64)
        pw, inv = _powers(len(codes) + 1)
        # prefix[k] = sum_{j<k} c_j B^-j: the hash of string[a:b] is B^(b-1) (prefix[b] - prefix[a]) mod P.
        self.prefix = np.concatenate([[0], np.cumsum(codes % _P * inv[:len(codes)] % _P) % _P])
        self.pw = pw

    def hashes(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(hash, start, end) of each window of n words."""
        a, b = self.starts[:len(self.starts) - n + 1], self.ends[n - 1:]
        diff = (self.prefix[b] - self.prefix[a]) % _P
        return diff * self.pw[b - 1] % _P, a, b


def top_duplicate(windows: _Windows, words: list[str], n: int) -> int:
    """datatrove's find_top_duplicate(get_n_grams(words, n)): the characters of the most frequent n-gram (the first
    seen among the most frequent) times its count. Assumes there is at least one n-gram."""
    hashes, starts, ends = windows.hashes(n)
    values, first, counts = np.unique(hashes, return_index=True, return_counts=True)
    most = counts.max()
    top = int(first[counts == most].min())  # Counter.most_common keeps the first inserted among equal counts
    members = np.flatnonzero(hashes == hashes[top])
    text = windows.string[starts[top]:ends[top]]
    if any(windows.string[starts[m]:ends[m]] != text for m in members.tolist()):  # a collision: count exactly
        return find_top_duplicate(get_n_grams(words, n))
    return len(text) * int(most)


def all_duplicate(windows: _Windows, words: list[str], n: int) -> int:
    """datatrove's find_all_duplicate(words, n): left to right, an n-gram (its words joined without spaces) seen
    before adds its characters and the scan jumps past it; one not seen is remembered."""
    hashes, starts, ends = windows.hashes(n)
    if len(hashes) == 0 or len(np.unique(hashes)) == len(hashes):
        return 0  # all distinct: nothing repeats
    string = windows.string
    hashes, starts, ends = hashes.tolist(), starts.tolist(), ends.tolist()
    seen: dict[int, int] = {}
    repeated, idx = 0, 0
    while idx < len(hashes):
        h = hashes[idx]
        earlier = seen.get(h)
        if earlier is None:
            seen[h] = idx
            idx += 1
        elif string[starts[earlier]:ends[earlier]] == string[starts[idx]:ends[idx]]:
            repeated += ends[idx] - starts[idx]
            idx += n
        else:  # a collision: count exactly
            return find_all_duplicate(words, n)
    return repeated


# ---------------------------------------------------------------------------------------------------------------
# The steps


class GopherRepetition(GopherRepetitionFilter):
    """datatrove's GopherRepetitionFilter, its verdicts, on shared words and hashed n-grams."""

    name = "👯 Gopher repetition (hashed)"

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        text = doc.text
        if not text:
            return False, "empty"
        paragraphs = self.paragraph_exp.split(text.strip())
        paragraphs_duplicates, char_duplicates = find_duplicates(paragraphs)
        if self.dup_para_frac and paragraphs_duplicates / len(paragraphs) > self.dup_para_frac:
            return False, "dup_para_frac"
        if self.dup_para_char_frac and char_duplicates / len(text) > self.dup_para_char_frac:
            return False, "dup_para_char_frac"
        lines = self._line_splitter.split(text)
        line_duplicates, char_duplicates = find_duplicates(lines)
        if self.dup_line_frac and line_duplicates / len(lines) > self.dup_line_frac:
            return False, "dup_line_frac"
        if self.dup_line_char_frac and char_duplicates / len(text) > self.dup_line_char_frac:
            return False, "dup_line_char_frac"

        words = view(text).words
        spaced = _Windows(words, " ") if self.top_n_grams else None
        for n, n_frac in self.top_n_grams:
            if len(words) < n:
                continue
            if top_duplicate(spaced, words, n) / len(text) > n_frac:
                return False, f"top_{n}_gram"
        joined = _Windows(words, "") if self.dup_n_grams else None
        for n, n_frac in self.dup_n_grams:
            if all_duplicate(joined, words, n) / len(text) > n_frac:
                return False, f"duplicated_{n}_n_grams"
        return True


def _flags(word: str) -> tuple[bool, bool]:
    flags = _WORD_FLAGS.get(word)
    if flags is None:
        flags = _WORD_FLAGS[word] = (not PUNCTUATION_SET.issuperset(word), any(c.isalpha() for c in word))
    return flags


class GopherQuality(GopherQualityFilter):
    """datatrove's GopherQualityFilter, its verdicts, on shared words and each word's tests cached."""

    name = "🥇 Gopher quality (shared words)"

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        text = doc.text
        words = view(text).words
        n_words = len(words)
        n_non_symbol = non_symbol_chars = n_alpha = 0
        for word in words:
            non_symbol, alpha = _flags(word)
            if non_symbol:
                n_non_symbol += 1
                non_symbol_chars += len(word)
            n_alpha += alpha
        if self.min_doc_words and n_non_symbol < self.min_doc_words:
            return False, "gopher_short_doc"
        if self.max_doc_words and n_non_symbol > self.max_doc_words:
            return False, "gopher_long_doc"
        # np.mean of the lengths: their sum is exact in a double, so this is the same number (nan for none).
        avg_n_words = non_symbol_chars / n_non_symbol if n_non_symbol else float("nan")
        if self.min_avg_word_length and avg_n_words < self.min_avg_word_length:
            return False, "gopher_below_avg_threshold"
        if self.max_avg_word_length and avg_n_words > self.max_avg_word_length:
            return False, "gopher_above_avg_threshold"
        if self.max_symbol_word_ratio and text.count("#") / n_words > self.max_symbol_word_ratio:
            return False, "gopher_too_many_hashes"
        if self.max_symbol_word_ratio and (text.count("...") + text.count("…")) / n_words > self.max_symbol_word_ratio:
            return False, "gopher_too_many_ellipsis"
        lines = text.splitlines()
        if self.max_bullet_lines_ratio and sum(
                s.lstrip().startswith(("•", "-")) for s in lines) / len(lines) > self.max_bullet_lines_ratio:
            return False, "gopher_too_many_bullets"
        if self.max_ellipsis_lines_ratio and sum(
                s.rstrip().endswith(("...", "…")) for s in lines) / len(lines) > self.max_ellipsis_lines_ratio:
            return False, "gopher_too_many_end_ellipsis"
        if self.max_non_alpha_words_ratio and n_alpha / n_words < self.max_non_alpha_words_ratio:
            return False, "gopher_below_alpha_threshold"
        if self.min_stop_words and len(self.stop_words.intersection(words)) < self.min_stop_words:
            return False, "gopher_enough_stop_words"
        return True


class LanguageAwareGopherQuality(GopherQuality):
    """Gopher's quality rules with the stop-word rule per document language (metadata.language, from LID)."""

    name = "🥇 Gopher quality (per-language stop words)"

    def __init__(self, config: GopherQualityConfig, exclusion_writer=None):
        super().__init__(
            min_doc_words=config.min_doc_words,
            max_doc_words=config.max_doc_words,
            min_avg_word_length=config.min_avg_word_length,
            max_avg_word_length=config.max_avg_word_length,
            max_symbol_word_ratio=config.max_symbol_word_ratio,
            max_bullet_lines_ratio=config.max_bullet_lines_ratio,
            max_ellipsis_lines_ratio=config.max_ellipsis_lines_ratio,
            max_non_alpha_words_ratio=config.max_non_alpha_words_ratio,
            min_stop_words=None,  # applied below, per language
            exclusion_writer=exclusion_writer,
        )
        table = DEFAULT_STOP_WORDS if config.stop_words is None else config.stop_words
        self.stop_words_by_language = {lang: frozenset(w.lower() for w in words) for lang, words in table.items()}
        self.required_stop_words = config.min_stop_words

    def filter(self, doc: Document):
        verdict = super().filter(doc)
        if verdict is not True or not self.required_stop_words:
            return verdict
        # A source without language ID is taken to be English, as Gopher's rule assumes.
        stop_words = self.stop_words_by_language.get(doc.metadata.get("language", "en"))
        if stop_words is None:
            return True
        found = stop_words.intersection(_WORD.findall(doc.text.lower()))
        if len(found) < self.required_stop_words:
            return False, "gopher_enough_stop_words"
        return True
