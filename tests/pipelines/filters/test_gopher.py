"""The fast prose rules (pipelines/filters/gopher.py and fineweb.py on the words of words.py, and C4's in c4.py) give
datatrove's verdicts, document for document, on every document of the demo's sources that reaches them."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
from datatrove.data import Document
from datatrove.utils.text import split_into_words
from datatrove.utils.word_tokenizers import load_word_tokenizer, strip_strings
from spacy.attrs import ORTH

from assets.recipe import load_recipe
from pipelines.filters.c4 import C4LineFilter
from pipelines.filters.gopher import LanguageAwareGopherQuality
from pipelines.filters.pipeline import datatrove_counterpart, filter_steps
from pipelines.filters.words import split_words
from pipelines.ingest.step import ingest_source
from pipelines.inputs import expand_inputs
from pipelines.shards import iter_documents
from tests.conftest import REPO

DEMO = REPO / "recipes" / "demo.yaml"


_NLP = load_word_tokenizer("en")  # datatrove's English word tokenizer (a blank spaCy pipeline with a sentencizer)


def _spacy_doc(text: str, sentences: bool):
    """datatrove's _do_tokenize of an English text, the IS_ALPHA retry included. For words alone, the pipeline's
    tokenizer without its sentencizer (nlp.make_doc): the sentencizer only marks sentence starts, no token changes,
    and it was a fifth of the spaCy time of the verdict test."""
    nlp = _NLP.tokenizer
    nlp.max_length = len(text) + 10
    run = (lambda t: nlp(t, disable=["parser", "tagger", "ner"])) if sentences else nlp.make_doc
    try:
        return run(text)
    except Exception:
        if "IS_ALPHA" not in text:
            raise
        return run(text.replace("IS_ALPHA", ""))


@functools.lru_cache(maxsize=4)  # the rules of one document ask for its words in turn (datatrove caches them too)
def reference_words(text: str) -> list[str]:
    """datatrove's split_into_words as it computes it (spaCy's blank English tokenizer on the whole text, tokens
    stripped, the IS_ALPHA retry), without its memory zone: the zone only frees the words' lexemes after each text,
    which changes no token and made datatrove's side of this test take minutes. Each token's text is its ORTH string,
    what Token.text returns, read from the doc's array instead of a Token object made per token (40% of the time)."""
    doc = _spacy_doc(text, sentences=False)
    strings = doc.vocab.strings
    return strip_strings([strings[orth] for orth in doc.to_array(ORTH).tolist()])


@functools.lru_cache(maxsize=1 << 16)  # C4 counts each kept line's sentences: menus and footers recur page to page
def reference_sentences(text: str, language: str = "en") -> list[str]:
    """datatrove's split_into_sentences (its parts between sentence ends), without the memory zone likewise."""
    spans = [sent.end_char for sent in _spacy_doc(text, sentences=True).sents]
    return [text[a:b] for a, b in zip([0] + spans[:-1], spans[:-1] + [len(text)])]


@pytest.fixture(scope="module")
def demo_documents(tmp_path_factory) -> dict[str, list[dict]]:
    """Every demo source's documents as its raw_crawl gives them to the filter (the real ingest, 2 workers)."""
    recipe = load_recipe(DEMO)
    out = tmp_path_factory.mktemp("raw")
    documents = {}
    for source in recipe.sources:
        inputs = expand_inputs(list(source.inputs), recipe.input_root)
        ingest_source(name=source.name, inputs=inputs, format=source.format, reader=source.reader,
                      out_dir=out / source.name, tasks=len(inputs), workers=2)
        documents[source.name] = [doc for part in sorted((out / source.name).glob("part-*.jsonl.gz"))
                                  for doc in iter_documents(part)]
    return documents


@pytest.mark.slow  # the demo's ingest (~30 s of CPU: HTML extraction), then both sides' rules
def test_every_demo_document_gets_datatrove_verdict_and_reason(demo_documents, monkeypatch):
    """Each source's documents go through its own filter steps in order (the ones before a rule decide which
    documents reach it, as in the pipeline); at every reimplemented rule, datatrove's own step judges the same
    document and must give the same keep or drop and the same reason; a kept C4 document has the same lines."""
    import datatrove.pipeline.filters.c4_filters as c4
    import datatrove.pipeline.filters.fineweb_quality_filter as fineweb
    import datatrove.pipeline.filters.gopher_quality_filter as gopher_quality
    import datatrove.pipeline.filters.gopher_repetition_filter as gopher_repetition

    for module in (fineweb, gopher_quality, gopher_repetition):
        monkeypatch.setattr(module, "split_into_words", lambda text, language="en": reference_words(text))
    monkeypatch.setattr(c4, "split_into_sentences", reference_sentences)
    recipe = load_recipe(DEMO)
    compared: dict[str, int] = {}
    for source in recipe.sources:
        config = dataclasses.replace(source.filter, quality_model=None, toxicity=None, perplexity=None, pii=None)
        steps = filter_steps(config, lists_root=REPO / "recipes")
        twins = [datatrove_counterpart(step) for step in steps]
        for raw in demo_documents[source.name]:
            doc = Document(text=raw["text"], id=raw["id"], metadata=dict(raw.get("metadata") or {}))
            for step, twin in zip(steps, twins):
                if twin is not None:
                    theirs_doc = Document(text=doc.text, id=doc.id, metadata=dict(doc.metadata))
                    theirs = twin.filter(theirs_doc)
                    before = doc.text
                verdict = step.filter(doc)
                ours = datatrove_rules_verdict(step, verdict)
                if twin is not None:
                    name = type(step).__name__
                    compared[name] = compared.get(name, 0) + 1
                    assert _decision(ours) == _decision(theirs), (source.name, raw["id"], name, ours, theirs)
                    if isinstance(step, C4LineFilter) and ours is True:
                        # datatrove joins the kept lines with "\n"; ours keeps them with the text between them, and
                        # with keep_headings (the web rules) the headings too: datatrove's lines, in order, among ours.
                        lines = iter(line.strip() for line in doc.text.splitlines() if line.strip())
                        theirs_lines = [line.strip() for line in theirs_doc.text.splitlines() if line.strip()]
                        if step.keep_headings:
                            assert all(any(mine == line for mine in lines) for line in theirs_lines), (
                                source.name, raw["id"], before)
                        else:
                            assert list(lines) == theirs_lines, (source.name, raw["id"], before)
                if _decision(verdict) != "kept":
                    break
    # Every rule was reached by many documents: the web rules by the crawl's pages, the c4 source's too.
    assert compared["GopherRepetition"] > 1000 and compared["FineWebQuality"] > 900, compared
    assert compared["LanguageAwareGopherQuality"] > 8000 and compared["C4LineFilter"] > 900, compared


def datatrove_rules_verdict(step, verdict):
    """Our step's verdict on the rules its datatrove twin has. LanguageAwareGopherQuality runs datatrove's Gopher
    quality rules without their stop-word rule (min_stop_words=None), then its stop-word rule per language, only on a
    document they kept: a drop by that rule is a keep by datatrove's rules, read off the one run of the step."""
    if isinstance(step, LanguageAwareGopherQuality):
        assert step.min_stop_words is None  # else the base rules could give this reason too
        if verdict == (False, "gopher_enough_stop_words"):
            return True
    return verdict


def _decision(verdict) -> str:
    if verdict is True or (isinstance(verdict, tuple) and verdict[0]):
        return "kept"
    return verdict[1] if isinstance(verdict, tuple) else "dropped"


@pytest.mark.slow  # the demo's ingest, shared with the test above
def test_words_are_datatrove_words(demo_documents):
    """split_words (spaCy on each whitespace-free chunk once, cached) gives datatrove's split_into_words itself, with
    its memory zone, on real documents of every kind: pages in seven languages, C4, books, math."""
    texts = [doc["text"] for name in ("web", "cc", "cc_wet", "c4") for doc in demo_documents[name][:60]]
    texts += [doc["text"] for doc in demo_documents["math"][:50]] + [demo_documents["books"][0]["text"][:200_000]]
    texts += ["a\u00a0b\u2028c  d\n\ne IS_ALPHA f", "don't (stop) U.S.A. e-mail: x@y.org 3.14% #tag ...", ""]
    for text in texts:
        assert split_words(text) == split_into_words(text), text[:200]
        assert split_words(text) == split_words(text)  # from the cache the second time
