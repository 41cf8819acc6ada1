"""pipelines.ingest.warc: real WARCs read record for record, and damaged gzip members, records and payloads reported."""

from __future__ import annotations

import gzip
import random
import zlib
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from pipelines.ingest import warc as warc_module
from pipelines.ingest.warc import WarcDamage, WarcEntry, read_warc

CC_EXCERPT = "crawl/resiliparse_CC-MAIN-2020-34_excerpt.warc.gz"
HTML = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\r\n<p>hello</p>"


def record(rec_type: str, block: bytes, *, rid: str = "<urn:uuid:1>", uri: str | None = "http://example.com/",
           content_type: str | None = "application/http; msgtype=response") -> bytes:
    """One WARC/1.0 record, written by hand (not by warcio) so each header is what the test says."""
    head = f"WARC/1.0\r\nWARC-Type: {rec_type}\r\nWARC-Record-ID: {rid}\r\nWARC-Date: 2024-01-01T00:00:00Z\r\n"
    if uri is not None:
        head += f"WARC-Target-URI: {uri}\r\n"
    if content_type is not None:
        head += f"Content-Type: {content_type}\r\n"
    head += f"Content-Length: {len(block)}\r\n\r\n"
    return head.encode() + block + b"\r\n\r\n"


def page(i: int) -> bytes:
    return record("response", HTML.replace(b"hello", b"page %d" % i), rid=f"<urn:uuid:{i}>", uri=f"http://e.com/{i}")


def members(*records: bytes) -> tuple[bytes, list[int]]:
    """A .warc.gz of one gzip member per record, and each member's offset."""
    data, offsets = b"", []
    for r in records:
        offsets.append(len(data))
        data += gzip.compress(r, mtime=0)
    return data, offsets


def read(path: Path, data: bytes, max_payload_bytes: int = 1 << 20) -> list[WarcEntry | WarcDamage]:
    path.write_bytes(data)
    return list(read_warc(path, max_payload_bytes=max_payload_bytes))


def ids(items) -> list[str | None]:
    return [x.record_id if isinstance(x, WarcEntry) else f"damage:{x.reason}" for x in items]


# --- real files -------------------------------------------------------------------------------------------------


def test_a_real_common_crawl_warc_gives_every_record_warcio_reads(shared_data):
    path = shared_data / CC_EXCERPT
    expected = []
    with open(path, "rb") as f:  # warcio on the whole file: fine for an undamaged one
        for r in ArchiveIterator(f):
            payload = r.content_stream().read() if r.rec_type == "response" else None
            expected.append((r.rec_type, r.rec_headers.get_header("WARC-Record-ID"),
                             r.rec_headers.get_header("WARC-Target-URI"), payload))
    items = list(read_warc(path, max_payload_bytes=8 << 20))
    assert all(isinstance(x, WarcEntry) for x in items)
    got = [(x.rec_type, x.record_id, x.url, x.payload if x.rec_type == "response" else None) for x in items]
    assert got == expected
    responses = [x for x in items if x.rec_type == "response"]
    assert len(responses) == 16  # the README's count
    assert all(x.http_status and x.payload for x in responses)
    # Records that never hold a document are not read past their headers; their type is the WARC one.
    for x in items:
        if x.rec_type in ("request", "metadata", "warcinfo"):
            assert x.payload is None and x.http_status is None and x.content_type.startswith("application/")


def test_each_origin_is_the_offset_of_the_gzip_member_that_holds_the_record(shared_data):
    path = shared_data / CC_EXCERPT
    raw = path.read_bytes()
    offsets = []
    for x in read_warc(path, max_payload_bytes=8 << 20):
        name, _, offset = x.origin.partition(":")
        assert name == path.name and "#" not in offset  # one record a member in a standard .warc.gz
        offset = int(offset)
        member = zlib.decompressobj(wbits=31).decompress(raw[offset:])
        assert member.startswith(b"WARC/1.0\r\n") and f"WARC-Record-ID: {x.record_id}".encode() in member[:2000]
        offsets.append(offset)
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets) and offsets[0] == 0


def test_an_uncompressed_copy_of_a_real_warc_reads_the_same(shared_data, tmp_path):
    gz = list(read_warc(shared_data / CC_EXCERPT, max_payload_bytes=8 << 20))
    plain_bytes = gzip.decompress((shared_data / CC_EXCERPT).read_bytes())
    plain = read(tmp_path / "excerpt.warc", plain_bytes, 8 << 20)
    strip = lambda x: (x.rec_type, x.record_id, x.url, x.date, x.content_type, x.http_status, x.payload)  # noqa: E731
    assert [strip(x) for x in plain] == [strip(x) for x in gz]
    # Origins of a plain WARC are record offsets in it.
    for x in plain:
        offset = int(x.origin.rpartition(":")[2])
        assert plain_bytes[offset:offset + 9] == b"WARC/1.0\r"


def test_a_wet_conversion_record_has_its_text_as_payload(shared_data):
    items = list(read_warc(shared_data / "crawl/whirlwind_CC-MAIN-2024-22.warc.wet.gz", max_payload_bytes=1 << 20))
    [conv] = [x for x in items if x.rec_type == "conversion"]
    assert conv.content_type == "text/plain" and conv.http_status is None
    text = conv.payload.decode("utf-8")
    assert len(text.split()) > 50 and conv.url.startswith("http")


# --- records and payloads ---------------------------------------------------------------------------------------


def test_records_without_a_document_keep_headers_only(tmp_path):
    data, _ = members(record("request", b"GET / HTTP/1.1\r\nHost: e.com\r\n\r\n", rid="<urn:uuid:r>",
                             content_type="application/http; msgtype=request"),
                      record("metadata", b"fetchTimeMs: 12\r\n", rid="<urn:uuid:m>",
                             content_type="application/warc-fields"))
    req, meta = read(tmp_path / "a.warc.gz", data)
    assert (req.rec_type, req.payload, req.http_status, req.content_type) == (
        "request", None, None, "application/http; msgtype=request")
    assert (meta.rec_type, meta.payload, meta.content_type) == ("metadata", None, "application/warc-fields")


def test_a_resource_record_without_a_content_type_still_gives_its_payload(tmp_path):
    [entry] = read(tmp_path / "a.warc.gz", members(record("resource", b"plain words", content_type=None))[0])
    assert (entry.payload, entry.content_type, entry.http_status) == (b"plain words", None, None)


def test_a_response_with_a_non_http_target_uri_gets_its_http_headers_parsed(tmp_path):
    data, _ = members(record("response", HTML, uri="dns:example.com"), record("response", HTML, uri="urn:x:y"))
    for entry in read(tmp_path / "a.warc.gz", data):
        assert (entry.http_status, entry.content_type) == ("200", "text/html; charset=utf-8")
        assert entry.payload == b"<p>hello</p>"


def test_a_response_whose_http_message_is_empty_is_bad_http_headers(tmp_path):
    data, offsets = members(record("response", b"", uri="urn:x:y", rid="<urn:uuid:empty>"), page(2))
    bad, good = read(tmp_path / "a.warc.gz", data)
    assert isinstance(bad, WarcDamage) and bad.reason == "bad_http_headers"
    assert bad.record_id == "<urn:uuid:empty>" and bad.origin == f"a.warc.gz:{offsets[0]}"
    assert good.payload == b"<p>page 2</p>"


def test_chunked_and_gzip_encoded_payloads_are_decoded(tmp_path):
    zipped = gzip.compress(b"zipped text", mtime=0)
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    both = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n"
            + b"%x\r\n" % len(zipped) + zipped + b"\r\n0\r\n\r\n")
    data, _ = members(record("response", chunked), record("response", both))
    assert [x.payload for x in read(tmp_path / "a.warc.gz", data)] == [b"hello world", b"zipped text"]


def test_a_payload_over_the_cap_is_flagged_not_kept(tmp_path):
    body = b"x" * 100
    data, _ = members(record("response", b"HTTP/1.1 200 OK\r\n\r\n" + body))
    [at_cap] = read(tmp_path / "a.warc.gz", data, max_payload_bytes=100)
    assert at_cap.payload == body and not at_cap.oversized
    [over] = read(tmp_path / "a.warc.gz", data, max_payload_bytes=99)
    assert over.payload is None and over.oversized and over.http_status == "200"


def test_a_response_without_a_target_uri_is_reported_and_reading_goes_on(tmp_path):
    # warcio raised AttributeError on it (load_http_headers calls uri.startswith), which ended the file.
    data, offsets = members(page(1), record("response", HTML, uri=None, rid="<urn:uuid:no-uri>"), page(3))
    items = read(tmp_path / "a.warc.gz", data)
    assert ids(items)[0] == "<urn:uuid:1>" and ids(items)[-1] == "<urn:uuid:3>" and len(items) == 3
    assert isinstance(items[1], WarcDamage) or items[1].record_id == "<urn:uuid:no-uri>"
    assert ids(items) == ["<urn:uuid:1>", "damage:bad_warc_record", "<urn:uuid:3>"]
    assert items[1].record_id == "<urn:uuid:no-uri>" and items[1].origin == f"a.warc.gz:{offsets[1]}"
    assert "WARC-Target-URI" in items[1].detail
    assert items[2].payload == b"<p>page 3</p>"


def test_http_records_without_a_target_uri_in_one_member_or_a_plain_warc_do_not_stop_it(tmp_path):
    no_uri = [record(t, HTML, uri=None, rid=f"<urn:uuid:{t}>") for t in ("request", "revisit", "response")]
    expected = ["<urn:uuid:1>", *["damage:bad_warc_record"] * 3, "<urn:uuid:3>"]
    one_member = read(tmp_path / "a.warc.gz", gzip.compress(page(1) + b"".join(no_uri) + page(3), mtime=0))
    assert ids(one_member) == expected
    assert [x.record_id for x in one_member[1:4]] == ["<urn:uuid:request>", "<urn:uuid:revisit>",
                                                       "<urn:uuid:response>"]
    plain = read(tmp_path / "a.warc", page(1) + b"".join(no_uri) + page(3))
    assert ids(plain) == expected and plain[-1].payload == b"<p>page 3</p>"
    # A record type without an HTTP message is still read without a target URI.
    [resource] = read(tmp_path / "b.warc.gz", members(record("resource", b"words", uri=None, content_type=None))[0])
    assert (resource.url, resource.payload) == (None, b"words")


def test_a_gzip_content_encoding_corrupt_midway_is_reported_not_truncated(tmp_path, capfd):
    # warcio's decoder swallowed a zlib error after its first block (written to stderr, the rest dropped).
    text = random.Random(0).randbytes(100_000).hex().encode()  # 200 kB that gzip cannot shrink much
    body = gzip.compress(text, mtime=0)
    cut = 3 * len(body) // 4  # past warcio's first read block
    corrupt = body[:cut] + bytes(b ^ 0xFF for b in body[cut:cut + 200]) + body[cut + 200:]
    data, _ = members(record("response", b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n" + corrupt,
                             rid="<urn:uuid:bad>"), page(2))
    item, after = read(tmp_path / "a.warc.gz", data)
    assert isinstance(item, WarcDamage) and item.reason == "bad_content_encoding", (
        f"got a WarcEntry with {len(item.payload)} of {len(text)} payload bytes")
    assert item.record_id == "<urn:uuid:bad>" and item.origin == "a.warc.gz:0" and "gzip" in item.detail
    assert after.payload == b"<p>page 2</p>"
    assert capfd.readouterr().err == ""  # reported, not printed
    # The same body sent chunked goes through warcio's chunked decoder: checked the same way.
    chunked = b"".join(b"%x\r\n" % len(part) + part + b"\r\n" for part in (corrupt[:50_000], corrupt[50_000:]))
    data, _ = members(record("response", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                             b"Content-Encoding: gzip\r\n\r\n" + chunked + b"0\r\n\r\n"))
    [item] = read(tmp_path / "a.warc.gz", data)
    assert isinstance(item, WarcDamage) and item.reason == "bad_content_encoding"


def test_a_gzip_content_encoding_corrupt_in_its_first_block_is_reported(tmp_path):
    # warcio takes a body that fails to decode at once for one sent without the encoding: not one with a gzip header.
    body = gzip.compress(b"some words " * 1000, mtime=0)
    corrupt = body[:20] + bytes(b ^ 0xFF for b in body[20:60]) + body[60:]
    data, _ = members(record("response", b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n" + corrupt))
    [item] = read(tmp_path / "a.warc.gz", data)
    assert isinstance(item, WarcDamage) and item.reason == "bad_content_encoding"


def test_a_content_encoding_the_body_does_not_have_is_ignored_as_warcio_does(tmp_path):
    # Servers do send "Content-Encoding: gzip" (or deflate) with a plain body: warcio passes it through, so here too.
    data, _ = members(*(record("response", f"HTTP/1.1 200 OK\r\nContent-Encoding: {enc}\r\n\r\n".encode()
                               + b"<p>plain</p>") for enc in ("gzip", "deflate")))
    assert [x.payload for x in read(tmp_path / "a.warc.gz", data)] == [b"<p>plain</p>"] * 2
    deflated = zlib.compress(b"deflated text")
    raw_deflate = deflated[2:-4]  # the headerless deflate stream some servers send for "deflate"
    data, _ = members(*(record("response", b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\n\r\n" + body)
                        for body in (deflated, raw_deflate)))
    assert [x.payload for x in read(tmp_path / "a.warc.gz", data)] == [b"deflated text"] * 2


# --- gzip framing and damage ------------------------------------------------------------------------------------


def test_several_records_in_one_member_are_numbered_in_their_origin(tmp_path):
    data = gzip.compress(page(1) + page(2) + page(3), mtime=0) + gzip.compress(page(4), mtime=0)
    second = len(gzip.compress(page(1) + page(2) + page(3), mtime=0))
    items = read(tmp_path / "a.warc.gz", data)
    assert [x.origin for x in items] == ["a.warc.gz:0", "a.warc.gz:0#1", "a.warc.gz:0#2", f"a.warc.gz:{second}"]
    assert [x.payload for x in items] == [b"<p>page %d</p>" % i for i in (1, 2, 3, 4)]


def test_a_file_cut_inside_its_last_member_reports_it_truncated(tmp_path):
    data, offsets = members(page(1), page(2), page(3))
    items = read(tmp_path / "a.warc.gz", data[:offsets[2] + 40])
    assert ids(items) == ["<urn:uuid:1>", "<urn:uuid:2>", "damage:truncated"]
    assert items[-1].origin == f"a.warc.gz:{offsets[2]}"


def test_a_corrupt_member_is_one_damage_and_reading_goes_on(tmp_path):
    data, offsets = members(page(1), page(2), page(3))
    mid = (offsets[1] + offsets[2]) // 2  # inside member 2's deflate data
    broken = data[:mid] + bytes(b ^ 0xFF for b in data[mid:mid + 4]) + data[mid + 4:]
    items = read(tmp_path / "a.warc.gz", broken)
    assert ids(items) == ["<urn:uuid:1>", "damage:bad_gzip_member", "<urn:uuid:3>"]
    assert items[1].origin == f"a.warc.gz:{offsets[1]}" and items[1].detail.startswith("zlib")


def test_a_member_whose_crc_fails_leaks_none_of_its_records(tmp_path):
    whole = gzip.compress(page(1) + page(2), mtime=0)
    bad_crc = whole[:-8] + bytes([whole[-8] ^ 0xFF]) + whole[-7:]  # the trailer: CRC32, then length
    data = bad_crc + gzip.compress(page(3), mtime=0)
    items = read(tmp_path / "a.warc.gz", data)
    assert ids(items) == ["damage:bad_gzip_member", "<urn:uuid:3>"]
    assert items[0].origin == "a.warc.gz:0"


def test_a_huge_member_streams_its_records_before_its_end_is_checked(tmp_path, monkeypatch):
    rng = random.Random(1)
    big = [record("resource", rng.randbytes(60_000).hex().encode(), rid=f"<urn:uuid:{i}>", content_type="text/plain")
           for i in (1, 2, 3)]  # each ~70 kB compressed: more than one read of the file
    whole = gzip.compress(b"".join(big), mtime=0)
    truncated = whole[:-4]
    assert ids(read(tmp_path / "a.warc.gz", truncated)) == ["damage:truncated"]  # held back, then dropped
    monkeypatch.setattr(warc_module, "HOLD_MAX_RECORDS", 1)  # past this many held records a member streams
    items = read(tmp_path / "a.warc.gz", truncated)
    assert ids(items)[-1] == "damage:truncated" and ids(items)[:2] == ["<urn:uuid:1>", "<urn:uuid:2>"]


def test_garbage_between_members_is_one_damage(tmp_path):
    data, offsets = members(page(1), page(2))
    junk = b"not gzip " * 50 + b"\x1f\x8b\x08 false header" + b" more junk" * 20
    items = read(tmp_path / "a.warc.gz", data[:offsets[1]] + junk + data[offsets[1]:])
    assert ids(items) == ["<urn:uuid:1>", "damage:bad_gzip_member", "<urn:uuid:2>"]
    assert items[1].origin == f"a.warc.gz:{offsets[1]}" and str(offsets[1]) in items[1].detail
    assert items[2].origin == f"a.warc.gz:{offsets[1] + len(junk)}"


def test_nul_padding_at_the_end_is_no_damage(tmp_path):
    data, _ = members(page(1), page(2))
    assert ids(read(tmp_path / "a.warc.gz", data + b"\x00" * 5000)) == ["<urn:uuid:1>", "<urn:uuid:2>"]


@pytest.mark.parametrize("junk", [b"garbage\r\n\r\n", b"\x00\x01\x02 binary"])
def test_a_sound_member_that_holds_no_warc_record_is_bad_warc_record(tmp_path, junk):
    data, offsets = members(page(1), junk, page(3))
    items = read(tmp_path / "a.warc.gz", data)
    assert ids(items) == ["<urn:uuid:1>", "damage:bad_warc_record", "<urn:uuid:3>"]
    assert items[1].origin == f"a.warc.gz:{offsets[1]}"


def test_a_member_holding_a_line_of_text_is_not_taken_for_a_record(tmp_path):
    # Each member gets a fresh warcio iterator, which used to sniff WARC or ARC again: a line of several words
    # came out as an ARC "response" with no record id. Only WARC is read.
    data, offsets = members(page(1), b"this is gzip but not a WARC record\r\n\r\n", page(3))
    items = read(tmp_path / "a.warc.gz", data)
    assert ids(items) == ["<urn:uuid:1>", "damage:bad_warc_record", "<urn:uuid:3>"]
    assert items[1].origin == f"a.warc.gz:{offsets[1]}" and "this is gzip" in items[1].detail
    # A real ARC header line (its filedesc:// record) is no WARC either, in a member or at a plain file's start.
    arc = b"filedesc://x.arc 0.0.0.0 20240101000000 text/plain 5\nhello\n"
    assert ids(read(tmp_path / "b.warc.gz", members(arc, page(3))[0])) == ["damage:bad_warc_record", "<urn:uuid:3>"]
    assert ids(read(tmp_path / "c.warc", arc + page(3))) == ["damage:bad_warc_record"]


def test_gzip_or_plain_is_told_by_the_bytes_not_the_name(tmp_path):
    data, _ = members(page(1))
    [a] = read(tmp_path / "named-plain.warc", data)
    [b] = read(tmp_path / "named-gzip.warc.gz", page(1))
    assert a.payload == b.payload == b"<p>page 1</p>"


def test_an_empty_file_has_no_records(tmp_path):
    assert read(tmp_path / "a.warc.gz", b"") == []


# --- plain WARC -------------------------------------------------------------------------------------------------


def test_a_plain_warc_cut_inside_a_record_reports_that_record_truncated(tmp_path):
    data = page(1) + page(2)
    items = read(tmp_path / "a.warc", data[:len(page(1)) + len(page(2)) - 15])
    assert ids(items) == ["<urn:uuid:1>", "damage:truncated"]
    assert items[1].record_id == "<urn:uuid:2>" and items[1].origin == f"a.warc:{len(page(1))}"


def test_a_malformed_record_in_a_plain_warc_ends_it_with_a_damage(tmp_path):
    items = read(tmp_path / "a.warc", page(1) + b"GARBAGE that is no WARC header\r\n\r\n" + page(3))
    assert ids(items) == ["<urn:uuid:1>", "damage:bad_warc_record"]
    assert items[1].detail.endswith("the rest of the file is unread")


def test_an_open_file_reads_like_its_path_under_the_name_given(tmp_path):
    # Remote inputs come as seekable file objects (fsspec); damage and resynchronization work the same on them.
    data, offsets = members(page(0), page(1), page(2))
    damaged = data[: offsets[1] + 30] + data[offsets[2]:]  # member 1 cut short, member 2 follows
    from_path = read(tmp_path / "a.warc.gz", damaged)
    with open(tmp_path / "a.warc.gz", "rb") as f:
        from_file = list(read_warc(f, max_payload_bytes=1 << 20, name="a.warc.gz"))
    assert from_file == from_path
    assert [type(x).__name__ for x in from_file] == ["WarcEntry", "WarcDamage", "WarcEntry"]
    assert all(x.origin.startswith("a.warc.gz:") for x in from_file)
