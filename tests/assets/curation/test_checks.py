"""The curation asset checks: great-expectations on the documents, and the blocking benchmark check.

documents_valid in chunks and on a seeded sample finds what one frame of every document finds (a built case with
violations in different chunks, and the real JSONL samples of ../shared/data), with no frame longer than a chunk.

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

import assets.curation.checks
from assets.curation.checks import (BENCHMARK_CHECK, DOCUMENTS_CHECK, UNIQUE_IDS, UniqueIds, documents_check,
                                    language_counts, read_documents, seeded_sample, validate_documents)
from assets.cli import main
from assets.recipe import DEMO_RECIPE, ChecksConfig
import pipelines.decontam.steps
from pipelines.decontam.index import BenchmarkIndex
from pipelines.filters.config import CodeConfig, FilterConfig, LanguageConfig, PiiConfig
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


def test_documents_check_finds_the_new_pii_kinds_left_and_passes_their_placeholders(tmp_path):
    store = LocalStore(tmp_path / "store")
    rows = [{"id": "1", "text": "Pay into GB82 WEST 1234 5698 7654 32 or card 4111 1111 1111 1111.",
             "metadata": {"language": "en"}},
            {"id": "2", "text": "Pay into <IBAN> or card <CARD_NUMBER>; token <GITHUB_TOKEN>, SSN <SSN>.",
             "metadata": {"language": "en"}},
            {"id": "3", "text": "ISBN 978-3-16-148410-0, version 1.13.6.34, order 4111 1111 1111 1112.",
             "metadata": {"language": "en"}}]
    store.put_bytes("out/part-00000.jsonl.gz", gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in rows)))
    result = documents_check(store, {"c4": ["out/part-00000.jsonl.gz"]},
                             {"c4": FilterConfig(language=LanguageConfig(languages=("en",)))})
    assert not result.passed
    assert result.metadata["pii_left_by_type"].value == {"IBAN": 1, "CARD_NUMBER": 1}
    assert "5698" not in json.dumps({k: v.value for k, v in result.metadata.items()}, default=str)
    # A source whose settings leave those kinds in is not held to them.
    off = FilterConfig(language=LanguageConfig(languages=("en",)), pii=PiiConfig(iban=False, card=False))
    assert documents_check(store, {"c4": ["out/part-00000.jsonl.gz"]}, {"c4": off}).passed


def put_parts(store, prefix, rows, per_part):
    """rows as gzip JSONL parts of `per_part` documents under `prefix`; their keys, in order."""
    keys = []
    for start in range(0, len(rows), per_part):
        key = f"{prefix}/part-{len(keys):05d}.jsonl.gz"
        store.put_bytes(key, gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in rows[start:start + per_part])))
        keys.append(key)
    return keys


def violations_in_chunks(n=11):
    """n documents of two sources, chunks of 4 in stream order (web's 6, then code's 5): web's id w1 again in the
    second chunk, a French page in the first, an empty text in the second, an e-mail address in the last chunk."""
    web = [{"id": f"w{i}", "text": f"Page {i} of the site.", "metadata": {"language": "en"}} for i in range(6)]
    web[1]["metadata"]["language"] = "fr"
    web[4]["id"] = "w1"
    web[5]["text"] = ""
    code = [{"id": f"c{i}", "text": f"x = {i}"} for i in range(n - 6)]
    code[-1]["text"] = "# ask jane.doe@example.org"
    return {"web": web, "code": code}


FILTERS = {"web": FilterConfig(language=LanguageConfig(languages=("en",))), "code": FilterConfig()}


def failed(details):
    return {name: (d["unexpected"], d["examples"]) for name, d in details.items() if not d["success"]}


def test_chunked_and_sampled_checks_find_what_one_frame_finds(tmp_path):
    store = LocalStore(tmp_path / "store")
    sources = violations_in_chunks()
    parts = {name: put_parts(store, name, rows, per_part=3) for name, rows in sources.items()}
    every = [{**d, "metadata": {**d.get("metadata", {}), "source": s}} for s, rows in sources.items() for d in rows]
    whole_success, whole = validate_documents(every, FILTERS)  # one frame of all 11
    assert not whole_success and failed(whole) == {
        "expect_column_values_to_be_in_set(language)[web]": (1, ["fr"]),
        "expect_column_value_lengths_to_be_between(text)": (1, [""]),
        UNIQUE_IDS: (2, ["web/w1", "web/w1"]),  # rows 1 and 4: chunks 1 and 2
        "expect_column_values_to_be_between(pii_left)": (1, ["1"]),  # row 10: the last chunk
    }
    chunked = documents_check(store, parts, FILTERS, ChecksConfig(chunk_documents=4))
    all_of_them = ChecksConfig(mode="sample", sample_documents=50, chunk_documents=4)  # a sample bigger than the set
    sampled = documents_check(store, parts, FILTERS, all_of_them)
    for result in chunked, sampled:
        meta = {k: v.value for k, v in result.metadata.items()}
        assert not result.passed and meta["expectations"] == whole
        assert meta["pii_left_by_type"] == {"EMAIL": 1}
        assert meta["documents"] == meta["validated"] == 11
        assert meta["largest_frame_rows"] == 4  # 3 frames (4, 4, 3 rows), never one of 11
    assert chunked.metadata["mode"].value == "chunks" and sampled.metadata["mode"].value == "sample"
    # Chunks of one row: the duplicate is still found across frames, every violation still counted once.
    single = documents_check(store, parts, FILTERS, ChecksConfig(chunk_documents=1))
    assert single.metadata["expectations"].value == whole and single.metadata["largest_frame_rows"].value == 1
    # Frames bounded by text instead: 45 characters hold two 19-character pages, or the empty page with four
    # 5-character code lines (the largest frame, 6 rows), whatever chunk_documents says.
    by_text = documents_check(store, parts, FILTERS, ChecksConfig(chunk_text_chars=45))
    assert by_text.metadata["expectations"].value == whole and by_text.metadata["largest_frame_rows"].value == 6


def test_a_sample_is_seeded_bounded_and_still_checks_every_id(tmp_path):
    store = LocalStore(tmp_path / "store")
    rows = [{"id": f"d{i}", "text": f"Document {i}." + (" Call +44 20 7946 0958." if i % 5 == 0 else "")}
            for i in range(200)]
    rows[150]["id"] = "d3"
    parts = {"c4": put_parts(store, "c4", rows, per_part=64)}
    assert seeded_sample(iter(range(200)), 20, seed=1) == seeded_sample(iter(range(200)), 20, seed=1)
    assert seeded_sample(iter(range(200)), 20, seed=1) != seeded_sample(iter(range(200)), 20, seed=2)
    picked = seeded_sample(iter(range(200)), 20, seed=1)
    assert len(set(picked)) == 20 and picked == sorted(picked) and max(picked) > 100  # in order, from all over
    assert seeded_sample(iter(range(5)), 20, seed=1) == list(range(5))

    settings = ChecksConfig(mode="sample", sample_documents=20, chunk_documents=8, seed=1)
    first, again = (documents_check(store, parts, {"c4": FilterConfig()}, settings) for _ in range(2))
    meta = {k: v.value for k, v in first.metadata.items()}
    assert meta == {k: v.value for k, v in again.metadata.items()}  # the same sample twice
    assert meta["documents"] == 200 and meta["validated"] == 20 and meta["largest_frame_rows"] == 8
    # The phone numbers the sample holds (every fifth document has one), not all 40.
    assert 0 < meta["expectations"]["expect_column_values_to_be_between(pii_left)"]["unexpected"] < 40
    # Uniqueness is over the whole set, not the sample: d3's two rows, 147 documents apart.
    assert meta["expectations"][UNIQUE_IDS] == {"success": False, "unexpected": 2, "examples": ["d3", "d3"]}


def test_unique_ids_are_exact_when_hashes_collide(monkeypatch):
    labels = ["a", "bb", "cc", "dd", "e", "bb", "fff"]
    ids = UniqueIds()
    monkeypatch.setattr(UniqueIds, "_hash", staticmethod(len))  # every id of a length collides
    for label in labels:
        ids.add(label)
    assert ids.duplicates(lambda: iter(labels)) == (2, ["bb", "bb"])  # "cc", "dd" and "a", "e" only collide
    clean = UniqueIds()
    for label in ["a", "bb", "ccc"]:  # lengths differ: no repeated hash
        clean.add(label)
    assert clean.duplicates(lambda: pytest.fail("no repeated hash: no second pass")) == (0, [])


def test_real_documents_chunked_match_one_frame(tmp_path, shared_data):
    store = LocalStore(tmp_path / "store")
    files = sorted((shared_data / "jsonl").glob("*.gz"))
    docs = [json.loads(line) for f in files for line in gzip.open(f)]
    for i, doc in enumerate(docs):
        doc.setdefault("id", f"doc-{i}")  # some samples carry no id
    parts = {"mixed": put_parts(store, "mixed", docs, per_part=13)}
    _, whole = validate_documents(docs, FilterConfig())
    assert whole["expect_column_values_to_be_between(pii_left)"]["unexpected"] == 4  # real pages carry PII
    result = documents_check(store, parts, {"mixed": FilterConfig()}, ChecksConfig(chunk_documents=8))
    assert result.metadata["expectations"].value == whole
    assert result.metadata["documents"].value == len(docs) == 70 and result.metadata["largest_frame_rows"].value == 8
    assert [d["id"] for d in read_documents(store, parts["mixed"])] == [d["id"] for d in docs]
    assert sum(language_counts(store, parts["mixed"]).values()) == 70


def test_parts_are_streamed_not_read_whole(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "store")
    keys = put_parts(store, "out", [{"id": str(i), "text": "t", "metadata": {"language": "de"}} for i in range(5)], 2)
    monkeypatch.setattr(LocalStore, "get_bytes", lambda *a: pytest.fail("a whole part read into memory"))
    assert language_counts(store, keys) == {"de": 5}
    assert documents_check(store, {"x": keys}, {"x": FilterConfig()}).passed


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
    real = pipelines.decontam.steps.DecontamShards

    def remove_nothing(*, index_path, **kwargs):  # the scan's tasks load an empty index; the check the real one
        index = BenchmarkIndex.load(index_path)
        empty = BenchmarkIndex(names=index.names, hashes=np.empty(0, np.uint64), owners=np.empty(0, np.uint16), ngram=index.ngram)
        empty.save(tmp_path / "empty.index")
        return real(index_path=str(tmp_path / "empty.index"), **kwargs)

    remove_nothing.name = real.name  # the stage's counts are read back under the step's name

    with monkeypatch.context() as patch:
        # The asset imports the scan where it runs: patched in the engine module, it runs this one.
        patch.setattr(pipelines.decontam.steps, "DecontamShards", remove_nothing)
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
