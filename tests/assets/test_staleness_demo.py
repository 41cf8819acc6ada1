"""The demo recipe with its trained tokenizer: a changed filter on `web` reruns web's chain, the dedup stage, the
sweep, training and evaluation; the tokenizer and every other source's outputs keep their data versions. Then
`--refresh` trains a new tokenizer on the sources' current outputs.

One long test on purpose: materializing the demo takes the time (minutes), the checks after it are cheap."""

import copy
import json

import pytest
from dagster import AssetKey, AssetSelection, DagsterInstance

from assets.cli import main
from assets.definitions import build_defs
from assets.recipe import load_recipe
from tests.assets.test_cli import shorter_training, status_rows, write_demo_copy

DATA_VERSION_TAG = "dagster/data_version"


def cheaper(raw):
    """shorter_training, no zero-shot evaluation during training and one small evaluation task: what reruns is the
    question here, not how well the models learn."""
    shorter_training(raw)
    raw["training"]["main"].setdefault("metrics", {})["downstream_interval"] = 0
    raw["evaluation"].update(tasks=raw["evaluation"]["tasks"][:1], limit=4)


def stricter_web_filter(raw):
    [web] = [s for s in raw["sources"] if s["name"] == "web"]
    web["filter"] = copy.deepcopy(web["filter"])  # the demo's YAML shares it with cc and cc_wet (an anchor)
    web["filter"]["gopher_quality"]["max_non_alpha_words_ratio"] = 0.5


def data_versions() -> dict[str, str]:
    """{asset (or asset[partition]): the data version of its latest materialization}."""
    instance = DagsterInstance.get()
    versions = {}
    for key in instance.get_asset_keys():
        for record in instance.fetch_materializations(key, limit=500).records:  # newest first
            event = record.asset_materialization
            name = key.to_user_string() + (f"[{event.partition}]" if event.partition else "")
            versions.setdefault(name, event.tags[DATA_VERSION_TAG])
    return versions


def tokenizer_manifest(capsys) -> dict:
    capsys.readouterr()
    assert main(["where", "tokenization/tokenizer"]) == 0
    return json.loads(capsys.readouterr().out.split("\n", 1)[1])


@pytest.mark.slow  # the whole demo (shorter training), then web's chain through training again
@pytest.mark.timeout(3600)  # 16 min for the first pass alone on 2 busy shared cores
def test_a_changed_web_filter_reruns_web_through_training_and_keeps_the_tokenizer(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    recipe = tmp_path / "recipe.yaml"
    write_demo_copy(recipe, cheaper)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    assert main(["materialize"]) == 0
    before, trained = data_versions(), tokenizer_manifest(capsys)

    write_demo_copy(recipe, lambda raw: (cheaper(raw), stricter_web_filter(raw)))
    # Dagster shows staleness one step at a time: the filtered asset whose section changed.
    assert {k for k, (state, _) in status_rows(capsys).items() if state != "fresh"} == {"curation/web/filtered"}
    assert main(["materialize", "--stale"]) == 0
    after = data_versions()
    assert all(state == "fresh" for state, _ in status_rows(capsys).values())

    graph = build_defs(load_recipe(recipe)).resolve_asset_graph()
    downstream = {k.to_user_string() for k in
                  AssetSelection.assets(AssetKey(["curation", "web", "filtered"])).downstream().resolve(graph)}
    others = {f"{stage}/{s.name}/{name}" for s in load_recipe(recipe).sources if s.name != "web"
              for stage, name in (("curation", "decontaminated"), ("tokenization", "packed"))}
    expected = downstream - others - {"tokenization/tokenizer"}
    assert {"curation/deduplicated", "curation/web/decontaminated", "tokenization/web/packed", "mixing/mix_sweep",
            "mixing/mixture_weights", "training/main", "evaluation/main"} <= expected
    changed = {name for name in after if before.get(name) != after[name]}
    assert {name.split("[")[0] for name in changed} == expected
    # Every proxy run of the sweep trained on the new web shards.
    assert {name for name in before if name.startswith("mixing/mix_sweep[")} <= changed
    # The tokenizer was reused, not trained again: same data version, the output its first run committed.
    assert after["tokenization/tokenizer"] == before["tokenization/tokenizer"]
    assert tokenizer_manifest(capsys)["run_id"] == trained["run_id"]
    assert {name for name in others if after[name] != before[name]} == set()

    # --refresh: a new tokenizer, sampled from the sources' current outputs (web's are new), so packing goes stale.
    assert main(["materialize", "--select", "tokenization/tokenizer", "--refresh"]) == 0
    refreshed = tokenizer_manifest(capsys)
    assert refreshed["run_id"] != trained["run_id"]
    assert refreshed["upstream"]["curation/web/decontaminated"] == after["curation/web/decontaminated"]
    assert refreshed["upstream"]["curation/web/decontaminated"] != trained["upstream"]["curation/web/decontaminated"]
    rows = status_rows(capsys)
    assert rows["tokenization/tokenizer"][0] == "fresh"
    assert all(rows[f"tokenization/{s.name}/packed"][0] == "stale" for s in load_recipe(recipe).sources)
