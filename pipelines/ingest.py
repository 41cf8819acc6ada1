"""Raw ingest: one source's input files -> normalized documents in datatrove's format, every record accounted for.

    stats = ingest_source(name="web", inputs=expand_inputs(["crawl/*.warc.gz"], data_dir), format="warc",
                          reader=ReaderConfig(workers=2), out_dir=Path("out/web"))

writes out/web/part-00000.jsonl.gz, ... (gzip JSON lines: {"text", "id", "metadata": {"source", "url" or
"origin", ...}}) and out/web/rejected.jsonl.gz (one {"reason", "origin", "detail"} line per bad record). Every
input record is a document, skipped (not a document by nature: a WARC request record, an empty file) or bad
(corrupt or failed, by reason): `stats.records == stats.documents + sum(stats.skipped) + sum(stats.bad)`.
When the bad fraction exceeds `reader.max_bad_fraction`, BadInputError is raised after writing.

This module is the orchestration: reading is pipelines/readers.py (formats: "warc", "wet", "jsonl", "parquet",
"text"), decoding and HTML extraction pipelines/extraction.py, shard writing pipelines/shards.py.
HTML -> text (trafilatura) is the slow part, 20-30 ms a page, so it runs in `reader.workers` processes over
ordered chunks with a bounded number in flight: the output is byte-identical for any worker count.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from pipelines.extraction import ExtractionTimeout, decode_text, extract_main_text, warm_up
from pipelines.readers import FORMATS, InputRecord, ReaderConfig, read_inputs, shorten
from pipelines.shards import GzipLines, ShardWriter


PROGRESS_EVERY = 1000  # records between progress reports
CHUNK_RECORDS = 16  # records a worker process handles per task (a chunk of HTML pages is ~0.3 s of work)
CHUNK_BYTES = 8 << 20  # ... or fewer, when their payloads are large
IN_FLIGHT_PER_WORKER = 3  # chunks submitted ahead per worker: keeps them busy, bounds memory
SHARD_COMPRESSLEVEL = 3  # ~2x faster than 6 for ~10% larger shards: they are intermediate data


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


class _Verdict(NamedTuple):
    """What an InputRecord became."""

    kind: str  # "doc" | "skip" | "bad"
    reason: str = ""
    doc: dict | None = None
    origin: str = ""
    id: str | None = None
    detail: str = ""


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

    def count_bytes(size: int) -> None:
        stats.bytes_in += size

    records = read_inputs(name, [Path(p) for p in inputs], format, reader, count_bytes=count_bytes)
    parallel = format in ("warc", "wet") and reader.extract_html and reader.workers > 1
    verdicts = _decide_all(records, reader, workers=reader.workers if parallel else 1)
    shards = ShardWriter(
        out_dir, records_per_shard=reader.docs_per_shard, compresslevel=SHARD_COMPRESSLEVEL, default=_json_default
    )
    rejected = GzipLines(out_dir / "rejected.jsonl.gz", compresslevel=SHARD_COMPRESSLEVEL)
    with closing(verdicts), shards, rejected:  # closing: stops worker processes
        for verdict in verdicts:
            stats.records += 1
            if verdict.kind == "doc":
                shards.write(verdict.doc)
                stats.documents += 1
            elif verdict.kind == "skip":
                stats.skipped[verdict.reason] = stats.skipped.get(verdict.reason, 0) + 1
            else:
                rejected.write(_rejected_line(verdict))
                stats.bad[verdict.reason] = stats.bad.get(verdict.reason, 0) + 1
            if progress is not None and stats.records % PROGRESS_EVERY == 0:
                progress(f"{name}: {stats.summary()}")
    stats.files = shards.files
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


def _rejected_line(verdict: _Verdict) -> dict:
    line = {"reason": verdict.reason, "origin": verdict.origin, "detail": verdict.detail}
    if verdict.id:
        line["id"] = verdict.id
    return line


def _json_default(value: Any) -> Any:
    """Parquet values JSON has no type for (bytes, decimals, ...)."""
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none"


# ---------------------------------------------------------------------------------------------------------------
# Deciding: decode, extract, check sizes. Runs in worker processes for HTML.


def _decide_all(records: Iterator[InputRecord], reader: ReaderConfig, *, workers: int) -> Iterator[_Verdict]:
    """Verdicts in input order. With workers > 1, chunks go to a process pool, a bounded number in flight."""
    chunks = _chunked(records)
    first, second = next(chunks, None), next(chunks, None)
    if workers <= 1 or second is None:  # one chunk of work does not pay for starting processes
        for chunk in (first, second):
            yield from _decide_chunk(chunk or [], reader)
        for chunk in chunks:
            yield from _decide_chunk(chunk, reader)
        return
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context(), initializer=warm_up)
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


def _chunked(records: Iterable[InputRecord]) -> Iterator[list[InputRecord]]:
    chunk: list[InputRecord] = []
    size = 0
    for record in records:
        chunk.append(record)
        size += len(record.body) if isinstance(record.body, (bytes, str)) else 0
        if len(chunk) >= CHUNK_RECORDS or size >= CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _decide_chunk(chunk: list[InputRecord], reader: ReaderConfig) -> list[_Verdict]:
    return [_decide(record, reader) for record in chunk]


def _decide(record: InputRecord, reader: ReaderConfig) -> _Verdict:
    if record.kind == "skip":
        return _Verdict("skip", record.reason)
    if record.kind == "bad":
        return _rejected(record, record.reason, record.detail)
    limit = reader.max_document_bytes
    if isinstance(record.body, bytes):
        if len(record.body) > limit:
            return _rejected(record, "oversized", f"{len(record.body)} bytes")
        text, detail = decode_text(record.body, record.charset, html=record.kind == "html")
        if text is None:
            return _rejected(record, "undecodable", detail)
    else:
        text = record.body
    if record.kind == "html" and reader.extract_html:
        try:
            text = extract_main_text(text)
        except ExtractionTimeout as timeout:
            return _rejected(record, "extraction_timeout", f"> {timeout.seconds} s")
        except Exception as exc:  # trafilatura/lxml failing on one page must not end the stage
            return _rejected(record, "extraction_error", shorten(repr(exc)))
        if not text:
            return _rejected(record, "no_text_extracted", "trafilatura found no main text")
    if len(text.strip()) < reader.min_text_chars:
        return _Verdict("skip", "empty")
    if len(text) * 4 > limit and len(text.encode("utf-8")) > limit:
        return _rejected(record, "oversized", "text larger than max_document_bytes")
    return _Verdict("doc", doc={"text": text, "id": record.id, "metadata": record.meta})


def _rejected(record: InputRecord, reason: str, detail: str) -> _Verdict:
    return _Verdict("bad", reason, origin=record.origin, id=record.id, detail=detail)
