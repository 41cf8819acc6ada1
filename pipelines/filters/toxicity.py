"""Toxic and offensive language: each sentence scored by a model that ships inside a wheel, each document judged
by the share of its sentences that are offensive and by its highest score.

    step = ToxicityFilter(ToxicityConfig(sentence_threshold=0.9, max_share=0.1, max_score=0.99))
    # kept documents get metadata toxicity_max (the highest sentence score) and toxicity_share (offensive
    # sentences / judged sentences); drops are counted as dropped_toxicity_share and dropped_toxicity_max

The model is alt-profanity-check's (profanity_check/data/{vectorizer,model}.joblib in its wheel): a bag-of-words
vectorizer and a calibrated linear SVM trained on ~200k human-labelled English comments and tweets (Wikipedia's
toxic comments, a Twitter hate-speech set). Chosen because it loads offline from the installed package (nothing is
fetched at run time), scores tens of thousands of sentences a second on one CPU core, and its pickles are tied to
the scikit-learn and joblib the stack already pins (constraints.txt; docs/stack.md). A transformer classifier
(Detoxify, a RoBERTa toxicity model) judges context better but must be downloaded and is ~1,000x slower on a CPU;
a word list cannot tell "the cock crowed" from an insult, where a model weighs the whole sentence. It knows English
only: documents of other languages (metadata.language, from language ID) pass unscored, as the quality model's do.

Sentences: a text is split at line breaks and after sentence-final punctuation (. ! ? …, optionally followed by a
closing quote or bracket) before whitespace; fragments of fewer than `min_sentence_words` alphabetic words (menu
items, headings, numbers) are not judged. Scoring runs once per batch of documents (one vectorizer and model call
for all their sentences), the model loaded on first use in the worker process, never pickled across.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter

from pipelines.filters.config import ToxicityConfig

# A break: a line break, or whitespace after . ! ? … (or after one of them and a closing quote or bracket).
_SENTENCE_BREAK = re.compile(r"\s*\n\s*|(?:(?<=[.!?…])|(?<=[.!?…][\"'”’)\]]))\s+")
_ALPHA_WORD = re.compile(r"[^\W\d_]+")
_BATCH_DOCUMENTS = 64  # documents scored together: one model call for all their sentences


def split_sentences(text: str, min_words: int) -> list[str]:
    """The text's sentences of at least min_words alphabetic words, stripped, in order."""
    pieces = (piece.strip() for piece in _SENTENCE_BREAK.split(text))
    return [piece for piece in pieces if piece and len(_ALPHA_WORD.findall(piece)) >= min_words]


def judge(scores: Sequence[float], config: ToxicityConfig) -> tuple[bool | tuple[bool, str], float, float]:
    """(the filter's verdict, the highest score, the share of sentences scoring >= sentence_threshold) for one
    document's sentence scores; a document without sentences to judge is kept with 0.0 and 0.0."""
    if not scores:
        return True, 0.0, 0.0
    top = max(scores)
    share = sum(score >= config.sentence_threshold for score in scores) / len(scores)
    if config.max_score is not None and top >= config.max_score:
        return (False, "toxicity_max"), top, share
    if share > config.max_share:
        return (False, "toxicity_share"), top, share
    return True, top, share


def _load_predict_prob() -> Callable[[list[str]], Sequence[float]]:
    """alt-profanity-check's predict_prob (its import unpickles the model and vectorizer from the wheel)."""
    from profanity_check import predict_prob

    return predict_prob


class ToxicityFilter(BaseFilter):
    """Drops documents with too many offensive sentences (toxicity_share) or one too offensive (toxicity_max);
    metadata gets toxicity_max and toxicity_share, rounded to 4 places."""

    name = "🤬 Toxicity (alt-profanity-check)"

    def __init__(self, config: ToxicityConfig, exclusion_writer=None):
        super().__init__(exclusion_writer, batch_size=_BATCH_DOCUMENTS)
        self.config = config
        self.languages = frozenset(config.languages)
        self._predict_prob: Callable[[list[str]], Sequence[float]] | None = None

    def filter(self, doc: Document):
        return self.filter_batch([doc])[0]

    def filter_batch(self, batch: list[Document]) -> list[bool | tuple[bool, str]]:
        judged = [doc.metadata.get("language", "en") in self.languages for doc in batch]
        per_doc = [split_sentences(doc.text, self.config.min_sentence_words) if scored else []
                   for doc, scored in zip(batch, judged)]
        everything = [sentence for sentences in per_doc for sentence in sentences]
        scores: list[float] = []
        if everything:
            if self._predict_prob is None:  # loaded in the task's process, not pickled across
                self._predict_prob = _load_predict_prob()
            scores = [float(score) for score in self._predict_prob(everything)]
        verdicts: list[bool | tuple[bool, str]] = []
        start = 0
        for doc, scored, sentences in zip(batch, judged, per_doc):
            if not scored:
                verdicts.append(True)
                continue
            verdict, top, share = judge(scores[start:start + len(sentences)], self.config)
            start += len(sentences)
            doc.metadata["toxicity_max"] = round(top, 4)
            doc.metadata["toxicity_share"] = round(share, 4)
            verdicts.append(verdict)
        return verdicts
