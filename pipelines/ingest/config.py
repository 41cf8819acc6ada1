"""A source's `reader` section (ReaderConfig): how its files are read into documents.

Kept apart from the readers (readers.py) so that reading a recipe and loading the code location (assets/recipe/)
do not import the WARC and HTML libraries behind them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ReaderConfig:
    """How one source's files are read. A recipe's `sources[].reader` section (pydantic mirrors these fields)."""

    # A misspelt or retired setting in the recipe is refused by name when pydantic reads it, not ignored.
    __pydantic_config__ = {"extra": "forbid"}

    text_fields: tuple[str, ...] = ("text",)  # jsonl/parquet: fields joined by "\n\n" make the text; all required
    id_field: str = "id"  # jsonl/parquet: an id given here is kept as is (a non-string one as its str())
    url_field: str = "url"  # jsonl/parquet: looked up at the top level, then inside "metadata"
    include: tuple[str, ...] = ("*",)  # text: fnmatch patterns on member/file paths or names ("*.py")
    extract_html: bool = True  # warc: HTML -> main text with trafilatura (else the decoded HTML is the text)
    min_text_chars: int = 1  # texts shorter than this (blank edges aside) are skipped as "empty"; 0 keeps them
    max_document_bytes: int = 8 * 2**20  # larger payloads/texts are bad as "oversized"
    max_bad_fraction: float = 0.1  # ingest fails (BadInputError) when bad / (documents + bad) exceeds this
    # No `workers`: ingest runs as the executor's tasks (PRETRAIN_EXECUTOR_WORKERS, PRETRAIN_EXECUTOR_TASKS); a
    # recipe that still sets reader.workers is refused by name rather than silently ignored.
    docs_per_shard: int = 10_000  # documents per part file (each input file's documents start a part of their own)

    def __post_init__(self):
        for name in ("text_fields", "include"):
            value = getattr(self, name)
            value = (value,) if isinstance(value, str) else tuple(value)
            if not value or not all(isinstance(v, str) and v for v in value):
                raise ValueError(f"reader.{name} must be a non-empty list of non-empty strings, got {value!r}")
            object.__setattr__(self, name, value)
        if self.min_text_chars < 0:
            raise ValueError(f"reader.min_text_chars must be >= 0, got {self.min_text_chars}")
        if self.max_document_bytes < 1:
            raise ValueError(f"reader.max_document_bytes must be >= 1, got {self.max_document_bytes}")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"reader.max_bad_fraction must be within [0, 1], got {self.max_bad_fraction}")
        if self.docs_per_shard < 1:
            raise ValueError(f"reader.docs_per_shard must be >= 1, got {self.docs_per_shard}")
