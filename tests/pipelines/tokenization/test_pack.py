"""Packing and the tokenizer's sample as datatrove tasks over store parts of real documents (GSM8K problems,
TheAlgorithms' Python files): the same bytes for 1, 2 and 4 tasks on 1 or 2 workers, one index in input order,
and a merged sample equal to one pass over the whole source."""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path

import numpy as np
import orjson
import pytest

from pipelines.runner import LocalRunner, stat_totals
from pipelines.tokenization.pack import (
    PackIndex,
    PackShards,
    SampleShards,
    merged_sample,
    shard_name,
    split_counts,
)
from pipelines.tokenization.packed_format import INDEX_FILE
from pipelines.shards import store_documents
from pipelines.tokenization.config import PackingConfig, TokenizerConfig
from pipelines.tokenization.tokenizer import adopt_tokenizer, is_val, sample_texts
from storage.local import LocalStore
from tests.conftest import SHARED_DATA

GPT2 = SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json"
EOS = 50256


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> tuple[LocalStore, dict[str, list[str]], dict[str, list[dict]]]:
    """Two sources in a store: math in 5 parts, code in 3; (store, keys per source, documents per source)."""
    root = tmp_path_factory.mktemp("parts")
    store = LocalStore(root / "store")
    math = [json.loads(line) for line in (SHARED_DATA / "math" / "gsm8k_train.jsonl").read_text().splitlines()[:500]]
    with tarfile.open(SHARED_DATA / "code" / "thealgorithms_python_py_files.tar.gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".py")][:120]
        code = [tar.extractfile(m).read().decode("utf-8", errors="replace") for m in members]
    docs = {"math": [{"id": f"math/{i}", "text": f"{d['question']}\n\n{d['answer']}"} for i, d in enumerate(math)],
            "code": [{"id": f"code/{i}", "text": t} for i, t in enumerate(code) if t.strip()]}
    keys = {}
    for name, n in (("math", 5), ("code", 3)):
        keys[name] = []
        size = -(-len(docs[name]) // n)
        for i in range(n):
            lines = b"".join(orjson.dumps(d) + b"\n" for d in docs[name][i * size:(i + 1) * size])
            keys[name].append(f"curation/{name}/decontaminated/v/part-{i:05d}.jsonl.gz")
            store.put_bytes(keys[name][-1], gzip.compress(lines))
    return store, keys, docs


def pack(store, keys, out: Path, logs: Path, tasks: int, workers: int, config=PackingConfig(val_fraction=0.1)):
    step = PackShards(store=store, keys=keys, tokenizer_file=str(GPT2), eos_id=EOS, config=config, output_dir=str(out))
    LocalRunner(workers=workers).run([step], logging_dir=logs / "pack", tasks=tasks)
    index = PackIndex(output_dir=str(out), shards=[shard_name(k) for k in keys], vocab_size=50257, eos_id=EOS)
    LocalRunner().run([index], logging_dir=logs / "index", tasks=1)
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    return files, logs / "pack" / "stats.json"


def test_store_parts_stream_in_order(parts):
    store, keys, docs = parts
    assert [d for key in keys["code"] for d in store_documents(store, key)] == docs["code"]
    assert shard_name(keys["code"][2]) == "part-00002"


def test_packing_in_tasks_gives_the_same_bytes_and_one_stream_in_input_order(parts, tmp_path):
    store, keys, docs = parts
    expected, stats = pack(store, keys["math"], tmp_path / "out-1", tmp_path / "logs-1", 1, 1)
    assert sorted(expected) == [INDEX_FILE] + [f"{split}/part-{i:05d}.{kind}.bin" for split in ("train", "val")
                                               for i in range(5) for kind in ("offsets", "tokens")]
    for tasks, workers in ((2, 1), (4, 2), (4, 1)):
        files, _ = pack(store, keys["math"], tmp_path / f"out-{tasks}-{workers}", tmp_path / f"logs-{tasks}-{workers}",
                        tasks, workers)
        assert files == expected, (tasks, workers)

    index = json.loads(expected[INDEX_FILE])
    counts = split_counts(stat_totals(stats, step=PackShards.name))
    assert {s: {"tokens": index["splits"][s]["tokens"], "documents": index["splits"][s]["documents"]}
            for s in ("train", "val")} == counts
    assert counts["train"]["documents"] + counts["val"]["documents"] == len(docs["math"])
    assert (index["dtype"], index["eos_id"], index["vocab_size"]) == ("uint16", EOS, 50257)
    # The val split, shards concatenated in index order, decodes to the held-out documents in input order.
    tokenizer = adopt_tokenizer(GPT2, TokenizerConfig())
    out = tmp_path / "out-1"
    decoded = []
    for entry in index["splits"]["val"]["shards"]:
        tokens = np.fromfile(out / entry["tokens_file"], dtype=np.uint16)
        offsets = np.fromfile(out / entry["offsets_file"], dtype=np.int64)
        assert (len(tokens), len(offsets) - 1) == (entry["tokens"], entry["documents"]) and tokens[-1] == EOS
        decoded += [tokenizer.decode(tokens[a:b - 1].tolist()) for a, b in zip(offsets[:-1], offsets[1:])]
    config = PackingConfig(val_fraction=0.1)
    assert decoded == [d["text"] for i, d in enumerate(docs["math"]) if is_val(d["id"], i, config)]


def test_the_tokenizer_sample_from_tasks_is_the_sample_of_the_whole(parts, tmp_path):
    store, keys, docs = parts
    config = TokenizerConfig(sample_bytes=120_000, seed=3)
    expected = sample_texts(docs, config)
    for tasks, workers in ((1, 1), (3, 2)):
        out = tmp_path / f"sample-{tasks}"
        step = SampleShards(store=store, sources=keys, config=config, output_dir=str(out))
        LocalRunner(workers=workers).run([step], logging_dir=tmp_path / f"logs-{tasks}", tasks=tasks)
        assert merged_sample(out, keys, config) == expected
        assert stat_totals(tmp_path / f"logs-{tasks}" / "stats.json", step=SampleShards.name)["shards"] == 8
    per_source = {name: sum(len(t.encode()) for t in expected if t in {d["text"] for d in docs[name]}) for name in docs}
    assert all(0 < n <= 60_000 for n in per_source.values()), per_source


def test_a_packing_run_killed_after_some_tasks_reruns_only_the_rest(parts, tmp_path):
    """The executor resource skips the tasks that completed; a task that did not is run again and rewrites its
    shards whole (temporary names, then a rename), so the result equals an uninterrupted run."""
    from resources.executor import ExecutorResource

    store, keys, _ = parts
    executor = ExecutorResource(kind="local", workers=1)
    out, logs = tmp_path / "out", tmp_path / "logs"

    def run():
        step = PackShards(store=store, keys=keys["math"], tokenizer_file=str(GPT2), eos_id=EOS,
                          config=PackingConfig(val_fraction=0.1), output_dir=str(out))
        return executor.run([step], logging_dir=logs, tasks=4)

    stats = stat_totals(run(), step=PackShards.name)
    whole = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    # "Kill" task 1 (its share: part 1): its marker, stats and one of its files gone, a half-written temporary
    # file left behind.
    (logs / "completions" / "00001").unlink()
    (logs / "stats" / "00001.json").unlink()
    (out / "train" / "part-00001.tokens.bin").unlink()
    (out / "train" / ".part-00001.tokens.bin.tmp").write_bytes(b"half")
    untouched = {p: p.stat().st_mtime_ns for p in out.rglob("*part-00003*")}
    assert stat_totals(run(), step=PackShards.name) == stats  # the merged counts of old and new tasks
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == whole
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*part-00003*")} == untouched  # task 3 did not run again


def test_input_shards_of_the_same_name_are_refused_before_any_task(parts):
    store, _, _ = parts
    with pytest.raises(ValueError, match="same name"):
        PackShards(store=store, keys=["a/part-00000.jsonl.gz", "b/part-00000.jsonl.gz"], tokenizer_file=str(GPT2),
                   eos_id=EOS, config=PackingConfig(), output_dir="out")
