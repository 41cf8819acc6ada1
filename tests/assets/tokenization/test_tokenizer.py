"""assets/tokenization/tokenizer.py: the spec for the demo recipe (a trained BPE reading every source) and for an
adopted tokenizer.json (no reads, only path and special tokens versioned), the build hook adopting the shared
GPT-2 tokenizer directly, and training on committed parts: the same tokenizer for any task count."""

import copy
import dataclasses
import hashlib
import json
import logging
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
    assert spec.code_version == code_version("tokenizer", None, spec.section)
    assert spec.resources == frozenset({"executor"}) and spec.resumable
    assert spec.failures == (ValueError,)
    assert spec.code is None and spec.code_refs == ()  # trained once and kept, whatever the code (module docstring)


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
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert inputs.fingerprints == [f"tokenizer.json:{path.stat().st_size}:sha256:{sha}"]  # by content
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


def test_trained_on_committed_parts_the_same_for_any_task_count(monkeypatch, tmp_path):
    import gzip

    from assets.core.upstream import Output
    from resources.executor import ExecutorResource
    from storage.local import LocalStore
    from storage.manifest import commit_folder
    from tests.conftest import SHARED_DATA

    recipe = demo_with(vocab_size=400, sample_bytes=60_000)
    spec = spec_of(monkeypatch, recipe)
    store = LocalStore(tmp_path / "store")
    problems = [json.loads(line) for line in (SHARED_DATA / "math" / "gsm8k_train.jsonl").read_text().splitlines()[:400]]
    outputs = {}
    for number, source in enumerate(recipe.sources):
        folder = tmp_path / "docs" / source.name
        folder.mkdir(parents=True)
        for part in range(2):
            chosen = problems[number * 20 + part * 10:number * 20 + part * 10 + 10]
            lines = "".join(json.dumps({"text": p["question"], "id": f"{source.name}/{part}/{i}"}) + "\n"
                            for i, p in enumerate(chosen))
            (folder / f"part-{part:05d}.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
        prefix = f"docs/{source.name}"
        outputs[source.name] = Output(decontaminated_key(source.name), prefix, commit_folder(store, prefix, folder, {}))
    digests = set()
    for tasks, workers in ((None, 1), (3, 2)):
        work = tmp_path / f"work-{tasks}"
        (work / "out").mkdir(parents=True)
        context = SimpleNamespace(log=logging.getLogger("t"),
                                  resources=SimpleNamespace(executor=ExecutorResource(kind="local", workers=workers, tasks=tasks)))
        inputs = Inputs(context=context, store=store, outputs=outputs, work=work)  # prepare reads the instance
        fields = spec.build(inputs, work / "out")
        assert fields["tokenizer"]["vocab_size"] == 400 and 0 < fields["counts"]["sample_bytes"] <= 60_000
        digests.add(fields["tokenizer"]["sha256"])
    assert len(digests) == 1
