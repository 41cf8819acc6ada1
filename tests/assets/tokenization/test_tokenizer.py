"""assets/tokenization/tokenizer.py: the spec for the demo recipe (a trained BPE reading every source) and for an
adopted tokenizer.json (no reads, only path and special tokens versioned), and the build hook adopting the
shared GPT-2 tokenizer directly."""

import copy
import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import yaml
from dagster import AssetKey
from tokenizers import Tokenizer

import assets.tokenization.tokenizer as tokenizer
from assets.core.factory import Inputs
from assets.core.versioning import code_version
from assets.curation.decontaminated import decontaminated_key
from assets.recipe import DEMO_RECIPE, Recipe, load_recipe

RAW = yaml.safe_load(DEMO_RECIPE.read_text())


def spec_of(monkeypatch, recipe):
    monkeypatch.setattr(tokenizer, "output_asset", lambda spec: spec)
    return tokenizer.tokenizer_asset(recipe, decontaminated_key)


def demo_with(**settings) -> Recipe:
    raw = copy.deepcopy(RAW)
    raw["tokenizer"].update(settings)
    return Recipe.model_validate({**raw, "path": DEMO_RECIPE})


def test_demo_spec_trains_on_every_source(monkeypatch):
    recipe = load_recipe(DEMO_RECIPE)
    spec = spec_of(monkeypatch, recipe)
    assert spec.key == AssetKey(["tokenization", "tokenizer"]) == tokenizer.tokenizer_key()
    assert (spec.group, spec.stage) == ("tokenization", "tokenizer")
    assert dict(spec.reads) == {s.name: AssetKey(["curation", s.name, "decontaminated"]) for s in recipe.sources}
    assert tokenizer.tokenizer_path(recipe) is None
    assert spec.section == {"tokenizer": dataclasses.asdict(recipe.tokenizer), "sources": [s.name for s in recipe.sources]}
    assert spec.section["tokenizer"]["vocab_size"] == 8192
    assert spec.code_version == code_version("tokenizer", "v1", spec.section)
    assert spec.failures == (ValueError,)
    inputs = spec.prepare(Inputs(context=None, store=None, outputs={}))
    assert inputs.fingerprints is None and inputs.manifest == {"inputs": []}


def test_an_adopted_tokenizer_reads_nothing_and_versions_only_its_file_and_specials(monkeypatch, tmp_path):
    recipe = demo_with(path="tokenizers/gpt2/tokenizer.json")
    path = recipe.input_root / "tokenizers/gpt2/tokenizer.json"
    assert tokenizer.tokenizer_path(recipe) == path
    assert tokenizer.tokenizer_path(demo_with(path=str(tmp_path / "t.json"))) == tmp_path / "t.json"  # absolute: as is
    spec = spec_of(monkeypatch, recipe)
    assert dict(spec.reads) == {}
    assert spec.section == {"path": "tokenizers/gpt2/tokenizer.json", "eos": "<|endoftext|>", "pad": "<|pad|>"}
    assert tokenizer.tokenizer_section(demo_with(path="tokenizers/gpt2/tokenizer.json", vocab_size=300)) == spec.section

    inputs = spec.prepare(Inputs(context=SimpleNamespace(log=logging.getLogger("t")), store=None, outputs={}))
    assert inputs.fingerprints == [f"tokenizer.json:{path.stat().st_size}"]
    assert inputs.manifest == {"inputs": [str(path)]}
    out = tmp_path / "out"
    out.mkdir()
    fields = spec.build(inputs, out)
    written = out / "tokenizer.json"
    built = Tokenizer.from_file(str(written))
    info = fields["tokenizer"]
    assert info["sha256"] == hashlib.sha256(written.read_bytes()).hexdigest()
    assert info["adopted"] is True and (info["eos"], info["pad"]) == ("<|endoftext|>", "<|pad|>")
    assert info["eos_id"] == built.token_to_id("<|endoftext|>") == 50256  # GPT-2's own end of text
    assert info["pad_id"] == built.token_to_id("<|pad|>") and info["pad_id"] >= 50257  # added
    assert info["vocab_size"] == built.get_vocab_size(with_added_tokens=True)
    assert fields["counts"] == {"sample_bytes": 0, "round_trip_documents": 0}


def test_documents_reads_local_parts_in_order(tmp_path):
    import gzip

    for i, texts in enumerate([["a", "b"], ["c"]]):
        lines = "".join(json.dumps({"text": t, "id": t}) + "\n" for t in texts)
        (tmp_path / f"part-{i:05d}.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    docs = list(tokenizer.documents(sorted(Path(tmp_path).glob("part-*"))))
    assert [d["text"] for d in docs] == ["a", "b", "c"]
