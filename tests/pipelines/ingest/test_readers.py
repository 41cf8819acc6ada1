"""Input readers on the real shared data: one InputRecord per input record, in order, bytes counted as stored.
(What records become -- documents, skips, rejections -- is tested end to end in test_ingest.py.)"""

from __future__ import annotations

import gzip
import json
import pickle
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from pipelines.ingest.config import ReaderConfig
from pipelines.ingest.readers import InputRecord, read_inputs

DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
CRAWL = DATA / "crawl"
GSM8K = DATA / "math" / "gsm8k_train.jsonl"
CODE_TARBALL = DATA / "code" / "thealgorithms_python_py_files.tar.gz"


def read(inputs: list[Path], fmt: str, reader: ReaderConfig = ReaderConfig(), name="src"):
    sizes: list[int] = []
    records = list(read_inputs(name, inputs, fmt, reader, count_bytes=sizes.append))
    return records, sizes


def test_warc_records_carry_payloads_undecoded():
    path = CRAWL / "dolma_sample-0000.warc.gz"
    records, sizes = read([path], "warc", name="web")
    assert sizes == [path.stat().st_size]
    assert Counter(r.kind for r in records) == {"html": 22, "skip": 26}
    assert Counter(r.reason for r in records if r.kind == "skip") == {
        "warc_request": 22, "uri_scheme_metadata": 2, "warcinfo": 1, "warc_metadata": 1,
    }
    pages = [r for r in records if r.kind == "html"]
    assert all(isinstance(r.body, bytes) and r.id.startswith("<urn:uuid:") for r in pages)
    assert all(list(r.meta) == ["source", "url", "origin", "date", "content_type"] for r in pages)
    assert all(r.meta["source"] == "web" and r.origin.startswith(path.name + ":") for r in pages)


def test_jsonl_rows_become_text_records_in_line_order(tmp_path):
    lines = GSM8K.read_bytes().splitlines()[:5]
    path = tmp_path / "head.jsonl.gz"
    path.write_bytes(gzip.compress(b"\n".join(lines[:2] + [b"", b"{oops"] + lines[2:]) + b"\n", mtime=0))
    records, sizes = read([path], "jsonl", ReaderConfig(text_fields=("question", "answer")), name="math")
    assert sizes == [path.stat().st_size]
    assert [r.kind for r in records] == ["text", "text", "bad", "text", "text", "text"]
    assert [r.origin for r in records] == [f"head.jsonl.gz:{n}" for n in (1, 2, 4, 5, 6, 7)]
    assert records[2].reason == "bad_json"
    first = json.loads(lines[0])
    assert records[0].body == first["question"] + "\n\n" + first["answer"]
    assert records[0].id == "math/head.jsonl.gz:1" and records[0].meta == {"source": "math", "origin": "head.jsonl.gz:1"}


def test_a_truncated_gzip_stream_ends_with_one_bad_record(tmp_path):
    data = gzip.compress(GSM8K.read_bytes()[:200_000], mtime=0)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    records, _ = read([path], "jsonl", ReaderConfig(text_fields=("question", "answer")))
    *good, last = records
    assert good and all(r.kind == "text" for r in good)
    assert last.kind == "bad" and last.reason == "truncated" and last.origin == f"cut.jsonl.gz:{len(good) + 1}"


def test_tar_members_in_archive_order_excluded_ones_skipped():
    records, sizes = read([CODE_TARBALL], "text", ReaderConfig(include=("*.py",)), name="code")
    assert sizes == [CODE_TARBALL.stat().st_size]
    assert Counter((r.kind, r.reason) for r in records) == {
        ("plain", ""): 1385, ("skip", "not_a_file"): 222, ("skip", "excluded"): 1,
    }
    with tarfile.open(CODE_TARBALL) as archive:
        order = [f"{CODE_TARBALL.name}::{m.name}" for m in archive]
    assert [r.origin for r in records] == order


def test_a_folder_counts_only_the_files_it_reads(tmp_path):
    (tmp_path / "books" / "b").mkdir(parents=True)
    (tmp_path / "books" / "b" / "one.txt").write_bytes(b"one " * 10)
    (tmp_path / "books" / "two.txt").write_bytes(gzip.compress(b"two " * 10, mtime=0))
    (tmp_path / "books" / "notes.md").write_bytes(b"# excluded" * 100)
    records, sizes = read([tmp_path / "books"], "text", ReaderConfig(include=("*.txt",)))
    assert [(r.origin, r.kind) for r in records] == [
        ("books::b/one.txt", "plain"), ("books::notes.md", "skip"), ("books::two.txt", "plain"),
    ]
    assert records[2].body == b"two " * 10  # gunzipped by its bytes
    assert sizes == [40, (tmp_path / "books" / "two.txt").stat().st_size]


def test_oversized_files_are_bad_before_being_read_whole(tmp_path):
    (tmp_path / "big.txt").write_bytes(b"x" * 5000)
    records, _ = read([tmp_path / "big.txt"], "text", ReaderConfig(max_document_bytes=1000))
    assert [(r.kind, r.reason) for r in records] == [("bad", "oversized")]


def test_a_folder_is_refused_for_other_formats(tmp_path):
    with pytest.raises(ValueError, match="only the text format reads folders"):
        read([tmp_path], "jsonl")
    with pytest.raises(ValueError, match="does not exist"):
        read([tmp_path / "missing.jsonl"], "jsonl")


def test_records_pickle():
    record = InputRecord("html", "a.warc.gz:0", id="<urn:uuid:a>", meta={"source": "web"}, body=b"<p>x</p>")
    assert pickle.loads(pickle.dumps(record)) == record
