"""The packed-shard layout that the packer writes and the trainer's loader reads (the one place it is defined).

    out/train/part-00003.tokens.bin    a shard's token stream (uint16 when the vocabulary fits, else uint32), EOS
                                       after every document
    out/train/part-00003.offsets.bin   int64, documents + 1 values starting at 0: document d of the shard is
                                       tokens[offsets[d]:offsets[d + 1]] (its EOS last)
    out/index.json                     per split, the shards in stream order with their counts and sampled hashes

One shard per input shard of documents (named after it, never after a task), so the files do not depend on how
many tasks packed them. A source's split is the concatenation of its shards in index order: one logical token
stream with document boundaries, as a single pair of files would be. Every shard ends with the EOS of its last
document, so no document spans two shards.

The index records, for each file, its size and `sampled_sha256`: the sha256 of SAMPLE_BLOCKS blocks of
SAMPLE_BLOCK_BYTES at fixed offsets (start, middle, end). A reader checks a file with a few MiB of reads whatever
its size (the store verified the whole file's sha256 when it was downloaded; a local store's files are the
committed ones), so a trainer's start-up stays flat as the data grows.

This module imports numpy and the standard library only: trainer ranks import it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from storage.manifest import SAMPLE_BLOCK_BYTES, SAMPLE_BLOCKS, sampled_sha256

SPLITS = ("train", "val")
INDEX_FILE = "index.json"
INDEX_FORMAT = 2  # 1 was one pair of files per split (before issue 17)


def shard_files(split: str, shard: str) -> tuple[str, str]:
    """(tokens file, offsets file) of one shard, relative to the packed output's folder."""
    return f"{split}/{shard}.tokens.bin", f"{split}/{shard}.offsets.bin"


def shard_entry(out_dir: Path, split: str, shard: str, dtype: np.dtype) -> dict | None:
    """The index entry of one shard written under out_dir, or None when the shard has no document in `split`."""
    tokens_file, offsets_file = shard_files(split, shard)
    tokens_path, offsets_path = Path(out_dir) / tokens_file, Path(out_dir) / offsets_file
    if not tokens_path.exists():
        return None
    tokens_bytes, offsets_bytes = tokens_path.stat().st_size, offsets_path.stat().st_size
    return {
        "shard": shard,
        "tokens_file": tokens_file,
        "offsets_file": offsets_file,
        "tokens": tokens_bytes // np.dtype(dtype).itemsize,
        "documents": offsets_bytes // 8 - 1,
        "tokens_bytes": tokens_bytes,
        "offsets_bytes": offsets_bytes,
        "tokens_sampled_sha256": sampled_sha256(tokens_path),
        "offsets_sampled_sha256": sampled_sha256(offsets_path),
    }


def build_index(out_dir: Path, shards: list[str], *, dtype: str, eos_id: int, vocab_size: int) -> dict:
    """The index of the shards (in this order: the stream's) found under out_dir: per split the shards that have
    documents in it, with the split's total tokens and documents."""
    index = {"format": INDEX_FORMAT, "dtype": dtype, "eos_id": eos_id, "vocab_size": vocab_size,
             "sample": {"block_bytes": SAMPLE_BLOCK_BYTES, "blocks": SAMPLE_BLOCKS}, "splits": {}}
    for split in SPLITS:
        entries = [e for shard in shards if (e := shard_entry(out_dir, split, shard, np.dtype(dtype))) is not None]
        index["splits"][split] = {"tokens": sum(e["tokens"] for e in entries),
                                  "documents": sum(e["documents"] for e in entries), "shards": entries}
    return index


def write_index(out_dir: Path, index: dict) -> Path:
    path = Path(out_dir) / INDEX_FILE
    path.write_text(json.dumps(index, indent=1) + "\n")
    return path
