"""pipelines.filters.quality: config checks, chunking, hashed features, a tiny fit, the saved model, labelled files."""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest

from pipelines.filters.quality import (
    QualityClassifierConfig,
    QualityScorer,
    chunks,
    features,
    read_labelled,
    train_quality_classifier,
)

GOOD = "theorem proof lemma corollary axiom definition".split()
BAD = "click buy now cheap deal free".split()


def config(**kw) -> QualityClassifierConfig:
    return QualityClassifierConfig(**{"positive_files": ("wiki.txt",), "negative_files": ("cc.txt",), **kw})


# --- config -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, message", [
    (dict(positive_files=()), "positive_files must name at least one file"),
    (dict(negative_files=(), negative_sources=()), "needs negative_sources or negative_files"),
    (dict(min_chunk_words=0), "1 <= min_chunk_words <= chunk_words"),
    (dict(chunk_words=10, min_chunk_words=11), "1 <= min_chunk_words <= chunk_words"),
    (dict(buckets=1), "buckets >= 2"),
    (dict(l2=-0.1), "l2 >= 0"),
    (dict(max_iter=0), "max_iter >= 1"),
])
def test_bad_classifier_settings_are_refused_by_name(kw, message):
    with pytest.raises(ValueError, match=message):
        config(**kw)


def test_negatives_may_come_from_sources_alone_and_edges_are_allowed():
    c = QualityClassifierConfig(positive_files=("a",), negative_sources=("cc",), chunk_words=1, min_chunk_words=1,
                                buckets=2, l2=0.0, max_iter=1)
    assert c.negative_files == () and c.chunk_words == c.min_chunk_words == 1


# --- chunks and features ----------------------------------------------------------------------------------------


def test_chunks_cut_by_words_and_drop_a_short_tail():
    text = " ".join(f"w{i}" for i in range(23))
    assert chunks(text, 10, 3) == [" ".join(f"w{i}" for i in range(0, 10)), " ".join(f"w{i}" for i in range(10, 20)),
                                   "w20 w21 w22"]
    assert chunks(text, 10, 4) == chunks(text, 10, 3)[:2]  # the 3-word tail is under the minimum
    assert chunks("a\n\nb\t c   d", 2, 1) == ["a b", "c d"]  # any whitespace splits; pieces are single-spaced
    assert chunks("", 5, 1) == [] and chunks("few words", 5, 3) == []


def test_features_are_l2_normalized_log_counts_in_crc32_buckets():
    buckets = 1 << 18
    X = features(["The cat, the CAT; dog!", "", "!!! ..."], buckets)
    assert X.shape == (3, buckets)
    h = {w: zlib.crc32(w.encode()) % buckets for w in ("the", "cat", "dog")}
    assert len(set(h.values())) == 3  # no collision among these three words
    raw = {h["the"]: math.log(3), h["cat"]: math.log(3), h["dog"]: math.log(2)}  # log(1 + count): 2, 2, 1
    norm = math.sqrt(sum(v * v for v in raw.values()))
    row = X[0].toarray().ravel()
    assert set(np.flatnonzero(row)) == set(raw)
    for col, value in raw.items():
        assert row[col] == pytest.approx(value / norm)
    assert X[1].nnz == 0 and X[2].nnz == 0  # no words: an all-zero row, not NaN


def test_colliding_words_share_a_bucket_and_rows_stay_unit_length():
    words = [f"word{i}" for i in range(20)]
    X = features([" ".join(words), "word3 word3"], 2)
    counts = np.zeros(2)
    for w in words:
        counts[zlib.crc32(w.encode()) % 2] += 1
    expected = np.log1p(counts) / np.linalg.norm(np.log1p(counts))
    np.testing.assert_allclose(X[0].toarray().ravel(), expected)
    np.testing.assert_allclose(np.linalg.norm(X[1].toarray()), 1.0)


# --- a tiny fit -------------------------------------------------------------------------------------------------


def corpus(words: list[str], n: int, start: int = 0) -> list[str]:
    return [" ".join(words[(start + i + j) % len(words)] for j in range(12)) for i in range(n)]


def test_a_separable_fit_scores_each_side_and_reports_accuracy(tmp_path):
    positives = [" ".join(corpus(GOOD, 5))]  # one 60-word reference text: chunked into 20-word pieces
    negatives = corpus(BAD, 7) + ["", "!!! ???"]  # documents as they are; the two without words are dropped
    labelled = [{"text": " ".join(GOOD), "label": 1}, {"text": " ".join(BAD), "label": "0"},
                {"text": "theorem lemma axiom", "label": "1"}, {"text": "cheap deal free", "label": 1}]
    out = tmp_path / "model" / "q.npy"
    result = train_quality_classifier(config(chunk_words=20, min_chunk_words=5, buckets=512), positives=positives,
                                      negatives=negatives, out_path=out, labelled=labelled)
    assert (result.positives, result.negatives, result.labelled) == (3, 7, 4)
    assert result.label_balance == pytest.approx(3 / 4)
    assert result.accuracy == pytest.approx(3 / 4)  # the last row is labelled 1 but is made of negative words
    params = np.load(out)
    assert params.dtype == np.float32 and params.shape == (512 + 1,)  # weights, then the bias
    scorer = QualityScorer(str(out))
    assert scorer.buckets == 512
    assert scorer.score("proof of the lemma and its corollary") > 0.5 > scorer.score("buy now, free and cheap")


def test_without_labelled_files_there_is_no_accuracy(tmp_path):
    result = train_quality_classifier(config(chunk_words=12, min_chunk_words=12, buckets=64),
                                      positives=corpus(GOOD, 2), negatives=corpus(BAD, 2), out_path=tmp_path / "m.npy")
    assert (result.accuracy, result.label_balance, result.labelled) == (None, None, 0)


def test_a_fit_without_examples_of_one_side_says_how_many_it_had(tmp_path):
    with pytest.raises(ValueError, match="0 positive and 2 negative"):
        train_quality_classifier(config(chunk_words=50, min_chunk_words=50), positives=["too short"],
                                 negatives=corpus(BAD, 2), out_path=tmp_path / "m.npy")
    with pytest.raises(ValueError, match="1 positive and 0 negative"):
        train_quality_classifier(config(chunk_words=12, min_chunk_words=12), positives=corpus(GOOD, 1),
                                 negatives=["", " ... "], out_path=tmp_path / "m.npy")
    assert not (tmp_path / "m.npy").exists()


# --- the scorer -------------------------------------------------------------------------------------------------


def test_a_text_without_words_scores_the_bias_alone(tmp_path):
    np.save(tmp_path / "m.npy", np.array([5.0, -5.0, 7.0, math.log(3)], dtype=np.float32))
    scorer = QualityScorer(str(tmp_path / "m.npy"))
    assert scorer.buckets == 3
    assert scorer.score("") == pytest.approx(0.75, rel=1e-6)  # sigmoid(log 3) = 3 / 4
    assert scorer.score("--- !!!") == pytest.approx(0.75, rel=1e-6)


def test_extreme_scores_saturate_without_overflow(tmp_path):
    np.save(tmp_path / "up.npy", np.array([1e30, 1e30, 0.0], dtype=np.float32))
    np.save(tmp_path / "down.npy", np.array([-1e30, -1e30, 0.0], dtype=np.float32))
    assert QualityScorer(str(tmp_path / "up.npy")).score("any words at all") == 1.0
    low = QualityScorer(str(tmp_path / "down.npy")).score("any words at all")
    assert 0.0 <= low < 1e-200


# --- labelled files ---------------------------------------------------------------------------------------------


def test_labelled_rows_are_read_in_order_skipping_blank_lines(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"text": "one", "label": 1}\n\n   \n{"text": "two", "label": "0", "extra": true}\n')
    b.write_text('{"text": "three", "label": "1"}')
    rows = read_labelled([a, b])
    assert [(r["text"], r["label"]) for r in rows] == [("one", 1), ("two", "0"), ("three", "1")]
    assert rows[1]["extra"] is True


@pytest.mark.parametrize("line", ['{"label": 1}', '{"text": "x", "label": 2}', '{"text": "x"}',
                                  '{"text": "x", "label": "yes"}', '{"text": "x", "label": null}'])
def test_a_bad_labelled_row_is_named_by_file_and_line(tmp_path, line):
    path = tmp_path / "labels.jsonl"
    path.write_text('{"text": "fine", "label": 0}\n\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"labels\.jsonl:3: a labelled row needs 'text' and 'label' 0 or 1"):
        read_labelled([path])


def test_a_labelled_line_that_is_not_json_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "labels.jsonl"
    path.write_text('{"text": "fine", "label": 0}\n{"text": "cut off", "lab\n')
    with pytest.raises(ValueError) as err:
        read_labelled([path])
    assert "labels.jsonl:2" in str(err.value)
    assert str(err.value).startswith(f"{path}:2: not valid JSON: Unterminated string")
    assert isinstance(err.value.__cause__, json.JSONDecodeError)  # json's own error, with its column, is kept


@pytest.mark.parametrize("line", ['"text and label"', '[{"text": "x", "label": 1}]', "1"])
def test_a_labelled_line_that_is_json_but_no_object_is_named_by_file_and_line(tmp_path, line):
    path = tmp_path / "labels.jsonl"
    path.write_text('{"text": "fine", "label": 0}\n' + line + "\n")
    with pytest.raises(ValueError, match=r"labels\.jsonl:2: a labelled row needs 'text' and 'label' 0 or 1"):
        read_labelled([path])


def test_the_real_dclm_labelled_files_read_row_for_row(shared_data):
    path = shared_data / "quality" / "dclm_agreement_data.jsonl"
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = read_labelled([path])
    assert len(rows) == len(lines) > 200
    assert rows[0] == json.loads(lines[0]) and rows[-1] == json.loads(lines[-1])
    labels = {int(r["label"]) for r in rows}
    assert labels == {0, 1}
