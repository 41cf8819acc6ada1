"""The recipe's `sources` section: one input corpus each, where it is, how it is read, how it is filtered.

    sources:
      - {name: web, format: warc, inputs: [crawl/*.warc.gz], filter: {language: {languages: [en]}, ...}}
      - {name: cc, format: warc, inputs: ["crawl/{dump}/*.warc.gz"], dumps: [CC-MAIN-2024-10, CC-MAIN-2024-18]}

A source composes the engines' own config types (its `reader` is pipelines.ingest.config.ReaderConfig, its `filter`
pipelines.filters.config.FilterConfig), and says which part of it versions which asset: raw_section() for raw_crawl,
filtered_section() for filtered, so a filter change makes only filtered and what is downstream of it stale.
"""

from __future__ import annotations

import functools
import re
from typing import Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipelines.filters.config import FilterConfig
from pipelines.ingest.config import ReaderConfig

# Reader settings that never change what ingest produces: the threshold only decides whether to fail. Leaving
# it out of the code version means setting it does not make the asset stale.
READER_FIELDS_NOT_VERSIONED = ("max_bad_fraction",)


@functools.cache
def _adapter(cls) -> pydantic.TypeAdapter:
    """One TypeAdapter per class: building one (its schema) took 23 ms, for every source's filtered asset."""
    return pydantic.TypeAdapter(cls)


DUMP_PLACEHOLDER = "{dump}"
DUMP_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"


class SourceConfig(BaseModel):
    """One input corpus: where it is, how to read it, and (later) its per-stage settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Asset-key-safe name: lower-case letters, digits and _")
    format: Literal["warc", "wet", "jsonl", "parquet", "text"] = Field(description=(
        "How the inputs are read: WARC (HTML extracted), WET (text), JSON lines, Parquet or plain text files"))
    inputs: list[str] = Field(min_length=1, description=(
        "Paths, globs or file:// URIs, relative to base_dir, or fsspec URLs and globs "
        "(s3://bucket/crawl/*.warc.gz; S3 endpoint and credentials from the AWS_* variables)"))
    reader: ReaderConfig = Field(ReaderConfig(), description=(
        "How records become documents (pipelines.ingest.config.ReaderConfig): which fields hold the text, id and "
        "URL, which files of a folder or tarball, HTML extraction, size limits, the share of bad records allowed"))
    filter: FilterConfig = Field(FilterConfig(), description=(
        "The filter steps, each turned on by name with its settings (pipelines/filters/config.py; docs/curation/"
        "filters.md); a step left out is off"))
    # A crawl of many dumps: `{dump}` in its inputs stands for one folder name (crawl/{dump}/*.warc.gz). Each dump
    # is a partition of the source's assets (assets/dumps.py). The dumps are these, or, left out, every
    # folder found where `{dump}` stands (found by the dump sensor and by `pretrain status` and `materialize`).
    dumps: list[str] | None = Field(None, description="The source's dumps, in order; needs {dump} in its inputs")

    @field_validator("name")
    @classmethod
    def _asset_key_safe(cls, name: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise ValueError(f"source name {name!r} must match [a-z][a-z0-9_]* (it becomes an asset key)")
        return name

    @field_validator("dumps")
    @classmethod
    def _dump_names(cls, dumps: list[str] | None) -> list[str] | None:
        for dump in dumps or []:
            if not re.fullmatch(DUMP_NAME, dump):
                raise ValueError(f"dump name {dump!r} must match {DUMP_NAME} (it becomes a partition and a folder)")
        if dumps is not None and len(set(dumps)) != len(dumps):
            raise ValueError(f"a dump is named twice: {dumps}")
        # The sequential dedup takes a crawl's dumps in name order (assets/dumps.py): a list in another order would be
        # deduplicated in an order it does not show ('dump2' after 'dump10').
        for earlier, later in zip(dumps or [], (dumps or [])[1:]):
            if later < earlier:
                raise ValueError(f"{later!r} is listed after {earlier!r} but sorts before it: dumps are deduplicated in "
                                 f"name order, so list them in that order ({sorted(dumps)}), or name them so that it is "
                                 "their time order (CC-MAIN-2024-10, dump02)")
        return dumps

    @model_validator(mode="after")
    def _dump_placeholder(self):
        marked = [DUMP_PLACEHOLDER in spec for spec in self.inputs]
        if any(marked) and not all(marked):
            raise ValueError(f"inputs: either every input has {DUMP_PLACEHOLDER} (a crawl of dumps) or none has")
        for spec in self.inputs:
            if spec.count(DUMP_PLACEHOLDER) > 1 or (DUMP_PLACEHOLDER in spec and
                                                    f"/{DUMP_PLACEHOLDER}/" not in f"/{spec}"):
                raise ValueError(f"inputs: {spec!r}: {DUMP_PLACEHOLDER} must be one whole folder of the path, once "
                                 "(crawl/{dump}/*.warc.gz)")
        if self.dumps is not None and not any(marked):
            raise ValueError(f"dumps: the inputs have no {DUMP_PLACEHOLDER}, so there is nothing to partition "
                             "(crawl/{dump}/*.warc.gz)")
        return self

    @property
    def has_dumps(self) -> bool:
        """A crawl of dumps: its assets are partitioned by dump."""
        return DUMP_PLACEHOLDER in self.inputs[0]

    def dump_inputs(self, dump: str) -> list[str]:
        """The inputs of one dump: {dump} replaced by its name."""
        return [spec.replace(DUMP_PLACEHOLDER, dump) for spec in self.inputs]

    def raw_section(self) -> dict:
        """The part of this source that decides the `raw_crawl` output (its code version hashes this)."""
        reader = _adapter(ReaderConfig).dump_python(self.reader, mode="json")
        for field in READER_FIELDS_NOT_VERSIONED:
            reader.pop(field, None)
        return {"name": self.name, "format": self.format, "inputs": list(self.inputs), "reader": reader}

    def filtered_section(self) -> dict:
        """The part of this source that decides the `filtered` output (not in raw_section: a filter change
        makes only filtered and what is downstream of it stale)."""
        return {"name": self.name, "filter": _adapter(FilterConfig).dump_python(self.filter, mode="json")}
