"""The sample step: keeps a seeded share of a source's documents, chosen by a hash of each document's id (so the
same ones whatever the order or the task count)."""

from __future__ import annotations

import hashlib

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter

from pipelines.filters.config import SampleConfig

class SampleFilter(BaseFilter):
    """Keeps a seeded `rate` of the documents by a hash of their id, so the same ones whatever the task count."""

    name = "🎲 Sample"

    def __init__(self, config: SampleConfig, exclusion_writer=None):
        super().__init__(exclusion_writer)
        self.rate, self.seed = config.rate, config.seed

    def filter(self, doc: Document):
        digest = hashlib.blake2b(f"{self.seed}\0{doc.id}".encode("utf-8", errors="surrogatepass"), digest_size=8)
        return True if int.from_bytes(digest.digest(), "little") < self.rate * 2**64 else (False, "sample")
