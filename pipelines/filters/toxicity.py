"""Toxic and offensive language: each sentence scored by a model that ships inside a wheel, each document judged
by the share of its sentences that are offensive and by its highest score.

    step = ToxicityFilter(ToxicityConfig(sentence_threshold=0.9, max_share=0.1, max_score=0.99))
    # kept documents get metadata toxicity_max (the highest sentence score) and toxicity_share (offensive
    # sentences / judged sentences); drops are counted as dropped_toxicity_share and dropped_toxicity_max

The model is alt-profanity-check's (profanity_check/data/{vectorizer,model}.joblib in its wheel): a bag-of-words
vectorizer and a calibrated linear SVM trained on ~200k human-labelled English comments and tweets (Wikipedia's
toxic comments, a Twitter hate-speech set). Chosen because it loads offline from the installed package (nothing is
fetched at run time), scores tens of thousands of sentences a second on one CPU core, and its pickles are tied to
the scikit-learn and joblib the stack already pins (constraints.txt; docs/stack.md). It is read here without
importing scikit-learn (_LinearToxicityModel: its state from the pickles, applied as scikit-learn applies it, the
same scores to the last bit), which saves every filtering process 1.1 s of imports. A transformer classifier
(Detoxify, a RoBERTa toxicity model) judges context better but must be downloaded and is ~1,000x slower on a CPU;
a word list cannot tell "the cock crowed" from an insult, where a model weighs the whole sentence. It knows English
only: documents of other languages (metadata.language, from language ID) pass unscored, as the quality model's do.

Sentences: a text is split at line breaks and after sentence-final punctuation (. ! ? …, optionally followed by a
closing quote or bracket) before whitespace; fragments of fewer than `min_sentence_words` alphabetic words (menu
items, headings, numbers) are not judged. Scoring runs once per batch of documents, the model loaded on first use
in the worker process (or as a local helper starts: pipelines/runner.py), never pickled across.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
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


@functools.cache
def _load_predict_prob() -> Callable[[list[str]], list[float]]:
    """alt-profanity-check's predict_prob, computed here from its model files without importing scikit-learn; read
    once per process (a local helper reads it as it starts)."""
    return _LinearToxicityModel.from_wheel().predict_prob


class _LinearToxicityModel:
    """alt-profanity-check's model (a TF-IDF vectorizer, then the mean of calibrated linear SVMs) read from its
    wheel's joblib files without scikit-learn, and applied as scikit-learn applies it, operation for operation:
    the same scores to the last bit (tests/pipelines/filters/test_toxicity.py holds it to the package's own
    predict_prob on real sentences). Importing the package imports scikit-learn and SciPy, ~1.1 s of every process
    that filters (a helper, the run's own) for a model of one dictionary and six vectors.

    Per sentence: lower-cased, its tokens (the vectorizer's token_pattern) counted by their vocabulary column (a
    stop word or unknown token has none); each count times its column's idf, the row divided by its L2 norm, both
    summed in column order as scikit-learn's sparse rows are; per SVM the dot product with its coefficients plus
    the intercept, the sigmoid calibration expit(-(a·d + b)) (a value within 1e-5 over 1 is 1, as scikit-learn
    clips it), and the mean over the SVMs."""

    def __init__(self, vocabulary: dict[str, int], idf: list[float], token_pattern: str,
                 svms: list[tuple[list[float], float, float, float]]):
        self.vocabulary, self.idf, self.token = vocabulary, idf, re.compile(token_pattern)
        self.svms = svms  # (coefficients, intercept, a, b) of each calibrated SVM

    @classmethod
    def from_wheel(cls) -> "_LinearToxicityModel":
        from importlib.util import find_spec

        spec = find_spec("profanity_check")  # found, not imported: its __init__ loads the model with scikit-learn
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("the toxicity filter needs the package alt-profanity-check (make install)")
        folder = Path(spec.submodule_search_locations[0]) / "data"
        vectorizer, model = (_read_state(folder / name) for name in ("vectorizer.joblib", "model.joblib"))
        settings = {"lowercase": True, "analyzer": "word", "ngram_range": (1, 1), "preprocessor": None,
                    "tokenizer": None, "strip_accents": None, "binary": False, "norm": "l2", "use_idf": True,
                    "sublinear_tf": False}
        changed = {key: vectorizer.get(key) for key, value in settings.items() if vectorizer.get(key) != value}
        if changed or model.get("method") != "sigmoid":  # what score() computes would no longer be the model
            raise RuntimeError(f"alt-profanity-check's model is not the one this scorer reads: vectorizer "
                               f"{changed}, calibration {model.get('method')!r}")
        svms = []
        for calibrated in model["calibrated_classifiers_"]:
            estimator, [calibrator] = calibrated["estimator"], calibrated["calibrators"]
            svms.append((estimator["coef_"][0].tolist(), float(estimator["intercept_"][0]),
                         float(calibrator["a_"]), float(calibrator["b_"])))
        return cls(dict(vectorizer["vocabulary_"]), vectorizer["_tfidf"]["idf_"].tolist(),
                   vectorizer["token_pattern"], svms)

    def predict_prob(self, texts: list[str]) -> list[float]:
        return [self.score(text) for text in texts]

    def score(self, text: str) -> float:
        counts: dict[int, int] = {}
        for token in self.token.findall(text.lower()):
            column = self.vocabulary.get(token)
            if column is not None:
                counts[column] = counts.get(column, 0) + 1
        columns = sorted(counts)
        values = [float(counts[column]) * self.idf[column] for column in columns]
        norm = 0.0
        for value in values:
            norm += value * value
        if norm != 0.0:
            norm = math.sqrt(norm)
            values = [value / norm for value in values]
        total = 0.0
        for coefficients, intercept, a, b in self.svms:
            decision = 0.0
            for column, value in zip(columns, values):
                decision += value * coefficients[column]
            probability = _expit(-(a * (decision + intercept) + b))
            total += 1.0 if 1.0 < probability <= 1.0 + 1e-5 else probability
        return total / len(self.svms)


def _expit(x: float) -> float:
    """SciPy's expit for a double (1 / (1 + exp(-x)) in its C++), with the C library's exp as SciPy's uses."""
    try:
        return 1.0 / (1.0 + math.exp(-x))
    except OverflowError:  # exp(-x) beyond a double: the C expression gives 1 / inf
        return 0.0


def _read_state(path) -> dict:
    """A joblib pickle of scikit-learn estimators as nested {attribute: value} dicts (numpy arrays as they were),
    with no scikit-learn class imported: every sklearn.* class unpickles as a plain holder of its state."""
    from joblib.numpy_pickle import NumpyUnpickler

    class State(dict):
        def __setstate__(self, state):
            self.update(state)

    class StateUnpickler(NumpyUnpickler):
        def find_class(self, module, name):
            return State if module.split(".")[0] == "sklearn" else super().find_class(module, name)

    with open(path, "rb") as handle:
        return StateUnpickler(str(path), handle, ensure_native_byte_order=False).load()


class ToxicityFilter(BaseFilter):
    """Drops documents with too many offensive sentences (toxicity_share) or one too offensive (toxicity_max);
    metadata gets toxicity_max and toxicity_share, rounded to 4 places."""

    name = "🤬 Toxicity (alt-profanity-check)"

    def __init__(self, config: ToxicityConfig, exclusion_writer=None):
        super().__init__(exclusion_writer, batch_size=_BATCH_DOCUMENTS)
        self.config = config
        self.languages = frozenset(config.languages)
        self._predict_prob: Callable[[list[str]], list[float]] | None = None

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
