"""pipelines/filters/words.py: the words of a text are datatrove's split_into_words, from the chunk cache (on every
word of the demo's sources: test_gopher.py's test_words_are_datatrove_words)."""

from datatrove.utils.text import split_into_words

from pipelines.filters import words


def test_a_text_s_words_are_datatrove_words_and_a_text_s_view_is_shared():
    text = "don't (stop) U.S.A. e-mail: x@y.org 3.14% #tag ... a\u00a0b"
    assert words.split_words(text) == list(split_into_words(text, "en"))
    assert words.view(text) is words.view(text) and words.view(text).words == words.split_words(text)
    assert words.view("".join(["an ", "equal text"])) is not words.view("an equal text")  # by identity, not by value


def test_words_stay_datatrove_words_when_the_chunk_cache_fills(monkeypatch):
    """The chunk cache is cleared when a text's new chunks would overfill it: that text's chunks cached before are
    gone too, and are tokenized again with the new ones (a KeyError there once waited for the 500,000th chunk)."""
    monkeypatch.setattr(words, "_MAX_CACHED_CHUNKS", 8)
    monkeypatch.setattr(words, "_CHUNK_WORDS", {})
    monkeypatch.setattr(words, "_WORD_FLAGS", {})
    texts = ["The cat sat on the mat.", "The dog (a big one) sat on the cat's mat, didn't it?",
             "Mat, cat and dog: all sat on the mat again."]
    for text in texts:
        assert words.split_words(text) == list(split_into_words(text, "en")), text
        assert len(words._CHUNK_WORDS) <= 8 + len(text.split())


def test_spacy_loads_without_torch_and_torch_still_imports_after():
    """spaCy's thinc imports torch when it can (1 s of the 1.7 s spaCy took to load); the words' tokenizer loads
    with torch hidden, in a fresh process, and torch imports as ever once it has."""
    import subprocess
    import sys

    from tests.conftest import REPO

    probe = ("import sys; from pipelines.filters import words; words._spacy(); loaded = 'torch' in sys.modules; "
             "import torch; print(loaded, float(torch.ones(3).sum()), words.split_words(\"It's 3.5 kg.\"))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False 3.0 ['It', \"'s\", '3.5', 'kg', '.']"
