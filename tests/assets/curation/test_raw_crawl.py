"""assets/curation/raw_crawl.py: the OutputSpec built for the demo recipe's sources, and its hooks run directly on
a tiny JSONL source in tmp_path (prepare's fingerprints, build's counts from the executor's stats, metadata's
accounting), locally and from a real S3 server (moto)."""

import gzip
import hashlib
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
from resources.executor import ExecutorResource


def spec_of(monkeypatch, recipe, source):
    monkeypatch.setattr(raw_crawl, "output_asset", lambda spec: spec)  # the OutputSpec, not the Dagster asset
    return raw_crawl.raw_crawl_asset(recipe, source)


def test_demo_specs_key_group_section_and_no_reads(monkeypatch):
    recipe = load_recipe(DEMO_RECIPE)
    web = recipe.source("web")
    spec = spec_of(monkeypatch, recipe, web)
    assert spec.key == AssetKey(["curation", "web", "raw_crawl"]) == raw_crawl.raw_crawl_key("web")
    assert (spec.group, spec.stage, spec.code_refs) == ("curation", "raw_crawl", ("assets.curation.raw_crawl",))
    assert dict(spec.reads) == {} and list(spec.deps) == [raw_crawl.inputs_key("web")]  # the observed input files
    assert spec.resources == frozenset({"executor"}) and spec.resumable
    # The bad-record threshold decides whether to fail, not what is written: not in the section.
    assert {k: v for k, v in spec.section.items() if k != "reader"} == {
        "name": "web", "format": "warc", "inputs": ["crawl/web-pages.warc.gz"]}
    assert spec.section == web.raw_section()
    assert "max_bad_fraction" not in spec.section["reader"]
    assert spec.code_version == code_version("raw_crawl", spec.code_sha256, spec.section)
    codes = {s.name: spec_of(monkeypatch, recipe, s).code_version for s in recipe.sources}
    assert len(set(codes.values())) == len(recipe.sources)


TINY_LINES = [json.dumps({"text": "The first document.", "id": "a"}), json.dumps({"text": "A second one.", "id": "b"}),
              "{not json", json.dumps({"text": "Third.", "id": "c"})]


def tiny_recipe(tmp_path, reader: dict, inputs=("docs.jsonl",)):
    (tmp_path / "docs.jsonl").write_text("\n".join(TINY_LINES) + "\n")
    recipe = Recipe.model_validate({"name": "tiny", "path": tmp_path / "recipe.yaml",
                                    "sources": [{"name": "tiny", "format": "jsonl", "inputs": list(inputs),
                                                 "reader": reader}]})
    return recipe


def prepared(spec, tmp_path, executor=None, work="work"):
    """The hooks' Inputs as the factory hands them to build: a context with the executor resource, a work folder."""
    executor = executor or ExecutorResource(kind="local", workers=1)
    context = SimpleNamespace(log=logging.getLogger("test"), resources=SimpleNamespace(executor=executor))
    return spec.prepare(Inputs(context=context, store=None, outputs={})).but(work=tmp_path / work)


def test_hooks_on_a_tiny_jsonl_source(monkeypatch, tmp_path):
    recipe = tiny_recipe(tmp_path, {"max_bad_fraction": 0.5})
    spec = spec_of(monkeypatch, recipe, recipe.source("tiny"))
    inputs = prepared(spec, tmp_path)
    size = (tmp_path / "docs.jsonl").stat().st_size
    sha = hashlib.sha256((tmp_path / "docs.jsonl").read_bytes()).hexdigest()
    assert inputs.fingerprints == [f"docs.jsonl:{size}:sha256:{sha}"]  # by content, not the name and size alone
    assert inputs.manifest == {"inputs": [str(tmp_path / "docs.jsonl")]}
    out = tmp_path / "out"
    out.mkdir()
    fields = spec.build(inputs, out)
    assert (tmp_path / "work" / "logs" / "ingest" / "stats.json").is_file()  # the counts' source
    counts = fields["counts"]
    assert counts["kept"] == 3 and counts["records"] == 4 and counts["bytes_in"] == size
    assert sum(counts["dropped"].values()) == 1 and counts["skipped"] == {}
    docs = [json.loads(line) for part in sorted(out.glob("part-*.jsonl.gz"))
            for line in gzip.decompress(part.read_bytes()).splitlines()]
    assert [d["text"] for d in docs] == ["The first document.", "A second one.", "Third."]
    assert fields["files"] == [{"path": "part-00000-00000.jsonl.gz", "records": 3},
                               {"path": "rejected-00000.jsonl.gz", "records": 1}]
    assert sorted(p.name for p in out.iterdir()) == [f["path"] for f in fields["files"]]

    meta = spec.metadata(inputs, Output(spec.key, "p", {**fields, "files": fields["files"]}))
    assert (meta["documents"], meta["records"], meta["input_bytes"]) == (3, 4, size)
    assert meta["bad_fraction"] == round(1 / 4, 6)
    [(reason, n)] = counts["dropped"].items()
    assert raw_crawl._records(counts) == {"written": 3, f"bad: {reason}": 1}


def test_too_many_bad_records_fail_naming_the_rejected_file(monkeypatch, tmp_path):
    recipe = tiny_recipe(tmp_path, {})  # the default max_bad_fraction (10%): 1 bad of 4 is too many
    spec = spec_of(monkeypatch, recipe, recipe.source("tiny"))
    inputs = prepared(spec, tmp_path)
    (tmp_path / "out").mkdir()
    with pytest.raises(Failure) as err:
        spec.build(inputs, tmp_path / "out")
    assert "25.0% of records are bad" in err.value.description
    assert f"{tmp_path / 'out'}/rejected-*.jsonl.gz" in err.value.description
    assert err.value.metadata["bad"].value == {"bad_json": 1}


def test_the_task_count_never_changes_the_output(monkeypatch, tmp_path):
    for name in ("more.jsonl", "most.jsonl"):
        (tmp_path / name).write_text("\n".join(TINY_LINES[:2] + TINY_LINES[3:]) + "\n")
    recipe = tiny_recipe(tmp_path, {"docs_per_shard": 2}, inputs=("*.jsonl",))
    spec = spec_of(monkeypatch, recipe, recipe.source("tiny"))
    outputs = []
    for run, executor in enumerate((None, ExecutorResource(kind="local", workers=1, tasks=5))):
        inputs = prepared(spec, tmp_path, executor, work=f"work{run}")
        (tmp_path / f"out{run}").mkdir()
        fields = spec.build(inputs, tmp_path / f"out{run}")
        outputs.append((fields, {p.name: p.read_bytes() for p in (tmp_path / f"out{run}").iterdir()}))
    assert outputs[0] == outputs[1]
    assert [f["path"] for f in outputs[0][0]["files"]] == [
        "part-00000-00000.jsonl.gz", "part-00000-00001.jsonl.gz", "part-00001-00000.jsonl.gz",
        "part-00001-00001.jsonl.gz", "part-00002-00000.jsonl.gz", "part-00002-00001.jsonl.gz",
        "rejected-00000.jsonl.gz"]
    assert outputs[0][0]["counts"]["kept"] == 9


def test_s3_inputs_fingerprint_and_read_like_local_ones(monkeypatch, tmp_path, s3):
    local = tiny_recipe(tmp_path, {"max_bad_fraction": 0.5})
    s3.client().upload_file(str(tmp_path / "docs.jsonl"), s3.bucket, "tiny/docs.jsonl")
    url = f"s3://{s3.bucket}/tiny/docs.jsonl"
    remote = tiny_recipe(tmp_path, {"max_bad_fraction": 0.5}, inputs=(f"s3://{s3.bucket}/tiny/*.jsonl",))
    results = []
    for run, recipe in enumerate((local, remote)):
        spec = spec_of(monkeypatch, recipe, recipe.source("tiny"))
        inputs = prepared(spec, tmp_path, work=f"work{run}")
        (tmp_path / f"out{run}").mkdir()
        results.append((inputs, spec.build(inputs, tmp_path / f"out{run}"),
                        {p.name: p.read_bytes() for p in (tmp_path / f"out{run}").iterdir()}))
    (_, local_fields, local_files), (remote_inputs, remote_fields, remote_files) = results
    head = s3.client().head_object(Bucket=s3.bucket, Key="tiny/docs.jsonl")
    [printed] = remote_inputs.fingerprints  # URL, size, ETag, modification time: nothing downloaded
    prefix = f"{url}:{(tmp_path / 'docs.jsonl').stat().st_size}:{head['ETag'].strip(chr(34))}:"
    assert printed.startswith(prefix) and str(head["LastModified"].date()) in printed[len(prefix):]
    assert remote_inputs.manifest == {"inputs": [url]}
    assert remote_fields == local_fields and remote_files == local_files


def test_accounting_helpers_by_hand():
    counts = {"kept": 7, "skipped": {"request": 2}, "dropped": {"bad_json": 2, "empty": 1}}
    assert raw_crawl._records(counts) == {"written": 7, "skipped: request": 2, "bad: bad_json": 2, "bad: empty": 1}
    assert raw_crawl._bad_fraction(counts) == 0.3  # 3 bad of 10 written or bad; skipped ones are neither
    assert raw_crawl._bad_fraction({"kept": 0, "dropped": {}}) == 0.0
