"""Gzip JSON-lines shards: the one writer (and reader) of the part-NNNNN.jsonl.gz files that ingest, dedup and
decontamination hand on, and of their side files (rejected.jsonl.gz, removed.jsonl.gz).

    with ShardWriter(out_dir, records_per_shard=10_000, compresslevel=3) as shards:
        shards.write({"text": ..., "id": ..., "metadata": {...}})
    shards.files  # [{"path": "part-00000.jsonl.gz", "records": 10000}, {"path": "part-00001.jsonl.gz", ...}]

Byte-reproducible: no timestamp or file name in the gzip header, records serialized by orjson with the keys in
the order given, so equal content is equal bytes (outputs are hashed into manifests).

The datatrove reader and writer that keep each document's input shard are pipelines/input_shards.py: this module
imports no datatrove, so a stage's own process (which only builds the steps its workers run) reads and writes
shards without importing datatrove's I/O stack (datatrove.io, fsspec, huggingface_hub: 0.1 s).
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson


class GzipLines:
    """A gzip file written one JSON record a line, with a fixed header (no name, mtime 0)."""

    def __init__(self, path: Path, *, compresslevel: int, default: Callable[[Any], Any] | None = None):
        self.path = Path(path)
        self.records = 0
        self._default = default  # orjson's hook for values JSON has no type for
        self._raw = open(self.path, "wb")
        self._gzip = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, compresslevel=compresslevel, mtime=0)

    def write(self, record: Any) -> None:
        self._gzip.write(orjson.dumps(record, default=self._default) + b"\n")
        self.records += 1

    def close(self) -> None:
        self._gzip.close()  # GzipFile leaves a file it was given open
        self._raw.close()

    def __enter__(self) -> GzipLines:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


class ShardWriter:
    """Records into out_dir/<prefix><stem>-NNNNN.jsonl.gz, a new shard after every `records_per_shard`. A shard is
    opened by its first record: no records, no shard files. `files` lists each shard's path (relative to out_dir)
    and record count, in order. Ingest names an input's shards after it: stem "part-00003" gives
    part-00003-00000.jsonl.gz, part-00003-00001.jsonl.gz, ..."""

    def __init__(
        self,
        out_dir: Path,
        *,
        records_per_shard: int,
        compresslevel: int,
        prefix: str = "",
        stem: str = "part",
        default: Callable[[Any], Any] | None = None,
    ):
        if records_per_shard < 1:
            raise ValueError(f"records_per_shard must be >= 1, got {records_per_shard}")
        self.out_dir = Path(out_dir)
        self.records_per_shard = records_per_shard
        self.compresslevel = compresslevel
        self.prefix = prefix  # e.g. "web/": dedup writes every source's shards under one out_dir
        self.stem = stem
        self.default = default
        self.files: list[dict] = []
        self._shard: GzipLines | None = None

    def write(self, record: Any) -> None:
        if self._shard is None or self._shard.records >= self.records_per_shard:
            self._close_shard()
            path = f"{self.prefix}{self.stem}-{len(self.files):05d}.jsonl.gz"
            self._shard = GzipLines(self.out_dir / path, compresslevel=self.compresslevel, default=self.default)
            self.files.append({"path": path, "records": 0})
        self._shard.write(record)
        self.files[-1]["records"] += 1

    def close(self) -> None:
        self._close_shard()

    def _close_shard(self) -> None:
        if self._shard is not None:
            self._shard.close()
            self._shard = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def iter_documents(path) -> Iterator[dict]:
    """The documents of one part-*.jsonl.gz (a path, or a binary file open on one), in order, one line in memory
    at a time; blank lines are not documents."""
    with gzip.open(path, "rb") as f:
        for line in f:
            if line.strip():
                yield orjson.loads(line)


def store_documents(store, key: str) -> Iterator[dict]:
    """The documents of one gzip JSON-lines object of an object store (storage/), streamed in line order."""
    with store.open_read(key) as raw:
        yield from iter_documents(raw)
