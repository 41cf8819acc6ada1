"""assets/curation/raw_crawl.py: the OutputSpec built for the demo recipe's sources, and its hooks run directly on
a tiny JSONL source in tmp_path (prepare's fingerprints, build's counts, metadata's accounting)."""

import gzip
import json
import logging
from types import SimpleNamespace

import pytest
from dagster import AssetKey, Failure

import assets.curation.raw_crawl as raw_crawl
from assets.core.factory import Inputs
from assets.core.upstream import Output
from assets.core.versioning import code_version
from assets.recipe import DEMO_RECIPE, Recipe, load_recipe


def spec_of(monkeypatch, recipe, source):
    monkeypatch.setattr(raw_crawl, "output_asset", lambda spec: spec)  # the OutputSpec, not the Dagster asset
    return raw_crawl.raw_crawl_asset(recipe, source)


def test_demo_specs_key_group_section_and_no_reads(monkeypatch):
    recipe = load_recipe(DEMO_RECIPE)
    web = recipe.source("web")
    spec = spec_of(monkeypatch, recipe, web)
    assert spec.key == AssetKey(["curation", "web", "raw_crawl"]) == raw_crawl.raw_crawl_key("web")
    assert (spec.group, spec.stage, spec.implementation) == ("curation", "raw_crawl", "v1")
    assert dict(spec.reads) == {} and list(spec.deps) == []
    # The reader's workers (set to 2 in the demo) change how, not what: not in the section.
    assert {k: v for k, v in spec.section.items() if k != "reader"} == {
        "name": "web", "format": "warc", "inputs": ["crawl/web-pages.warc.gz"]}
    assert spec.section == web.raw_section()
    assert "workers" not in spec.section["reader"] and "max_bad_fraction" not in spec.section["reader"]
    assert spec.code_version == code_version("raw_crawl", "v1", spec.section)
    codes = {s.name: spec_of(monkeypatch, recipe, s).code_version for s in recipe.sources}
    assert len(set(codes.values())) == len(recipe.sources)


def tiny_recipe(tmp_path, reader: dict):
    lines = [json.dumps({"text": "The first document.", "id": "a"}), json.dumps({"text": "A second one.", "id": "b"}),
             "{not json", json.dumps({"text": "Third.", "id": "c"})]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n")
    recipe = Recipe.model_validate({"name": "tiny", "path": tmp_path / "recipe.yaml",
                                    "sources": [{"name": "tiny", "format": "jsonl", "inputs": ["docs.jsonl"],
                                                 "reader": reader}]})
    return recipe


def test_hooks_on_a_tiny_jsonl_source(monkeypatch, tmp_path):
    recipe = tiny_recipe(tmp_path, {"max_bad_fraction": 0.5})
    spec = spec_of(monkeypatch, recipe, recipe.source("tiny"))
    context = SimpleNamespace(log=logging.getLogger("test"))
    inputs = spec.prepare(Inputs(context=context, store=None, outputs={}))
    size = (tmp_path / "docs.jsonl").stat().st_size
    assert inputs.fingerprints == [f"docs.jsonl:{size}"]
    assert inputs.manifest == {"inputs": [str(tmp_path / "docs.jsonl")]}
    out = tmp_path / "out"
    out.mkdir()
    fields = spec.build(inputs, out)
    counts = fields["counts"]
    assert counts["kept"] == 3 and counts["records"] == 4 and counts["bytes_in"] == size
    assert sum(counts["dropped"].values()) == 1 and counts["skipped"] == {}
    docs = [json.loads(line) for part in sorted(out.glob("part-*.jsonl.gz"))
            for line in gzip.decompress(part.read_bytes()).splitlines()]
    assert [d["text"] for d in docs] == ["The first document.", "A second one.", "Third."]
    assert {f["path"] for f in fields["files"]} >= {p.name for p in out.glob("part-*.jsonl.gz")}

    meta = spec.metadata(inputs, Output(spec.key, "p", {**fields, "files": fields["files"]}))
    assert (meta["documents"], meta["records"], meta["input_bytes"]) == (3, 4, size)
    assert meta["bad_fraction"] == round(1 / 4, 6)
    [(reason, n)] = counts["dropped"].items()
    assert raw_crawl._records(counts) == {"written": 3, f"bad: {reason}": 1}


def test_too_many_bad_records_fail_naming_the_rejected_file(monkeypatch, tmp_path):
    recipe = tiny_recipe(tmp_path, {})  # the default max_bad_fraction (10%): 1 bad of 4 is too many
    spec = spec_of(monkeypatch, recipe, recipe.source("tiny"))
    inputs = spec.prepare(Inputs(context=SimpleNamespace(log=logging.getLogger("test")), store=None, outputs={}))
    (tmp_path / "out").mkdir()
    with pytest.raises(Failure) as err:
        spec.build(inputs, tmp_path / "out")
    assert "25.0% of records are bad" in err.value.description
    assert f"{tmp_path / 'out'}/rejected.jsonl.gz" in err.value.description
    assert err.value.metadata["bad"].value == {"bad_json": 1}


def test_accounting_helpers_by_hand():
    counts = {"kept": 7, "skipped": {"request": 2}, "dropped": {"bad_json": 2, "empty": 1}}
    assert raw_crawl._records(counts) == {"written": 7, "skipped: request": 2, "bad: bad_json": 2, "bad: empty": 1}
    assert raw_crawl._bad_fraction(counts) == 0.3  # 3 bad of 10 written or bad; skipped ones are neither
    assert raw_crawl._bad_fraction({"kept": 0, "dropped": {}}) == 0.0
