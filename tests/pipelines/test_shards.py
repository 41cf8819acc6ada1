"""The one gzip JSON-lines shard writer: rollover at its size limit, reproducible bytes, side files, reading back;
and the datatrove reader/writer pair that names outputs after inputs, so any task count writes the same files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from datatrove.pipeline.base import PipelineStep

from pipelines.runner import LocalRunner
from pipelines.shards import INPUT_SHARD, GzipLines, InputShardReader, InputShardWriter, ShardWriter, iter_documents

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


class _DropOdd(PipelineStep):
    """Drops documents whose id ends in an odd digit into an exclusion writer (as our filters do)."""

    name = "drop odd"

    def __init__(self, rejected: InputShardWriter):
        super().__init__()
        self.rejected = rejected

    def run(self, data, rank: int = 0, world_size: int = 1):
        with self.rejected:
            for doc in data:
                if int(doc.id[-1]) % 2:
                    self.rejected.write(doc, rank)
                else:
                    yield doc


def shard_stage(in_dir: Path, out_dir: Path, logs: Path, *, tasks: int, workers: int) -> dict[str, bytes]:
    steps = [InputShardReader(str(in_dir), glob_pattern="part-*.jsonl.gz"),
             _DropOdd(InputShardWriter(str(out_dir), prefix="rejected-")), InputShardWriter(str(out_dir))]
    LocalRunner(workers=workers).run(steps, logging_dir=logs, tasks=tasks)
    return {p.name: p.read_bytes() for p in sorted(out_dir.iterdir())}


def test_datatrove_stages_name_outputs_after_their_inputs_so_any_task_count_writes_the_same_bytes(tmp_path):
    # Five real input shards of unequal sizes; no output may depend on which task read which shard.
    records = gsm8k_records(230)
    write(tmp_path / "in", records, records_per_shard=50)
    outputs = {(tasks, workers): shard_stage(tmp_path / "in", tmp_path / f"out-{tasks}-{workers}",
                                             tmp_path / f"logs-{tasks}-{workers}", tasks=tasks, workers=workers)
               for tasks, workers in [(1, 1), (2, 2), (4, 2), (7, 1)]}
    reference = outputs[(1, 1)]
    assert sorted(reference) == [f"part-0000{i}.jsonl.gz" for i in range(5)] + [f"rejected-part-0000{i}.jsonl.gz" for i in range(5)]
    for run, files in outputs.items():
        assert files == reference, run
    # The documents are those of their input file, in order, without the field that carried the file's name.
    kept = list(iter_documents(tmp_path / "out-4-2" / "part-00001.jsonl.gz"))
    assert [d["id"] for d in kept] == [r["id"] for r in records[50:100] if int(r["id"][-1]) % 2 == 0]
    assert kept[0]["metadata"] == records[50]["metadata"] and INPUT_SHARD not in kept[0]["metadata"]


def test_datatrove_gzip_headers_carry_no_time_or_name(tmp_path):
    write(tmp_path / "in", gsm8k_records(10))
    shard_stage(tmp_path / "in", tmp_path / "out", tmp_path / "logs", tasks=1, workers=1)
    header = (tmp_path / "out" / "part-00000.jsonl.gz").read_bytes()[:10]
    assert header[3] & 0x08 == 0 and header[4:8] == b"\0\0\0\0"  # FNAME flag unset, MTIME 0


def test_a_document_not_read_by_the_input_shard_reader_is_refused_by_name(tmp_path):
    from datatrove.data import Document

    writer = InputShardWriter(str(tmp_path))
    with pytest.raises(ValueError, match="'doc-7' has no _input_shard"):
        writer.write(Document(text="x", id="doc-7"), rank=0)


def test_a_stem_names_the_shards_of_one_input(tmp_path):
    shards = write(tmp_path, gsm8k_records(90), stem="part-00003")
    assert [f["path"] for f in shards.files] == ["part-00003-00000.jsonl.gz", "part-00003-00001.jsonl.gz",
                                                 "part-00003-00002.jsonl.gz"]


def test_the_input_shard_reader_reads_a_folder_in_a_bucket_like_one_on_disk(tmp_path, s3):
    # A committed output read in place from an S3 store (the filter stage's input): the same bytes out.
    records = gsm8k_records(120)
    write(tmp_path / "in", records, records_per_shard=50)
    for path in sorted((tmp_path / "in").iterdir()):
        s3.client().upload_file(str(path), s3.bucket, f"raw/v1/{path.name}")
    s3.client().put_object(Bucket=s3.bucket, Key="raw/v1/manifest.json", Body=b"{}")  # not a part: not read
    on_disk = shard_stage(tmp_path / "in", tmp_path / "out-disk", tmp_path / "logs-disk", tasks=2, workers=1)
    steps = [InputShardReader(f"s3://{s3.bucket}/raw/v1", glob_pattern="part-*.jsonl.gz"),
             _DropOdd(InputShardWriter(str(tmp_path / "out-s3"), prefix="rejected-")),
             InputShardWriter(str(tmp_path / "out-s3"))]
    LocalRunner().run(steps, logging_dir=tmp_path / "logs-s3", tasks=2)
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "out-s3").iterdir())} == on_disk
    # A file:// URI (a local store's uri()) is its folder.
    assert InputShardReader((tmp_path / "in").as_uri()).data_folder.path == str(tmp_path / "in")
