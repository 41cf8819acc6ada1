"""The dedup stage's four datatrove phases on real C4/Dolma pages: the same bytes whatever the task count and the
workers, a killed phase resumed, inputs streamed from the object store. On a Ray cluster: the executor test
(tests/resources/test_executor.py) materializes this stage there and compares its files and counts with one local
task's (that test took in this module's own Ray run, the same path, so Ray starts once in the suite)."""

import gzip
import json
import random
from pathlib import Path

import pytest
from datatrove.pipeline.base import PipelineStep

from pipelines.dedup.config import DedupConfig
from pipelines.dedup.stage import deduplicate
from pipelines.runner import LocalRunner
from pipelines.dedup.steps import Shard
from pipelines.shards import iter_documents
from tests.pipelines.dedup.test_minhash import c4_docs, edit_words, write_part  # noqa: F401  (c4_docs: a fixture)


@pytest.fixture(scope="module")
def corpus(c4_docs, tmp_path_factory) -> list[tuple[str, list[Path]]]:  # noqa: F811
    """Three sources over six shards: near copies across sources and shards, exact copies, a document without
    words, a blank line, and a shard whose documents are all removed."""
    root = tmp_path_factory.mktemp("corpus")
    docs = [d for d in c4_docs if len(d["text"].split()) >= 150]
    rng = random.Random(3)
    web = docs[:24]
    news = docs[24:36] + [{**docs[2], "id": "zz-exact-of-2"}, {"text": "!!! ...", "id": "no-words", "metadata": {}}]
    copies = [{"text": edit_words(docs[i]["text"], edits=2, seed=i), "id": f"copy-{i}", "metadata": {}}
              for i in (0, 3, 5, 26, 30)]
    shards = {
        "web": [web[:8], web[8:16], web[16:]],
        "news": [news],
        "mirror": [copies[:3], copies[3:] + [{**copies[0], "id": "copy-0-again"}]],
    }
    sources = []
    for name, parts in shards.items():
        paths = []
        for k, part in enumerate(parts):
            rng.shuffle(part)
            paths.append(write_part(root / name / f"part-{k:05d}.jsonl.gz", part))
        sources.append((name, paths))
    # A blank line inside a shard is not a document (and does not shift the documents' lines).
    text = (root / "news" / "part-00000.jsonl.gz").read_bytes()
    lines = gzip.decompress(text).splitlines(keepends=True)
    (root / "news" / "part-00000.jsonl.gz").write_bytes(gzip.compress(b"".join(lines[:3] + [b"\n"] + lines[3:])))
    return sources


def files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def run_stage(tmp_path: Path, corpus, executor, label: str, config=DedupConfig()):
    stats = deduplicate(sources=corpus, config=config, work_dir=tmp_path / label / "work",
                        out_dir=tmp_path / label / "out", executor=executor)
    return stats, files(tmp_path / label / "out")


@pytest.mark.slow  # ~8 s: five runs of the stage, one on a forkserver pool
def test_the_output_is_the_same_bytes_for_any_task_count_and_workers(tmp_path, corpus):
    reference, out = run_stage(tmp_path, corpus, LocalRunner(workers=1, tasks=1), "one")
    # The copies go to removed-<shard> files named after their input shards; mirror (last in the recipe) keeps
    # nothing, so it has no part file; the news page copied exactly from web goes, the web original stays.
    assert sorted(out) == ["mirror/removed-00000.jsonl.gz", "mirror/removed-00001.jsonl.gz", "news/part-00000.jsonl.gz",
                           "news/removed-00000.jsonl.gz", "web/part-00000.jsonl.gz", "web/part-00001.jsonl.gz",
                           "web/part-00002.jsonl.gz"]
    assert reference.documents_in == {"web": 24, "news": 14, "mirror": 6}
    assert reference.kept == {"web": 24, "news": 13, "mirror": 0}
    # copy-0-again is copy-0's exact copy, but their cluster keeps web's page: both are near duplicates of it.
    assert reference.removed == {"exact_duplicate": 1, "near_duplicate": 6}
    assert reference.cluster_sizes == {2: 5, 3: 1} and reference.exact_pairs == 2
    assert sum(f["records"] for f in reference.files) == 44
    for label, executor in (("two", LocalRunner(workers=1, tasks=2)), ("four", LocalRunner(workers=2, tasks=4))):
        stats, other = run_stage(tmp_path, corpus, executor, label)
        assert other == out, label
        assert stats == reference, label
    # Buckets split into key ranges (bucket_docs) find the same pairs, so the same output.
    stats, other = run_stage(tmp_path, corpus, LocalRunner(workers=1, tasks=3), "ranges", DedupConfig(bucket_docs=7))
    assert other == out
    assert len(list((tmp_path / "ranges" / "work" / "pairs").glob("band-00-*.npy"))) == 7  # 44 documents / 7


class FailOnce(PipelineStep):
    """Stands for a task killed after its work: raises in `rank` the first time (a marker file remembers)."""

    name = "fail once"

    def __init__(self, rank: int, marker: Path):
        super().__init__()
        self.rank, self.marker = rank, marker

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        if rank == self.rank and not self.marker.exists():
            self.marker.touch()
            raise RuntimeError(f"task {rank} killed")
        return iter(())


class KillingRunner(LocalRunner):
    """The local runner, with FailOnce appended to one phase's pipeline."""

    def __init__(self, phase: str, rank: int, marker: Path, **kwargs):
        super().__init__(**kwargs)
        self.phase, self.rank, self.marker = phase, rank, marker

    def run(self, pipeline, *, logging_dir, tasks):
        if Path(logging_dir).name == self.phase:
            pipeline = [*pipeline, FailOnce(self.rank, self.marker)]
        return super().run(pipeline, logging_dir=logging_dir, tasks=tasks)


def task_logs(work: Path) -> dict[str, int]:
    """Every task log and completion marker of every phase, with its modification time."""
    return {p.relative_to(work).as_posix(): p.stat().st_mtime_ns
            for pattern in ("logs/*/logs/task_*.log", "logs/*/completions/*") for p in work.glob(pattern)}


@pytest.mark.parametrize("phase", ["signatures", "removal"])
def test_a_killed_phase_resumes_with_only_the_tasks_that_did_not_complete(tmp_path, corpus, phase):
    reference, out = run_stage(tmp_path, corpus, LocalRunner(workers=1, tasks=4), "whole")
    executor = KillingRunner(phase, rank=2, marker=tmp_path / "killed.marker", workers=1, tasks=4)
    with pytest.raises(RuntimeError, match="task 2 killed"):
        run_stage(tmp_path, corpus, executor, "killed")
    work = tmp_path / "killed" / "work"
    first = task_logs(work)
    # Tasks 0 and 1 completed before task 2 died; task 3 never started (one worker runs them in order).
    assert sorted(p for p in first if p.startswith(f"logs/{phase}/completions/")) == [
        f"logs/{phase}/completions/00000", f"logs/{phase}/completions/00001"]

    stats, resumed = run_stage(tmp_path, corpus, executor, "killed")
    second = task_logs(work)
    ran_again = sorted(p for p in second if first.get(p) != second[p])
    phase_after = {"signatures": ["buckets", "clusters", "removal"], "removal": []}[phase]
    expected = [f"logs/{phase}/completions/0000{r}" for r in (2, 3)] + [f"logs/{phase}/logs/task_0000{r}.log" for r in (2, 3)]
    # The phases after the killed one ran for the first time, each with all of its tasks.
    expected += [p for p in second if p.split("/")[1] in phase_after]
    assert ran_again == sorted(expected)
    assert resumed == out
    assert stats == reference


def test_a_phase_resumed_with_another_task_count_starts_over(tmp_path, corpus):
    """Four tasks' completion markers mean nothing to two tasks (a rank's shards depend on the count): every phase
    runs again, and the output and counts are still those of one uninterrupted run."""
    reference, out = run_stage(tmp_path, corpus, LocalRunner(workers=1, tasks=1), "whole")
    executor = KillingRunner("removal", rank=2, marker=tmp_path / "killed.marker", workers=1, tasks=4)
    with pytest.raises(RuntimeError, match="task 2 killed"):
        run_stage(tmp_path, corpus, executor, "killed")
    stats, resumed = run_stage(tmp_path, corpus, LocalRunner(workers=1, tasks=2), "killed")
    assert resumed == out and stats == reference
    logs = tmp_path / "killed" / "work" / "logs"
    for phase in ("signatures", "buckets", "removal"):
        assert sorted(p.name for p in (logs / phase / "completions").iterdir()) == ["00000", "00001"], phase


@pytest.mark.slow  # ~7 s on S3: moto serves every shard twice (signatures, removal)
def test_shards_stream_from_the_object_store(tmp_path, corpus, store):
    from_disk, out = run_stage(tmp_path, corpus, LocalRunner(workers=1, tasks=2), "disk")
    sources = []
    for name, paths in corpus:
        keys = []
        for path in paths:
            key = f"upstream/{name}/{path.name}"
            store.put_file(key, path)
            keys.append(key)
        sources.append((name, [Shard(name, key, store) for key in keys]))
    # One worker: a forkserver started by an earlier test would not have this test's AWS_* variables.
    from_store, other = run_stage(tmp_path, sources, LocalRunner(workers=1, tasks=3), "store")
    assert other == out and from_store == from_disk


def test_the_counts_come_from_each_phases_stats(tmp_path, corpus):
    stats, _ = run_stage(tmp_path, corpus, LocalRunner(workers=1, tasks=2), "run")
    merged = json.loads((tmp_path / "run" / "work" / "logs" / "buckets" / "stats.json").read_text())
    assert merged[0]["stats"]["candidate_pairs"]["total"] == stats.candidate_pairs >= stats.verified_pairs > 0
    clusters = json.loads((tmp_path / "run" / "work" / "logs" / "clusters" / "stats.json").read_text())[0]["stats"]
    assert stats.cluster_bytes_per_document == round(clusters["held_bytes"]["total"] / 44, 1) > 0


def test_two_shards_of_a_source_may_not_write_the_same_file(tmp_path, corpus):
    web = corpus[0][1]
    other = tmp_path / "elsewhere" / web[0].name
    other.parent.mkdir()
    other.write_bytes(web[0].read_bytes())
    with pytest.raises(ValueError, match="would both write web/part-00000.jsonl.gz"):
        deduplicate(sources=[("web", [web[0], other])], config=DedupConfig(), work_dir=tmp_path / "w", out_dir=tmp_path / "o")


def test_the_kept_documents_of_all_shards_read_back(tmp_path, corpus):
    stats, _ = run_stage(tmp_path, corpus, LocalRunner(), "run")
    out = tmp_path / "run" / "out"
    kept = [d for name, _ in corpus for p in sorted((out / name).glob("part-*.jsonl.gz")) for d in iter_documents(p)]
    assert len(kept) == sum(stats.kept.values()) and len({d["id"] for d in kept}) == len(kept)
    assert "no-words" in {d["id"] for d in kept}
