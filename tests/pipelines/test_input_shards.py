"""The datatrove reader/writer pair that names outputs after inputs, so any task count writes the same files, with
gzip headers that carry no time or name; and the reader on a bucket's folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from datatrove.pipeline.base import PipelineStep

from pipelines.input_shards import INPUT_SHARD, InputShardReader, InputShardWriter
from pipelines.runner import LocalRunner
from pipelines.shards import iter_documents
from tests.pipelines.test_shards import gsm8k_records, write


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
