"""datatrove's prose rules (Gopher repetition and quality, FineWeb quality) with datatrove's verdicts, several times
faster: the words of a document are found once and shared by every step, and repetition is counted on hashes.

    words = split_words(text)        # == datatrove's split_into_words(text) (spaCy's English tokenizer), cached
    GopherRepetition(...).filter(doc), GopherQuality(...).filter(doc), FineWebQuality(...).filter(doc)

Each step subclasses datatrove's (the same settings, attributes, reasons and stats) and overrides `filter` only;
tests/pipelines/filters/test_prose.py runs both over every document of the demo's sources and compares each verdict.

Where the time went in datatrove (profiled on the demo's 1,168 web pages, 5 KB each, ~45 ms a page for the web rule
set): spaCy's tokenizer, 60% of it, because datatrove tokenizes inside a spaCy memory zone, so every word's lexeme is
built again in every document; the n-gram rules joining and hashing millions of strings; C4's sentence counting
(pipelines/filters/c4.py).

- **Words.** spaCy (datatrove's blank English tokenizer, without the lexical attributes no boundary depends on) splits
  the text on whitespace (Python's str.isspace, as str.split does) and tokenizes each whitespace-free chunk on its
  own, the same way wherever it stands (its own cache is keyed by the chunk). So the
  words of a text are the chunks' tokens in order: each chunk is tokenized once per process (those a document has
  that are not cached yet, in one spaCy call) and kept in a bounded cache; words repeat (Zipf), so most documents
  need no spaCy at all. The last few texts' analyses are kept by identity, so the steps of one document share them.
- **Repetition.** An n-gram is compared as datatrove compares it, by the string its words make ("".join for the
  duplicated n-grams, " ".join for the top ones), through a polynomial hash of that string computed with numpy for
  every window at once; a hash shared by two windows is checked on the strings themselves, and any collision
  falls back to datatrove's own code for that document, so the verdicts are exact, not probable.
"""

from __future__ import annotations

import numpy as np
from datatrove.data import Document
from datatrove.pipeline.filters import FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter
from datatrove.pipeline.filters.gopher_repetition_filter import (
    find_all_duplicate,
    find_duplicates,
    find_top_duplicate,
    get_n_grams,
)
from datatrove.utils.text import PUNCTUATION_SET, split_into_words
from datatrove.utils.typeshelper import Languages

_MAX_CACHED_CHUNKS = 500_000  # whitespace-free chunks -> their words; cleared when full (memory stays bounded)
_CHUNK_WORDS: dict[str, tuple[str, ...]] = {}
_WORD_FLAGS: dict[str, tuple[bool, bool]] = {}  # word -> (not all punctuation, has a letter): Gopher's tests
_RECENT = 4  # analyses kept, by text identity: one document's steps share its words
_recent: list[tuple[str, "TextView"]] = []
_nlp = None


def _spacy():
    """spaCy's tokenizer of the blank English pipeline, datatrove's (spacy.blank("en")), without the lexical attributes
    (shape, like_num, ... computed for every new word: 40% of its time) that no word boundary depends on."""
    global _nlp
    if _nlp is None:
        import spacy

        nlp = spacy.blank("en")
        nlp.vocab.lex_attr_getters = {}
        _nlp = nlp
    return _nlp


def _tokenize_chunks(chunks: list[str]) -> None:
    """The words of each chunk (no whitespace in it), from one spaCy call on the chunks joined by spaces."""
    nlp = _spacy()
    joined = " ".join(chunks)
    starts, at = [], 0
    for chunk in chunks:
        starts.append(at)
        at += len(chunk) + 1
    found: list[list[str]] = [[] for _ in chunks]
    with nlp.memory_zone():  # the words' lexemes are freed after: the vocabulary does not grow with the corpus
        doc = nlp.tokenizer(joined)
        i = 0
        for token in doc:
            while i + 1 < len(starts) and token.idx >= starts[i + 1]:
                i += 1
            word = token.text.strip()  # datatrove's strip_strings
            if word:
                found[i].append(word)
    for chunk, words in zip(chunks, found):
        _CHUNK_WORDS[chunk] = tuple(words)


def split_words(text: str) -> list[str]:
    """datatrove's split_into_words(text) (English), from the chunk cache."""
    if "IS_ALPHA" in text:  # a string that breaks spaCy's tokenizer: datatrove retries without it, its own way
        return list(split_into_words(text, Languages.english))
    chunks = text.split()
    missing = [chunk for chunk in dict.fromkeys(chunks) if chunk not in _CHUNK_WORDS]
    if missing:
        if len(_CHUNK_WORDS) + len(missing) > _MAX_CACHED_CHUNKS:
            # Cleared when full, and then this text's chunks that were cached are missing too.
            _CHUNK_WORDS.clear()
            _WORD_FLAGS.clear()
            missing = list(dict.fromkeys(chunks))
        _tokenize_chunks(missing)
    words: list[str] = []
    for chunk in chunks:
        words += _CHUNK_WORDS[chunk]
    return words


class TextView:
    """One text's words, computed once and shared by the steps that look at it."""

    __slots__ = ("text", "_words")

    def __init__(self, text: str):
        self.text = text
        self._words: list[str] | None = None

    @property
    def words(self) -> list[str]:
        if self._words is None:
            self._words = split_words(self.text)
        return self._words


def view(text: str) -> TextView:
    """The analysis of `text`, shared while it is among the last few asked for (same object, not equal text: a
    step that rewrites doc.text gets a new one)."""
    for seen, found in _recent:
        if seen is text:
            return found
    found = TextView(text)
    _recent.insert(0, (text, found))
    del _recent[_RECENT:]
    return found


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


class FineWebQuality(FineWebQualityFilter):
    """datatrove's FineWebQualityFilter, its verdicts, on shared words."""

    name = "🍷 FineWeb quality (shared words)"

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        text = doc.text
        lines = [line for line in text.split("\n") if line.strip() != ""]
        if len(lines) == 0:
            return False, "empty"
        ratio = sum(1 for line in lines if line.endswith(self.stop_chars)) / len(lines)
        if ratio < self.line_punct_thr and not (ratio == 0 and self.line_punct_exclude_zero):
            return False, "line_punct_ratio"
        ratio = sum(1 for line in lines if len(line) <= self.short_line_length) / len(lines)
        if ratio > self.short_line_threshold:
            return False, "short_line_ratio"
        if find_duplicates(lines)[1] / len(text.replace("\n", "")) > self.char_duplicates_ratio:
            return False, "char_dup_ratio"
        if text.count("\n") / len(view(text).words) > self.new_line_ratio:
            return False, "list_ratio"
        return True
