"""The packed layout's sampled hash and index: a few blocks of a large file, the whole of a small one; the index
lists only shards with documents in a split, in the order given."""

import hashlib

import numpy as np

from pipelines.packed_format import (
    SAMPLE_BLOCK_BYTES,
    build_index,
    sampled_blocks,
    sampled_sha256,
    shard_files,
)


def test_sampled_hash_reads_three_blocks_of_a_large_file_and_sees_a_changed_block(tmp_path):
    big = tmp_path / "big.bin"
    data = bytearray(np.random.default_rng(0).integers(0, 256, 10 * SAMPLE_BLOCK_BYTES, dtype=np.uint8).tobytes())
    big.write_bytes(bytes(data))
    blocks = sampled_blocks(len(data))
    assert blocks == [(0, SAMPLE_BLOCK_BYTES), (9 * SAMPLE_BLOCK_BYTES // 2, SAMPLE_BLOCK_BYTES),
                      (9 * SAMPLE_BLOCK_BYTES, SAMPLE_BLOCK_BYTES)]
    expected = hashlib.sha256(str(len(data)).encode())
    for offset, length in blocks:
        expected.update(bytes(data[offset:offset + length]))
    first = sampled_sha256(big)
    assert first == expected.hexdigest()
    data[-1] ^= 0xFF  # in the last block
    big.write_bytes(bytes(data))
    assert sampled_sha256(big) != first
    small = tmp_path / "small.bin"
    small.write_bytes(b"abc")
    assert sampled_blocks(3) == [(0, 3)]
    assert sampled_sha256(small) == hashlib.sha256(b"3abc").hexdigest()


def test_the_index_lists_shards_with_documents_in_the_order_given(tmp_path):
    for split, shard, lengths in (("train", "part-00001", [3, 2]), ("train", "part-00000", [4]), ("val", "part-00001", [5])):
        tokens_file, offsets_file = shard_files(split, shard)
        (tmp_path / split).mkdir(exist_ok=True)
        np.arange(sum(lengths), dtype=np.uint16).tofile(tmp_path / tokens_file)
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64).tofile(tmp_path / offsets_file)
    index = build_index(tmp_path, ["part-00001", "part-00000"], dtype="uint16", eos_id=0, vocab_size=300)
    train, val = index["splits"]["train"], index["splits"]["val"]
    assert [e["shard"] for e in train["shards"]] == ["part-00001", "part-00000"]
    assert (train["tokens"], train["documents"], val["tokens"], val["documents"]) == (9, 3, 5, 1)
    entry = train["shards"][0]
    assert (entry["tokens_bytes"], entry["offsets_bytes"]) == (10, 24)
    assert entry["tokens_sampled_sha256"] == sampled_sha256(tmp_path / "train" / "part-00001.tokens.bin")
