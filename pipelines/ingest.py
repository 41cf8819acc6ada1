"""Raw ingest: one source's input files -> normalized documents in datatrove's format, every record accounted for.

    stats = ingest_source(name="web", inputs=expand_inputs(["crawl/*.warc.gz"], data_dir), format="warc",
                          reader=ReaderConfig(workers=2), out_dir=Path("out/web"))

writes out/web/part-00000.jsonl.gz, ... (gzip JSON lines: {"text", "id", "metadata": {"source", "url" or
"origin", ...}}) and out/web/rejected.jsonl.gz (one {"reason", "origin", "detail"} line per bad record). Every
input record is a document, skipped (not a document by nature: a WARC request record, an empty file) or bad
(corrupt or failed, by reason): `stats.records == stats.documents + sum(stats.skipped) + sum(stats.bad)`.
When the bad fraction exceeds `reader.max_bad_fraction`, BadInputError is raised after writing.

Formats: "warc" / "wet" (see pipelines/warc.py: gzip members handled here so damage loses one record, not the
rest of the file), "jsonl" (also .json; gzip or not), "parquet", "text" (plain files, folders, tar archives).

HTML -> text (trafilatura) is the slow part, 20-30 ms a page, so it runs in `reader.workers` processes over
ordered chunks with a bounded number in flight: the output is byte-identical for any worker count.
"""

from __future__ import annotations

import fnmatch
import gzip
import multiprocessing
import os
import re
import signal
import tarfile
import threading
import zlib
from collections import deque
from contextlib import closing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple
from urllib.parse import unquote, urlparse

import orjson

from pipelines.warc import GZIP_MAGIC, PAYLOAD_TYPES, WarcDamage, WarcEntry, read_warc

FORMATS = ("warc", "wet", "jsonl", "parquet", "text")

PROGRESS_EVERY = 1000  # records between progress reports
CHUNK_RECORDS = 16  # records a worker process handles per task (a chunk of HTML pages is ~0.3 s of work)
CHUNK_BYTES = 8 << 20  # ... or fewer, when their payloads are large
IN_FLIGHT_PER_WORKER = 3  # chunks submitted ahead per worker: keeps them busy, bounds memory
EXTRACT_TIMEOUT_S = 30  # a pathological page must not hang the stage; generous, so it never depends on load
SHARD_COMPRESSLEVEL = 3  # ~2x faster than 6 for ~10% larger shards: they are intermediate data

HTML_TYPES = ("text/html", "application/xhtml+xml")
PLAIN_TYPES = ("text/plain",)
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
# URIs of a crawler's own bookkeeping (wget's metadata://, heritrix's dns:), never web documents.
NON_DOCUMENT_SCHEMES = ("dns:", "whois:", "ntp:", "metadata:")
# Input fields that would clash with the metadata this stage sets are kept under "original_<name>".
RESERVED_METADATA = ("source", "url", "origin")


@dataclass(frozen=True, kw_only=True)
class ReaderConfig:
    """How one source's files are read. A recipe's `sources[].reader` section (pydantic mirrors these fields)."""

    text_fields: tuple[str, ...] = ("text",)  # jsonl/parquet: fields joined by "\n\n" make the text; all required
    id_field: str = "id"  # jsonl/parquet: an id given here is kept as is (a non-string one as its str())
    url_field: str = "url"  # jsonl/parquet: looked up at the top level, then inside "metadata"
    include: tuple[str, ...] = ("*",)  # text: fnmatch patterns on member/file paths or names ("*.py")
    extract_html: bool = True  # warc: HTML -> main text with trafilatura (else the decoded HTML is the text)
    min_text_chars: int = 1  # texts shorter than this (blank edges aside) are skipped as "empty"; 0 keeps them
    max_document_bytes: int = 8 * 2**20  # larger payloads/texts are bad as "oversized"
    max_bad_fraction: float = 0.1  # ingest fails (BadInputError) when bad / (documents + bad) exceeds this
    workers: int = 2  # processes for HTML extraction (1 = in-process); never changes the output
    docs_per_shard: int = 10_000

    def __post_init__(self):
        for name in ("text_fields", "include"):
            value = getattr(self, name)
            value = (value,) if isinstance(value, str) else tuple(value)
            if not value or not all(isinstance(v, str) and v for v in value):
                raise ValueError(f"{name} must be a non-empty list of non-empty strings, got {value!r}")
            object.__setattr__(self, name, value)
        if self.min_text_chars < 0:
            raise ValueError(f"min_text_chars must be >= 0, got {self.min_text_chars}")
        if self.max_document_bytes < 1:
            raise ValueError(f"max_document_bytes must be >= 1, got {self.max_document_bytes}")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"max_bad_fraction must be within [0, 1], got {self.max_bad_fraction}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.docs_per_shard < 1:
            raise ValueError(f"docs_per_shard must be >= 1, got {self.docs_per_shard}")


@dataclass
class IngestStats:
    records: int = 0  # every record seen in the input (WARC: every record of every type)
    documents: int = 0  # written
    skipped: dict[str, int] = field(default_factory=dict)  # not documents by nature, by kind
    bad: dict[str, int] = field(default_factory=dict)  # corrupt or failed, by reason (listed in rejected.jsonl.gz)
    bytes_in: int = 0  # bytes of the input files (compressed, as stored)
    files: list[dict] = field(default_factory=list)  # per shard: {"path": "part-00000.jsonl.gz", "records": n}

    def bad_fraction(self) -> float:
        bad = sum(self.bad.values())
        return bad / (self.documents + bad) if bad else 0.0

    def summary(self) -> str:
        return (
            f"{self.records} records: {self.documents} documents, skipped {_counts(self.skipped)}, "
            f"bad {_counts(self.bad)}; {self.bytes_in / 1e6:.1f} MB read"
        )


class BadInputError(ValueError):
    """Too many bad records in a source. The output was written; `.stats` has the counts."""

    def __init__(self, message: str, stats: IngestStats):
        super().__init__(message)
        self.stats = stats


# ---------------------------------------------------------------------------------------------------------------
# Inputs


def expand_inputs(inputs: list[str], base_dir) -> list[Path]:
    """Paths, globs (relative to base_dir; ** recurses) or file:// URIs -> sorted existing paths, no repeats."""
    base = Path(base_dir)
    found: set[Path] = set()
    for spec in inputs:
        text = str(spec)
        if text.startswith("file://"):
            uri = urlparse(text)
            if uri.netloc not in ("", "localhost"):
                raise ValueError(f"input {spec!r}: a file:// URI must name an absolute local path (file:///...)")
            text = unquote(uri.path)
        elif re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]+://", text):
            raise ValueError(f"input {spec!r}: only local paths and file:// URIs are read here")
        pattern = str(base / Path(text).expanduser())
        if re.search(r"[*?[]", text):
            matches = [Path(p) for p in glob(pattern, recursive=True)]
            if not matches:
                raise ValueError(f"input pattern {spec!r} matches nothing (looked in {base})")
            found.update(Path(os.path.abspath(p)) for p in matches)
        elif os.path.exists(pattern):
            found.add(Path(os.path.abspath(pattern)))
        else:
            raise ValueError(f"input {spec!r} does not exist (looked for {pattern})")
    return sorted(found)


# ---------------------------------------------------------------------------------------------------------------
# Records on their way to a verdict


class _Work(NamedTuple):
    """One input record, read; what it becomes is decided by _decide (in a worker process for HTML)."""

    kind: str  # "html" | "plain" (bytes to decode) | "text" (a str already) | "skip" | "bad"
    origin: str
    id: str | None = None
    meta: dict | None = None  # the document's metadata, should it become one
    body: bytes | str | None = None
    charset: str | None = None  # declared by the HTTP header
    reason: str = ""  # for "skip" / "bad"
    detail: str = ""


class _Verdict(NamedTuple):
    kind: str  # "doc" | "skip" | "bad"
    reason: str = ""
    doc: dict | None = None
    origin: str = ""
    id: str | None = None
    detail: str = ""


def _skip(reason: str, origin: str = "") -> _Work:
    return _Work("skip", origin, reason=reason)


def _bad(reason: str, origin: str, detail: str, id: str | None = None) -> _Work:
    return _Work("bad", origin, id=id, reason=reason, detail=detail)


# ---------------------------------------------------------------------------------------------------------------
# The entry point


def ingest_source(
    *,
    name: str,
    inputs: list[Path],
    format: str,
    reader: ReaderConfig,
    out_dir: Path,
    progress: Callable[[str], Any] | None = None,
) -> IngestStats:
    """Read every input of one source into out_dir/part-NNNNN.jsonl.gz + rejected.jsonl.gz. See the module doc."""
    if format not in FORMATS:
        raise ValueError(f"source {name!r}: format {format!r} is not one of {FORMATS}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    leftovers = sorted(p.name for p in out_dir.glob("part-*.jsonl.gz")) + [
        p.name for p in out_dir.glob("rejected.jsonl.gz")
    ]
    if leftovers:
        raise ValueError(
            f"source {name!r}: {out_dir} already holds output ({', '.join(leftovers[:3])}); use an empty folder"
        )

    stats = IngestStats()
    works = _read_inputs(name, [Path(p) for p in inputs], format, reader, stats)
    parallel = format in ("warc", "wet") and reader.extract_html and reader.workers > 1
    verdicts = _decide_all(works, reader, workers=reader.workers if parallel else 1)
    with closing(verdicts), _Output(out_dir, reader.docs_per_shard) as output:  # closing: stops worker processes
        for verdict in verdicts:
            stats.records += 1
            if verdict.kind == "doc":
                output.document(verdict.doc)
                stats.documents += 1
            elif verdict.kind == "skip":
                stats.skipped[verdict.reason] = stats.skipped.get(verdict.reason, 0) + 1
            else:
                output.rejected(verdict)
                stats.bad[verdict.reason] = stats.bad.get(verdict.reason, 0) + 1
            if progress is not None and stats.records % PROGRESS_EVERY == 0:
                progress(f"{name}: {stats.summary()}")
    stats.files = output.files
    stats.skipped = dict(sorted(stats.skipped.items()))
    stats.bad = dict(sorted(stats.bad.items()))
    assert stats.records == stats.documents + sum(stats.skipped.values()) + sum(stats.bad.values())
    assert stats.documents == sum(f["records"] for f in stats.files)
    if progress is not None:
        progress(f"{name}: done, {stats.summary()}")
    if stats.bad_fraction() > reader.max_bad_fraction:
        raise BadInputError(
            f"source {name!r}: {stats.bad_fraction():.1%} of records are bad, above max_bad_fraction "
            f"{reader.max_bad_fraction:.1%} (bad by reason: {_counts(stats.bad)}; {stats.documents} documents, "
            f"{stats.records} records; see {out_dir / 'rejected.jsonl.gz'})",
            stats,
        )
    return stats


def iter_documents(path) -> Iterator[dict]:
    """The documents of one part-*.jsonl.gz, in order."""
    with gzip.open(path, "rb") as f:
        for line in f:
            if line.strip():
                yield orjson.loads(line)


def _read_inputs(
    name: str, inputs: list[Path], format: str, reader: ReaderConfig, stats: IngestStats
) -> Iterator[_Work]:
    for path in inputs:
        if not path.exists():
            raise ValueError(f"source {name!r}: input {path} does not exist")
        if path.is_dir() and format != "text":
            raise ValueError(f"source {name!r}: input {path} is a folder; only the text format reads folders")
        if format in ("warc", "wet"):
            stats.bytes_in += path.stat().st_size
            yield from _warc_works(name, path, reader)
        elif format == "jsonl":
            stats.bytes_in += path.stat().st_size
            yield from _jsonl_works(name, path, reader)
        elif format == "parquet":
            stats.bytes_in += path.stat().st_size
            yield from _parquet_works(name, path, reader)
        else:
            yield from _text_works(name, path, reader, stats)


# ---------------------------------------------------------------------------------------------------------------
# WARC / WET


def _warc_works(name: str, path: Path, reader: ReaderConfig) -> Iterator[_Work]:
    for item in read_warc(path, max_payload_bytes=reader.max_document_bytes):
        if isinstance(item, WarcDamage):
            yield _bad(item.reason, item.origin, item.detail, item.record_id)
        else:
            yield _warc_work(name, item)


def _warc_work(name: str, entry: WarcEntry) -> _Work:
    """What a WARC record is: not a document by its type, bad, or a payload to decode (and extract)."""
    if entry.rec_type not in PAYLOAD_TYPES:
        # request, metadata, revisit (no payload of its own), warcinfo, continuation, ...
        return _skip("warcinfo" if entry.rec_type == "warcinfo" else f"warc_{entry.rec_type}", entry.origin)
    if (entry.url or "").lower().startswith(NON_DOCUMENT_SCHEMES):
        return _skip(f"uri_scheme_{entry.url.split(':', 1)[0].lower()}", entry.origin)
    if entry.http_status is not None and not entry.http_status.startswith("2"):
        # Redirects and error pages hold no content of the URL.
        return _skip(f"http_status_{entry.http_status[:1]}xx", entry.origin)
    if entry.oversized:
        return _bad("oversized", entry.origin, "payload larger than max_document_bytes", entry.record_id)
    mime, charset = _parse_content_type(entry.content_type)
    payload = entry.payload or b""
    if entry.rec_type == "conversion":  # WET: text extracted by the crawler
        kind = "plain"
    elif mime in HTML_TYPES:
        kind = "html"
    elif mime in PLAIN_TYPES:
        kind = "plain"
    elif not mime and _looks_like_markup(payload):
        kind = "html"
    else:
        detail = f"Content-Type {entry.content_type!r}" if mime else "no Content-Type and not markup"
        return _bad("unsupported_content_type", entry.origin, detail, entry.record_id)
    meta = {"source": name}
    if entry.url:
        meta["url"] = entry.url
    meta["origin"] = entry.origin
    if entry.date:
        meta["date"] = entry.date
    meta["content_type"] = mime or ("text/plain" if kind == "plain" else "text/html")
    doc_id = entry.record_id or f"{name}/{entry.origin}"
    return _Work(kind, entry.origin, id=doc_id, meta=meta, body=payload, charset=charset)


def _parse_content_type(value: str | None) -> tuple[str, str | None]:
    """'text/html; charset=ISO-8859-1' -> ('text/html', 'iso-8859-1')."""
    if not value:
        return "", None
    mime, _, params = value.partition(";")
    match = re.search(r"charset\s*=\s*[\"']?([^\"';\s]+)", params, re.I)
    return mime.strip().lower(), (match.group(1).lower() if match else None)


def _looks_like_markup(payload: bytes) -> bool:
    head = payload[:256].lstrip(b"\xef\xbb\xbf \t\r\n\x0c").lower()
    return head.startswith(b"<")


# ---------------------------------------------------------------------------------------------------------------
# JSONL / Parquet


def _jsonl_works(name: str, path: Path, reader: ReaderConfig) -> Iterator[_Work]:
    lineno = 0
    try:
        for lineno, line in enumerate(_lines(path), 1):
            origin = f"{path.name}:{lineno}"
            if not line.strip():
                continue  # a blank line holds no record
            if lineno == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 BOM some editors write
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield _bad("undecodable", origin, f"not UTF-8: {exc.reason} at byte {exc.start}")
                continue
            try:
                row = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                yield _bad("bad_json", origin, _short(str(exc)))
                continue
            yield _row_work(name, row, origin, reader)
    except _StreamDamage as exc:
        yield _bad(exc.reason, f"{path.name}:{lineno + 1}", f"{exc.detail}; records after line {lineno} are lost")


def _parquet_works(name: str, path: Path, reader: ReaderConfig) -> Iterator[_Work]:
    import pyarrow.parquet as pq

    row_index = 0
    try:
        with pq.ParquetFile(path) as parquet:
            for batch in parquet.iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    yield _row_work(name, row, f"{path.name}:{row_index}", reader)
                    row_index += 1
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid / ArrowIOError derive from these
        yield _bad("bad_parquet", f"{path.name}:{row_index}", f"{_short(str(exc))}; rows from {row_index} on are lost")


def _row_work(name: str, row: Any, origin: str, reader: ReaderConfig) -> _Work:
    """A JSON object / Parquet row -> its text, id and metadata (its other fields, merged with its "metadata")."""
    if not isinstance(row, dict):
        return _bad("bad_json", origin, f"a {type(row).__name__}, not an object")
    parts = []
    for key in reader.text_fields:
        value = row.get(key)
        if not isinstance(value, str):
            return _bad("missing_text", origin, f"no string field {key!r}")
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
    return _Work("text", origin, id=doc_id, meta=meta, body="\n\n".join(parts))


class _StreamDamage(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def _lines(path: Path) -> Iterator[bytes]:
    """The lines of a file, gunzipped if it is gzip (by its bytes). Damage raises _StreamDamage at that point."""
    pending: list[bytes] = []  # the pieces of a line that spans chunks
    for chunk in _chunks_of(path):
        lines = chunk.split(b"\n")
        if len(lines) > 1:
            yield b"".join([*pending, lines[0]])
            yield from lines[1:-1]
            pending = []
        pending.append(lines[-1])
    if tail := b"".join(pending):
        yield tail


def _chunks_of(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    with open(path, "rb") as f:
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


def _text_works(name: str, path: Path, reader: ReaderConfig, stats: IngestStats) -> Iterator[_Work]:
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if not p.is_dir()):
            member = file.relative_to(path).as_posix()
            origin = f"{path.name}::{member}"
            if not file.is_file():
                yield _skip("not_a_file", origin)
            elif not _included(member, reader.include):
                yield _skip("excluded", origin)
            else:
                stats.bytes_in += file.stat().st_size
                yield _file_work(name, file, origin, reader)
    elif path.name.lower().endswith(TAR_SUFFIXES):
        stats.bytes_in += path.stat().st_size
        yield from _tar_works(name, path, reader)
    elif not _included(path.name, reader.include):
        yield _skip("excluded", path.name)
    else:
        stats.bytes_in += path.stat().st_size
        yield _file_work(name, path, path.name, reader)


def _included(member: str, patterns: tuple[str, ...]) -> bool:
    base = member.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(member, p) or fnmatch.fnmatchcase(base, p) for p in patterns)


def _file_work(name: str, path: Path, origin: str, reader: ReaderConfig) -> _Work:
    """One file, one document (gunzipped if it is gzip)."""
    limit = reader.max_document_bytes
    chunks, size = [], 0
    try:
        for chunk in _chunks_of(path):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return _bad("oversized", origin, f"larger than max_document_bytes ({limit})")
    except _StreamDamage as exc:
        return _bad(exc.reason, origin, exc.detail)
    return _plain_work(name, origin, b"".join(chunks))


def _plain_work(name: str, origin: str, data: bytes) -> _Work:
    return _Work("plain", origin, id=f"{name}/{origin}", meta={"source": name, "origin": origin}, body=data)


def _tar_works(name: str, path: Path, reader: ReaderConfig) -> Iterator[_Work]:
    """Members in archive order, streamed (the archive is never read whole)."""
    member_name = ""
    try:
        with tarfile.open(path, mode="r|*") as archive:
            for member in archive:
                member_name = member.name
                origin = f"{path.name}::{member.name}"
                if not member.isfile():
                    yield _skip("not_a_file", origin)
                elif not _included(member.name, reader.include):
                    yield _skip("excluded", origin)
                elif member.size > reader.max_document_bytes:
                    yield _bad("oversized", origin, f"{member.size} bytes > max_document_bytes")
                else:
                    yield _plain_work(name, origin, archive.extractfile(member).read())
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        reason = "truncated" if isinstance(exc, EOFError) or "unexpected end" in str(exc) else "bad_archive"
        yield _bad(reason, f"{path.name}::{member_name}", f"{_short(str(exc))}; nothing past this point could be read")


# ---------------------------------------------------------------------------------------------------------------
# Deciding: decode, extract, check sizes. Runs in worker processes for HTML.


def _decide_all(works: Iterator[_Work], reader: ReaderConfig, *, workers: int) -> Iterator[_Verdict]:
    """Verdicts in input order. With workers > 1, chunks go to a process pool, a bounded number in flight."""
    chunks = _chunked(works)
    first, second = next(chunks, None), next(chunks, None)
    if workers <= 1 or second is None:  # one chunk of work does not pay for starting processes
        for chunk in (first, second):
            yield from _decide_chunk(chunk or [], reader)
        for chunk in chunks:
            yield from _decide_chunk(chunk, reader)
        return
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context(), initializer=_warm_up)
    try:
        pending = deque([pool.submit(_decide_chunk, first, reader), pool.submit(_decide_chunk, second, reader)])
        for chunk in chunks:
            pending.append(pool.submit(_decide_chunk, chunk, reader))
            if len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()
    finally:
        # On an early exit (an error while writing), drop the queued chunks instead of finishing them.
        pool.shutdown(wait=True, cancel_futures=True)


def _pool_context():
    # Not fork: the caller may be a threaded Dagster process. forkserver needs the caller's module importable
    # without side effects (an `if __name__ == "__main__":` guard), as datatrove's executors do.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _warm_up() -> None:
    import trafilatura  # noqa: F401  (first import costs ~0.3 s; pay it before the first chunk)


def _chunked(works: Iterable[_Work]) -> Iterator[list[_Work]]:
    chunk: list[_Work] = []
    size = 0
    for work in works:
        chunk.append(work)
        size += len(work.body) if isinstance(work.body, (bytes, str)) else 0
        if len(chunk) >= CHUNK_RECORDS or size >= CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _decide_chunk(chunk: list[_Work], reader: ReaderConfig) -> list[_Verdict]:
    return [_decide(work, reader) for work in chunk]


def _decide(work: _Work, reader: ReaderConfig) -> _Verdict:
    if work.kind == "skip":
        return _Verdict("skip", work.reason)
    if work.kind == "bad":
        return _rejected(work, work.reason, work.detail)
    limit = reader.max_document_bytes
    if isinstance(work.body, bytes):
        if len(work.body) > limit:
            return _rejected(work, "oversized", f"{len(work.body)} bytes")
        text, detail = _decode(work.body, work.charset, html=work.kind == "html")
        if text is None:
            return _rejected(work, "undecodable", detail)
    else:
        text = work.body
    if work.kind == "html" and reader.extract_html:
        try:
            text = _extract_main_text(text)
        except _ExtractionTimeout:
            return _rejected(work, "extraction_timeout", f"> {EXTRACT_TIMEOUT_S} s")
        except Exception as exc:  # trafilatura/lxml failing on one page must not end the stage
            return _rejected(work, "extraction_error", _short(repr(exc)))
        if not text:
            return _rejected(work, "no_text_extracted", "trafilatura found no main text")
    if len(text.strip()) < reader.min_text_chars:
        return _Verdict("skip", "empty")
    if len(text) * 4 > limit and len(text.encode("utf-8")) > limit:
        return _rejected(work, "oversized", "text larger than max_document_bytes")
    return _Verdict("doc", doc={"text": text, "id": work.id, "metadata": work.meta})


def _rejected(work: _Work, reason: str, detail: str) -> _Verdict:
    return _Verdict("bad", reason, origin=work.origin, id=work.id, detail=detail)


# WHATWG-style label fixes: what browsers decode these declared charsets as (supersets of the labels).
_CHARSET_ALIASES = {
    "iso-8859-1": "cp1252", "iso8859-1": "cp1252", "latin1": "cp1252", "latin-1": "cp1252", "us-ascii": "cp1252",
    "ascii": "cp1252", "gb2312": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030", "shift_jis": "cp932",
    "shift-jis": "cp932", "sjis": "cp932", "x-sjis": "cp932", "euc-kr": "cp949", "ks_c_5601-1987": "cp949",
    "tis-620": "cp874", "iso-8859-9": "cp1254", "iso-8859-11": "cp874",
}
_META_CHARSET = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([a-zA-Z0-9_:.+-]{1,40})""", re.I)
_MAX_REPLACED = 0.001  # a UTF-8 text with at most this fraction of stray bytes is kept, those bytes as U+FFFD
_MAX_NULS = 0.001  # more NULs than this fraction of the characters: binary data, not text
_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def _decode(data: bytes, declared: str | None, *, html: bool) -> tuple[str | None, str]:
    """Bytes -> text, or (None, why). In order: a BOM; UTF-8 (valid UTF-8 is very rarely anything else); the
    charset declared by HTTP, then by <meta>; cchardet's guess; UTF-8 with a few stray bytes replaced. A candidate
    counts only if it decodes strictly and is not binary (see _without_stray_nuls)."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            return _try(data[len(bom) :], codec), f"invalid {codec} after its BOM"
    candidates = ["utf-8"]
    if declared:
        candidates.append(declared)
    if html and (match := _META_CHARSET.search(data[:4096])):
        candidates.append(match.group(1).decode("ascii").lower())
    for charset in candidates:
        if (text := _try(data, _CHARSET_ALIASES.get(charset, charset))) is not None:
            return text, ""
    import cchardet

    guess = (cchardet.detect(data) or {}).get("encoding")
    if guess and (text := _try(data, _CHARSET_ALIASES.get(guess.lower(), guess))) is not None:
        return text, ""
    text = data.decode("utf-8", errors="replace")
    replaced = text.count("\ufffd")
    if replaced <= _MAX_REPLACED * len(text) and (kept := _without_stray_nuls(text)) is not None:
        return kept, ""
    declared_all = ", ".join(dict.fromkeys(candidates[1:])) or "none"
    return None, f"{replaced}/{len(data)} bytes invalid as UTF-8; declared: {declared_all}; detector guessed: {guess}"


def _try(data: bytes, codec: str) -> str | None:
    try:
        text = data.decode(codec)
    except (UnicodeDecodeError, LookupError):
        return None
    return _without_stray_nuls(text)


def _without_stray_nuls(text: str) -> str | None:
    """None for binary-looking text (NULs above _MAX_NULS, e.g. UTF-16 read as UTF-8); else the text without its
    NULs (real pages have a few, and lxml refuses any)."""
    nuls = text.count("\x00")
    if not nuls:
        return text
    return None if nuls > _MAX_NULS * len(text) else text.replace("\x00", "")


class _ExtractionTimeout(BaseException):
    """BaseException, so that no `except Exception` inside trafilatura swallows it."""


def _extract_main_text(html: str) -> str | None:
    """Main text as datatrove's Trafilatura() extractor gets it (same call, same options)."""
    from trafilatura import extract
    from trafilatura.deduplication import LRU_TEST

    # deduplicate=True drops text segments seen several times before, in a cache global to the process; cleared
    # per page so a page's text never depends on which pages this process handled before (any worker count).
    LRU_TEST.clear()
    with _deadline(EXTRACT_TIMEOUT_S):
        return extract(html, favor_precision=True, include_comments=False, deduplicate=True)


class _deadline:
    """SIGALRM after `seconds`, raised as _ExtractionTimeout; only where signals can be used (a main thread)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.armed = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()

    def __enter__(self):
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, _raise_timeout)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
        return False


def _raise_timeout(signum, frame):
    raise _ExtractionTimeout()


# ---------------------------------------------------------------------------------------------------------------
# Output


class _Output:
    """part-NNNNN.jsonl.gz shards of docs_per_shard documents, and rejected.jsonl.gz. Byte-reproducible: no
    timestamps or names in the gzip headers, keys in a fixed order."""

    def __init__(self, out_dir: Path, docs_per_shard: int):
        self.out_dir = out_dir
        self.docs_per_shard = docs_per_shard
        self.files: list[dict] = []
        self._shard = None
        self._rejected = _GzipLines(out_dir / "rejected.jsonl.gz")

    def document(self, doc: dict) -> None:
        if self._shard is None or self.files[-1]["records"] >= self.docs_per_shard:
            self._close_shard()
            path = f"part-{len(self.files):05d}.jsonl.gz"
            self._shard = _GzipLines(self.out_dir / path)
            self.files.append({"path": path, "records": 0})
        self._shard.write(orjson.dumps(doc, default=_json_default) + b"\n")
        self.files[-1]["records"] += 1

    def rejected(self, verdict: _Verdict) -> None:
        line = {"reason": verdict.reason, "origin": verdict.origin, "detail": verdict.detail}
        if verdict.id:
            line["id"] = verdict.id
        self._rejected.write(orjson.dumps(line) + b"\n")

    def _close_shard(self) -> None:
        if self._shard is not None:
            self._shard.close()
            self._shard = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._close_shard()
        self._rejected.close()
        return False


class _GzipLines:
    """A gzip file written line by line, with a fixed header (no name, mtime 0) so equal content is equal bytes."""

    def __init__(self, path: Path):
        self._raw = open(path, "wb")
        self._gzip = gzip.GzipFile(
            filename="", mode="wb", fileobj=self._raw, compresslevel=SHARD_COMPRESSLEVEL, mtime=0
        )

    def write(self, line: bytes) -> None:
        self._gzip.write(line)

    def close(self) -> None:
        self._gzip.close()  # GzipFile leaves a file it was given open
        self._raw.close()


def _json_default(value: Any) -> Any:
    """Parquet values JSON has no type for (bytes, decimals, ...)."""
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none"


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
