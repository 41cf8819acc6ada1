"""Raw ingest: one source's input files -> normalized documents in datatrove's format, every record accounted for,
as a datatrove pipeline step (IngestStep) that the executor resource runs in as many tasks as it likes.

    steps = ingest_pipeline(name="web", inputs=expand_inputs(["s3://crawl/*.warc.gz"], data_dir), format="warc",
                            reader=ReaderConfig(), out_dir=out, logging_dir=logs)
    stats_path = executor.run(steps, logging_dir=logs, tasks=executor.tasks_for(len(inputs)))
    stats = ingest_stats(stats_path, logging_dir=logs, inputs=len(inputs))
    check_bad_fraction(stats, name="web", reader=reader, out_dir=out)  # BadInputError above max_bad_fraction

or all of it on this machine in one call (tests, benches): `ingest_source(name=..., ..., tasks=2, workers=2)`.

Each task takes the inputs rank::world_size (in the list's order; expand_inputs sorts it) and writes, for input
file i (its index in the whole list), its documents to part-<i:05d>-<k:05d>.jsonl.gz (gzip JSON lines
{"text", "id", "metadata": {"source", "url" or "origin", ...}}, `reader.docs_per_shard` a part) and its bad
records to rejected-<i:05d>.jsonl.gz ({"reason", "origin", "detail"} a line; no bad record, no file). Files are
named after their input, never after a task, written by pipelines/shards.py's reproducible gzip, and each input
is read in order: the output bytes are the same for any task or worker count. Which parts an input gave (and
their record counts, for the manifest) is noted in <logging_dir>/files/<i:05d>.json.

Every input record is a document, skipped (not a document by nature: a WARC request record, an empty file) or
bad (corrupt or failed, by reason). The counts go to datatrove's stats (records, documents, skipped_<kind>,
bad_<reason>, bytes_in), which the executor merges over the tasks into stats.json:
`records == documents + sum(skipped) + sum(bad)`.

Reading is pipelines/ingest/readers.py (local files and fsspec URLs; formats "warc", "wet", "jsonl", "parquet",
"text"), decoding and HTML extraction pipelines/ingest/extraction.py (in the task: the executor's tasks and workers are
the parallelism; there is no process pool of our own).
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from datatrove.pipeline.base import PipelineStep

from pipelines.ingest.extraction import ExtractionTimeout, decode_text, extract_main_text
from pipelines.inputs import Input, as_input, input_name
from pipelines.ingest.config import ReaderConfig
from pipelines.ingest.readers import FORMATS, InputRecord, read_inputs, shorten
from pipelines.runner import LocalRunner, stat_totals
from pipelines.shards import GzipLines, ShardWriter
from storage.objects import write_atomic

SHARD_COMPRESSLEVEL = 3  # ~2x faster than 6 for ~10% larger shards: they are intermediate data
LISTING_FOLDER = "files"  # under the logging dir: per input, the parts it gave


@dataclass
class IngestStats:
    records: int = 0  # every record seen in the input (WARC: every record of every type)
    documents: int = 0  # written
    skipped: dict[str, int] = field(default_factory=dict)  # not documents by nature, by kind
    bad: dict[str, int] = field(default_factory=dict)  # corrupt or failed, by reason (listed in rejected-*.jsonl.gz)
    bytes_in: int = 0  # bytes of the input files (compressed, as stored)
    files: list[dict] = field(default_factory=list)  # per part: {"path": "part-00000-00000.jsonl.gz", "records": n}
    rejected: list[dict] = field(default_factory=list)  # per rejected file: {"path": "rejected-00000...", "records"}

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
# The step


class IngestStep(PipelineStep):
    """Reads its task's share of the inputs and writes each input's parts and rejected records (module doc).

    Picklable (Ray and Slurm pickle the pipeline): it holds the input list and settings; files are opened in run().
    A task that runs again (a resumed stage) rewrites the same files."""

    name = "🧾 Ingest (damage-tolerant readers)"
    type = "📖 - READER"

    def __init__(self, *, name: str, inputs: list, format: str, reader: ReaderConfig, out_dir, listing_dir):
        super().__init__()
        if format not in FORMATS:
            raise ValueError(f"source {name!r}: format {format!r} is not one of {FORMATS}")
        self.source = name
        self.inputs: list[Input] = [as_input(p) for p in inputs]
        self.format = format
        self.reader = reader
        self.out_dir = Path(out_dir)
        self.listing_dir = Path(listing_dir)

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        if data:
            yield from data  # nothing comes before a reader; anything that does passes through
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.listing_dir.mkdir(parents=True, exist_ok=True)
        for index in range(rank, len(self.inputs), world_size):
            with self.track_time(unit="file"):
                self._ingest(index)

    def _ingest(self, index: int) -> None:
        from datatrove.utils.logging import logger

        location = self.inputs[index]
        counts: Counter = Counter({"files": 1, "records": 0, "documents": 0, "bytes_in": 0})

        def count_bytes(size: int) -> None:
            counts["bytes_in"] += size

        parts = ShardWriter(self.out_dir, records_per_shard=self.reader.docs_per_shard, stem=f"part-{index:05d}",
                            compresslevel=SHARD_COMPRESSLEVEL, default=_json_default)
        rejected: GzipLines | None = None
        try:
            for record in read_inputs(self.source, [location], self.format, self.reader, count_bytes=count_bytes):
                verdict = _decide(record, self.reader)
                counts["records"] += 1
                if verdict.kind == "doc":
                    parts.write(verdict.doc)
                    counts["documents"] += 1
                elif verdict.kind == "skip":
                    counts[f"skipped_{verdict.reason}"] += 1
                else:
                    if rejected is None:
                        rejected = GzipLines(self.out_dir / f"rejected-{index:05d}.jsonl.gz",
                                             compresslevel=SHARD_COMPRESSLEVEL)
                    rejected.write(_rejected_line(verdict))
                    counts[f"bad_{verdict.reason}"] += 1
        finally:
            parts.close()
            if rejected is not None:
                rejected.close()
        for key, value in sorted(counts.items()):
            self.stat_update(key, value=value)
        listing = {
            "input": str(location),
            "parts": parts.files,
            "rejected": {"path": rejected.path.name, "records": rejected.records} if rejected is not None else None,
        }
        write_atomic(self.listing_dir / f"{index:05d}.json", [json.dumps(listing).encode()])
        logger.info(f"{self.source}: input {index} ({input_name(location)}): {counts['records']} records, "
                    f"{counts['documents']} documents, {sum(v for k, v in counts.items() if k.startswith('bad_'))} bad")


# ---------------------------------------------------------------------------------------------------------------
# A stage: the steps, its counts, its verdict


def ingest_pipeline(*, name: str, inputs: list, format: str, reader: ReaderConfig, out_dir, logging_dir) -> list:
    """The stage's datatrove steps, for an executor run with this logging_dir."""
    listing = Path(logging_dir) / LISTING_FOLDER
    return [IngestStep(name=name, inputs=inputs, format=format, reader=reader, out_dir=out_dir, listing_dir=listing)]


def ingest_stats(stats_path, *, logging_dir, inputs: int) -> IngestStats:
    """The counts of a finished run, from its merged stats.json, and its files, from the per-input listings."""
    totals = {key: int(n) for key, n in stat_totals(stats_path, step=IngestStep.name).items()}
    stats = IngestStats(records=totals.get("records", 0), documents=totals.get("documents", 0),
                        bytes_in=totals.get("bytes_in", 0))
    stats.skipped = {k[len("skipped_"):]: n for k, n in sorted(totals.items()) if k.startswith("skipped_")}
    stats.bad = {k[len("bad_"):]: n for k, n in sorted(totals.items()) if k.startswith("bad_")}
    listing_dir = Path(logging_dir) / LISTING_FOLDER
    for index in range(inputs):
        path = listing_dir / f"{index:05d}.json"
        if not path.is_file():
            raise RuntimeError(f"ingest: input {index} has no listing {path}: its task did not finish")
        listing = json.loads(path.read_text())
        stats.files += listing["parts"]
        stats.rejected += [listing["rejected"]] if listing["rejected"] else []
    if totals.get("files", 0) != inputs:
        raise RuntimeError(f"ingest: the stats count {totals.get('files', 0)} input files read, not {inputs} "
                           f"({stats_path}); a task's stats are missing or counted twice")
    assert stats.records == stats.documents + sum(stats.skipped.values()) + sum(stats.bad.values()), stats
    assert stats.documents == sum(f["records"] for f in stats.files), (stats.documents, stats.files)
    assert sum(stats.bad.values()) == sum(f["records"] for f in stats.rejected), (stats.bad, stats.rejected)
    return stats


def check_bad_fraction(stats: IngestStats, *, name: str, reader: ReaderConfig, out_dir) -> None:
    """BadInputError when the source's bad fraction is above reader.max_bad_fraction (the output stays written)."""
    if stats.bad_fraction() > reader.max_bad_fraction:
        raise BadInputError(
            f"source {name!r}: {stats.bad_fraction():.1%} of records are bad, above max_bad_fraction "
            f"{reader.max_bad_fraction:.1%} (bad by reason: {_counts(stats.bad)}; {stats.documents} documents, "
            f"{stats.records} records; see {Path(out_dir) / 'rejected-*.jsonl.gz'})",
            stats,
        )


def ingest_source(
    *,
    name: str,
    inputs: list,
    format: str,
    reader: ReaderConfig,
    out_dir,
    tasks: int = 1,
    workers: int = 1,
    logging_dir=None,
) -> IngestStats:
    """The whole stage on this machine (pipelines/runner.py's LocalRunner) into an empty out_dir; see the module doc.
    Without a logging_dir, the run's logs go to a temporary folder."""
    if format not in FORMATS:
        raise ValueError(f"source {name!r}: format {format!r} is not one of {FORMATS}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    leftovers = sorted(p.name for pattern in ("part-*.jsonl.gz", "rejected*.jsonl.gz") for p in out_dir.glob(pattern))
    if leftovers:
        raise ValueError(
            f"source {name!r}: {out_dir} already holds output ({', '.join(leftovers[:3])}); use an empty folder"
        )
    if logging_dir is None:
        with tempfile.TemporaryDirectory(prefix="ingest-logs-") as logs:
            return ingest_source(name=name, inputs=inputs, format=format, reader=reader, out_dir=out_dir,
                                 tasks=tasks, workers=workers, logging_dir=logs)
    steps = ingest_pipeline(name=name, inputs=inputs, format=format, reader=reader, out_dir=out_dir,
                            logging_dir=logging_dir)
    stats_path = LocalRunner(workers=workers).run(steps, logging_dir=Path(logging_dir), tasks=tasks)
    stats = ingest_stats(stats_path, logging_dir=logging_dir, inputs=len(inputs))
    check_bad_fraction(stats, name=name, reader=reader, out_dir=out_dir)
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
# Deciding: decode, extract, check sizes.


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
