"""Ingest: one source's input files to documents. Readers per format (WARC/WET, JSON lines, parquet, text, tar),
the damage-tolerant WARC reader, payload decoding and HTML main-text extraction, and the ingest step that keeps,
skips or counts every record; config.py holds a source's `reader` section.

It may import the shared pipelines.inputs, pipelines.shards and pipelines.runner, and storage.
"""
