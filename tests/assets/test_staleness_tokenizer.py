"""The trained tokenizer is kept, on two small sources (the demo's c4 and math, no training): a changed filter on
c4 reruns c4's chain and the dedup stage, and nothing else gets a new data version; `--refresh` trains a new
tokenizer on the sources' current outputs. tests/assets/test_staleness_demo.py does the same on the whole demo."""

import pytest
import yaml

from assets.cli import main
from assets.recipe import DEMO_RECIPE
from tests.assets.test_cli import status_rows
from tests.assets.test_staleness_demo import data_versions, tokenizer_manifest


def write_recipe(path, c4_threshold: float):
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    sources = {s["name"]: s for s in raw["sources"]}
    raw["sources"] = [sources["c4"], sources["math"]]
    for source in raw["sources"]:
        source["filter"] = {"gopher_quality": {"max_non_alpha_words_ratio": c4_threshold if source["name"] == "c4"
                                               else 0.8}}
    raw["decontamination"]["benchmarks"] = ["benchmarks/gsm8k_test.jsonl"]
    raw["tokenizer"] = {"vocab_size": 1024, "sample_bytes": 400000}
    for section in ("quality_classifier", "mixing", "training", "evaluation"):
        raw.pop(section, None)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


@pytest.mark.slow  # curation and packing of two small sources, twice: ~2-4 min
def test_a_changed_filter_keeps_the_trained_tokenizer_until_refresh(tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe, 0.8)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    assert main(["materialize"]) == 0
    before, trained = data_versions(), tokenizer_manifest(capsys)
    assert set(trained["upstream"]) == {"curation/c4/decontaminated", "curation/math/decontaminated"}
    assert trained["code_version"].startswith("tokenizer:kept:")

    write_recipe(recipe, 0.5)
    assert main(["materialize", "--stale"]) == 0
    after = data_versions()
    changed = {name for name in after if before.get(name) != after[name]}
    assert changed == {"curation/c4/filtered", "curation/deduplicated", "curation/c4/decontaminated",
                       "tokenization/c4/packed"}
    assert tokenizer_manifest(capsys)["run_id"] == trained["run_id"]  # reused: the first run's output
    assert all(state == "fresh" for state, _ in status_rows(capsys).values())

    assert main(["materialize", "--select", "tokenization/tokenizer", "--refresh"]) == 0
    refreshed = tokenizer_manifest(capsys)
    assert refreshed["run_id"] != trained["run_id"]
    assert refreshed["upstream"] == {"curation/c4/decontaminated": after["curation/c4/decontaminated"],
                                     "curation/math/decontaminated": after["curation/math/decontaminated"]}
    rows = status_rows(capsys)
    assert rows["tokenization/tokenizer"][0] == "fresh"
    assert data_versions()["tokenization/tokenizer"] != after["tokenization/tokenizer"]  # another sample, vocabulary
    assert {rows[k][0] for k in ("tokenization/c4/packed", "tokenization/math/packed")} == {"stale"}
    # Without --refresh, the refreshed tokenizer is the kept one from now on.
    assert main(["materialize", "--select", "tokenization/tokenizer"]) == 0
    assert tokenizer_manifest(capsys)["run_id"] == refreshed["run_id"]
