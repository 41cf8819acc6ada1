"""Tokenization assets end to end: curation chain -> tokenizer -> packed for two demo sources, read back by the trainer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from assets.cli import main
from assets.recipe import DEMO_RECIPE
from pipelines.shards import iter_documents
from pipelines.tokenization.config import PackingConfig
from pipelines.tokenization.tokenizer import is_val
from tests.assets.test_staleness_demo import first_lines
from trainer.data.mixture import DataConfig, MixtureDataset, PackedSource

SOURCES = ("math", "code")
MATH_PROBLEMS = 1500  # of GSM8K's 7,473: tokenizing and packing does not depend on how many there are


@pytest.fixture
def math_head(tmp_path, shared_data):
    """The first MATH_PROBLEMS lines of the demo's GSM8K file, as they are."""
    return first_lines(shared_data / "math/gsm8k_train.jsonl", tmp_path / "gsm8k-head.jsonl", MATH_PROBLEMS)


def write_recipe(path, math_inputs, **sections):
    """The demo's math and code sources (reader settings only; math reads `math_inputs`) with the demo's tokenizer
    and packing sections."""
    demo = yaml.safe_load(DEMO_RECIPE.read_text())
    sources = [
        {key: value for key, value in source.items() if key in ("name", "format", "inputs", "reader")}
        for source in demo["sources"]
        if source["name"] in SOURCES
    ]
    for source in sources:
        if source["name"] == "math":
            source["inputs"] = [str(math_inputs)]
    raw = {
        "name": "tokenization-test",
        "base_dir": str((DEMO_RECIPE.parent / demo["base_dir"]).resolve()),
        "sources": sources,
        "tokenizer": demo["tokenizer"],
        "packing": demo["packing"],
        **sections,
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def where(key: str, capsys) -> tuple[str, dict]:
    capsys.readouterr()
    assert main(["where", key]) == 0
    uri, manifest = capsys.readouterr().out.split("\n", 1)
    return uri, json.loads(manifest)


@pytest.mark.slow  # ingests two sources, trains a tokenizer, packs: ~20 s
def test_tokenizer_and_packed_shards_from_two_sources(tmp_path, monkeypatch, capsys, pretrain_home, math_head):
    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe, math_head)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    selection = "+tokenization/*"  # and the whole curation chain under it
    assert main(["materialize", "--select", selection]) == 0

    _, tok_manifest = where("tokenization/tokenizer", capsys)
    info = tok_manifest["tokenizer"]
    [entry] = tok_manifest["files"]
    assert entry["path"] == "tokenizer.json" and entry["sha256"] == info["sha256"]
    assert info["vocab_size"] == 8192 and (info["eos_id"], info["pad_id"]) == (0, 1)
    assert set(tok_manifest["upstream"]) == {f"curation/{s}/decontaminated" for s in SOURCES}
    assert 0 < tok_manifest["counts"]["sample_bytes"] <= 4_000_000
    assert tok_manifest["counts"]["round_trip_documents"] == 1000

    store = pretrain_home / "store"
    folders = {}
    packing = PackingConfig(val_fraction=0.02)
    for source in SOURCES:
        uri, manifest = where(f"tokenization/{source}/packed", capsys)
        _, raw = where(f"curation/{source}/decontaminated", capsys)
        assert manifest["upstream"] == {
            "tokenization/tokenizer": tok_manifest["data_version"],
            f"curation/{source}/decontaminated": raw["data_version"],
        }
        assert manifest["tokenizer"]["sha256"] == info["sha256"] and manifest["packing"]["dtype"] == "uint16"
        counts = manifest["counts"]
        assert counts["train"]["documents"] + counts["val"]["documents"] == raw["counts"]["kept"]
        assert counts["val"]["documents"] > 0 and counts["train"]["tokens"] > 10 * counts["train"]["documents"]
        shard_files = {entry[f"{kind}_file"] for split in ("train", "val")
                       for entry in manifest["packing"]["splits"][split]["shards"] for kind in ("tokens", "offsets")}
        assert {f["path"] for f in manifest["files"]} == {"index.json"} | shard_files
        assert all(path.startswith(("train/part-", "val/part-")) for path in shard_files)
        assert all(len(f["sha256"]) == 64 for f in manifest["files"])
        folders[source] = uri.removeprefix("file://")
        assert folders[source].startswith(str(store))

        # The first training document decodes to the first raw document the split keeps for training.
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(store / tok_manifest["asset"] / tok_manifest["version_key"] / "tokenizer.json"))
        # The first part of documents (decontamination_report.jsonl, beside the parts, sorts first).
        first_part = next(f["path"] for f in raw["files"] if f["path"].startswith("part-"))
        raw_docs = iter_documents(store / raw["asset"] / raw["version_key"] / first_part)
        first = next(d for i, d in enumerate(raw_docs) if not is_val(d.get("id"), i, packing))
        packed = PackedSource(source, folders[source], "train")
        assert tokenizer.decode(packed.document(0)[:-1].tolist(), skip_special_tokens=False) == first["text"]
        assert packed.tokens == counts["train"]["tokens"]

    # The trainer reads the committed outputs as they are.
    data = MixtureDataset(DataConfig(shards=folders, weights={"math": 0.5, "code": 0.5}, seq_len=256))
    batch = data.batch(list(range(8)))
    assert batch["tokens"].shape == (8, 257) and set(batch["sources"]) == {"math", "code"}
    assert int(batch["tokens"].max()) < 8192

    # Everything is fresh; materializing again reuses the committed outputs (same data versions).
    capsys.readouterr()
    assert main(["status"]) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    for key in ["tokenization/tokenizer"] + [f"tokenization/{s}/packed" for s in SOURCES]:
        assert rows[key].startswith("fresh"), (key, rows[key])
    before = {s: where(f"tokenization/{s}/packed", capsys)[1]["data_version"] for s in SOURCES}
    assert main(["materialize", "--select", "tokenization/*"]) == 0
    assert {s: where(f"tokenization/{s}/packed", capsys)[1]["data_version"] for s in SOURCES} == before
    instance = DagsterInstance.get()
    assert len(instance.fetch_materializations(AssetKey(["tokenization", "tokenizer"]), limit=10).records) == 2


@pytest.mark.slow  # materializes assets through the CLI
def test_an_adopted_tokenizer_needs_no_documents(tmp_path, monkeypatch, capsys, math_head):
    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe, math_head, tokenizer={"path": "tokenizers/gpt2/tokenizer.json"})
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    # No raw_crawl materialized: the adopted tokenizer depends on none.
    assert main(["materialize", "--select", "tokenization/tokenizer"]) == 0
    _, manifest = where("tokenization/tokenizer", capsys)
    info = manifest["tokenizer"]
    assert info["adopted"] and info["vocab_size"] == 50258 and (info["eos_id"], info["pad_id"]) == (50256, 50257)
    assert manifest["upstream"] == {} and manifest["inputs"][0].endswith("gpt2/tokenizer.json")

    # Packing without its documents fails, naming what to materialize first.
    assert main(["materialize", "--select", "tokenization/math/packed"]) == 1
    assert "curation/math/decontaminated has never been materialized" in capsys.readouterr().err

    assert main(["materialize", "--select", "+tokenization/math/packed"]) == 0
    _, curated = where("curation/math/decontaminated", capsys)
    _, packed = where("tokenization/math/packed", capsys)
    assert packed["packing"]["dtype"] == "uint16" and packed["packing"]["eos_id"] == 50256
    assert packed["counts"]["train"]["documents"] + packed["counts"]["val"]["documents"] == curated["counts"]["kept"] > 1400
    assert np.dtype(packed["packing"]["dtype"]).itemsize * packed["counts"]["train"]["tokens"] == sum(
        f["bytes"] for f in packed["files"] if f["path"].startswith("train/") and f["path"].endswith(".tokens.bin")
    )
