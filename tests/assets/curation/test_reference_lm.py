"""assets/curation/reference_lm.py and the filtered assets that read it: the recipe refuses reference files that are
shared (train and val, a quality positive, a benchmark) naming the field; one home, materialized once for the module
(a reference model of real text and two small sources of wikitext paragraphs, one filtered by perplexity), shows the
model's validation figures and the filtered asset's CCNet buckets; the model stays fresh while its text is the same
and goes stale when it changes, and once retrained it makes stale the source that uses it, not the other."""

from __future__ import annotations

import json
import random

import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from assets.cli import main
from assets.recipe import Recipe, RecipeError, load_recipe
from pipelines.filters.perplexity import read_reference_text, reference_paragraphs
from tests.assets.test_cli import materialization_counts, status_rows
from tests.conftest import REPO, SHARED_DATA

REFERENCE = "curation/reference_lm"


def recipe_dict(tmp_path, **reference) -> dict:
    (tmp_path / "notes.jsonl").write_text('{"text": "a note"}\n')
    return {"name": "ref", "base_dir": str(tmp_path),
            "sources": [{"name": "notes", "format": "jsonl", "inputs": ["notes.jsonl"]}],
            "quality_classifier": {"positive_files": ["good.txt"], "negative_files": ["bad.txt"]},
            "decontamination": {"benchmarks": ["bench/test.txt"]},
            "reference": {"train_files": ["train.txt"], "val_files": ["val.txt"], **reference}}


@pytest.mark.parametrize("reference, message", [
    (dict(val_files=["./train.txt"]), "reference.val_files: './train.txt' is also in reference.train_files"),
    (dict(train_files=["good.txt"]), "reference.train_files: 'good.txt' is also in quality_classifier.positive_files"),
    (dict(val_files=["bench/../bench/test.txt"]), "reference.val_files: 'bench/../bench/test.txt' is also in "
                                                  "decontamination.benchmarks"),
])
def test_reference_files_shared_with_val_positives_or_benchmarks_are_refused_by_field(tmp_path, reference, message):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(recipe_dict(tmp_path, **reference)))
    with pytest.raises(RecipeError, match=message.replace(".", r"\.")):
        load_recipe(recipe)


def test_a_perplexity_filter_needs_the_reference_section(tmp_path):
    raw = recipe_dict(tmp_path)
    raw.pop("reference")
    raw["sources"][0]["filter"] = {"perplexity": {"max_perplexity": 100.0}}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    with pytest.raises(RecipeError, match=r"sources\[notes\]\.filter\.perplexity needs the recipe's `reference`"):
        load_recipe(recipe)
    assert Recipe.model_validate({**recipe_dict(tmp_path), "path": recipe}).reference.val_files == ("val.txt",)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A home with curation/reference_lm (80 steps on 400 KB of State of the Union addresses, ~15 s) and both
    sources filtered: `prose` by perplexity (at most 1e9: everything is kept and scored), `plain` without it.
    Both sources are 40 wikitext paragraphs and the same paragraphs with their words shuffled."""
    root = tmp_path_factory.mktemp("reference-home")
    data = root / "data"
    data.mkdir()
    train = reference_paragraphs(read_reference_text(SHARED_DATA / "misc" / "state_union.zip"))
    (data / "train.txt").write_text("\n".join(train)[:400_000])
    val = reference_paragraphs(read_reference_text(SHARED_DATA / "misc" / "inaugural.zip"))
    (data / "val.txt").write_text("\n".join(val)[:30_000])
    wiki = reference_paragraphs(read_reference_text(SHARED_DATA / "wiki" / "wikitext-2-valid.txt"), 40)[:40]
    rng = random.Random(0)
    mixed = [" ".join(rng.sample(p.split(), len(p.split()))) for p in wiki]
    docs = ([{"id": f"w{i}", "text": t} for i, t in enumerate(wiki)]
            + [{"id": f"s{i}", "text": t} for i, t in enumerate(mixed)])
    (data / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    recipe = {"name": "ref", "base_dir": str(data),
              "sources": [{"name": "prose", "format": "jsonl", "inputs": ["docs.jsonl"],
                           "filter": {"perplexity": {"max_perplexity": 1e9}, "pii": None}},
                          {"name": "plain", "format": "jsonl", "inputs": ["docs.jsonl"], "filter": {"pii": None}}],
              "reference": {"train_files": ["train.txt"], "val_files": ["val.txt"], "vocab_size": 1024,
                            "train_tokens": 80 * 16 * 64}}
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    env = pytest.MonkeyPatch()
    for name, value in {"PRETRAIN_HOME": root / "home", "DAGSTER_HOME": root / "home" / "dagster",
                        "PRETRAIN_RECIPE": root / "recipe.yaml",
                        "TORCH_EXTENSIONS_DIR": REPO / ".venv" / "torch_extensions", "DS_ACCELERATOR": "cpu"}.items():
        env.setenv(name, str(value))
    assert main(["materialize", "--select", f"{REFERENCE},+curation/prose/filtered,+curation/plain/filtered"]) == 0
    yield root
    env.undo()


@pytest.fixture
def in_home(home, monkeypatch):
    monkeypatch.setenv("PRETRAIN_HOME", str(home / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "home" / "dagster"))
    monkeypatch.setenv("PRETRAIN_RECIPE", str(home / "recipe.yaml"))
    return home


def latest_metadata(key: str) -> dict:
    [record] = DagsterInstance.get().fetch_materializations(AssetKey.from_user_string(key), limit=1).records
    return {k: v.value for k, v in record.asset_materialization.metadata.items()}


@pytest.mark.slow
def test_the_model_reports_its_validation_loss_and_the_filtered_asset_ccnet_buckets(in_home):
    meta = latest_metadata(REFERENCE)
    assert meta["val_perplexity"] < 1024 / 2  # far below a uniform guess over its vocabulary
    assert meta["val_paragraphs"] > 5 and meta["steps"] == 80
    # The export process reports through the asset's Pipes session: its line is in the run's log, and Dagster's
    # warning of a session that received no message is not.
    instance = DagsterInstance.get()
    run_id = instance.get_latest_materialization_event(AssetKey(REFERENCE.split("/"))).run_id
    messages = [entry.user_message for entry in instance.all_logs(run_id)]
    assert any(f"perplexity {meta['val_perplexity']}" in m and "reference model exported" in m for m in messages)
    assert not any("did not receive any messages" in m for m in messages)
    prose = latest_metadata("curation/prose/filtered")
    assert prose["perplexity_scored"] == 80 and prose["documents"] == 80
    buckets = prose["perplexity_buckets"]
    assert "| head |" in buckets and "| tail |" in buckets
    # 30th/60th percentile cuts of 80 documents: 24 head, 24 middle, 32 tail.
    counts = [int(row.rsplit("|", 2)[1]) for row in buckets.splitlines()[2:]]
    assert counts == [24, 24, 32]
    assert "perplexity_scored" not in latest_metadata("curation/plain/filtered")


@pytest.mark.slow
def test_fresh_while_the_text_is_the_same_stale_when_it_changes_and_only_its_users_follow(in_home, capsys):
    filtered = ["curation/prose/filtered", "curation/plain/filtered"]
    rows = status_rows(capsys)
    assert rows[REFERENCE] == ("fresh", "-") and all(rows[k] == ("fresh", "-") for k in filtered)

    train = in_home / "data" / "train.txt"
    before = train.read_text()
    train.write_text(before + "\nA new closing paragraph of the address, thanking the Congress and the people.")
    state, cause = status_rows(capsys)[REFERENCE]
    assert state == "stale", cause
    train.write_text(before)  # the same bytes again: the same version, fresh
    assert status_rows(capsys)[REFERENCE] == ("fresh", "-")

    train.write_text(before.replace("Congress", "the Congress of the United States"))
    assert main(["materialize", "--select", REFERENCE]) == 0
    rows = status_rows(capsys)
    assert rows[REFERENCE] == ("fresh", "-")
    state, cause = rows["curation/prose/filtered"]
    assert state == "stale" and REFERENCE in cause, cause
    assert rows["curation/plain/filtered"] == ("fresh", "-")
    assert materialization_counts([REFERENCE])[REFERENCE] == 2
