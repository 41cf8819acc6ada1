"""WARC/WET reading that survives damage: every record is either read or reported, never lost silently.

    for item in read_warc(Path("crawl/web-pages.warc.gz"), max_payload_bytes=8 << 20):
        ...  # a WarcEntry (one WARC record, payload decoded per its HTTP headers) or a WarcDamage
    read_warc(fsspec_file, max_payload_bytes=8 << 20, name="web-pages.warc.gz")  # any seekable binary file

Why not warcio's ArchiveIterator on the gzip file directly: it decompresses the whole file as one stream, so
one bad or truncated gzip member ends the file and the records after it are lost. Here the gzip layer is ours:
the file is split into members (a standard .warc.gz has one record per member), each member is decompressed
on its own with zlib, and after a damaged one we resynchronize on the next gzip header and go on. warcio then
parses each member's records from the decompressed stream. A damaged member counts as one WarcDamage, however
many records it held (an unknown number).

A member's records are handed out only after its gzip trailer (CRC and length) has been checked, so a damaged
member never leaks garbage records; only a member too large to hold (a non-standard whole-file gzip) streams its
records before its end is verified.

warcio is used in three places where its own behaviour would lose or invent records, each narrowed here:
- it sniffs WARC or ARC afresh for each member (a new iterator each), so a member holding a line of text became a
  bogus ARC "response"; this module reads WARC (and WET, WAT) only, so such a member is bad_warc_record damage;
- it raised AttributeError on an HTTP record (response, request, revisit) without WARC-Target-URI, which ended
  the file; such a record is now bad_warc_record damage and reading goes on;
- its Content-Encoding decoder wrote a decoding error met part-way to stderr and dropped the rest of the body,
  so a corrupt payload came out short; it is now bad_content_encoding damage.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from warcio.archiveiterator import ArchiveIterator
from warcio.bufferedreaders import BufferedReader, ChunkedDataReader
from warcio.exceptions import ArchiveLoadFailed
from warcio.recordloader import ArcWarcRecord, ArcWarcRecordLoader
from warcio.statusandheaders import StatusAndHeadersParser, StatusAndHeadersParserException

GZIP_MAGIC = b"\x1f\x8b\x08"  # gzip id bytes + the deflate method: where a member can start
READ_SIZE = 1 << 16

# Record types whose payload can be a document; the others are never read beyond their headers.
PAYLOAD_TYPES = ("response", "resource", "conversion")

# Records of a member held back until its CRC is verified; past these, a (non-standard, huge) member streams.
HOLD_MAX_RECORDS = 256
HOLD_MAX_BYTES = 64 << 20


@dataclass
class WarcEntry:
    """One WARC record as read: its headers and, for PAYLOAD_TYPES, its payload."""

    origin: str  # "<file name>:<offset of its gzip member or record>", plus "#k" for the k-th record of a member
    rec_type: str
    record_id: str | None
    url: str | None
    date: str | None
    content_type: str | None  # the HTTP Content-Type if the record holds an HTTP message, else the WARC one
    http_status: str | None  # None for records without an HTTP message
    payload: bytes | None  # de-chunked and decompressed per the HTTP headers; None when not read or too large
    oversized: bool = False  # the payload exceeded max_payload_bytes and was not kept


@dataclass
class WarcDamage:
    """Input that could not be read as a record: a damaged gzip member, a malformed record."""

    reason: str  # "bad_gzip_member" | "truncated" | "bad_warc_record" | "bad_http_headers" | "bad_content_encoding"
    origin: str
    detail: str
    record_id: str | None = None


class _WarcRecordLoader(ArcWarcRecordLoader):
    """warcio's record loader, minus its crash on an HTTP record without WARC-Target-URI (it calls uri.startswith).

    Such a record is left without parsed HTTP headers here and reported as damage by _read_record."""

    def load_http_headers(self, rec_type, uri, stream, length):
        if uri is None:
            return None
        return super().load_http_headers(rec_type, uri, stream, length)


class _WarcIterator(ArchiveIterator):
    """warcio's ArchiveIterator for WARC records only: never ARC, whatever the first line of a stream looks like."""

    def __init__(self, fileobj):
        super().__init__(fileobj)
        self.known_format = "warc"  # warcio then parses WARC headers only: anything else is ArchiveLoadFailed
        self.loader = _WarcRecordLoader(verify_http=False, arc2warc=False)  # ArchiveIterator's own defaults


class ContentEncodingError(Exception):
    """A payload's Content-Encoding could not be decoded (raised where warcio would print and truncate)."""


class _StrictDecoding:
    """warcio's Content-Encoding decoding, except that a decoder error is raised, not swallowed.

    warcio takes a body whose first block does not decode for one sent without the encoding and passes it through
    as it is (kept: servers do lie about Content-Encoding), unless it starts with the gzip magic under a gzip
    encoding, which is then a damaged gzip stream. An error after some output was decoded was written to stderr
    by warcio and the rest of the body dropped: here it raises ContentEncodingError. A body that merely ends early
    (a truncated record, WARC-Truncated) still gives what it decoded, as with warcio."""

    _started = False  # whether a block was given to the decoder (warcio's own test, bytes out, misses a block
    # that gave none, e.g. one holding only a gzip header, and then passed the rest through undecoded)

    def _decompress(self, data):
        if self.decompressor is None or not data:
            return super()._decompress(data)
        if not self._started:
            decomp_type = self.decomp_type
            out = super()._decompress(data)  # warcio's guess; for deflate, it retries as raw deflate
            self._started = True
            if self.decompressor is None and decomp_type == "gzip" and data.startswith(GZIP_MAGIC):
                raise ContentEncodingError("gzip: a body with a gzip header that does not decompress")
            return out
        try:
            return self.decompressor.decompress(data)
        except Exception as exc:
            raise ContentEncodingError(
                f"{self.decomp_type}: {type(exc).__name__}: {exc} (after {self.num_block_read} decoded bytes)"
            ) from None


class _StrictBufferedReader(_StrictDecoding, BufferedReader):
    pass


class _StrictChunkedDataReader(_StrictDecoding, ChunkedDataReader):
    pass


def _content_stream(record: ArcWarcRecord):
    """ArcWarcRecord.content_stream (warcio 1.8), with decoders that raise ContentEncodingError."""
    if not record.http_headers:
        return record.raw_stream
    encoding = record.http_headers.get_header("content-encoding")
    if encoding:
        encoding = encoding.lower()
        if encoding not in BufferedReader.get_supported_decompressors():
            encoding = None
    if record.http_headers.get_header("transfer-encoding") == "chunked":
        return _StrictChunkedDataReader(record.raw_stream, decomp_type=encoding)
    if encoding:
        return _StrictBufferedReader(record.raw_stream, decomp_type=encoding)
    return record.raw_stream


class GzipDamage(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class MemberStream:
    """One gzip member, decompressed on demand; a file-like object warcio can read records from."""

    def __init__(self, members: GzipMembers):
        self._members = members
        self._zlib = zlib.decompressobj(wbits=31)  # 31: gzip header and trailer, CRC and length checked
        self._out = b""
        self._pos = 0
        self.done = False

    def read(self, size: int = -1) -> bytes:
        while not self.done and (size < 0 or len(self._out) - self._pos < size):
            self._fill()
        end = len(self._out) if size < 0 else self._pos + size
        chunk = self._out[self._pos : end]
        self._pos += len(chunk)
        return chunk

    def drain(self) -> None:
        """Read to the member's end, so its trailer is checked."""
        while not self.done:
            self._pos = len(self._out)
            self._fill()

    def _fill(self) -> None:
        data = self._members.take()
        if not data:
            raise GzipDamage("truncated", "the file ends inside a gzip member")
        try:
            out = self._zlib.decompress(data)
        except zlib.error as exc:
            raise GzipDamage("bad_gzip_member", f"zlib: {exc}") from None
        # Drop what was already read, so the buffer holds about one input chunk's worth of output.
        self._out = self._out[self._pos :] + out
        self._pos = 0
        if self._zlib.eof:
            self._members.give_back(self._zlib.unused_data)
            self.done = True


class GzipMembers:
    """The members of a (multi-member) gzip file, opened one at a time. The file must be seekable."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self._pending = b""  # compressed bytes read from the file but not yet given to a member
        self._offset = raw.tell()  # file offset of _pending[0]

    @property
    def offset(self) -> int:
        """File offset of the next compressed byte not yet given to a member."""
        return self._offset

    def take(self) -> bytes:
        if self._pending:
            data, self._pending = self._pending, b""
            self._offset += len(data)
            return data
        data = self._raw.read(READ_SIZE)
        self._offset += len(data)
        return data

    def give_back(self, data: bytes) -> None:
        """The bytes a finished member did not use: the start of the next one."""
        self._pending = data + self._pending
        self._offset -= len(data)

    def next_start(self) -> int | None:
        """Offset of the next member, None at the end of the file. Raises GzipDamage when no gzip header is there."""
        while len(self._pending) < len(GZIP_MAGIC):
            more = self._raw.read(READ_SIZE)
            if not more:
                break
            self._pending += more
        if not self._pending:
            return None
        if not self._pending.startswith(GZIP_MAGIC):
            if self._only_padding_left():
                return None
            raise GzipDamage("bad_gzip_member", f"no gzip header at offset {self._offset}")
        return self._offset

    def _only_padding_left(self) -> bool:
        """Whether the rest of the file is NUL bytes (some writers pad to a block size): an end, not damage."""
        while not self._pending.strip(b"\x00"):
            more = self._raw.read(READ_SIZE)
            if not more:
                return True
            self._offset += len(self._pending)
            self._pending = more
        return False

    def open(self) -> MemberStream:
        return MemberStream(self)

    def resync(self, offset: int) -> None:
        """Position on the first gzip header at or after `offset` (or at the end of the file)."""
        self._raw.seek(offset)
        self._offset, self._pending = offset, b""
        keep = len(GZIP_MAGIC) - 1  # a header may straddle two reads
        while True:
            chunk = self._raw.read(READ_SIZE)
            buf = self._pending + chunk
            found = buf.find(GZIP_MAGIC)
            if found >= 0:
                self._offset += found
                self._pending = buf[found:]
                return
            if not chunk:
                self._offset += len(buf)
                self._pending = b""
                return
            self._offset += max(0, len(buf) - keep)
            self._pending = buf[-keep:]


def read_warc(
    source: Path | BinaryIO, *, max_payload_bytes: int, name: str | None = None
) -> Iterator[WarcEntry | WarcDamage]:
    """Every record of a WARC (.warc.gz with gzip members, or plain .warc), or what was damaged, in file order.

    `source` is a path, or a seekable binary file (a remote input streamed through fsspec) with its file `name`,
    which origins start with."""
    if hasattr(source, "read"):
        yield from _read_warc_file(source, name or getattr(source, "name", "") or "input", max_payload_bytes)
        return
    path = Path(source)
    with open(path, "rb") as raw:
        yield from _read_warc_file(raw, name or path.name, max_payload_bytes)


def _read_warc_file(raw: BinaryIO, name: str, max_payload_bytes: int) -> Iterator[WarcEntry | WarcDamage]:
    start = raw.tell()
    # Decided by the bytes, not the name or libmagic: a gzip file starts with its magic.
    is_gzip = raw.read(2) == GZIP_MAGIC[:2]
    raw.seek(start)
    if is_gzip:
        yield from _read_gzip_warc(raw, name, max_payload_bytes)
    else:
        yield from _read_plain_warc(raw, name, max_payload_bytes)


def _read_gzip_warc(raw: BinaryIO, name: str, max_payload_bytes: int) -> Iterator[WarcEntry | WarcDamage]:
    members = GzipMembers(raw)
    # After damage, false gzip headers inside the damaged bytes fail too: they are the same damage, counted once.
    in_damage = False
    while True:
        try:
            start = members.next_start()
        except GzipDamage as exc:  # bytes between members that are no gzip header
            if not in_damage:
                yield WarcDamage(exc.reason, f"{name}:{members.offset}", exc.detail)
            in_damage = True
            members.resync(members.offset + 1)
            continue
        if start is None:
            return
        stream = members.open()
        held: list[WarcEntry | WarcDamage] = []
        held_bytes = 0
        try:
            for k, record in enumerate(_WarcIterator(stream)):
                origin = f"{name}:{start}" + (f"#{k}" if k else "")
                entry = _read_record(record, origin, max_payload_bytes)
                held.append(entry)
                held_bytes += len(getattr(entry, "payload", None) or b"")
                if len(held) > HOLD_MAX_RECORDS or held_bytes > HOLD_MAX_BYTES:
                    yield from held
                    held, held_bytes = [], 0
            stream.drain()
        except GzipDamage as exc:
            if not in_damage:
                yield WarcDamage(exc.reason, f"{name}:{start}", exc.detail)
            in_damage = True
            members.resync(start + 1)
            continue
        except (ArchiveLoadFailed, StatusAndHeadersParserException, ValueError) as exc:
            # The gzip data may be sound but hold no valid WARC record: find out by reading to the member's end.
            try:
                stream.drain()
            except GzipDamage as damage:
                if not in_damage:
                    yield WarcDamage(damage.reason, f"{name}:{start}", damage.detail)
                in_damage = True
                members.resync(start + 1)
                continue
            held.append(WarcDamage("bad_warc_record", f"{name}:{start}", _short(exc)))
        yield from held
        in_damage = False


def _read_plain_warc(raw: BinaryIO, name: str, max_payload_bytes: int) -> Iterator[WarcEntry | WarcDamage]:
    """An uncompressed WARC: there is no framing to resynchronize on, so a malformed record ends the file."""
    iterator = _WarcIterator(raw)
    # Each entry is handed out one record late: only once warcio has read a record to its end (when it moves to
    # the next) does its length limit show whether the file ended inside it.
    previous: tuple[ArcWarcRecord, WarcEntry | WarcDamage] | None = None
    try:
        for record in iterator:
            if previous is not None:
                yield _unless_truncated(*previous)
                previous = None
            previous = record, _read_record(record, f"{name}:{iterator.offset}", max_payload_bytes)
        if previous is not None:
            yield _unless_truncated(*previous)
            previous = None
    except (ArchiveLoadFailed, StatusAndHeadersParserException, ValueError) as exc:
        if previous is not None:
            yield _unless_truncated(*previous)
        detail = _short(exc) + "; the rest of the file is unread"
        yield WarcDamage("bad_warc_record", f"{name}:{iterator.offset}", detail)


def _unless_truncated(record: ArcWarcRecord, entry: WarcEntry | WarcDamage) -> WarcEntry | WarcDamage:
    if getattr(record.raw_stream, "limit", 0) > 0:
        return WarcDamage("truncated", entry.origin, "the file ends inside this record", entry.record_id)
    return entry


_HTTP_PARSER = StatusAndHeadersParser(["HTTP/1.0", "HTTP/1.1"], verify=False)

# Record types that carry an HTTP message and, by the WARC standard, must name their WARC-Target-URI.
HTTP_RECORD_TYPES = ArcWarcRecordLoader.HTTP_RECORDS  # ("response", "request", "revisit")


def _read_record(record: ArcWarcRecord, origin: str, max_payload_bytes: int) -> WarcEntry | WarcDamage:
    headers = record.rec_headers
    rec_type = record.rec_type or "unknown"
    record_id = headers.get_header("WARC-Record-ID")
    warc_type = headers.get_header("Content-Type")
    entry = WarcEntry(
        origin=origin,
        rec_type=rec_type,
        record_id=record_id,
        url=headers.get_header("WARC-Target-URI"),
        date=headers.get_header("WARC-Date"),
        content_type=warc_type,
        http_status=None,
        payload=None,
    )
    if rec_type in HTTP_RECORD_TYPES and entry.url is None:
        return WarcDamage("bad_warc_record", origin, f"a {rec_type} record without WARC-Target-URI", record_id)
    if rec_type not in PAYLOAD_TYPES:
        return entry
    if record.http_headers is None and rec_type == "response" and (warc_type or "").startswith("application/http"):
        # warcio parses HTTP headers only for http(s): target URIs; some real WARCs have other (broken) ones.
        try:
            record.http_headers = _HTTP_PARSER.parse(record.raw_stream)
        except (StatusAndHeadersParserException, EOFError, ValueError) as exc:
            return WarcDamage("bad_http_headers", origin, _short(exc), record_id)
    if record.http_headers is not None:
        entry.http_status = record.http_headers.get_statuscode()
        entry.content_type = record.http_headers.get_header("Content-Type")
    try:
        # content_stream() undoes chunking and Content-Encoding; read one byte past the cap to see oversize.
        payload = _content_stream(record).read(max_payload_bytes + 1)
    except GzipDamage:
        raise
    except Exception as exc:  # warcio's decoders raise assorted types on a lying Content-Encoding
        return WarcDamage("bad_content_encoding", origin, _short(exc), record_id)
    if len(payload) > max_payload_bytes:
        entry.oversized = True
    else:
        entry.payload = payload
    return entry


def _short(exc: BaseException, limit: int = 200) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
