"""assets/curation/quality_classifier.py: the OutputSpec for the demo recipe (key, reads of the negative and
boilerplate sources, section), a negative source the recipe lacks, prepare's fingerprints and missing-file error,
the build on a small corpus (both models scored on the selection half, the recipe's `model` on the held-out half
and as the output), the boilerplate of real WARC pages, the recipe's bad `model`, and metadata with the majority
baseline. The build on the demo's sources is covered by the slow curation tests; the model's held-out ROC AUC on the
labelled documents by tests/pipelines/filters/test_quality.py."""

import gzip
import hashlib
import json
import logging
from types import SimpleNamespace

import pydantic
import pytest
from dagster import AssetKey

import assets.curation.quality_classifier as qc
from assets.core.factory import Inputs
from assets.core.upstream import Output
from assets.core.versioning import code_version
from assets.recipe import DEMO_RECIPE, Recipe, load_recipe
from pipelines.filters.quality import QualityClassifierConfig, QualityScorer
from pipelines.ingest.config import ReaderConfig
from pipelines.ingest.step import ingest_source


def spec_of(monkeypatch, recipe, config):
    monkeypatch.setattr(qc, "output_asset", lambda spec: spec)
    return qc.quality_classifier_asset(recipe, config)


def test_demo_spec(monkeypatch):
    recipe = load_recipe(DEMO_RECIPE)
    spec = spec_of(monkeypatch, recipe, recipe.quality_classifier)
    assert spec.key == AssetKey(["curation", "quality_classifier"])
    assert (spec.group, spec.stage) == ("curation", "quality_classifier")
    assert dict(spec.reads) == {"negative:cc": AssetKey(["curation", "cc", "raw_crawl"]),
                                "boilerplate:web": AssetKey(["curation", "web", "raw_crawl"])}
    assert spec.section["negative_sources"] == ["cc"] and spec.section["boilerplate_sources"] == ["web"]
    assert spec.section["model"] == "linear_bigrams"
    assert spec.section["positive_files"] == ["quality/cs336_high_quality_wiki_reference.txt", "wiki/wikitext-2-valid.txt"]
    assert spec.section == pydantic.TypeAdapter(QualityClassifierConfig).dump_python(recipe.quality_classifier, mode="json")
    assert spec.code_version == code_version("quality_classifier", spec.code_sha256, spec.section)


def tiny(tmp_path, **config):
    (tmp_path / "docs.jsonl").write_text("{}\n")
    recipe = Recipe.model_validate({"name": "tiny", "path": tmp_path / "recipe.yaml",
                                    "sources": [{"name": "web", "format": "jsonl", "inputs": ["docs.jsonl"]}]})
    return recipe, QualityClassifierConfig(**config)


def test_a_negative_source_the_recipe_lacks_fails_at_definition(monkeypatch, tmp_path):
    recipe, config = tiny(tmp_path, positive_files=("good.txt",), negative_sources=("nope",))
    with pytest.raises(KeyError, match="has no source 'nope'"):
        spec_of(monkeypatch, recipe, config)


def test_prepare_fingerprints_every_file_and_names_a_missing_one(monkeypatch, tmp_path):
    (tmp_path / "good.txt").write_text("Reference text.\n")
    (tmp_path / "bad.txt").write_text("buy now!!!\n")
    recipe, config = tiny(tmp_path, positive_files=("good.txt",), negative_files=("bad.txt",), negative_sources=("web",))
    spec = spec_of(monkeypatch, recipe, config)
    assert dict(spec.reads) == {"negative:web": AssetKey(["curation", "web", "raw_crawl"])}
    inputs = spec.prepare(Inputs(context=SimpleNamespace(log=logging.getLogger("t")), store=None, outputs={}))
    sha = {name: hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() for name in ("good.txt", "bad.txt")}
    assert inputs.fingerprints == [f"good.txt:16:sha256:{sha['good.txt']}", f"bad.txt:11:sha256:{sha['bad.txt']}"]
    assert inputs.manifest["inputs"] == inputs.fingerprints
    assert inputs.extra["files"] == {"good.txt": tmp_path / "good.txt", "bad.txt": tmp_path / "bad.txt"}
    (tmp_path / "bad.txt").unlink()
    with pytest.raises(ValueError, match=r"quality_classifier: file 'bad.txt' not found"):
        spec.prepare(Inputs(context=None, store=None, outputs={}))
    # The factory turns a declared failure into a Dagster Failure carrying just this message.
    assert ValueError in spec.failures


def test_metadata_has_the_held_out_figures_beside_the_compared_ones(monkeypatch, tmp_path):
    recipe, config = tiny(tmp_path, positive_files=("good.txt",), negative_files=("bad.txt",), model="linear_words")
    spec = spec_of(monkeypatch, recipe, config)
    manifest = {"model": "linear_words",
                "models": {"linear_words": {"documents": 5, "accuracy": 0.8, "roc_auc": 0.85, "majority_baseline": 0.6},
                           "linear_bigrams": {"documents": 5, "accuracy": 0.6, "roc_auc": 0.9,
                                              "majority_baseline": 0.6}},
                "held_out": {"documents": 4, "accuracy": 0.75, "roc_auc": 0.7, "majority_baseline": 0.5},
                "counts": {"positives": 5, "negatives": 7, "boilerplate_pages": 2}}
    meta = spec.metadata(None, Output(spec.key, "p", manifest))
    assert meta == {"model": "linear_words",
                    "roc_auc_held_out": 0.7, "accuracy_held_out": 0.75, "held_out_documents": 4,
                    "majority_baseline_held_out": 0.5,
                    "roc_auc_selection": 0.85, "accuracy_selection": 0.8, "selection_documents": 5,
                    "accuracy_linear_words": 0.8, "roc_auc_linear_words": 0.85,
                    "accuracy_linear_bigrams": 0.6, "roc_auc_linear_bigrams": 0.9,
                    "positives": 5, "negatives": 7, "boilerplate_pages": 2}
    # Without labelled files there is nothing to score: the figures are None, not an error.
    bare = {**manifest, "held_out": None, "models": {"linear_words": None, "linear_bigrams": None}}
    meta = spec.metadata(None, Output(spec.key, "p", bare))
    assert meta["roc_auc_held_out"] is None and meta["roc_auc_selection"] is None
    assert meta["roc_auc_linear_words"] is None


GOOD = ("The theorem follows from the lemma, and the proof of the corollary uses the same axiom. " * 8).strip()
BAD = ("Click here to buy now, free shipping on every cheap deal, sign up for our newsletter. " * 8).strip()


@pytest.mark.parametrize("model, word_ngrams", [("linear_words", 1), ("linear_bigrams", 2)])
def test_the_build_scores_both_models_and_outputs_the_recipes(monkeypatch, tmp_path, model, word_ngrams):
    (tmp_path / "good.txt").write_text(GOOD)
    (tmp_path / "bad.txt").write_text(BAD)
    rows = [{"text": GOOD[:200], "label": 1}, {"text": BAD[:200], "label": 0}, {"text": "the proof", "label": 1},
            {"text": "buy now", "label": 0}]
    (tmp_path / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe, config = tiny(tmp_path, positive_files=("good.txt",), negative_files=("bad.txt",),
                          labelled_files=("labels.jsonl",), model=model, chunk_words=40, min_chunk_words=10,
                          buckets=1024)
    spec = spec_of(monkeypatch, recipe, config)
    context = SimpleNamespace(log=logging.getLogger("t"))
    inputs = spec.prepare(Inputs(context=context, store=None, outputs={}))
    out = tmp_path / "out"
    manifest = spec.build(inputs.but(work=tmp_path / "work"), out)
    assert manifest["model"] == model and set(manifest["models"]) == {"linear_words", "linear_bigrams"}
    # A separable toy: every model ranks it right, on each half (one of each label).
    perfect = {"documents": 2, "accuracy": 1.0, "roc_auc": 1.0, "majority_baseline": 0.5}
    for figures in manifest["models"].values():
        assert figures == perfect
    assert manifest["held_out"] == perfect
    assert manifest["counts"] == {"positives": 3, "negatives": 1, "boilerplate_pages": 0}
    assert [p.name for p in out.iterdir()] == [qc.MODEL_FILE]  # the chosen model alone is the output
    assert QualityScorer(str(out / qc.MODEL_FILE)).word_ngrams == word_ngrams
    meta = spec.metadata(None, Output(spec.key, "p", manifest))  # what the UI shows of this build
    assert meta["model"] == model and meta["majority_baseline_held_out"] == 0.5
    figures = ("accuracy_linear_words", "roc_auc_linear_words", "accuracy_linear_bigrams", "roc_auc_linear_bigrams",
               "roc_auc_held_out", "roc_auc_selection")
    assert [meta[k] for k in figures] == [1.0] * 6


def test_a_model_the_recipe_does_not_know_is_an_error_naming_the_field(tmp_path):
    raw = DEMO_RECIPE.read_text().replace("  model: linear_bigrams\n", "  model: fasttext\n")
    assert "model: fasttext" in raw
    path = tmp_path / "recipe.yaml"
    data = (DEMO_RECIPE.parent / "../../shared/data").resolve()
    path.write_text(raw.replace("base_dir: ../../shared/data", f"base_dir: {data}"))
    with pytest.raises(Exception) as err:
        load_recipe(path)
    assert "quality_classifier.model must be one of linear_words, linear_bigrams, got 'fasttext'" in str(err.value)


def test_boilerplate_of_real_pages_is_what_their_extraction_dropped(tmp_path, shared_data):
    """The dolma wget WARC (~20 English sites): each page raw_crawl kept gives the lines of its HTML's visible text
    that its main text lacks; no line of the main text is among them."""
    warc = "crawl/dolma_sample-0000.warc.gz"
    recipe = Recipe.model_validate({"name": "t", "base_dir": str(shared_data), "path": tmp_path / "recipe.yaml",
                                    "sources": [{"name": "pages", "format": "warc", "inputs": [warc]}]})
    ingest_source(name="pages", inputs=[shared_data / warc], format="warc", reader=ReaderConfig(), out_dir=tmp_path)
    docs = [json.loads(line) for part in sorted(tmp_path.glob("part-*.jsonl.gz")) for line in gzip.open(part, "rt")]
    assert len(docs) > 5
    dropped = qc.source_boilerplate(recipe, "pages", docs)
    assert len(docs) // 2 < len(dropped) <= len(docs) and set(dropped) <= {doc["id"] for doc in docs}
    for doc in docs:
        if doc["id"] not in dropped:
            continue
        lines = dropped[doc["id"]].split("\n")
        assert all(line == " ".join(line.split()) and line for line in lines)  # whitespace-normalized, none empty
        main = " ".join(doc["text"].split())
        assert not [line for line in lines if line in main]  # nothing the main text holds
    every = [line for text in dropped.values() for line in text.split("\n")]
    assert {"Skip to main content", "Privacy Policy"} & set(every), every[:50]  # what menus and footers say
    # A document id that no page has gives nothing: the main text and its page are matched by id.
    assert qc.source_boilerplate(recipe, "pages", [{**docs[0], "id": "nope"}]) == {}
