"""assets/curation/quality_classifier.py: the OutputSpec for the demo recipe (key, reads of the negative sources,
section), a negative source the recipe lacks, prepare's fingerprints and missing-file error, and metadata's
majority baseline. The build (training the model) is covered by the slow curation tests."""

import hashlib
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
from pipelines.filters.quality import QualityClassifierConfig


def spec_of(monkeypatch, recipe, config):
    monkeypatch.setattr(qc, "output_asset", lambda spec: spec)
    return qc.quality_classifier_asset(recipe, config)


def test_demo_spec(monkeypatch):
    recipe = load_recipe(DEMO_RECIPE)
    spec = spec_of(monkeypatch, recipe, recipe.quality_classifier)
    assert spec.key == AssetKey(["curation", "quality_classifier"])
    assert (spec.group, spec.stage) == ("curation", "quality_classifier")
    assert dict(spec.reads) == {"cc": AssetKey(["curation", "cc", "raw_crawl"])}
    assert spec.section["negative_sources"] == ["cc"]
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
    assert dict(spec.reads) == {"web": AssetKey(["curation", "web", "raw_crawl"])}
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


def test_metadata_majority_baseline(monkeypatch, tmp_path):
    recipe, config = tiny(tmp_path, positive_files=("good.txt",), negative_files=("bad.txt",))
    spec = spec_of(monkeypatch, recipe, config)
    manifest = {"accuracy": 0.8, "label_balance": 0.3, "counts": {"labelled": 10, "positives": 5, "negatives": 7}}
    meta = spec.metadata(None, Output(spec.key, "p", manifest))
    assert meta == {"accuracy": 0.8, "labelled_documents": 10, "majority_baseline": 0.7, "positives": 5, "negatives": 7}
    assert spec.metadata(None, Output(spec.key, "p", {**manifest, "label_balance": None}))["majority_baseline"] is None
