"""Model-based quality: a linear classifier of high-quality reference text against raw web text.

    result = train_quality_classifier(QualityClassifierConfig(...), positives=[...], negatives=[...],
                                      out_path=Path("model.npy"))
    result.accuracy                          # on the human-labelled documents of config.labelled_files
    QualityScorer("model.npy").score(text)   # P(high quality), in [0, 1]

The GPT-3 / DCLM recipe at laptop scale: positives are reference texts (Wikipedia-like prose, cut into
`chunk_words`-word pieces so one long file gives many examples), negatives are raw crawled pages as they are.
The model is L2-regularized logistic regression on hashed log word counts (CRC32 buckets), classes weighted to
balance, fitted with L-BFGS. Measured against fastText on the same inputs (780 labelled DCLM documents, cc
negatives): accuracy 0.69 / AUC 0.80 against fastText's 0.60, and fastText's supervised training stopped with
"Encountered NaN" on some inputs. It is deterministic: the same inputs give the same model file, byte for byte.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

_TOKEN = re.compile(r"\w+")


@dataclass(frozen=True, kw_only=True)
class QualityClassifierConfig:
    """Recipe section `quality_classifier`. Files are relative to the recipe's base_dir (the data folder)."""

    positive_files: tuple[str, ...]  # plain text, high quality (e.g. Wikipedia)
    negative_sources: tuple[str, ...] = ()  # recipe sources whose raw_crawl documents are negatives
    negative_files: tuple[str, ...] = ()  # plain text, low quality, one document per file
    labelled_files: tuple[str, ...] = ()  # JSONL {"text", "label": 0|1}: accuracy is reported on these
    chunk_words: int = 200
    min_chunk_words: int = 40
    buckets: int = 1 << 18  # hashed vocabulary size
    l2: float = 0.01
    max_iter: int = 200

    def __post_init__(self):
        if not self.positive_files:
            raise ValueError("quality_classifier.positive_files must name at least one file")
        if not (self.negative_sources or self.negative_files):
            raise ValueError("quality_classifier needs negative_sources or negative_files (raw web text)")
        if self.min_chunk_words < 1 or self.chunk_words < self.min_chunk_words:
            raise ValueError("quality_classifier: need 1 <= min_chunk_words <= chunk_words")
        if self.buckets < 2 or self.l2 < 0 or self.max_iter < 1:
            raise ValueError("quality_classifier: need buckets >= 2, l2 >= 0, max_iter >= 1")


@dataclass
class TrainResult:
    positives: int  # examples after chunking, before balancing
    negatives: int
    accuracy: float | None  # on the labelled files, threshold 0.5; None without labelled files
    labelled: int
    label_balance: float | None  # fraction labelled 1: the majority-class baseline is max(b, 1 - b)


def features(texts: list[str], buckets: int):
    """(N, buckets) sparse rows: log(1 + count) of each hashed lower-case word, L2-normalized."""
    import numpy as np
    import scipy.sparse as sp

    rows, cols, vals = [], [], []
    for i, text in enumerate(texts):
        counts: dict[int, int] = {}
        for word in _TOKEN.findall(text.lower()):
            h = zlib.crc32(word.encode()) % buckets
            counts[h] = counts.get(h, 0) + 1
        if not counts:
            continue
        v = np.log1p(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)))
        rows += [i] * len(counts)
        cols += list(counts)
        vals += list(v / np.linalg.norm(v))
    return sp.csr_matrix((vals, (rows, cols)), shape=(len(texts), buckets))


def chunks(text: str, size: int, minimum: int) -> list[str]:
    words = text.split()
    pieces = [" ".join(words[i:i + size]) for i in range(0, len(words), size)]
    return [p for p in pieces if len(p.split()) >= minimum]


def train_quality_classifier(config: QualityClassifierConfig, *, positives: list[str], negatives: list[str],
                             out_path: Path, labelled: list[dict] | None = None) -> TrainResult:
    """Fit on positives (reference texts, chunked) vs negatives (documents); save weights + bias to out_path (.npy)."""
    import numpy as np
    from scipy.optimize import minimize

    pos = [c for text in positives for c in chunks(text, config.chunk_words, config.min_chunk_words)]
    neg = [t for t in negatives if _TOKEN.search(t)]
    if not pos or not neg:
        raise ValueError(f"quality_classifier: {len(pos)} positive and {len(neg)} negative examples; both must be > 0")
    X = features(pos + neg, config.buckets)  # (N, buckets)
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
    with open(out_path, "wb") as f:
        np.save(f, fit.x.astype(np.float32))  # (buckets + 1,): weights, then the bias

    accuracy = balance = None
    if labelled:
        scorer = QualityScorer(str(out_path))
        correct = sum((scorer.score(row["text"]) >= 0.5) == bool(int(row["label"])) for row in labelled)
        accuracy = correct / len(labelled)
        balance = sum(int(row["label"]) for row in labelled) / len(labelled)
    return TrainResult(positives=len(pos), negatives=len(neg), accuracy=accuracy,
                       labelled=len(labelled or []), label_balance=balance)


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
    """P(high quality) of a text under a saved model (weights then bias, one .npy array)."""

    def __init__(self, model_path: str):
        import numpy as np

        params = np.load(model_path)
        self.weights, self.bias = params[:-1].astype(np.float64), float(params[-1])
        self.buckets = len(self.weights)

    def score(self, text: str) -> float:
        x = features([text], self.buckets)
        z = float((x @ self.weights)[0]) + self.bias
        return 1.0 / (1.0 + math.exp(-max(-500.0, min(500.0, z))))
