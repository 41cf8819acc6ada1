"""Decontamination on real data: real benchmark items planted in real web pages (../shared/data); the scan as
datatrove tasks over store parts gives the same bytes for any task and worker count."""

import gzip
import json
from pathlib import Path

from datatrove.executor import LocalPipelineExecutor

import orjson
import pytest

from pipelines.decontam import (
    BenchmarkIndex,
    DecontamConfig,
    Decontaminator,
    DecontamShards,
    benchmark_texts,
    decontam_counts,
    decontaminate,
    output_names,
    written_files,
)
from pipelines.dedup import WordHasher, ngram_hashes, normalized_words
from pipelines.shards import iter_documents
from storage.local import LocalStore
from tests.conftest import SHARED_DATA

BENCH = SHARED_DATA / "benchmarks"


def first_record(path: Path, skip: int = 0) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        for i, line in enumerate(f):
            if i == skip:
                return json.loads(line)


@pytest.fixture(scope="module")
def index() -> BenchmarkIndex:
    return BenchmarkIndex.build([BENCH / "gsm8k_test.jsonl", BENCH / "hellaswag_val.jsonl.gz", BENCH / "HumanEval.jsonl.gz"], 13)


@pytest.fixture(scope="module")
def pages() -> list[dict]:
    """Real C4 web pages in datatrove's format."""
    docs = [json.loads(line) for line in gzip.open(SHARED_DATA / "jsonl" / "olmo_c4_100_domains_theguardian.jsonl.gz")]
    return [{"text": d["text"], "id": f"page-{i}", "metadata": {"source": "web"}} for i, d in enumerate(docs)]


def write_part(path: Path, docs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as f:
        for doc in docs:
            f.write(orjson.dumps(doc) + b"\n")
    return path


def planted(page: dict, item_text: str, doc_id: str) -> dict:
    paragraphs = page["text"].split("\n")
    middle = len(paragraphs) // 2
    text = "\n".join(paragraphs[:middle] + [item_text] + paragraphs[middle:])
    return {**page, "text": text, "id": doc_id}


def test_a_planted_gsm8k_item_drops_its_page_and_clean_pages_survive_unchanged(tmp_path, index, pages):
    item = first_record(BENCH / "gsm8k_test.jsonl", skip=3)
    dirty = planted(pages[0], f"Homework help: {item['question']}", "dirty")
    docs = pages[1:] + [dirty]
    stats = decontaminate(inputs=[write_part(tmp_path / "part-00007.jsonl.gz", docs)], index=index,
                          config=DecontamConfig(), out_dir=tmp_path / "out")

    # Named after the input part.
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["part-00007.jsonl.gz", "removed-00007.jsonl.gz"]
    kept = list(iter_documents(tmp_path / "out" / "part-00007.jsonl.gz"))
    removed = list(iter_documents(tmp_path / "out" / "removed-00007.jsonl.gz"))
    assert kept == pages[1:]  # byte-for-byte the documents that went in
    assert [d["id"] for d in removed] == ["dirty"] and removed[0]["metadata"]["contaminated_by"] == ["gsm8k_test"]
    assert stats.hits == {"gsm8k_test": 1, "hellaswag_val": 0, "HumanEval": 0}
    assert (stats.documents_in, stats.kept, stats.dropped) == (len(docs), len(pages) - 1, 1)


def test_cut_removes_just_the_hellaswag_span(tmp_path, index, pages):
    item = first_record(BENCH / "hellaswag_val.jsonl.gz", skip=10)
    text = f"{item['ctx']} {item['endings'][int(item['label'])]}"
    dirty = planted(pages[2], text, "dirty")
    config = DecontamConfig(action="cut")
    stats = decontaminate(inputs=[write_part(tmp_path / "part-00000.jsonl.gz", [dirty])], index=index, config=config, out_dir=tmp_path / "out")

    (doc,) = iter_documents(tmp_path / "out" / "part-00000.jsonl.gz")
    assert item["ctx"] not in doc["text"]
    assert doc["metadata"]["contaminated_by"] == ["hellaswag_val"]
    assert doc["metadata"]["decontam_chars_cut"] >= len(text) - 10 and doc["metadata"]["decontam_spans_cut"] == 1
    # What remains is the page around it, and no benchmark n-gram is left in it.
    assert all(paragraph.strip() in doc["text"] for paragraph in pages[2]["text"].split("\n"))
    assert len(doc["text"]) <= len(pages[2]["text"]) + 3  # at most the item's final punctuation stays
    assert Decontaminator(index).find(doc["text"]) == ([], set())
    assert (stats.cut, stats.dropped, stats.spans_cut, stats.hits["hellaswag_val"]) == (1, 0, 1, 1)


def test_humaneval_code_in_a_page_is_found(index, pages):
    item = first_record(BENCH / "HumanEval.jsonl.gz", skip=5)
    spans, names = Decontaminator(index).find(pages[3]["text"] + "\n\n" + item["prompt"] + item["canonical_solution"])
    assert names == {"HumanEval"} and spans and spans[0][0] >= len(pages[3]["text"])


@pytest.mark.parametrize(
    "name, texts",
    [
        ("lambada_openai_test.jsonl", 5153),
        ("hellaswag_val.jsonl.gz", 10042 * 4),
        ("mmlu_dev.jsonl.gz", 285 * 4),
        ("arc_challenge_test.jsonl", None),
        ("piqa_val.jsonl", None),
        ("openbook_qa.jsonl", None),
        ("siqa.jsonl", None),
        ("commonsense_qa.jsonl", None),
        ("boolq_val.jsonl", None),
        ("winogrande_dev.jsonl", None),
        ("gsm8k_test.jsonl", 1319),
        ("math_test.jsonl", 5000),
        ("HumanEval.jsonl.gz", 164),
        ("wikitext-2-test.txt", None),
    ],
)
def test_every_shared_benchmark_layout_is_read(name, texts):
    found = list(benchmark_texts(BENCH / name))
    assert found and all(isinstance(t, str) and t.strip() for t in found)
    if texts is not None:
        assert len(found) == texts


def test_unknown_layouts_and_missing_files_are_named(tmp_path):
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"prompt_text": "x"}\n')
    with pytest.raises(ValueError, match="odd.jsonl.*unknown benchmark layout"):
        BenchmarkIndex.build([odd], 13)
    with pytest.raises(ValueError, match="does not exist"):
        BenchmarkIndex.build([tmp_path / "nope.jsonl"], 13)
    with pytest.raises(ValueError, match="decontamination.action"):
        DecontamConfig(action="hide")


def test_the_index_round_trips_and_counts_short_items(tmp_path, index):
    assert index.items["gsm8k_test"] == 1319 and index.short_items["gsm8k_test"] == 0
    index.save(tmp_path / "index.npz")
    again = BenchmarkIndex.load(tmp_path / "index.npz")
    assert again.names == index.names and (again.hashes == index.hashes).all() and again.ngram == 13
    mmlu = BenchmarkIndex.build([BENCH / "mmlu_dev.jsonl.gz"], 13)
    assert mmlu.short_items["mmlu_dev"] > 0  # a one-line question with a one-word answer has no 13-gram


def test_runs_of_numbers_are_not_contamination_but_math_problems_are():
    """MATH is full of number runs that any code has (the primes, 1..13); they are not indexed."""
    index = BenchmarkIndex.build([BENCH / "math_test.jsonl"], 13)
    checker = Decontaminator(index)
    primes = "PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61]"
    counting = "for i in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]: print(i)"
    assert checker.find(primes) == ([], set()) and checker.find(counting) == ([], set())
    assert BenchmarkIndex.build([BENCH / "math_test.jsonl"], 13, min_letter_words=0).matches(
        ngram_hashes(WordHasher()(normalized_words(primes)), 13)
    )[1] == {"math_test"}  # without the rule, the primes would count as MATH leakage
    problem = first_record(BENCH / "math_test.jsonl", skip=2)["context"]
    assert checker.find(f"Forum post: can anyone help? {problem} Thanks!")[1] == {"math_test"}


def test_outputs_are_named_after_the_input_part():
    assert output_names("curation/deduplicated/v/web/part-00003.jsonl.gz") == ("part-00003.jsonl.gz", "removed-00003.jsonl.gz")
    assert output_names("part-00003-00001.jsonl.gz") == ("part-00003-00001.jsonl.gz", "removed-00003-00001.jsonl.gz")


def run_scan(store, keys, index_path, out, logs, tasks, workers, config=DecontamConfig()):
    step = DecontamShards(store=store, keys=keys, index_path=str(index_path), config=config, output_dir=str(out),
                          records_dir=str(logs / "records"))
    LocalPipelineExecutor([step], tasks=tasks, workers=workers, logging_dir=str(logs)).run()
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}, logs / "stats.json"


def test_the_scan_in_tasks_gives_the_same_bytes_for_1_2_and_4_tasks_and_counts_every_document(tmp_path, index, pages):
    """Five parts in a store, two with planted items: byte-identical outputs for any task and worker count, and
    the merged stats account for every document."""
    store = LocalStore(tmp_path / "store")
    gsm8k = first_record(BENCH / "gsm8k_test.jsonl", skip=3)
    hellaswag = first_record(BENCH / "hellaswag_val.jsonl.gz", skip=10)
    parts = [pages[i * 2:(i + 1) * 2] for i in range(5)]  # the 10 pages
    parts[1] = parts[1] + [planted(pages[8], f"Homework help: {gsm8k['question']}", "dirty-gsm8k")]
    parts[3] = [planted(pages[9], f"{hellaswag['ctx']} {hellaswag['endings'][0]}", "dirty-hs")] + parts[3]
    keys = []
    for i, docs in enumerate(parts):
        local = write_part(tmp_path / "parts" / f"part-{i:05d}.jsonl.gz", docs)
        keys.append(f"dedup/web/part-{i:05d}.jsonl.gz")
        store.put_file(keys[-1], local)
    index.save(tmp_path / "index.npz")
    expected, stats = run_scan(store, keys, tmp_path / "index.npz", tmp_path / "out-1", tmp_path / "logs-1", 1, 1)
    assert sorted(expected) == [f"part-{i:05d}.jsonl.gz" for i in range(5)] + ["removed-00001.jsonl.gz", "removed-00003.jsonl.gz"]
    counts = decontam_counts(stats, index.names)
    assert counts == {"in": 12, "kept": 10, "dropped": {"contaminated": 2}, "cut": 0, "chars_cut": 0, "spans_cut": 0,
                      "hits": {"gsm8k_test": 1, "hellaswag_val": 1, "HumanEval": 0}}
    assert [d["id"] for d in iter_documents(tmp_path / "out-1" / "removed-00003.jsonl.gz")] == ["dirty-hs"]
    # The parts' records list every file written, with its count, without reading the output back.
    assert written_files(tmp_path / "logs-1" / "records", keys) == [
        {"path": name, "records": sum(1 for _ in iter_documents(tmp_path / "out-1" / name))} for name in sorted(expected)]
    for tasks, workers in ((2, 1), (4, 2), (4, 1)):
        files, stats = run_scan(store, keys, tmp_path / "index.npz", tmp_path / f"out-{tasks}-{workers}",
                                tmp_path / f"logs-{tasks}-{workers}", tasks, workers)
        assert files == expected, (tasks, workers)
        assert decontam_counts(stats, index.names) == counts
    # Cut: the same documents, kept with the span cut out, counted as cut.
    _, stats = run_scan(store, keys, tmp_path / "index.npz", tmp_path / "out-cut", tmp_path / "logs-cut", 2, 1,
                        DecontamConfig(action="cut"))
    cut = decontam_counts(stats, index.names)
    assert (cut["kept"], cut["cut"], cut["dropped"], cut["spans_cut"]) == (12, 2, {}, 2) and cut["chars_cut"] > 100


def test_parts_streamed_from_s3_give_the_bytes_of_the_same_parts_on_disk(tmp_path, index, pages, s3):
    """The tasks read the parts through the store (moto S3 here; each task gets a copy of the pipeline, the S3
    store rebuilt from its settings), streamed, never downloaded first: the outputs equal those of the same parts
    in a local store. One worker: a forkserver started by an earlier test would not have this test's AWS_*
    variables (a deployment sets them before anything starts)."""
    from storage.objects import open_store

    gsm8k = first_record(BENCH / "gsm8k_test.jsonl", skip=3)
    docs = pages[:6] + [planted(pages[6], f"Homework help: {gsm8k['question']}", "dirty")] + pages[7:]
    local, remote = LocalStore(tmp_path / "store"), open_store(f"s3://{s3.bucket}/root")
    keys = []
    for i in range(3):
        path = write_part(tmp_path / "parts" / f"part-{i:05d}.jsonl.gz", docs[i * 4:(i + 1) * 4])
        keys.append(f"dedup/web/part-{i:05d}.jsonl.gz")
        local.put_file(keys[-1], path)
        remote.put_file(keys[-1], path)
    index.save(tmp_path / "index.npz")
    expected, stats = run_scan(local, keys, tmp_path / "index.npz", tmp_path / "out-local", tmp_path / "logs-local", 1, 1)
    files, s3_stats = run_scan(remote, keys, tmp_path / "index.npz", tmp_path / "out-s3", tmp_path / "logs-s3", 3, 1)
    assert files == expected and "removed-00001.jsonl.gz" in files
    assert decontam_counts(s3_stats, index.names) == decontam_counts(stats, index.names)
