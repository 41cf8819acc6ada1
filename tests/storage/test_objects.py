"""The store's contract (storage/objects.py), held by both backends: a local folder and a real S3 server on loopback."""

from __future__ import annotations

import gzip
import hashlib
import json
import os

import pytest

from storage.local import LocalStore
from storage.manifest import read_manifest
from storage.objects import ObjectInfo, ObjectNotFoundError
from storage.s3 import S3Store

from tests.storage.store_helpers import MiB, sha


def test_put_get_exists_list_delete(store, tmp_path):
    assert store.list() == []
    info = store.put_bytes("a/b/one.txt", b"one")
    assert info == ObjectInfo("a/b/one.txt", 3, sha(b"one"))
    src = tmp_path / "two.bin"
    src.write_bytes(b"\x00two")
    assert store.put_file("a/two.bin", src) == ObjectInfo("a/two.bin", 4, sha(b"\x00two"))
    store.put_bytes("z.txt", b"")

    assert store.get_bytes("a/b/one.txt") == b"one"
    assert store.get_bytes("z.txt") == b""
    assert store.exists("a/two.bin") and not store.exists("a/missing") and not store.exists("a")
    assert store.list() == ["a/b/one.txt", "a/two.bin", "z.txt"]
    assert store.list("a") == store.list("a/") == ["a/b/one.txt", "a/two.bin"]
    assert store.list("a/b") == ["a/b/one.txt"]
    assert store.list("nothing/here") == []

    store.put_bytes("a/b/one.txt", b"replaced")
    assert store.get_bytes("a/b/one.txt") == b"replaced"
    store.delete("a/b/one.txt")
    store.delete("a/b/one.txt")  # deleting a missing key is not an error
    assert not store.exists("a/b/one.txt")
    assert store.list() == ["a/two.bin", "z.txt"]


def test_uri_names_the_backend(store):
    uri = store.uri("x/y.bin")
    if isinstance(store, S3Store):
        assert uri == f"{store.url}/x/y.bin" and uri.startswith("s3://test-") and store.url.endswith("/root/prefix")
    else:
        assert uri == f"file://{store.url}/x/y.bin" and os.path.isabs(store.url)


def test_prefix_is_a_folder_not_a_string_prefix(store):
    store.put_bytes("a/b/x", b"1")
    store.put_bytes("a/bc/y", b"2")
    store.put_bytes("a/b.txt", b"3")
    assert store.list("a/b") == ["a/b/x"]


def test_missing_objects(store, tmp_path):
    for call in (lambda: store.get_bytes("no/such"), lambda: store.download("no/such", tmp_path / "out")):
        with pytest.raises(ObjectNotFoundError, match="no/such"):
            call()
    with pytest.raises(FileNotFoundError):  # ObjectNotFoundError is one too
        store.open_read("no/such")
    assert not (tmp_path / "out").exists()
    assert read_manifest(store, "never/committed") is None


@pytest.mark.parametrize(
    "key",
    ["", "/etc/passwd", "../outside", "a/../../outside", "a/..", "./a", "a//b", "a/", "a\\b"]
    + ["s3://b/k", "file:///x", "C:/x", ".x.0123.store-partial"],
)
def test_keys_are_confined_to_the_root(store, key):
    for call in (
        lambda: store.put_bytes(key, b"x"),
        lambda: store.get_bytes(key),
        lambda: store.exists(key),
        lambda: store.delete(key),
        lambda: store.uri(key),
        lambda: store.open_read(key),
    ):
        with pytest.raises(ValueError, match="store key") as info:
            call()
        assert repr(key) in str(info.value)
    assert store.list() == []


def test_list_stays_inside_the_root(store, s3_or_none, tmp_path):
    store.put_bytes("in/side", b"1")
    if isinstance(store, S3Store):
        # Objects beside and above the store's prefix, in the same bucket.
        client = s3_or_none.client()
        for key in ("outside", "root/prefix2/x", "root/prefixed", "root/x"):
            client.put_object(Bucket=store.bucket, Key=key, Body=b"0")
    else:
        (tmp_path / "store2").mkdir()
        (tmp_path / "store2" / "x").write_bytes(b"0")
        (tmp_path / "outside").write_bytes(b"0")
        os.symlink(tmp_path, tmp_path / "store" / "link-to-parent")  # a symlinked folder is not walked
        (tmp_path / "store" / "in" / ".side.5eed.store-partial").write_bytes(b"")  # a crashed write's temp file
    assert store.list() == ["in/side"]
    with pytest.raises(ValueError):
        store.list("../")


def test_large_object_round_trips_through_multipart(store, s3_or_none, tmp_path):
    data = os.urandom(100 * MiB)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    info = store.put_file("big/blob.bin", src)
    assert info == ObjectInfo("big/blob.bin", len(data), sha(data))
    if isinstance(store, S3Store):
        head = s3_or_none.client().head_object(Bucket=store.bucket, Key="root/prefix/big/blob.bin")
        # A multipart ETag is "<md5 of the part md5s>-<parts>": 100 MiB in 8 MiB parts is 13 parts.
        assert head["ETag"].strip('"').endswith("-13"), head["ETag"]
        assert head["Metadata"]["sha256"] == sha(data)

    out = tmp_path / "dl" / "big.bin"
    store.download("big/blob.bin", out)
    assert out.read_bytes() == data
    assert sorted(os.listdir(out.parent)) == ["big.bin"]  # no temp file left behind
    digest = hashlib.sha256()
    with store.open_read("big/blob.bin") as reader:
        while chunk := reader.read(4 * MiB):
            digest.update(chunk)
    assert digest.hexdigest() == sha(data)


def test_failed_write_keeps_the_old_object(store, tmp_path):
    store.put_bytes("k", b"old")
    with pytest.raises(FileNotFoundError):
        store.put_file("k", tmp_path / "no-such-source")
    assert store.get_bytes("k") == b"old"
    if isinstance(store, LocalStore):
        assert os.listdir(store.url) == ["k"]  # the temp file is gone too


def test_open_read_streams_lines_through_gzip(store):
    lines = [json.dumps({"id": i, "text": "x" * i}) for i in range(2000)]
    store.put_bytes("docs.jsonl.gz", gzip.compress("\n".join(lines).encode()))
    with store.open_read("docs.jsonl.gz") as raw, gzip.open(raw, "rt") as reader:
        assert [line.rstrip("\n") for line in reader] == lines


def test_download_replaces_an_existing_file(store, tmp_path):
    store.put_bytes("k", b"new")
    out = tmp_path / "out.bin"
    out.write_bytes(b"old content")
    store.download("k", out)
    assert out.read_bytes() == b"new" and os.listdir(tmp_path).count("out.bin") == 1


# --- S3 only -----------------------------------------------------------------------------------------


@pytest.fixture
def s3_or_none(request):
    """The S3 environment when the test runs against the S3 store, else None."""
    return request.getfixturevalue("s3") if request.node.callspec.params.get("store") == "s3" else None
