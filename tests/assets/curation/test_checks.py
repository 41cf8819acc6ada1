"""The curation asset checks: great-expectations on the documents, and the blocking benchmark check.

The blocking test materializes a small real source (Guardian articles and a C4 page carrying a GSM8K test problem)
through raw_crawl -> filtered -> deduplicated -> decontaminated -> tokenizer -> packed with the decontamination
engine patched, in this process, to remove nothing: the check must catch the surviving n-grams and stop packing.
"""

import gzip
import json

import numpy as np
import orjson
import pytest
import yaml
from dagster import AssetCheckKey, AssetKey, DagsterInstance, DagsterRunStatus

import assets.curation.decontaminated
from assets.curation.checks import BENCHMARK_CHECK, DOCUMENTS_CHECK, documents_check, validate_documents
from assets.cli import main
from assets.recipe import DEMO_RECIPE
from pipelines.decontam import BenchmarkIndex
from pipelines.filters import CodeConfig, FilterConfig, LanguageConfig, PiiConfig
from storage.local import LocalStore

SOURCE = "pages"
DECONTAMINATED = f"curation/{SOURCE}/decontaminated"
DOWNSTREAM = ("tokenization/tokenizer", f"tokenization/{SOURCE}/packed")


def test_each_source_is_held_to_its_own_languages_and_pii_settings():
    filters = {
        "web": FilterConfig(language=LanguageConfig(languages=("en", "de"))),
        "code": FilterConfig(code=CodeConfig(), pii=PiiConfig(phone=False)),  # no language ID, digit runs allowed
    }
    good = [
        {"id": "a", "text": "Ein Satz.", "metadata": {"source": "web", "language": "de"}},
        {"id": "a", "text": "X = '+44 20 7946 0958'", "metadata": {"source": "code"}},  # same id, other source
    ]
    success, details = validate_documents(good, filters)
    assert success and set(details) == {
        "expect_column_values_to_not_be_null(text)", "expect_column_value_lengths_to_be_between(text)",
        "expect_column_values_to_be_unique(id)", "expect_column_values_to_be_between(pii_left)",
        "expect_column_values_to_be_in_set(language)[web]",  # code has no language filter, so no language rule
    }
    bad = good + [
        {"id": "b", "text": "Bonjour.", "metadata": {"source": "web", "language": "fr"}},
        {"id": "c", "text": "Call +44 20 7946 0958.", "metadata": {"source": "web", "language": "en"}},
        {"id": "c", "text": "Again.", "metadata": {"source": "web", "language": "en"}},
    ]
    success, details = validate_documents(bad, filters)
    assert not success
    assert {name: d["unexpected"] for name, d in details.items() if not d["success"]} == {
        "expect_column_values_to_be_in_set(language)[web]": 1,
        "expect_column_values_to_be_between(pii_left)": 1,  # the web phone number; code's is allowed
        "expect_column_values_to_be_unique(id)": 2,
    }
    with pytest.raises(ValueError, match="books"):
        validate_documents(bad + [{"id": "z", "text": "x", "metadata": {"source": "books"}}], filters)


def test_documents_check_reads_the_committed_parts_and_never_logs_pii(tmp_path):
    store = LocalStore(tmp_path / "store")
    rows = [{"id": "1", "text": "Mail jane.doe@example.org today.", "metadata": {"language": "en"}},
            {"id": "2", "text": "Nothing to see.", "metadata": {"language": "en"}}]
    store.put_bytes("out/part-00000.jsonl.gz", gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in rows)))
    result = documents_check(store, {"c4": ["out/part-00000.jsonl.gz"]},
                             {"c4": FilterConfig(language=LanguageConfig(languages=("en",)))})
    assert result.check_name == DOCUMENTS_CHECK and not result.passed
    assert result.metadata["documents"].value == 2
    assert result.metadata["pii_left_by_type"].value == {"EMAIL": 1}
    assert "jane.doe" not in json.dumps({k: v.value for k, v in result.metadata.items()}, default=str)


def write_source(path, shared_data):
    pages = [json.loads(line) for line in gzip.open(shared_data / "jsonl" / "olmo_c4_100_domains_theguardian.jsonl.gz")]
    host = json.loads(gzip.open(shared_data / "jsonl" / "olmo_c4-sample.01.json.gz").readline())["text"]
    question = json.loads(open(shared_data / "benchmarks" / "gsm8k_test.jsonl").readline())["question"]
    rows = [{"id": f"guardian-{i}", "text": page["text"]} for i, page in enumerate(pages[:8])]
    rows.append({"id": "zz-contaminated", "text": host + "\n\nToday's puzzle: " + question + "\n\nPost your answer below."})
    path.write_text("".join(orjson.dumps(row).decode() + "\n" for row in rows))


def write_recipe(path, source_file, action="drop"):
    demo = yaml.safe_load(DEMO_RECIPE.read_text())
    raw = {
        "name": "blocking-check",
        "base_dir": str((DEMO_RECIPE.parent / demo["base_dir"]).resolve()),
        "sources": [{"name": SOURCE, "format": "jsonl", "inputs": [str(source_file)]}],  # filter: PII scrubbing only
        "decontamination": {"benchmarks": ["benchmarks/gsm8k_test.jsonl"], "action": action},
        "tokenizer": {"vocab_size": 512, "sample_bytes": 200_000},
        "packing": {"val_fraction": 0.0},
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def materializations(key: str) -> list:
    return DagsterInstance.get().fetch_materializations(AssetKey(key.split("/")), limit=10).records


def check_history(key: str, name: str) -> list:
    """(status, metadata) of the check's executions, newest first."""
    records = DagsterInstance.get().event_log_storage.get_asset_check_execution_history(
        AssetCheckKey(AssetKey(key.split("/")), name), limit=10)
    out = []
    for record in records:
        evaluation = record.event.dagster_event.event_specific_data
        out.append((record.status.value, {k: v.value for k, v in evaluation.metadata.items()}))
    return out


def last_run_status():
    return DagsterInstance.get().get_runs(limit=1)[0].status


@pytest.mark.slow  # materializes assets through the CLI
def test_a_surviving_benchmark_ngram_fails_the_blocking_check_and_nothing_is_packed(tmp_path, monkeypatch, shared_data):
    source_file = tmp_path / "pages.jsonl"
    write_source(source_file, shared_data)
    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe, source_file)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    # --jobs 1: every run in this process, where the engine is patched below (a worker process would not see it).
    select = ["materialize", "--select", f"+tokenization/{SOURCE}/packed", "--jobs", "1"]

    # No recipe setting lets a matching document through, so the engine is broken on purpose: an empty index.
    real = assets.curation.decontaminated.decontaminate

    def remove_nothing(*, index, **kwargs):
        empty = BenchmarkIndex(names=index.names, hashes=np.empty(0, np.uint64), owners=np.empty(0, np.uint16), ngram=index.ngram)
        return real(index=empty, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(assets.curation.decontaminated, "decontaminate", remove_nothing)
        assert main(select) == 1
    assert last_run_status() == DagsterRunStatus.FAILURE
    [first] = materializations(DECONTAMINATED)  # the output is committed and recorded: the check judges it
    first = {k: v.value for k, v in first.asset_materialization.metadata.items()}
    assert first["dropped"] == 0
    [(status, meta)] = check_history(DECONTAMINATED, BENCHMARK_CHECK)
    assert status == "FAILED"
    assert meta["hits_per_benchmark"] == {"gsm8k_test": 1} and meta["examples"] == ["zz-contaminated"]
    assert meta["documents_with_hits"] == 1 and meta["surviving_ngrams"] > 0
    assert check_history(DECONTAMINATED, DOCUMENTS_CHECK)[0][0] == "SUCCEEDED"  # non-blocking, and clean otherwise
    for key in DOWNSTREAM:
        assert materializations(key) == [], key  # blocked in the same run

    # The real engine again, same recipe: the committed output is reused, and the check re-scans it and blocks again.
    assert main(select) == 1
    again = materializations(DECONTAMINATED)
    assert len(again) == 2
    metas = [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in again]
    assert metas[0]["data_version"] == metas[1]["data_version"] and metas[0]["version_key"] == metas[1]["version_key"]
    assert [status for status, _ in check_history(DECONTAMINATED, BENCHMARK_CHECK)] == ["FAILED", "FAILED"]
    for key in DOWNSTREAM:
        assert materializations(key) == [], key

    # A new decontamination setting (cut the spans) is a new version: computed by the real engine, the re-scan finds
    # nothing left of the problem, the check passes and the shards are packed.
    write_recipe(recipe, source_file, action="cut")
    assert main(select) == 0
    status, meta = check_history(DECONTAMINATED, BENCHMARK_CHECK)[0]
    assert status == "SUCCEEDED" and meta["hits_per_benchmark"] == {"gsm8k_test": 0} and meta["documents"] == 9
    latest = {k: v.value for k, v in materializations(DECONTAMINATED)[0].asset_materialization.metadata.items()}
    assert latest["cut"] == 1 and latest["hits_per_benchmark"] == {"gsm8k_test": 1}
    for key in DOWNSTREAM:
        assert len(materializations(key)) == 1, key
