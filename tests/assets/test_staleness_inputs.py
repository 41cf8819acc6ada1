"""Raw inputs as the UI and `pretrain status` see them: a file replaced in place by one of the same size, and a new
file matching a source's glob, each make the source's raw_crawl stale (its observed input set has a new data
version), and `pretrain materialize --stale` builds it again."""

import json
import os

import yaml
from dagster import AssetKey, DagsterInstance

from assets.cli import main
from tests.assets.test_cli import materialization_counts, status_rows

DOCS = [{"text": f"Document number {i} of the notes, long enough to be kept.", "id": f"n{i}"} for i in range(4)]


def write_jsonl(path, docs, mtime_ns):
    path.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    os.utime(path, ns=(mtime_ns, mtime_ns))  # a replaced file gets a new modification time, as a copy would


def test_a_replaced_file_of_the_same_size_and_a_new_file_make_raw_crawl_stale(tmp_path, monkeypatch, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    write_jsonl(notes / "a.jsonl", DOCS[:2], 1_000_000_000_000_000_000)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "notes", "sources": [
        {"name": "notes", "format": "jsonl", "inputs": [str(notes / "*.jsonl")]}]}))
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    raw, inputs = "curation/notes/raw_crawl", "curation/notes/inputs"

    assert main(["materialize", "--select", raw]) == 0
    assert status_rows(capsys)[raw] == ("fresh", "-")
    assert materialization_counts([raw])[raw] == 1

    # The same bytes count, one document's text changed: only the content says the file is another one.
    replaced = [DOCS[0], {**DOCS[1], "text": DOCS[1]["text"].replace("notes", "NOTES")}]
    before = (notes / "a.jsonl").stat().st_size
    write_jsonl(notes / "a.jsonl", replaced, 1_000_000_000_500_000_000)
    assert (notes / "a.jsonl").stat().st_size == before
    state, cause = status_rows(capsys)[raw]
    assert state == "stale" and inputs in cause, cause
    assert main(["materialize", "--stale"]) == 0
    assert materialization_counts([raw])[raw] == 2
    assert status_rows(capsys)[raw] == ("fresh", "-")
    assert "NOTES" in _documents(capsys, raw)

    # A new file matching the glob.
    write_jsonl(notes / "b.jsonl", DOCS[2:], 1_000_000_001_000_000_000)
    state, cause = status_rows(capsys)[raw]
    assert state == "stale" and inputs in cause, cause
    assert main(["materialize", "--stale"]) == 0
    assert len(_documents(capsys, raw).splitlines()) == 4

    # The schedule's observation job computes the same data version as the CLI's observation: nothing turns stale.
    from assets.definitions import build_defs
    from assets.recipe import load_recipe

    result = build_defs(load_recipe()).resolve_job_def("observe_inputs").execute_in_process(
        instance=DagsterInstance.get())
    assert result.success
    observations = DagsterInstance.get().fetch_observations(AssetKey.from_user_string(inputs), limit=2).records
    versions = [r.asset_observation.tags["dagster/data_version"] for r in observations]
    assert versions[0] == versions[1]
    assert status_rows(capsys)[raw] == ("fresh", "-")


def _documents(capsys, asset) -> str:
    capsys.readouterr()
    assert main(["docs", asset]) == 0
    return capsys.readouterr().out
