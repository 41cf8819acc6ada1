"""pipelines.filters.quality: config checks, chunking, hashed features, boilerplate, ROC AUC, a tiny fit of each
model, the saved model, labelled files."""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest

from pipelines.filters.quality import (
    MODELS,
    QualityClassifierConfig,
    QualityScorer,
    boilerplate,
    chunks,
    features,
    read_labelled,
    roc_auc,
    split_labelled,
    train_quality_classifier,
)

GOOD = "theorem proof lemma corollary axiom definition".split()
BAD = "click buy now cheap deal free".split()


def config(**kw) -> QualityClassifierConfig:
    return QualityClassifierConfig(**{"positive_files": ("wiki.txt",), "negative_files": ("cc.txt",), **kw})


# --- config -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, message", [
    (dict(positive_files=()), "positive_files must name at least one file"),
    (dict(negative_files=(), negative_sources=()), "needs negative_sources, boilerplate_sources or negative_files"),
    (dict(model="fasttext"), "quality_classifier.model must be one of linear_words, linear_bigrams, got 'fasttext'"),
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
    assert c.model == "linear_bigrams"  # the default: the better of the two on the labelled documents
    only_boilerplate = QualityClassifierConfig(positive_files=("a",), boilerplate_sources=("web",),
                                               model="linear_words")
    assert only_boilerplate.boilerplate_sources == ("web",) and only_boilerplate.model == "linear_words"


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


def test_bigram_features_add_each_adjacent_pair_joined_by_one_space():
    buckets = 1 << 18
    row = features(["Cat sat; cat sat."], buckets, word_ngrams=2)[0].toarray().ravel()
    h = {g: zlib.crc32(g.encode()) % buckets for g in ("cat", "sat", "cat sat", "sat cat")}
    assert len(set(h.values())) == 4
    raw = {h["cat"]: math.log(3), h["sat"]: math.log(3), h["cat sat"]: math.log(3), h["sat cat"]: math.log(2)}
    norm = math.sqrt(sum(v * v for v in raw.values()))
    assert set(np.flatnonzero(row)) == set(raw)
    for col, value in raw.items():
        assert row[col] == pytest.approx(value / norm)
    words_only = features(["Cat sat; cat sat."], buckets)[0]
    assert set(words_only.indices) == {h["cat"], h["sat"]}  # word_ngrams=1: the first model's features


# --- boilerplate ------------------------------------------------------------------------------------------------


PAGE = """<?xml version="1.0" encoding="utf-8"?>
<html><head><title>River news</title><style>p {color: red}</style><script>var x = "Cookies";</script></head>
<body><nav><a href="/">Home</a> <a href="/login">Log in</a></nav>
<article><p>The river rose by <b>two metres</b> overnight, and the town closed its bridges.</p>
<p>Officials expect   the water to fall by Friday.</p></article>
<div>Views<!-- counter -->: 1,204</div><footer>Subscribe to our newsletter<br>© 2024 River Times</footer></body></html>"""
MAIN = ("The river rose by two metres overnight, and the town closed its bridges.\n"
        "Officials expect the water to fall by Friday.")


def test_boilerplate_is_the_visible_text_the_main_text_lacks():
    dropped = boilerplate(PAGE, MAIN).split("\n")
    # Script and style are not visible; the pieces of the kept paragraph that <b> splits are in the main text; a
    # comment does not cut its line in two.
    assert dropped == ["River news", "Home", "Log in", "Views: 1,204", "Subscribe to our newsletter",
                       "© 2024 River Times"]
    assert boilerplate(PAGE, "").count("\n") > len(dropped)  # with no main text, the article's lines are dropped too
    assert boilerplate("", MAIN) == ""  # nothing to parse


# --- ROC AUC ----------------------------------------------------------------------------------------------------


def pairwise_auc(scores, labels):
    """By definition: over every (labelled 1, labelled 0) pair, 1 when the 1 scores higher, 1/2 on a tie."""
    ones = [s for s, y in zip(scores, labels) if y]
    zeros = [s for s, y in zip(scores, labels) if not y]
    return sum((a > b) + 0.5 * (a == b) for a in ones for b in zeros) / (len(ones) * len(zeros))


def test_roc_auc_is_the_share_of_pairs_ranked_right_ties_half():
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert roc_auc([0.9, 0.1], [1, 0]) == 1.0 and roc_auc([0.1, 0.9], [1, 0]) == 0.0
    assert roc_auc([0.5, 0.5, 0.5], [1, 0, 1]) == 0.5
    rng = np.random.default_rng(0)
    scores = list(rng.integers(0, 20, 200) / 20)  # many ties
    labels = list(rng.integers(0, 2, 200))
    assert roc_auc(scores, labels) == pytest.approx(pairwise_auc(scores, labels))
    with pytest.raises(ValueError, match="labelled 0 and 1"):
        roc_auc([0.2, 0.3], [1, 1])


# --- a tiny fit -------------------------------------------------------------------------------------------------


def corpus(words: list[str], n: int, start: int = 0) -> list[str]:
    return [" ".join(words[(start + i + j) % len(words)] for j in range(12)) for i in range(n)]


def test_a_separable_fit_scores_each_side_and_reports_accuracy(tmp_path):
    positives = [" ".join(corpus(GOOD, 5))]  # one 60-word reference text: chunked into 20-word pieces
    negatives = corpus(BAD, 7) + ["", "!!! ???"]  # documents as they are; the two without words are dropped
    labelled = [{"text": " ".join(GOOD), "label": 1}, {"text": " ".join(BAD), "label": "0"},
                {"text": "theorem lemma axiom", "label": "1"}, {"text": "cheap deal free", "label": 1}]
    for model, ngrams in (("linear_words", 1), ("linear_bigrams", 2)):
        out = tmp_path / "model" / f"{model}.npy"
        result = train_quality_classifier(config(chunk_words=20, min_chunk_words=5, buckets=512, model=model),
                                          positives=positives, negatives=negatives, out_path=out, labelled=labelled)
        assert (result.model, result.positives, result.negatives) == (model, 3, 7)
        # Half of each label held out: of the three 1s two (round(1.5) is 2), of the one 0 none.
        selection, held_out = split_labelled(labelled, 0.5)
        assert (result.selection.documents, result.held_out.documents) == (2, 2)
        assert result.selection.label_balance == 0.5 and result.held_out.label_balance == 1.0
        assert result.held_out.roc_auc is None  # one label only: no pair to rank
        saved = np.load(out)
        assert saved.dtype.names == ("word_ngrams", "bias", "weights") and saved.shape == (1,)
        assert saved["weights"].dtype == np.float32 and saved["weights"].shape == (1, 512)
        assert saved["word_ngrams"][0] == ngrams
        scorer = QualityScorer(str(out))
        assert (scorer.buckets, scorer.word_ngrams) == (512, ngrams)
        assert scorer.score("proof of the lemma and its corollary") > 0.5 > scorer.score("buy now, free and cheap")
        assert scorer.score(labelled[2]["text"]) > scorer.score(labelled[3]["text"])
        scores = [scorer.score(row["text"]) for row in labelled]
        assert scorer.scores([row["text"] for row in labelled]) == pytest.approx(scores)  # one matrix, same scores
        for part, figures in ((selection, result.selection), (held_out, result.held_out)):
            part_scores = [scorer.score(row["text"]) for row in part]
            labels = [int(row["label"]) for row in part]
            right = sum((score >= 0.5) == bool(label) for score, label in zip(part_scores, labels))
            assert figures.accuracy == pytest.approx(right / len(part))
            if 0 < sum(labels) < len(labels):
                assert figures.roc_auc == pytest.approx(pairwise_auc(part_scores, labels))
        # The last row is labelled 1 but made of negative words: of the four, it alone is wrong.
        assert result.selection.accuracy * 2 + result.held_out.accuracy * 2 == pytest.approx(3)
    # The config's model unless the call names one; the same inputs give the same file, byte for byte.
    default = train_quality_classifier(config(chunk_words=20, min_chunk_words=5, buckets=512), positives=positives,
                                       negatives=negatives, out_path=tmp_path / "d.npy")
    assert default.model == "linear_bigrams" and set(MODELS) == {"linear_words", "linear_bigrams"}
    assert (tmp_path / "d.npy").read_bytes() == (tmp_path / "model" / "linear_bigrams.npy").read_bytes()
    with pytest.raises(ValueError, match="quality model must be one of linear_words, linear_bigrams, got 'x'"):
        train_quality_classifier(config(), positives=positives, negatives=negatives, out_path=tmp_path / "x.npy",
                                 model="x")


def test_without_labelled_files_there_is_no_accuracy(tmp_path):
    result = train_quality_classifier(config(chunk_words=12, min_chunk_words=12, buckets=64),
                                      positives=corpus(GOOD, 2), negatives=corpus(BAD, 2), out_path=tmp_path / "m.npy")
    assert (result.selection, result.held_out) == (None, None)


def test_labelled_documents_split_by_content_within_each_label():
    rows = [{"text": f"document {i}", "label": i % 3 == 0} for i in range(90)]  # 30 labelled 1, 60 labelled 0
    selection, held_out = split_labelled(rows, 0.5)
    assert sorted(map(id, selection + held_out)) == sorted(map(id, rows))  # each row on exactly one side
    assert [sum(int(r["label"]) for r in part) for part in (selection, held_out)] == [15, 15]
    assert (len(selection), len(held_out)) == (45, 45)
    # The files' order does not move a row to the other side, nor does one more row (the held-out part grows by
    # at most that row or the next in hash order; none leaves it).
    assert {r["text"] for r in split_labelled(rows[::-1], 0.5)[1]} == {r["text"] for r in held_out}
    again = {r["text"] for r in split_labelled(rows + [{"text": "new", "label": 1}], 0.5)[1]}
    assert {r["text"] for r in held_out} <= again and len(again) == 46
    small, large = split_labelled(rows, 0.2)[1], split_labelled(rows, 0.6)[1]
    assert (len(small), len(large)) == (18, 54) and {r["text"] for r in small} <= {r["text"] for r in large}
    with pytest.raises(ValueError, match=r"held_out_fraction must be in \(0, 1\), got 1.0"):
        config(held_out_fraction=1.0)


def test_a_fit_without_examples_of_one_side_says_how_many_it_had(tmp_path):
    with pytest.raises(ValueError, match="0 positive and 2 negative"):
        train_quality_classifier(config(chunk_words=50, min_chunk_words=50), positives=["too short"],
                                 negatives=corpus(BAD, 2), out_path=tmp_path / "m.npy")
    with pytest.raises(ValueError, match="1 positive and 0 negative"):
        train_quality_classifier(config(chunk_words=12, min_chunk_words=12), positives=corpus(GOOD, 1),
                                 negatives=["", " ... "], out_path=tmp_path / "m.npy")
    assert not (tmp_path / "m.npy").exists()


# --- the scorer -------------------------------------------------------------------------------------------------


def save_model(path, weights, bias, word_ngrams=1):
    """A model file as the docstring of QualityScorer describes it, written here by hand."""
    record = np.zeros(1, dtype=[("word_ngrams", "<i4"), ("bias", "<f4"), ("weights", "<f4", (len(weights),))])
    record["word_ngrams"], record["bias"], record["weights"] = word_ngrams, bias, weights
    np.save(path, record)


def test_a_text_without_words_scores_the_bias_alone(tmp_path):
    save_model(tmp_path / "m.npy", [5.0, -5.0, 7.0], math.log(3))
    scorer = QualityScorer(str(tmp_path / "m.npy"))
    assert scorer.buckets == 3
    assert scorer.score("") == pytest.approx(0.75, rel=1e-6)  # sigmoid(log 3) = 3 / 4
    assert scorer.score("--- !!!") == pytest.approx(0.75, rel=1e-6)


def test_a_bigram_model_scores_a_pair_it_weighs(tmp_path):
    buckets = 1 << 12
    weights = np.zeros(buckets)
    weights[zlib.crc32(b"buy now") % buckets] = -50.0  # the pair alone, neither word
    save_model(tmp_path / "m.npy", weights, 0.0, word_ngrams=2)
    scorer = QualityScorer(str(tmp_path / "m.npy"))
    assert scorer.score("now buy") == 0.5 and scorer.score("buy now") < 1e-10


def test_a_file_that_is_not_a_model_is_named(tmp_path):
    np.save(tmp_path / "old.npy", np.array([5.0, -5.0, 7.0, 1.0], dtype=np.float32))  # the first model's layout
    with pytest.raises(ValueError, match=r"old\.npy: not a quality model"):
        QualityScorer(str(tmp_path / "old.npy"))


def test_extreme_scores_saturate_without_overflow(tmp_path):
    save_model(tmp_path / "up.npy", [1e30, 1e30], 0.0)
    save_model(tmp_path / "down.npy", [-1e30, -1e30], 0.0)
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


# --- on real data -----------------------------------------------------------------------------------------------


def web_boilerplate(shared_data, pages: int) -> list[str]:
    """The boilerplate of the first `pages` HTML pages of the web crawl: each page's main text extracted as ingest
    does, then the lines of its visible text that the extraction dropped."""
    from pipelines.ingest.extraction import decode_text, extract_main_text
    from pipelines.ingest.config import ReaderConfig
    from pipelines.ingest.readers import read_inputs

    found = []
    for record in read_inputs("web", [shared_data / "crawl" / "web-pages.warc.gz"], "warc", ReaderConfig(),
                              count_bytes=lambda size: None):
        if record.kind != "html":
            continue
        html, _ = decode_text(record.body, record.charset, html=True)
        main = extract_main_text(html) if html else None
        if main:
            found.append(boilerplate(html, main))
            if len(found) == pages:
                return found
    raise AssertionError(f"the web crawl has fewer than {pages} pages with main text")


@pytest.mark.slow  # 7-11 s on 2 shared cores: 50 pages extracted by trafilatura, a fit on ~1,200 examples
def test_the_new_model_ranks_held_out_human_labels_above_an_auc_of_080(shared_data, tmp_path):
    """The demo's negatives, smaller: the low-quality file without cc's raw crawl, and the boilerplate of 50 web
    pages rather than 1,168. linear_bigrams ranks the held-out half of the 780 human-labelled DCLM documents (the
    half no setting was chosen on) with a ROC AUC above 0.80 (computed here from the scores, pair by pair), and
    beats the majority baseline there."""
    positives = [(shared_data / "quality" / "cs336_high_quality_wiki_reference.txt").read_text(),
                 (shared_data / "wiki" / "wikitext-2-valid.txt").read_text()]
    negatives = [(shared_data / "quality" / "cs336_low_quality_cc.txt").read_text(), *web_boilerplate(shared_data, 50)]
    labelled = read_labelled(sorted((shared_data / "quality").glob("dclm_*_data.jsonl")))
    assert len(labelled) == 780
    config = QualityClassifierConfig(positive_files=("-",), negative_files=("-",))
    result = train_quality_classifier(config, positives=positives, negatives=negatives, out_path=tmp_path / "m.npy",
                                      labelled=labelled)
    held_out = split_labelled(labelled, config.held_out_fraction)[1]
    scorer = QualityScorer(str(tmp_path / "m.npy"))
    scores = [scorer.score(row["text"]) for row in held_out]
    labels = [int(row["label"]) for row in held_out]
    auc = pairwise_auc(scores, labels)
    print(f"held-out ROC AUC {auc:.4f}, in-sample {result.selection.roc_auc:.4f}")
    assert auc > 0.80, auc
    assert result.held_out.roc_auc == pytest.approx(auc) and result.held_out.documents == len(held_out) == 390
    majority = max(sum(labels), len(labels) - sum(labels)) / len(labels)
    accuracy = sum((score >= 0.5) == bool(label) for score, label in zip(scores, labels)) / len(labels)
    assert result.held_out.accuracy == pytest.approx(accuracy) and accuracy > majority + 0.05, (accuracy, majority)
    wiki = positives[0][:3000]
    scorer = QualityScorer(str(tmp_path / "m.npy"))
    assert scorer.score(wiki) > scorer.score(negatives[0])
