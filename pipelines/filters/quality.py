"""Model-based quality: a linear classifier of high-quality reference text against low-quality web text.

    result = train_quality_classifier(QualityClassifierConfig(...), positives=[...], negatives=[...],
                                      out_path=Path("model.npy"), model="linear_bigrams")
    result.selection.roc_auc                 # on the part of config.labelled_files the choices are made on
    result.held_out.roc_auc                  # on the part no choice was made on: the figure to trust
    QualityScorer("model.npy").score(text)   # P(high quality), in [0, 1]

The GPT-3 / DCLM recipe at laptop scale: positives are reference texts (Wikipedia-like prose, cut into
`chunk_words`-word pieces so one long file gives many examples), negatives are low-quality web text as it is.
Each model is L2-regularized logistic regression on hashed log n-gram counts (CRC32 buckets, each row
L2-normalized), classes weighted to balance, fitted with L-BFGS; deterministic (the same inputs give the same
model file, byte for byte) and fitted in seconds on one core. The models (`model` in the recipe section):

    linear_words    words alone (the first model)
    linear_bigrams  words and word bigrams (the default): the best of those measured below

The human-labelled documents are split (`split_labelled`): the choices below are made on the selection half
(390 of the 780 DCLM documents), and the chosen model is reported on the other half, which no choice saw. The
negatives matter more than the model. On the selection half (majority baseline 0.544), positives the two reference
files, accuracy at 0.5 / ROC AUC; the second row adds its negatives to those of the first:

    negatives                                  l2      linear_words    linear_bigrams
    cc raw crawl (83) + cs336_low_quality_cc   0.01    0.715 / 0.831   0.738 / 0.846
    + the web pages' boilerplate (1,168)       0.003   0.772 / 0.858   0.787 / 0.873
                                               0.01    0.749 / 0.881   0.777 / 0.889   <- the demo's
                                               0.03    0.741 / 0.894   0.759 / 0.898
                                               0.1     0.715 / 0.901   0.756 / 0.901

Held out (the other 390, majority baseline 0.544), the demo's choice scores 0.746 / 0.839: the figure to trust.
l2 trades ranking for the threshold: more penalty ranks a little better and answers worse at 0.5, which is where
the quality_model filter decides; 0.01 is the balance of both (measured 2026-12-05).

So the negatives are the cc crawl, the low-quality file and `boilerplate_sources`: for each page of those sources,
the lines of its visible text that the extractor dropped (menus, teasers, cookie and newsletter boxes, footers;
see `boilerplate`), one negative per page. The web pages' main text is mostly edited articles, the kind of text
the DCLM raters keep, and their boilerplate the kind they reject. Measured earlier on all 780 labels, before they
were split (so in-sample, and only a guide): nltk's webtext (forums, chat, ads, reviews; 1,439 files) as more
negatives took the AUC to 0.57-0.59, probably because the raters keep much conversational, first-person web text
(blog posts, forum answers) that webtext teaches the model to reject; the boilerplate of the English pages alone
(323) gave 0.75-0.77 where all pages' gave 0.85-0.86 (most pages are German, but their menus and boxes share
interface words, numbers and dates with any page); word and character 3-4-grams 0.75 (5x slower); fastText
supervised (1-2-grams, 5-25 epochs) 0.79.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_TOKEN = re.compile(r"\w+")
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*>")

# The models a recipe may choose: name -> the longest word n-gram hashed (1: words, 2: words and bigrams).
MODELS = {"linear_words": 1, "linear_bigrams": 2}


@dataclass(frozen=True, kw_only=True)
class QualityClassifierConfig:
    """Recipe section `quality_classifier`. Files are relative to the recipe's base_dir (the data folder)."""

    positive_files: tuple[str, ...]  # plain text, high quality (e.g. Wikipedia)
    negative_sources: tuple[str, ...] = ()  # recipe sources whose raw_crawl documents are negatives
    boilerplate_sources: tuple[str, ...] = ()  # HTML sources whose pages' dropped lines are negatives, one per page
    negative_files: tuple[str, ...] = ()  # plain text, low quality, one document per file
    labelled_files: tuple[str, ...] = ()  # JSONL {"text", "label": 0|1}: accuracy and ROC AUC are reported on these
    # The labelled documents split in two by a hash of their text (see split_labelled): the models are compared,
    # and this section's choices measured, on the selection part; the held-out part is scored by the chosen model
    # alone, the figure a user can trust.
    held_out_fraction: float = 0.5
    model: str = "linear_bigrams"  # the one the quality_model filter uses; every model of MODELS is evaluated
    chunk_words: int = 200
    min_chunk_words: int = 40
    buckets: int = 1 << 18  # hashed vocabulary size
    l2: float = 0.01
    max_iter: int = 200

    def __post_init__(self):
        if not self.positive_files:
            raise ValueError("quality_classifier.positive_files must name at least one file")
        if not (self.negative_sources or self.negative_files or self.boilerplate_sources):
            raise ValueError("quality_classifier needs negative_sources, boilerplate_sources or negative_files "
                             "(low-quality web text)")
        if self.model not in MODELS:
            raise ValueError(f"quality_classifier.model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.min_chunk_words < 1 or self.chunk_words < self.min_chunk_words:
            raise ValueError("quality_classifier: need 1 <= min_chunk_words <= chunk_words")
        if not 0 < self.held_out_fraction < 1:
            raise ValueError(f"quality_classifier.held_out_fraction must be in (0, 1), got {self.held_out_fraction}")
        if self.buckets < 2 or self.l2 < 0 or self.max_iter < 1:
            raise ValueError("quality_classifier: need buckets >= 2, l2 >= 0, max_iter >= 1")


@dataclass(frozen=True)
class LabelledScore:
    """A model's figures on some labelled documents."""

    documents: int
    accuracy: float  # threshold 0.5
    roc_auc: float | None  # P(a document labelled 1 scores above one labelled 0); None when one label is missing
    label_balance: float  # fraction labelled 1: the majority-class baseline is max(b, 1 - b)


@dataclass
class TrainResult:
    model: str
    positives: int  # examples after chunking, before balancing
    negatives: int
    selection: LabelledScore | None  # on the labelled part the choices are made on; None without labelled files
    held_out: LabelledScore | None  # on the part no choice was made on


def features(texts: list[str], buckets: int, word_ngrams: int = 1):
    """(N, buckets) sparse rows: log(1 + count) of each hashed lower-case word n-gram (n <= word_ngrams; an
    n-gram is its words joined by single spaces, hashed by CRC32), L2-normalized."""
    import numpy as np
    import scipy.sparse as sp

    rows, cols, vals = [], [], []
    for i, text in enumerate(texts):
        words = [word.encode() for word in _TOKEN.findall(text.lower())]
        grams = [zlib.crc32(word) for word in words]
        hashes = list(grams)
        for n in range(1, word_ngrams):
            # CRC32 continues over appended bytes: crc32(b" " + next, crc32(a)) == crc32(a + b" " + next), so each
            # longer n-gram's hash costs one short call, not a join and a hash of the whole n-gram.
            grams = [zlib.crc32(b" " + word, h) for h, word in zip(grams, words[n:])]
            hashes += grams
        if not hashes:
            continue
        counts = Counter(h % buckets for h in hashes)
        v = np.log1p(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)))
        rows.append(np.full(len(counts), i))
        cols.append(np.fromiter(counts.keys(), dtype=np.int64, count=len(counts)))
        vals.append(v / np.linalg.norm(v))
    if not rows:
        return sp.csr_matrix((len(texts), buckets))
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                         shape=(len(texts), buckets))


def chunks(text: str, size: int, minimum: int) -> list[str]:
    words = text.split()
    pieces = [" ".join(words[i:i + size]) for i in range(0, len(words), size)]
    return [p for p in pieces if len(p.split()) >= minimum]


def split_labelled(rows: list[dict], held_out_fraction: float) -> tuple[list[dict], list[dict]]:
    """(selection, held_out): within each label, the rows ordered by the SHA-256 of their text and the first
    round(n * held_out_fraction) held out. Stratified, so both parts keep the label mix; by content, so the split
    does not move when files are reordered or rows appended elsewhere, and a row keeps its side."""
    import hashlib

    selection, held_out = [], []
    for label in (0, 1):
        group = sorted((row for row in rows if int(row["label"]) == label),
                       key=lambda row: hashlib.sha256(row["text"].encode()).digest())
        cut = round(len(group) * held_out_fraction)
        held_out += group[:cut]
        selection += group[cut:]
    return selection, held_out


def score_labelled(scorer: "QualityScorer", rows: list[dict]) -> LabelledScore | None:
    if not rows:
        return None
    scores = scorer.scores([row["text"] for row in rows])
    labels = [int(row["label"]) for row in rows]
    accuracy = sum((s >= 0.5) == bool(label) for s, label in zip(scores, labels)) / len(rows)
    auc = roc_auc(scores, labels) if 0 < sum(labels) < len(labels) else None
    return LabelledScore(documents=len(rows), accuracy=accuracy, roc_auc=auc, label_balance=sum(labels) / len(rows))


def boilerplate(html: str, main_text: str) -> str:
    """The lines of a page's visible text (scripts, styles and comments aside) that its extracted main text does
    not hold, whitespace-normalized, one per line: what the extractor dropped. "" when the HTML does not parse."""
    from lxml import etree

    try:
        # lxml refuses a str that declares its encoding; the text is decoded already. Plain etree elements, not
        # lxml.html's: the same tree, without a Python class looked up for every node (a third faster here).
        root = etree.fromstring(_XML_DECLARATION.sub("", html), etree.HTMLParser())
    except (etree.ParserError, ValueError):
        return ""
    if root is None:  # nothing but blank space or a comment
        return ""
    etree.strip_elements(root, "script", "style", "noscript", "template", "svg", etree.Comment,
                         etree.ProcessingInstruction, with_tail=False)  # the text after each stays
    main = " ".join(main_text.split())
    lines = (" ".join(line.split()) for line in "\n".join(root.itertext()).split("\n") if line and not line.isspace())
    # Inline markup splits a kept paragraph into several pieces: a piece found in the main text was kept.
    return "\n".join(line for line in lines if line not in main)


def roc_auc(scores: list[float], labels: list[int]) -> float:
    """The probability that a document labelled 1 scores above one labelled 0 (ties count half): Mann-Whitney U
    from average ranks."""
    from scipy.stats import rankdata

    ranks = rankdata(scores)  # ties get their average rank
    ones = sum(labels)
    zeros = len(labels) - ones
    if not ones or not zeros:
        raise ValueError("ROC AUC needs documents labelled 0 and 1")
    return float((sum(r for r, label in zip(ranks, labels) if label) - ones * (ones + 1) / 2) / (ones * zeros))


def train_quality_classifier(config: QualityClassifierConfig, *, positives: list[str], negatives: list[str],
                             out_path: Path, labelled: list[dict] | None = None,
                             model: str | None = None) -> TrainResult:
    """Fit `model` (default: config.model) on positives (reference texts, chunked) vs negatives (documents);
    save it to out_path (.npy, see QualityScorer)."""
    import numpy as np
    from scipy.optimize import minimize

    model = model or config.model
    if model not in MODELS:
        raise ValueError(f"quality model must be one of {', '.join(MODELS)}, got {model!r}")
    pos = [c for text in positives for c in chunks(text, config.chunk_words, config.min_chunk_words)]
    neg = [t for t in negatives if _TOKEN.search(t)]
    if not pos or not neg:
        raise ValueError(f"quality_classifier: {len(pos)} positive and {len(neg)} negative examples; both must be > 0")
    X = features(pos + neg, config.buckets, MODELS[model])  # (N, buckets)
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]  # (N,)
    # Far more of one class than the other would make "always that class" the optimum: weight to balance.
    weight = np.where(y == 1, len(y) / (2 * len(pos)), len(y) / (2 * len(neg)))

    def loss_and_grad(params):
        w, b = params[:-1], params[-1]
        z = X @ w + b
        p = 1.0 / (1.0 + np.exp(-z))
        loss = np.sum(weight * (np.logaddexp(0.0, z) - y * z)) / len(y) + config.l2 / 2 * (w @ w)
        r = weight * (p - y) / len(y)
        return loss, np.r_[X.T @ r + config.l2 * w, r.sum()]

    fit = minimize(loss_and_grad, np.zeros(config.buckets + 1), jac=True, method="L-BFGS-B",
                   options={"maxiter": config.max_iter})
    out_path.parent.mkdir(parents=True, exist_ok=True)
    saved = np.zeros(1, dtype=_model_dtype(config.buckets))
    saved["word_ngrams"], saved["bias"], saved["weights"] = MODELS[model], fit.x[-1], fit.x[:-1]
    with open(out_path, "wb") as f:
        np.save(f, saved)  # one record: the header and raw bytes, no timestamp, so the same fit gives the same file

    selection, held_out = split_labelled(labelled or [], config.held_out_fraction)
    scorer = QualityScorer(str(out_path))
    return TrainResult(model=model, positives=len(pos), negatives=len(neg),
                       selection=score_labelled(scorer, selection), held_out=score_labelled(scorer, held_out))


def _model_dtype(buckets: int):
    import numpy as np

    return np.dtype([("word_ngrams", "<i4"), ("bias", "<f4"), ("weights", "<f4", (buckets,))])


def read_labelled(paths: list[Path]) -> list[dict]:
    rows = []
    for path in paths:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not valid JSON: {exc}") from exc
            if not isinstance(row, dict) or "text" not in row or row.get("label") not in (0, 1, "0", "1"):
                raise ValueError(f"{path}:{i}: a labelled row needs 'text' and 'label' 0 or 1")
            rows.append(row)
    return rows


class QualityScorer:
    """P(high quality) of a text under a saved model: one record of word_ngrams (int32), bias and the bucket
    weights (float32), saved with numpy."""

    def __init__(self, model_path: str):
        import numpy as np

        saved = np.load(model_path)
        if saved.dtype.names != ("word_ngrams", "bias", "weights") or saved.shape != (1,):
            raise ValueError(f"{model_path}: not a quality model (a record of word_ngrams, bias, weights)")
        self.word_ngrams = int(saved["word_ngrams"][0])
        self.bias = float(saved["bias"][0])
        self.weights = saved["weights"][0].astype(np.float64)
        self.buckets = len(self.weights)

    def score(self, text: str) -> float:
        return self.scores([text])[0]

    def scores(self, texts: list[str]) -> list[float]:
        """Each text's P(high quality), the texts' features built as one matrix."""
        z = features(texts, self.buckets, self.word_ngrams) @ self.weights + self.bias
        return [1.0 / (1.0 + math.exp(-max(-500.0, min(500.0, float(x))))) for x in z]
