"""The recipe's `checks` section: how the documents_valid asset check reads each curated output.

The curation stages themselves are configured by the engines' own types, composed by the recipe as they are
(dedup: pipelines.dedup.config.DedupConfig, decontamination: pipelines.decontam.config.DecontamConfig, the quality
classifier: pipelines.filters.quality.QualityClassifierConfig, the reference model: ReferenceConfig); a source's
filter is its own section's (assets/recipe/sources.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ChecksConfig(BaseModel):
    """How the documents_valid asset check reads an output (assets/curation/checks.py): in chunks of at most
    `chunk_documents` rows (every document), or on a seeded sample of `sample_documents` documents. How a check
    is run, not what an asset makes: no asset's code version includes it, so changing it makes nothing stale."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["chunks", "sample"] = Field("chunks", description=(
        "chunks: every document, in frames of at most chunk_documents rows; sample: a seeded sample of "
        "sample_documents documents"))
    chunk_documents: int = Field(10_000, ge=1, description="Rows of the largest DataFrame a check builds")
    # GE holds ~9 bytes per character of a frame's text at its peak (pandas 3 string copies, measured): this bounds
    # a frame of long documents where the row count would not.
    chunk_text_chars: int = Field(4 * 2**20, ge=1, description="Text characters of the largest frame (a longer "
                                  "document is a frame of its own)")
    sample_documents: int = Field(10_000, ge=1, description="Documents validated in `sample` mode")
    seed: int = Field(0, description="Seed of the sample (`sample` mode): the same seed, the same sample")
