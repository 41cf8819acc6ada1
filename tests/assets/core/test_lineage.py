"""Lineage from a packed output back to the raw crawl, by data version, through a real Dagster instance."""

import json

import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from assets.cli import main
from assets.definitions import build_resources
from assets.core.lineage import cross_check, find_output, lineage
from assets.recipe import DEMO_RECIPE
from assets.core.upstream import latest_output
from trainer.checkpoint.store import LocalCheckpoints


def write_recipe(path, max_non_alpha: float):
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    c4 = next(s for s in raw["sources"] if s["name"] == "c4")
    c4["filter"] = {"gopher_quality": {"max_non_alpha_words_ratio": max_non_alpha}}
    raw["sources"] = [c4]
    raw["decontamination"]["benchmarks"] = ["benchmarks/gsm8k_test.jsonl"]
    raw["tokenizer"] = {"path": "tokenizers/gpt2/tokenizer.json"}
    for section in ("quality_classifier", "mixing", "training", "ablation"):
        raw.pop(section, None)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


@pytest.mark.slow  # materializes assets through the CLI
def test_lineage_walks_back_to_raw_by_data_version(tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "recipe.yaml"
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    write_recipe(recipe, 0.8)
    assert main(["materialize", "--select", "+tokenization/c4/packed"]) == 0
    instance, store = DagsterInstance.get(), build_resources()["store"].open()
    packed = latest_output(instance, store, AssetKey(["tokenization", "c4", "packed"]))
    first = lineage(instance, store, [packed])
    assert [r["asset"] for r in first] == [
        "tokenization/c4/packed", "curation/c4/decontaminated", "tokenization/tokenizer",
        "curation/deduplicated", "curation/c4/filtered", "curation/c4/raw_crawl"]
    for record in first:
        assert record["data_version"] and record["code_version"] and record["run_id"] and record["prefix"]
    assert cross_check(instance, first) == []

    # A changed filter makes new outputs downstream of raw; the old packed output's lineage still
    # resolves to the exact outputs that made it, not to the latest ones.
    write_recipe(recipe, 0.5)
    assert main(["materialize", "--stale"]) == 0
    newer = lineage(instance, store, [latest_output(instance, store, AssetKey(["tokenization", "c4", "packed"]))])
    by_asset = lambda records: {r["asset"]: r["data_version"] for r in records}  # noqa: E731
    old, new = by_asset(first), by_asset(newer)
    assert old["curation/c4/raw_crawl"] == new["curation/c4/raw_crawl"]
    assert old["curation/c4/filtered"] != new["curation/c4/filtered"]
    again = lineage(instance, store, [find_output(instance, store, packed.key, packed.data_version)])
    assert again == first
    forged = [{**first[0], "data_version": "0" * 64}]
    assert "is not in this instance" in cross_check(instance, forged)[0]

    # `pretrain lineage` reads it back from a committed checkpoint alone, and cross-checks it here.
    checkpoints = LocalCheckpoints(tmp_path / "checkpoints")
    (checkpoints.staging_dir(32) / "model.pt").write_bytes(b"weights")
    checkpoints.commit(32, {"step": 32, "tokens": 4096, "lineage": first, "config": {"stage": "main"}})
    capsys.readouterr()
    assert main(["lineage", str(checkpoints.root)]) == 0  # a run folder: its `latest`
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith(f"checkpoint {checkpoints.root}/step-00000032: stage main, step 32")
    assert [line.split()[0] for line in out.splitlines()[1:]] == [r["asset"] for r in first]
    assert "every output is there" in err
    assert main(["lineage", str(checkpoints.path(32)), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lineage"] == first
    (checkpoints.staging_dir(33) / "model.pt").write_bytes(b"weights")
    checkpoints.commit(33, {"step": 33, "lineage": forged})
    assert main(["lineage", str(checkpoints.path(33))]) == 1
    assert "is not in this instance" in capsys.readouterr().err
