"""Input readers: one source's files -> InputRecords, one per input record, in input order.

    for record in read_inputs("web", expand_inputs(["crawl/*.warc.gz"], data_dir), "warc", ReaderConfig(),
                              count_bytes=lambda n: None):
        ...  # record.kind: "html" | "plain" | "text" (may become a document) | "skip" | "bad" (never will)

Inputs are local paths or fsspec URLs (`s3://bucket/crawl/*.warc.gz`; S3 endpoint and credentials from the
AWS_* variables, as boto3 reads them). A remote file is streamed through fsspec's read-ahead buffer, never
copied whole to local disk; it reads to the same records, origins included, as the same file on disk.
Formats: "warc" / "wet" (see pipelines/ingest/warc.py: gzip members handled there so damage loses one record, not the
rest of the file), "jsonl" (also .json; gzip or not), "parquet", "text" (plain files, local folders, tar archives).
Readers never decode or extract HTML (that is pipelines/ingest/extraction.py, run by pipelines/ingest/step.py): a record
carries the bytes, the metadata its document would get, or why it is skipped or bad.
"""

from __future__ import annotations

import fnmatch
import tarfile
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import orjson

from pipelines.ingest.config import ReaderConfig
from pipelines.inputs import Input, as_input, input_info, input_name, open_input
from pipelines.ingest.extraction import HTML_TYPES, PLAIN_TYPES, looks_like_markup, parse_content_type
from pipelines.ingest.warc import GZIP_MAGIC, PAYLOAD_TYPES, WarcDamage, WarcEntry, read_warc

FORMATS = ("warc", "wet", "jsonl", "parquet", "text")

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
# URIs of a crawler's own bookkeeping (wget's metadata://, heritrix's dns:), never web documents.
NON_DOCUMENT_SCHEMES = ("dns:", "whois:", "ntp:", "metadata:")
# Input fields that would clash with the metadata this stage sets are kept under "original_<name>".
RESERVED_METADATA = ("source", "url", "origin")


class InputRecord(NamedTuple):
    """One input record, read; what it becomes is decided by pipelines/ingest/step.py (in a worker process for HTML)."""

    kind: str  # "html" | "plain" (bytes to decode) | "text" (a str already) | "skip" | "bad"
    origin: str
    id: str | None = None
    meta: dict | None = None  # the document's metadata, should it become one
    body: bytes | str | None = None
    charset: str | None = None  # declared by the HTTP header
    reason: str = ""  # for "skip" / "bad"
    detail: str = ""


def skipped_record(reason: str, origin: str = "") -> InputRecord:
    return InputRecord("skip", origin, reason=reason)


def bad_record(reason: str, origin: str, detail: str, id: str | None = None) -> InputRecord:
    return InputRecord("bad", origin, id=id, reason=reason, detail=detail)


def shorten(text: str, limit: int = 200) -> str:
    """A detail for rejected.jsonl.gz: at most `limit` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------------------------
# Which files


def read_inputs(
    name: str, inputs: list, format: str, reader: ReaderConfig, *, count_bytes: Callable[[int], Any]
) -> Iterator[InputRecord]:
    """Every record of every input, in order. `count_bytes(n)` is called as input files are opened, with their
    size as stored (files a text source excludes are not counted)."""
    for location in map(as_input, inputs):
        if isinstance(location, Path):
            if not location.exists():
                raise ValueError(f"source {name!r}: input {location} does not exist")
            if location.is_dir() and format != "text":
                raise ValueError(f"source {name!r}: input {location} is a folder; only the text format reads folders")
        if format == "text":
            yield from _text_records(name, location, reader, count_bytes)
            continue
        try:
            size = input_info(location)["size"]
        except FileNotFoundError:
            raise ValueError(f"source {name!r}: input {location} does not exist") from None
        count_bytes(size)
        if format in ("warc", "wet"):
            yield from _warc_records(name, location, reader)
        elif format == "jsonl":
            yield from _jsonl_records(name, location, reader)
        else:
            yield from _parquet_records(name, location, reader)


# ---------------------------------------------------------------------------------------------------------------
# WARC / WET


def _warc_records(name: str, location: Input, reader: ReaderConfig) -> Iterator[InputRecord]:
    with open_input(location) as raw:
        for item in read_warc(raw, max_payload_bytes=reader.max_document_bytes, name=input_name(location)):
            if isinstance(item, WarcDamage):
                yield bad_record(item.reason, item.origin, item.detail, item.record_id)
            else:
                yield _warc_record(name, item)


def _warc_record(name: str, entry: WarcEntry) -> InputRecord:
    """What a WARC record is: not a document by its type, bad, or a payload to decode (and extract)."""
    if entry.rec_type not in PAYLOAD_TYPES:
        # request, metadata, revisit (no payload of its own), warcinfo, continuation, ...
        return skipped_record("warcinfo" if entry.rec_type == "warcinfo" else f"warc_{entry.rec_type}", entry.origin)
    if (entry.url or "").lower().startswith(NON_DOCUMENT_SCHEMES):
        return skipped_record(f"uri_scheme_{entry.url.split(':', 1)[0].lower()}", entry.origin)
    if entry.http_status is not None and not entry.http_status.startswith("2"):
        # Redirects and error pages hold no content of the URL.
        return skipped_record(f"http_status_{entry.http_status[:1]}xx", entry.origin)
    if entry.oversized:
        return bad_record("oversized", entry.origin, "payload larger than max_document_bytes", entry.record_id)
    mime, charset = parse_content_type(entry.content_type)
    payload = entry.payload or b""
    if entry.rec_type == "conversion":  # WET: text extracted by the crawler
        kind = "plain"
    elif mime in HTML_TYPES:
        kind = "html"
    elif mime in PLAIN_TYPES:
        kind = "plain"
    elif not mime and looks_like_markup(payload):
        kind = "html"
    else:
        detail = f"Content-Type {entry.content_type!r}" if mime else "no Content-Type and not markup"
        return bad_record("unsupported_content_type", entry.origin, detail, entry.record_id)
    meta = {"source": name}
    if entry.url:
        meta["url"] = entry.url
    meta["origin"] = entry.origin
    if entry.date:
        meta["date"] = entry.date
    meta["content_type"] = mime or ("text/plain" if kind == "plain" else "text/html")
    doc_id = entry.record_id or f"{name}/{entry.origin}"
    return InputRecord(kind, entry.origin, id=doc_id, meta=meta, body=payload, charset=charset)


# ---------------------------------------------------------------------------------------------------------------
# JSONL / Parquet


def _jsonl_records(name: str, location: Input, reader: ReaderConfig) -> Iterator[InputRecord]:
    lineno = 0
    file_name = input_name(location)
    try:
        for lineno, line in enumerate(_lines(location), 1):
            origin = f"{file_name}:{lineno}"
            if not line.strip():
                continue  # a blank line holds no record
            if lineno == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 BOM some editors write
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield bad_record("undecodable", origin, f"not UTF-8: {exc.reason} at byte {exc.start}")
                continue
            try:
                row = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                yield bad_record("bad_json", origin, shorten(str(exc)))
                continue
            yield _row_record(name, row, origin, reader)
    except _StreamDamage as exc:
        yield bad_record(exc.reason, f"{file_name}:{lineno + 1}", f"{exc.detail}; records after line {lineno} are lost")


def _parquet_records(name: str, location: Input, reader: ReaderConfig) -> Iterator[InputRecord]:
    import pyarrow.parquet as pq

    row_index = 0
    file_name = input_name(location)
    try:
        with open_input(location) as raw, pq.ParquetFile(raw) as parquet:
            for batch in parquet.iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    yield _row_record(name, row, f"{file_name}:{row_index}", reader)
                    row_index += 1
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid / ArrowIOError derive from these
        detail = f"{shorten(str(exc))}; rows from {row_index} on are lost"
        yield bad_record("bad_parquet", f"{file_name}:{row_index}", detail)


def _row_record(name: str, row: Any, origin: str, reader: ReaderConfig) -> InputRecord:
    """A JSON object / Parquet row -> its text, id and metadata (its other fields, merged with its "metadata")."""
    if not isinstance(row, dict):
        return bad_record("bad_json", origin, f"a {type(row).__name__}, not an object")
    parts = []
    for key in reader.text_fields:
        value = row.get(key)
        if not isinstance(value, str):
            return bad_record("missing_text", origin, f"no string field {key!r}")
        parts.append(value)
    doc_id = row.get(reader.id_field)
    if doc_id is None or doc_id == "":
        doc_id = f"{name}/{origin}"  # where it came from: unique within the source, and stable
    elif not isinstance(doc_id, str):
        doc_id = str(doc_id)
    nested = row.get("metadata")
    nested = nested if isinstance(nested, dict) else ({} if nested is None else {"metadata": nested})
    url = row.get(reader.url_field) or nested.get(reader.url_field)
    meta: dict[str, Any] = {"source": name}
    if url:
        meta["url"] = url
    meta["origin"] = origin
    used = {*reader.text_fields, reader.id_field, "metadata"}
    for key, value in [*nested.items(), *((k, v) for k, v in row.items() if k not in used)]:
        if key == reader.url_field and value == url:
            continue
        meta[f"original_{key}" if key in RESERVED_METADATA else key] = value
    return InputRecord("text", origin, id=doc_id, meta=meta, body="\n\n".join(parts))


class _StreamDamage(Exception):
    """A file's bytes end or break inside its gzip stream; what was read before stands."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def _lines(path: Input) -> Iterator[bytes]:
    """The lines of a file, gunzipped if it is gzip (by its bytes). Damage raises _StreamDamage at that point."""
    pending: list[bytes] = []  # the pieces of a line that spans chunks
    for chunk in _file_chunks(path):
        lines = chunk.split(b"\n")
        if len(lines) > 1:
            yield b"".join([*pending, lines[0]])
            yield from lines[1:-1]
            pending = []
        pending.append(lines[-1])
    if tail := b"".join(pending):
        yield tail


def _file_chunks(path: Input, size: int = 1 << 20) -> Iterator[bytes]:
    """A file's bytes in chunks, gunzipped if it is gzip (by its magic, not its name); concatenated gzip members
    are one stream. Damage raises _StreamDamage where it is met."""
    with open_input(path) as f:
        if f.read(2) != GZIP_MAGIC[:2]:
            f.seek(0)
            while chunk := f.read(size):
                yield chunk
            return
        f.seek(0)
        decompressor = zlib.decompressobj(wbits=31)
        while True:
            data = f.read(size)
            if not data:
                if not decompressor.eof:
                    raise _StreamDamage("truncated", "the file ends inside its gzip stream")
                return
            while data:
                try:
                    yield decompressor.decompress(data)
                except zlib.error as exc:
                    raise _StreamDamage("bad_gzip_member", f"zlib: {exc}") from None
                data = b""
                if decompressor.eof:  # concatenated gzip members are one stream (gzip -c a b > ab)
                    data = decompressor.unused_data
                    if data.strip(b"\x00"):
                        decompressor = zlib.decompressobj(wbits=31)
                    else:
                        data = b""


# ---------------------------------------------------------------------------------------------------------------
# Text: plain files, folders, tar archives


def _text_records(
    name: str, path: Input, reader: ReaderConfig, count_bytes: Callable[[int], Any]
) -> Iterator[InputRecord]:
    if not isinstance(path, Path):  # a remote file (expand_inputs gives files only: folders are globbed)
        file_name = input_name(path)
        if file_name.lower().endswith(TAR_SUFFIXES):
            count_bytes(input_info(path)["size"])
            yield from _tar_records(name, path, reader)
        elif not _included(file_name, reader.include):
            yield skipped_record("excluded", file_name)
        else:
            count_bytes(input_info(path)["size"])
            yield _file_record(name, path, file_name, reader)
    elif path.is_dir():
        for file in sorted(p for p in path.rglob("*") if not p.is_dir()):
            member = file.relative_to(path).as_posix()
            origin = f"{path.name}::{member}"
            if not file.is_file():
                yield skipped_record("not_a_file", origin)
            elif not _included(member, reader.include):
                yield skipped_record("excluded", origin)
            else:
                count_bytes(file.stat().st_size)
                yield _file_record(name, file, origin, reader)
    elif path.name.lower().endswith(TAR_SUFFIXES):
        count_bytes(path.stat().st_size)
        yield from _tar_records(name, path, reader)
    elif not _included(path.name, reader.include):
        yield skipped_record("excluded", path.name)
    else:
        count_bytes(path.stat().st_size)
        yield _file_record(name, path, path.name, reader)


def _included(member: str, patterns: tuple[str, ...]) -> bool:
    base = member.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(member, p) or fnmatch.fnmatchcase(base, p) for p in patterns)


def _file_record(name: str, path: Input, origin: str, reader: ReaderConfig) -> InputRecord:
    """One file, one document (gunzipped if it is gzip)."""
    limit = reader.max_document_bytes
    chunks, size = [], 0
    try:
        for chunk in _file_chunks(path):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return bad_record("oversized", origin, f"larger than max_document_bytes ({limit})")
    except _StreamDamage as exc:
        return bad_record(exc.reason, origin, exc.detail)
    return _plain_record(name, origin, b"".join(chunks))


def _plain_record(name: str, origin: str, data: bytes) -> InputRecord:
    return InputRecord("plain", origin, id=f"{name}/{origin}", meta={"source": name, "origin": origin}, body=data)


def _tar_records(name: str, path: Input, reader: ReaderConfig) -> Iterator[InputRecord]:
    """Members in archive order, streamed (the archive is never read whole)."""
    member_name = ""
    file_name = input_name(path)
    try:
        with open_input(path) as raw, tarfile.open(fileobj=raw, mode="r|*") as archive:
            for member in archive:
                member_name = member.name
                origin = f"{file_name}::{member.name}"
                if not member.isfile():
                    yield skipped_record("not_a_file", origin)
                elif not _included(member.name, reader.include):
                    yield skipped_record("excluded", origin)
                elif member.size > reader.max_document_bytes:
                    yield bad_record("oversized", origin, f"{member.size} bytes > max_document_bytes")
                else:
                    yield _plain_record(name, origin, archive.extractfile(member).read())
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        reason = "truncated" if isinstance(exc, EOFError) or "unexpected end" in str(exc) else "bad_archive"
        detail = f"{shorten(str(exc))}; nothing past this point could be read"
        yield bad_record(reason, f"{file_name}::{member_name}", detail)
