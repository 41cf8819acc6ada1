"""The packed layout's index: it lists only shards with documents in a split, in the order given, with their sampled
hashes (storage/manifest.py)."""


import numpy as np

from pipelines.tokenization.packed_format import build_index, shard_files
from storage.manifest import sampled_sha256


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
