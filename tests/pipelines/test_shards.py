"""The one gzip JSON-lines shard writer: rollover at its size limit, reproducible bytes, side files, reading back;
and that a stage's own process builds its steps without datatrove's I/O stack. The datatrove reader/writer pair
that names outputs after inputs is tests/pipelines/test_input_shards.py."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.shards import GzipLines, ShardWriter, iter_documents

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "math" / "gsm8k_train.jsonl"


def gsm8k_records(count: int) -> list[dict]:
    with open(GSM8K, encoding="utf-8") as f:
        return [{"text": row["question"], "id": f"gsm8k/{i}", "metadata": {"answer": row["answer"]}}
                for i, row in zip(range(count), map(json.loads, f))]


def write(out_dir: Path, records: list[dict], **kwargs) -> ShardWriter:
    out_dir.mkdir(parents=True, exist_ok=True)
    with ShardWriter(out_dir, **{"records_per_shard": 40, "compresslevel": 3, **kwargs}) as shards:
        for record in records:
            shards.write(record)
    return shards


def test_a_new_shard_starts_when_one_is_full(tmp_path):
    records = gsm8k_records(100)
    shards = write(tmp_path, records, records_per_shard=40)
    assert shards.files == [
        {"path": "part-00000.jsonl.gz", "records": 40},
        {"path": "part-00001.jsonl.gz", "records": 40},
        {"path": "part-00002.jsonl.gz", "records": 20},
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f["path"] for f in shards.files]
    assert [doc for f in shards.files for doc in iter_documents(tmp_path / f["path"])] == records


def test_exactly_full_shards_leave_no_empty_one_behind(tmp_path):
    shards = write(tmp_path, gsm8k_records(80), records_per_shard=40)
    assert [f["records"] for f in shards.files] == [40, 40]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-00000.jsonl.gz", "part-00001.jsonl.gz"]


def test_no_records_no_shard_files(tmp_path):
    shards = write(tmp_path, [])
    assert shards.files == [] and list(tmp_path.iterdir()) == []


def test_equal_records_are_equal_bytes_across_runs(tmp_path):
    records = gsm8k_records(500)
    first = write(tmp_path / "a", records, records_per_shard=200)
    write(tmp_path / "b", records, records_per_shard=200)
    for f in first.files:
        assert (tmp_path / "a" / f["path"]).read_bytes() == (tmp_path / "b" / f["path"]).read_bytes()
    header = (tmp_path / "a" / "part-00000.jsonl.gz").read_bytes()[:10]
    assert header[:3] == b"\x1f\x8b\x08"
    assert header[3] == 0  # flags: no file name, no comment, no extra field
    assert header[4:8] == b"\x00\x00\x00\x00"  # mtime 0


def test_compression_level_is_the_callers(tmp_path):
    records = gsm8k_records(500)
    fast = write(tmp_path / "fast", records, records_per_shard=500, compresslevel=1)
    small = write(tmp_path / "small", records, records_per_shard=500, compresslevel=9)
    fast_bytes = (tmp_path / "fast" / fast.files[0]["path"]).read_bytes()
    small_bytes = (tmp_path / "small" / small.files[0]["path"]).read_bytes()
    assert gzip.decompress(fast_bytes) == gzip.decompress(small_bytes)
    assert len(small_bytes) < len(fast_bytes)


def test_one_line_per_record_keys_in_the_order_given(tmp_path):
    write(tmp_path, [{"text": "b", "id": "1", "metadata": {"z": 1, "a": 2}}])
    assert gzip.decompress((tmp_path / "part-00000.jsonl.gz").read_bytes()) == (
        b'{"text":"b","id":"1","metadata":{"z":1,"a":2}}\n'
    )


def test_a_prefix_puts_shards_in_a_subfolder(tmp_path):
    (tmp_path / "web").mkdir()
    shards = write(tmp_path, gsm8k_records(3), records_per_shard=2, prefix="web/")
    assert [f["path"] for f in shards.files] == ["web/part-00000.jsonl.gz", "web/part-00001.jsonl.gz"]
    assert len(list(iter_documents(tmp_path / "web" / "part-00001.jsonl.gz"))) == 1


def test_values_json_has_no_type_for_go_through_the_default_hook(tmp_path):
    def as_text(value):
        return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)

    write(tmp_path, [{"text": "x", "blob": b"\xffab"}], default=as_text)
    assert list(iter_documents(tmp_path / "part-00000.jsonl.gz")) == [{"text": "x", "blob": "\ufffdab"}]
    with pytest.raises(TypeError):
        write(tmp_path / "strict", [{"text": "x", "blob": b"ab"}])


def test_a_side_file_counts_its_records_and_is_there_even_when_empty(tmp_path):
    with GzipLines(tmp_path / "rejected.jsonl.gz", compresslevel=3) as rejected:
        pass
    assert rejected.records == 0 and list(iter_documents(tmp_path / "rejected.jsonl.gz")) == []
    with GzipLines(tmp_path / "removed.jsonl.gz", compresslevel=1) as removed:
        removed.write({"reason": "bad_json", "origin": "a.jsonl:3"})
        removed.write({"reason": "undecodable", "origin": "a.jsonl:9"})
    assert removed.records == 2
    assert [r["origin"] for r in iter_documents(tmp_path / "removed.jsonl.gz")] == ["a.jsonl:3", "a.jsonl:9"]


def test_reading_skips_blank_lines(tmp_path):
    path = tmp_path / "part-00000.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"id": "a"}\n\n  \n{"id": "b"}\n'))
    assert [d["id"] for d in iter_documents(path)] == ["a", "b"]


def test_bad_shard_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="records_per_shard"):
        ShardWriter(tmp_path, records_per_shard=0, compresslevel=3)


def test_a_stem_names_the_shards_of_one_input(tmp_path):
    shards = write(tmp_path, gsm8k_records(90), stem="part-00003")
    assert [f["path"] for f in shards.files] == ["part-00003-00000.jsonl.gz", "part-00003-00001.jsonl.gz",
                                                 "part-00003-00002.jsonl.gz"]


def test_a_stage_process_that_builds_its_steps_imports_no_datatrove_io(tmp_path):
    # With two or more workers the run's process only builds the steps its helpers run: the data stages' step
    # modules (shards read and written by our own code) must not pull in datatrove.io, fsspec's registry of
    # filesystems and huggingface_hub, 0.1 s of a ~0.7 s stage at the bench's 1x (bench/scale.py).
    modules = ["pipelines.ingest.step", "pipelines.dedup.stage", "pipelines.dedup.sequential",
               "pipelines.decontam.steps", "pipelines.tokenization.pack"]
    code = (f"import sys; import {', '.join(modules)}; "
            "print(sorted(m for m in ('datatrove.io', 'huggingface_hub', 'datatrove.pipeline.readers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
