"""The commit protocol (storage/manifest.py) on both backends: every file first, the manifest last, nothing on bad input."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from storage.local import LocalStore
from storage.manifest import SAMPLE_BLOCK_BYTES, commit_folder, data_version_of, read_manifest, sampled_blocks, sampled_sha256
from storage.objects import StoreError

from tests.storage.store_helpers import make_folder, sha, spy_puts


def test_commit_folder_writes_every_file_then_the_manifest(store, tmp_path, monkeypatch):
    files = {"part-0.jsonl": b"a" * 1000, "sub/part-1.jsonl": b"b" * 10, "sub/deeper/z": b""}
    local = make_folder(tmp_path / "work", files)
    calls = spy_puts(store, monkeypatch)
    given = {"asset": "curation/web/filtered", "files": [{"path": "part-0.jsonl", "records": 1000}]}

    manifest = commit_folder(store, "curation/web/filtered/v1", local, given)

    assert calls[-1] == "curation/web/filtered/v1/manifest.json" and len(calls) == 4  # the marker comes last
    assert manifest is given  # completed in place and returned
    assert manifest["files"] == [
        {"path": "part-0.jsonl", "bytes": 1000, "sha256": sha(files["part-0.jsonl"]), "records": 1000},
        {"path": "sub/deeper/z", "bytes": 0, "sha256": sha(b"")},
        {"path": "sub/part-1.jsonl", "bytes": 10, "sha256": sha(files["sub/part-1.jsonl"])},
    ]
    assert manifest["data_version"] == data_version_of(manifest["files"])
    assert read_manifest(store, "curation/web/filtered/v1") == manifest
    assert read_manifest(store, "curation/web/filtered/v1/") == manifest
    for entry in manifest["files"]:
        assert sha(store.get_bytes(f"curation/web/filtered/v1/{entry['path']}")) == entry["sha256"]
    if isinstance(store, LocalStore):
        root = tmp_path / "store" / "curation/web/filtered/v1"
        marker = (root / "manifest.json").stat().st_mtime_ns
        assert all(marker >= (root / rel).stat().st_mtime_ns for rel in files)


def test_commit_folder_failing_upload_leaves_no_manifest(store, tmp_path, monkeypatch):
    local = make_folder(tmp_path / "work", {"a": b"1", "b": b"2", "c": b"3"})
    put_file = store.put_file

    def fail_on_b(key, path):
        if key.endswith("/b"):
            raise StoreError("injected failure for " + store.uri(key))
        return put_file(key, path)

    monkeypatch.setattr(store, "put_file", fail_on_b)
    with pytest.raises(StoreError, match="injected"):
        commit_folder(store, "out/v1", local, {})
    assert store.list("out/v1") == ["out/v1/a"]
    assert read_manifest(store, "out/v1") is None


def test_commit_folder_refuses_bad_input_before_uploading(store, tmp_path):
    with_marker = make_folder(tmp_path / "w1", {"data": b"1", "manifest.json": b"{}"})
    with pytest.raises(ValueError, match="manifest.json"):
        commit_folder(store, "out/v1", with_marker, {})
    plain = make_folder(tmp_path / "w2", {"data": b"1"})
    with pytest.raises(ValueError, match="ghost"):
        commit_folder(store, "out/v1", plain, {"files": [{"path": "ghost", "records": 3}]})
    with pytest.raises(ValueError, match="store prefix"):
        commit_folder(store, "../out", plain, {})
    with pytest.raises(ValueError, match="not a folder"):
        commit_folder(store, "out/v1", tmp_path / "missing", {})
    assert store.list() == []


def test_data_version_of():
    files = [{"path": "b", "sha256": "22", "records": 5}, {"path": "a", "sha256": "11"}]
    assert data_version_of(files) == sha(b"a:11\nb:22\n") == data_version_of(files[::-1])
    assert data_version_of([]) == sha(b"")


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
