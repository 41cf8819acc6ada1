"""Deduplication's algorithm: exact (normalized-text hash) and MinHash LSH with verified candidates.

The text -> signature primitives live here, the recipe's `dedup` settings in pipelines/dedup/config.py; the stage
that runs them over a corpus as datatrove pipelines is pipelines/dedup/stage.py (`deduplicate`), its steps
pipelines/dedup/steps.py.

  - words: NFKC, case-folded, punctuation dropped, combining marks kept in their word (`normalized_words`;
    decontamination compares the same way);
  - exact: a 128-bit xxh3 of the normalized words joined by spaces: equal hashes are exact duplicates;
  - near: `ngram`-word shingles hashed to uint64 (vectorized), a MinHash signature of bands*rows uint32 values
    (`MinHasher`), one uint64 key per band of `rows` values: equal keys in a band make an LSH candidate pair;
  - verification: a candidate pair is merged only when the fraction of signature positions the two share (the
    estimated Jaccard) is >= verify_threshold. The 28x4 banding makes nearly every pair above Jaccard 0.6 a
    candidate, so verification makes the cut: it drops the candidates at J 0.3-0.5 and, at 0.65, keeps those at
    J 0.7-0.8 (DedupConfig's comments in config.py give the reasoning). bench/dedup.py, through the staged datatrove path on 2
    shared cores, on 2,250 English and 2,250 non-English pairs of real passages (English / non-English): recall
    1.000 / 1.000 at J >= 0.8, 0.975 / 0.975 at J 0.7-0.8 (FineWeb's 14x8 verified at 0.7: 0.68 / 0.68), no
    false positive at J 0.3-0.5; 1.4-1.7x datasketch MinHashLSH's documents/s (one process each; datasketch at
    112 permutations, threshold 0.75, finds 0.47 / 0.50 at J 0.7-0.8);
  - keep rule: in each cluster of two or more documents the one with the smallest (source position in the
    recipe, document id, text hash) is kept -- a rule that does not depend on the order documents are read in.
"""

from __future__ import annotations

import unicodedata
import numpy as np
import regex
import xxhash

from pipelines.dedup.config import DedupConfig

HASH_CHUNK = 4096  # shingles hashed at once: (112, 4096) uint64 = 3.7 MB, about cache-sized
# A word: letters, digits and the combining marks that belong to them. The `regex` module's \w is Unicode's word
# class, marks included; `re`'s leaves them out and cut words of Devanagari, Bengali, Thai, pointed Hebrew, ... into
# letters ('हिन्दी' -> ['ह', 'न', 'द']), so that two texts of the same script shared most of their shingles.
WORD = regex.compile(r"\w+")
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


# ---------------------------------------------------------------------------------------------------------------
# Text -> words -> shingles -> signatures


def normalized_words(text: str) -> list[str]:
    """Words of the text as dedup and decontamination compare them: NFKC, case-folded, punctuation dropped."""
    return WORD.findall(unicodedata.normalize("NFKC", text).casefold())


class WordHasher:
    """word -> stable uint64 (xxh3, no per-process salt), with a bounded cache: most words repeat."""

    def __init__(self, max_cache: int = 1 << 20):
        self._cache = _HashCache()
        self._max_cache = max_cache

    def __call__(self, words: list[str]) -> np.ndarray:
        if len(self._cache) > self._max_cache:
            self._cache.clear()
        # map() over the dict's C-level lookup: 3-4x faster than a Python loop over the words.
        return np.fromiter(map(self._cache.__getitem__, words), dtype=np.uint64, count=len(words))


class _HashCache(dict):
    def __missing__(self, word: str) -> int:
        h = self[word] = xxhash.xxh3_64_intdigest(word)
        return h


def ngram_hashes(word_hashes: np.ndarray, n: int) -> np.ndarray:
    """uint64 hash of every run of n consecutive words, (len - n + 1,); a text shorter than n is one n-gram."""
    if len(word_hashes) == 0:
        return np.empty(0, dtype=np.uint64)
    n = min(n, len(word_hashes))
    count = len(word_hashes) - n + 1
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps on purpose
        h = word_hashes[:count].copy()
        for k in range(1, n):
            h = h * _GOLDEN + word_hashes[k : k + count]
        return _mix(h)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every input bit reaches every output bit."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(30))
        h = h * _MIX1
        h = h ^ (h >> np.uint64(27))
        h = h * _MIX2
        return h ^ (h >> np.uint64(31))


class MinHasher:
    """Signatures of many documents at once: per permutation i, h_i(x) = x * a_i + b_i (odd a_i, mod 2^64) then
    an xorshift-multiply so high bits depend on all bits; the signature value is the min over the shingles."""

    def __init__(self, config: DedupConfig):
        rng = np.random.default_rng(config.seed)
        self.a = rng.integers(1, 2**63, size=config.permutations, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self.b = rng.integers(0, 2**63, size=config.permutations, dtype=np.uint64)
        self.config = config

    def signatures(self, shingle_sets: list[np.ndarray]) -> np.ndarray:
        """(D, P) uint32 signatures of D non-empty shingle sets, P = bands * rows."""
        sizes = np.array([len(s) for s in shingle_sets])
        assert sizes.min(initial=1) > 0, "every shingle set must be non-empty"
        flat = np.concatenate(shingle_sets)  # (S,)
        owner = np.repeat(np.arange(len(shingle_sets)), sizes)  # (S,) document of each shingle
        out = np.full((len(self.a), len(shingle_sets)), np.iinfo(np.uint64).max, dtype=np.uint64)  # (P, D)
        # Small chunks updated in place, laid out (P, chunk) so the per-document min runs along contiguous
        # memory: one big (S, P) temporary was 20x slower.
        for i in range(0, len(flat), HASH_CHUNK):
            x, who = flat[i : i + HASH_CHUNK], owner[i : i + HASH_CHUNK]
            with np.errstate(over="ignore"):
                y = self.a[:, None] * x[None, :]  # (P, chunk)
                y += self.b[:, None]
                y ^= y >> np.uint64(31)
                y *= _MIX2
            starts = np.flatnonzero(np.concatenate([[True], who[1:] != who[:-1]]))
            docs = who[starts]
            out[:, docs] = np.minimum(out[:, docs], np.minimum.reduceat(y, starts, axis=1))
        out = out.T  # (D, P)
        # The top 32 bits of the 64-bit values are as good a permutation, at half the disk.
        return (out >> np.uint64(32)).astype(np.uint32)

    def band_keys(self, signatures: np.ndarray) -> np.ndarray:
        """(D, bands) uint64: one key per band of `rows` signature values."""
        d = signatures.shape[0]
        rows = signatures.reshape(d, self.config.bands, self.config.rows).astype(np.uint64)
        with np.errstate(over="ignore"):
            key = np.zeros((d, self.config.bands), dtype=np.uint64)
            for r in range(self.config.rows):
                key = _mix(key * _GOLDEN + rows[:, :, r])
        return key


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    """Fraction of signature positions two documents share (per row of the (K, P) inputs)."""
    return (sig_a == sig_b).mean(axis=-1)


def run_pairs(sorted_keys: np.ndarray, order: np.ndarray, sorted_keys2: np.ndarray | None = None) -> np.ndarray:
    """Pairs linking every member of a run of equal keys to the run's first member and to its predecessor."""
    same = sorted_keys[1:] == sorted_keys[:-1]
    if sorted_keys2 is not None:
        same &= sorted_keys2[1:] == sorted_keys2[:-1]
    if not same.any():
        return np.empty((0, 2), dtype=np.int64)
    # Index of the first element of the run each position belongs to.
    starts = np.flatnonzero(np.concatenate([[True], ~same]))
    run_first = starts[np.searchsorted(starts, np.arange(len(sorted_keys)), side="right") - 1]
    members = np.flatnonzero(np.concatenate([[False], same]))
    first = np.stack([order[run_first[members]], order[members]], axis=1)
    previous = np.stack([order[members - 1], order[members]], axis=1)
    return np.concatenate([first, previous]).astype(np.int64)
