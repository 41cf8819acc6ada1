"""Decontamination as datatrove tasks over store parts of real web pages with real benchmark items planted: the
same bytes for 1, 2 and 4 tasks on 1 or 2 workers, every document counted in the merged stats, parts streamed
from S3 equal to the same parts on disk."""


from pipelines.runner import LocalRunner
from pipelines.decontam.config import DecontamConfig
from pipelines.decontam.steps import DecontamShards, decontam_counts, write_report, written_files
from pipelines.shards import iter_documents
from storage.local import LocalStore
from tests.pipelines.decontam.test_index import BENCH, first_record, index, pages, planted, write_part  # noqa: F401 (fixtures)


def run_scan(store, keys, index_path, out, logs, tasks, workers, config=DecontamConfig()):
    step = DecontamShards(store=store, keys=keys, index_path=str(index_path), config=config, output_dir=str(out),
                          records_dir=str(logs / "records"))
    LocalRunner(workers=workers).run([step], logging_dir=logs, tasks=tasks)
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
    index.save(tmp_path / "benchmarks.index")
    expected, stats = run_scan(store, keys, tmp_path / "benchmarks.index", tmp_path / "out-1", tmp_path / "logs-1", 1, 1)
    assert sorted(expected) == ([f"part-{i:05d}.jsonl.gz" for i in range(5)]
                                + ["removed-00001.jsonl.gz", "removed-00003.jsonl.gz"])
    counts = decontam_counts(stats, index.names)
    assert counts == {"in": 12, "kept": 10, "dropped": {"contaminated": 2}, "cut": 0, "chars_cut": 0, "spans_cut": 0,
                      "hits": {"gsm8k_test": 1, "hellaswag_val": 1, "HumanEval": 0}}
    assert [d["id"] for d in iter_documents(tmp_path / "out-1" / "removed-00003.jsonl.gz")] == ["dirty-hs"]
    # The parts' records list every file written, with its count, without reading the output back.
    assert written_files(tmp_path / "logs-1" / "records", keys) == [
        {"path": name, "records": sum(1 for _ in iter_documents(tmp_path / "out-1" / name))} for name in sorted(expected)]
    # The report: one line per hit, parts in key order, naming the item (GSM8K by line, HellaSwag by its `ind`).
    summary = write_report(tmp_path / "logs-1" / "records", keys, tmp_path / "report-1.jsonl")
    assert [(h["part"], h["id"], h["action"], h["benchmark"], h["item"]) for h in summary["first"]] == [
        ("part-00001.jsonl.gz", "dirty-gsm8k", "dropped", "gsm8k_test", "line=4"),
        ("part-00003.jsonl.gz", "dirty-hs", "dropped", "hellaswag_val", f"ind={hellaswag['ind']}")]
    assert summary["first"][1]["span"].startswith(hellaswag["ctx"][:40])
    assert (summary["hits"], summary["hits_per_benchmark"]) == (2, {"gsm8k_test": 1, "hellaswag_val": 1})
    report = (tmp_path / "report-1.jsonl").read_bytes()
    for tasks, workers in ((2, 1), (4, 2), (4, 1)):
        files, stats = run_scan(store, keys, tmp_path / "benchmarks.index", tmp_path / f"out-{tasks}-{workers}",
                                tmp_path / f"logs-{tasks}-{workers}", tasks, workers)
        assert files == expected, (tasks, workers)
        assert decontam_counts(stats, index.names) == counts
        write_report(tmp_path / f"logs-{tasks}-{workers}" / "records", keys, tmp_path / "report.jsonl")
        assert (tmp_path / "report.jsonl").read_bytes() == report, (tasks, workers)
    # Cut: the same documents, kept with the span cut out, counted as cut.
    _, stats = run_scan(store, keys, tmp_path / "benchmarks.index", tmp_path / "out-cut", tmp_path / "logs-cut", 2, 1,
                        DecontamConfig(action="cut"))
    cut = decontam_counts(stats, index.names)
    assert (cut["kept"], cut["cut"], cut["dropped"], cut["spans_cut"]) == (12, 2, {}, 2) and cut["chars_cut"] > 100


def test_parts_streamed_from_s3_give_the_bytes_of_the_same_parts_on_disk(tmp_path, index, pages, s3):
    """The tasks read the parts through the store (moto S3 here; each task gets a copy of the pipeline, the S3
    store rebuilt from its settings), streamed, never downloaded first: the outputs equal those of the same parts
    in a local store. One worker: a forkserver started by an earlier test would not have this test's AWS_*
    variables (a deployment sets them before anything starts)."""
    from storage.factory import open_store

    gsm8k = first_record(BENCH / "gsm8k_test.jsonl", skip=3)
    docs = pages[:6] + [planted(pages[6], f"Homework help: {gsm8k['question']}", "dirty")] + pages[7:]
    local, remote = LocalStore(tmp_path / "store"), open_store(f"s3://{s3.bucket}/root")
    keys = []
    for i in range(3):
        path = write_part(tmp_path / "parts" / f"part-{i:05d}.jsonl.gz", docs[i * 4:(i + 1) * 4])
        keys.append(f"dedup/web/part-{i:05d}.jsonl.gz")
        local.put_file(keys[-1], path)
        remote.put_file(keys[-1], path)
    index.save(tmp_path / "benchmarks.index")
    expected, stats = run_scan(local, keys, tmp_path / "benchmarks.index", tmp_path / "out-local", tmp_path / "logs-local", 1, 1)
    files, s3_stats = run_scan(remote, keys, tmp_path / "benchmarks.index", tmp_path / "out-s3", tmp_path / "logs-s3", 3, 1)
    assert files == expected and "removed-00001.jsonl.gz" in files
    assert decontam_counts(s3_stats, index.names) == decontam_counts(stats, index.names)
