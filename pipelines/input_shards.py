"""The datatrove reader and writer that keep each document's input shard: the writer names every output file after
the input file its documents came from, never after the task's rank, so a stage writes the same files whatever
number of tasks shares the input (the executor's contract, resources/executor.py).

    steps = [InputShardReader(str(in_dir), glob_pattern="part-*.jsonl.gz"), *filters,
             InputShardWriter(str(out_dir))]   # in_dir/part-00003-00000.jsonl.gz -> out_dir/part-00003-00000.jsonl.gz

Apart from pipelines/shards.py (our own gzip JSON-lines writer and readers) because these import datatrove's I/O
stack (datatrove.io, fsspec, huggingface_hub: 0.1 s in a fresh process), which a stage that only reads and writes
shards in its tasks should not pay in the process that builds its steps.
"""

from __future__ import annotations

import gzip
from pathlib import PurePosixPath
from urllib.parse import unquote, urlparse

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
