"""The recipe's `dedup` section (DedupConfig): which rule, exact and near, and the MinHash LSH banding.

Kept apart from the algorithm (minhash.py) so that reading a recipe and loading the code location
(assets/recipe/) import neither numpy nor xxhash.
"""

from __future__ import annotations

from dataclasses import dataclass

DEDUP_RULES = ("transitive", "sequential")


@dataclass(frozen=True, kw_only=True)
class DedupConfig:
    """The recipe's `dedup` section. FineWeb's 5-word shingles and 112 permutations, banded 28 x 4 (FineWeb: 14 x 8)
    and verified at 0.65, so that pairs at Jaccard 0.7-0.8 are found too (the comments below say why)."""

    # A misspelt or retired setting in the recipe is refused by name when pydantic reads it, not ignored.
    __pydantic_config__ = {"extra": "forbid"}

    # Which document of a duplicate group stays. "transitive": clusters are closed over every match, each keeps its
    # smallest (source position, id): independent of reading order, but an old kept document could lose to a new
    # one, so the whole corpus is deduplicated at once. "sequential": in corpus order (dump by dump), a document is
    # removed when it matches an earlier kept one; kept documents never change, so a new dump is deduplicated
    # against the index of what was kept before (pipelines/dedup/sequential.py). A crawl of dumps needs it.
    rule: str = "transitive"
    exact: bool = True  # remove documents whose normalized text is identical
    near: bool = True  # remove near-duplicates found by MinHash LSH
    ngram: int = 5  # words per shingle
    # A pair of Jaccard J is an LSH candidate with probability 1 - (1 - J^rows)^bands. FineWeb's 14 x 8 gives 0.56 at
    # J 0.70 and 0.92 at 0.80: with verification at 0.7 on top, bench/dedup.py found 0.68 of its pairs at J 0.7-0.8.
    # 28 x 4 keeps FineWeb's 112 permutations (the signature's cost and size) but makes nearly every pair above J 0.6
    # a candidate (0.98 at 0.6, 0.999 at 0.7) and leaves the cut to verification. The price: more candidates at
    # J 0.3-0.5 (0.20-0.84 of such pairs; 3.3x the candidate pairs of 14 x 8 in the bench), each one comparison of
    # two signatures in the bucket phase, and 28 band keys a document instead of 14 (no slower in the bench).
    bands: int = 28
    rows: int = 4  # signature values per band: bands * rows permutations in all
    # The estimated Jaccard has a standard deviation of sqrt(J(1-J)/112), 0.043 at J 0.7: verifying at 0.7 would
    # lose half of the pairs at the band's lower edge. At 0.65 (binomial over the 112 positions, with the banding):
    # merged 0.88 at J 0.70, 0.99 at 0.75, 0.15 at 0.60, 0.001 at 0.50. Measured (bench/dedup.py, 1,189 pairs at
    # J 0.7-0.8, English and non-English): 0.975; none of 1,224 pairs at J 0.3-0.5; all 1,353 at J >= 0.8.
    verify_threshold: float = 0.65  # a candidate pair is merged only if its signatures agree on this fraction; 0 = off
    seed: int = 1  # picks the permutations; changing it changes which borderline pairs are found
    batch_shingles: int = 1 << 15  # shingles hashed per vectorized batch (bounds memory: x bands*rows*8 bytes)
    # Documents per bucket task: a band's (and the exact hashes') keys are split into key ranges of about this
    # many documents, one bucket task each (memory ~24 bytes a document). Changes the work, never the output.
    bucket_docs: int = 1 << 24

    def __post_init__(self):
        for name in ("ngram", "bands", "rows", "batch_shingles", "bucket_docs"):
            if getattr(self, name) < 1:
                raise ValueError(f"dedup.{name} must be >= 1, got {getattr(self, name)}")
        if self.rule not in DEDUP_RULES:
            raise ValueError(f"dedup.rule must be one of {', '.join(DEDUP_RULES)}, got {self.rule!r}")
        if not 0.0 <= self.verify_threshold <= 1.0:
            raise ValueError(f"dedup.verify_threshold must be within [0, 1], got {self.verify_threshold}")

    @property
    def permutations(self) -> int:
        return self.bands * self.rows
