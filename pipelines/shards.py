"""Gzip JSON-lines shards: the one writer (and reader) of the part-NNNNN.jsonl.gz files that ingest, dedup and
decontamination hand on, and of their side files (rejected.jsonl.gz, removed.jsonl.gz).

    with ShardWriter(out_dir, records_per_shard=10_000, compresslevel=3) as shards:
        shards.write({"text": ..., "id": ..., "metadata": {...}})
    shards.files  # [{"path": "part-00000.jsonl.gz", "records": 10000}, {"path": "part-00001.jsonl.gz", ...}]

Byte-reproducible: no timestamp or file name in the gzip header, records serialized by orjson with the keys in
the order given, so equal content is equal bytes (outputs are hashed into manifests).

For datatrove pipelines, InputShardReader and InputShardWriter keep each document's input shard: the writer names
every output file after the input file its documents came from, never after the task's rank, so a stage writes the
same files whatever number of tasks shares the input (the executor's contract, resources/executor.py).

    steps = [InputShardReader(str(in_dir), glob_pattern="part-*.jsonl.gz"), *filters,
             InputShardWriter(str(out_dir))]   # in_dir/part-00003-00000.jsonl.gz -> out_dir/part-00003-00000.jsonl.gz
"""

from __future__ import annotations

import gzip
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse
from typing import Any, Callable, Iterator

import orjson
from datatrove.data import Document
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter

from fsspec.compression import register_compression

from pipelines.inputs import URL_SCHEME, remote_fs

INPUT_SHARD = "_input_shard"  # the metadata field the reader sets and the writer takes out again

# datatrove's writers gzip through fsspec, whose GzipFile stamps the current time and the file's path in every
# header: the same documents would give different bytes, so a rebuilt output would get a new data version and
# make everything downstream stale. Equal content, equal bytes, as GzipLines writes. Registered on import, so
# in every process that unpickles a pipeline with our writers (Ray and Slurm workers) as well.
register_compression("gzip", lambda f, **kwargs: gzip.GzipFile(fileobj=f, filename="", mtime=0, **kwargs), "gz",
                     force=True)


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


class InputShardReader(JsonlReader):
    """datatrove's JSON-lines reader, noting in each document the name of the file it came from. Each task reads
    the sorted input files rank::world_size (datatrove's sharding), each file in order. The folder is a path or
    a URL (file://, or s3://... as pipelines/inputs.py reaches it: a store's committed output, read in place)."""

    name = "🐿 Jsonl (input shard noted)"

    def __init__(self, data_folder, **kwargs):
        if isinstance(data_folder, str) and data_folder.startswith("file://"):
            data_folder = unquote(urlparse(data_folder).path)
        elif isinstance(data_folder, str) and URL_SCHEME.match(data_folder):
            fs, path = remote_fs(data_folder)
            data_folder = (path, fs)  # datatrove's DataFolder on that filesystem, pickled with the steps
        super().__init__(data_folder, add_file_path=False, **kwargs)

    def get_document_from_dict(self, data: dict, source_file: str, id_in_file: int):
        document = super().get_document_from_dict(data, source_file, id_in_file)
        if document:
            document.metadata[INPUT_SHARD] = PurePosixPath(source_file).name
        return document


class InputShardWriter(JsonlWriter):
    """Writes each document to out_dir/<prefix><its input file's name>, without the noted field. Documents come
    file by file, so a file is closed as soon as the next one starts: a task holds one file open, however many
    inputs it has."""

    name = "🐿 Jsonl (named after the input shard)"

    def __init__(self, output_folder, *, prefix: str = ""):
        # The name template is unused (see _get_output_filename); datatrove warns when it lacks ${rank}.
        super().__init__(output_folder, output_filename="${rank}", compression="gzip")
        self.prefix = prefix
        self._current: str | None = None

    def _get_output_filename(self, document: Document, rank: int | str = 0, **kwargs) -> str:
        shard = document.metadata.get(INPUT_SHARD)
        if not shard:
            raise ValueError(f"document {document.id!r} has no {INPUT_SHARD}: read it with InputShardReader")
        name = self.prefix + shard
        if self._current is not None and name != self._current:
            self.output_mg.pop(self._current).close()
        self._current = name
        return name

    def _default_adapter(self, document: Document) -> dict:
        data = super()._default_adapter(document)
        metadata = {key: value for key, value in data.get("metadata", {}).items() if key != INPUT_SHARD}
        if metadata:
            data["metadata"] = metadata
        else:
            data.pop("metadata", None)
        return data
