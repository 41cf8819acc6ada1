"""The words of a text as datatrove's split_into_words finds them (spaCy's English tokenizer), found once and shared
by the steps that decide on them (gopher.py, fineweb.py).

    words = split_words(text)        # == datatrove's split_into_words(text), cached
    view(text).words                 # the same, shared by the steps of one document

spaCy (datatrove's blank English tokenizer, without the lexical attributes no boundary depends on) splits the text on
whitespace (Python's str.isspace, as str.split does) and tokenizes each whitespace-free chunk on its own, the same way
wherever it stands (its own cache is keyed by the chunk). So the words of a text are the chunks' tokens in order: each
chunk is tokenized once per process (those a document has that are not cached yet, in one spaCy call) and kept in a
bounded cache; words repeat (Zipf), so most documents need no spaCy at all. The last few texts' analyses are kept by
identity, so the steps of one document share them. Profiled on the demo's web pages, spaCy's tokenizer was 60% of
datatrove's time: datatrove tokenizes inside a spaCy memory zone, so every word's lexeme is built again in every
document.
"""

from __future__ import annotations

from datatrove.utils.text import split_into_words
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
        import sys

        # spaCy imports thinc, which imports torch when it can: 1.0 s of the 1.7 s spaCy took to load, for neural
        # layers a tokenizer never runs (a filter task, or a helper as it starts, loads it). torch is hidden while
        # spaCy loads, unless this process has it already; thinc then notes it absent and `import torch` works as
        # ever after. (Another thread importing torch in that ~0.6 s would fail: no filter process has one.)
        hide = "torch" not in sys.modules
        if hide:
            sys.modules["torch"] = None  # an import of it raises ImportError
        try:
            import spacy
        finally:
            if hide and sys.modules.get("torch", 0) is None:
                del sys.modules["torch"]

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
