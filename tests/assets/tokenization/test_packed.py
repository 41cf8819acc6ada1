"""assets/tokenization/packed.py: the spec for the demo recipe's sources (key, reads, the packing section without
the batch sizes), and the build hook run directly on a few committed documents and the shared GPT-2 tokenizer:
every document encoded with EOS after it, each in exactly one of train and val; the same files for 1, 2 and 4
tasks on 1 or 2 workers."""

import copy
import dataclasses
import gzip
import json
import logging
from types import SimpleNamespace

import yaml
from dagster import AssetKey
from tokenizers import Tokenizer

import assets.tokenization.packed as packed
from assets.core.factory import Inputs
from assets.core.upstream import Output
from assets.core.versioning import code_version
from assets.curation.decontaminated import decontaminated_key
from assets.recipe import DEMO_RECIPE, Recipe, load_recipe
from resources.executor import ExecutorResource
from tests.conftest import SHARED_DATA
from storage.local import LocalStore
from storage.manifest import commit_folder

RAW = yaml.safe_load(DEMO_RECIPE.read_text())


def spec_of(monkeypatch, recipe, source="web"):
    monkeypatch.setattr(packed, "output_asset", lambda spec: spec)
    return packed.packed_asset(recipe, source, decontaminated_key)


def demo_with(**packing) -> Recipe:
    raw = copy.deepcopy(RAW)
    raw["packing"].update(packing)
    return Recipe.model_validate({**raw, "path": DEMO_RECIPE})


def test_demo_spec(monkeypatch):
    recipe = load_recipe(DEMO_RECIPE)
    spec = spec_of(monkeypatch, recipe, "code")
    assert spec.key == AssetKey(["tokenization", "code", "packed"]) == packed.packed_key("code")
    assert (spec.group, spec.stage) == ("tokenization", "packed")
    assert dict(spec.reads) == {"tokenizer": AssetKey(["tokenization", "tokenizer"]),
                                "documents": AssetKey(["curation", "code", "decontaminated"])}
    settings = dataclasses.asdict(recipe.packing)
    assert spec.section == {"source": "code", "packing": {"val_fraction": 0.02, "split_seed": settings["split_seed"]}}
    assert spec.code_version == code_version("packed", spec.code_sha256, spec.section)
    assert spec.resources == frozenset({"executor"}) and spec.resumable
    assert spec.failures == (ValueError,)
    # Batch sizes change how, not what: the same version; the held-out share changes it.
    assert spec_of(monkeypatch, demo_with(batch_documents=7, batch_bytes=1000), "code").code_version == spec.code_version
    assert spec_of(monkeypatch, demo_with(val_fraction=0.1), "code").code_version != spec.code_version


def test_build_packs_every_document_with_eos(monkeypatch, tmp_path):
    recipe = demo_with(val_fraction=0.3)
    spec = spec_of(monkeypatch, recipe, "web")
    store = LocalStore(tmp_path / "store")
    source = SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json"
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_bytes(source.read_bytes())
    tok = Output(AssetKey(["tokenization", "tokenizer"]), "tok/v",
                 {**commit_folder(store, "tok/v", tmp_path / "tok", {}),
                  "tokenizer": {"sha256": "s" * 64, "vocab_size": 50257, "eos_id": 50256}})
    texts = [f"Document number {i} says hello to the world." for i in range(12)]
    (tmp_path / "docs").mkdir()
    for part in range(3):  # three parts of four documents
        lines = "".join(json.dumps({"text": t, "id": f"d{i}"}) + "\n" for i, t in enumerate(texts) if i // 4 == part)
        (tmp_path / "docs" / f"part-{part:05d}.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    docs = Output(decontaminated_key("web"), "docs/v", commit_folder(store, "docs/v", tmp_path / "docs", {}))

    outputs, built = {}, {}
    for tasks, workers in ((None, 1), (2, 1), (4, 2)):
        work = tmp_path / f"work-{tasks}-{workers}"
        (work / "out").mkdir(parents=True)
        executor = ExecutorResource(kind="local", workers=workers, tasks=tasks)
        inputs = Inputs(context=SimpleNamespace(log=logging.getLogger("t"), resources=SimpleNamespace(executor=executor)),
                        store=store, outputs={"tokenizer": tok, "documents": docs}, work=work)
        fields = spec.build(inputs, work / "out")
        outputs[tasks, workers] = {p.relative_to(work / "out").as_posix(): p.read_bytes()
                                   for p in sorted((work / "out").rglob("*")) if p.is_file()}
        built[tasks, workers] = fields
    assert outputs[None, 1] == outputs[2, 1] == outputs[4, 2]
    assert built[None, 1] == built[2, 1] == built[4, 2]
    assert "index.json" in outputs[None, 1] and "train/part-00002.tokens.bin" in outputs[None, 1]
    assert fields["tokenizer"] == {"sha256": "s" * 64, "vocab_size": 50257}
    counts = fields["counts"]
    assert counts["train"]["documents"] + counts["val"]["documents"] == 12
    assert counts["val"]["documents"] > 0 and counts["train"]["documents"] > 0
    gpt2 = Tokenizer.from_file(str(source))
    expected = sum(len(gpt2.encode(t).ids) + 1 for t in texts)  # + EOS after each
    assert counts["train"]["tokens"] + counts["val"]["tokens"] == expected
    packing = fields["packing"]
    assert packing["dtype"] == "uint16" and packing["eos_id"] == 50256
    assert [e["shard"] for e in packing["splits"]["train"]["shards"]] == ["part-00000", "part-00001", "part-00002"]
    assert packing["splits"]["train"]["tokens"] == counts["train"]["tokens"]
