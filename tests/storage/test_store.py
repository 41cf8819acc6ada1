"""The object store against both backends (a local folder and a real S3 server on loopback)."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import pickle
import threading

import pytest

from storage.local import LocalStore
from storage.manifest import commit_folder, data_version_of, read_manifest
from storage.objects import ObjectInfo, ObjectNotFoundError, StoreError, open_store
from storage.s3 import S3Store

MiB = 2**20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_folder(root, files: dict[str, bytes]):
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def spy_puts(store, monkeypatch, after_put=None) -> list[str]:
    """Record the keys `store` is asked to write, in order; `after_put(n)` runs after the n-th put_file."""
    calls = []
    put_file, put_bytes = store.put_file, store.put_bytes

    def spied_put_file(key, path):
        calls.append(key)
        info = put_file(key, path)
        if after_put:
            after_put(len(calls))
        return info

    def spied_put_bytes(key, data):
        calls.append(key)
        return put_bytes(key, data)

    monkeypatch.setattr(store, "put_file", spied_put_file)
    monkeypatch.setattr(store, "put_bytes", spied_put_bytes)
    return calls


# --- both backends -----------------------------------------------------------------------------------


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


def test_open_store_picks_the_backend(tmp_path, s3):
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    local = open_store(f"file://{tmp_path}/x")
    assert isinstance(local, LocalStore) and local.url == str((tmp_path / "x").resolve())
    remote = open_store(f"s3://{s3.bucket}/a/b/", max_attempts=2)
    assert isinstance(remote, S3Store) and remote.url == f"s3://{s3.bucket}/a/b" and remote.max_attempts == 2
    assert open_store(f"s3://{s3.bucket}").uri("k") == f"s3://{s3.bucket}/k"
    for bad in ("gs://bucket/x", "s3://", "s3:///x", "s3://bucket/../x", ""):
        with pytest.raises(ValueError):
            open_store(bad)


# --- S3 only -----------------------------------------------------------------------------------------


@pytest.fixture
def s3_or_none(request):
    """The S3 environment when the test runs against the S3 store, else None."""
    return request.getfixturevalue("s3") if request.node.callspec.params.get("store") == "s3" else None


def test_s3_sha256_is_stored_and_verified(s3, tmp_path):
    store = S3Store(f"s3://{s3.bucket}/p")
    info = store.put_bytes("k", b"payload")
    client = s3.client()
    assert client.head_object(Bucket=s3.bucket, Key="p/k")["Metadata"] == {"sha256": info.sha256}
    # Change the content behind the store's back, keeping the recorded digest: reads must notice.
    client.put_object(Bucket=s3.bucket, Key="p/k", Body=b"tampered", Metadata={"sha256": info.sha256})
    with pytest.raises(StoreError, match="sha256"):
        store.get_bytes("k")
    with pytest.raises(StoreError, match="sha256"):
        store.download("k", tmp_path / "out")
    assert os.listdir(tmp_path) == []


def test_s3_store_keeps_credentials_out_of_repr_and_pickles(s3):
    store = S3Store(f"s3://{s3.bucket}/p", max_attempts=2)
    assert s3.secret not in repr(store) and repr(store) == f"S3Store('s3://{s3.bucket}/p')"
    copy = pickle.loads(pickle.dumps(store))
    store.put_bytes("k", b"v")
    assert copy.get_bytes("k") == b"v" and copy.max_attempts == 2


def test_s3_permanent_errors_are_not_retried(s3, caplog):
    store = S3Store("s3://no-such-bucket-here/p", max_attempts=5, backoff_base=5)
    expected = r"S3 put_bytes of s3://no-such-bucket-here/p/k failed \(not retryable.*NoSuchBucket"
    with pytest.raises(StoreError, match=expected):
        store.put_bytes("k", b"v")
    assert not [r for r in caplog.records if r.name == "storage.s3"]


def test_s3_retries_ride_out_a_short_outage(s3, s3_proxy, caplog):
    caplog.set_level(logging.WARNING, logger="storage.s3")
    store = S3Store(f"s3://{s3.bucket}/p", endpoint_url=s3_proxy.url, max_attempts=6, backoff_base=0.1)
    s3_proxy.down()
    threading.Timer(0.5, s3_proxy.up).start()
    assert store.put_bytes("k", b"made it") == ObjectInfo("k", 7, sha(b"made it"))
    assert store.get_bytes("k") == b"made it"
    retries = [r.getMessage() for r in caplog.records if r.name == "storage.s3"]
    assert retries and all("s3://" in m and "/p/k" in m and "/6)" in m for m in retries)


def test_s3_server_killed_mid_commit(s3, tmp_path, monkeypatch, caplog):
    """The real server process is killed after the first file of a commit.

    The next upload is refused at the socket, retried max_attempts times, then StoreError names the
    URI, the operation and the attempts; the manifest is never even attempted (checked on the calls
    the store received, since moto keeps its state in memory and a restarted server is empty; the
    proxy test below checks what stays visible on a server that lives on).
    """
    caplog.set_level(logging.WARNING, logger="storage.s3")
    store = S3Store(f"s3://{s3.bucket}/p", max_attempts=3, backoff_base=0.05, connect_timeout=1)
    local = make_folder(tmp_path / "work", {"a": b"1" * 100, "b": b"2" * 100, "c": b"3" * 100})
    calls = spy_puts(store, monkeypatch, after_put=lambda n: n == 1 and s3.stop())

    with pytest.raises(StoreError) as info:
        commit_folder(store, "out/v1", local, {})

    message = str(info.value)
    assert f"S3 put_file of s3://{s3.bucket}/p/out/v1/b failed after 3 attempts" in message
    assert "EndpointConnectionError" in message or "Connect" in message
    assert calls == ["out/v1/a", "out/v1/b"]  # never "out/v1/manifest.json"
    retries = [r for r in caplog.records if r.name == "storage.s3"]
    assert [r.levelno for r in retries] == [logging.WARNING] * 2
    assert "attempt 1/3" in retries[0].getMessage() and "attempt 2/3" in retries[1].getMessage()
    assert s3.secret not in message + caplog.text + repr(info.value.__cause__)

    s3.start()  # back, empty: the store works again
    assert store.list() == []
    assert commit_folder(store, "out/v1", local, {})["data_version"] == read_manifest(store, "out/v1")["data_version"]


def test_s3_network_cut_mid_commit_leaves_only_complete_objects(s3, s3_proxy, tmp_path, monkeypatch, caplog):
    """The network to a live server is cut after the first file of a commit, then restored.

    Cutting a TCP relay (not the server) keeps the server's state, so after the StoreError we can look:
    only the file uploaded before the cut is visible, it is whole, and there is no manifest, so
    readers see the output as missing. A second commit then completes it.
    """
    caplog.set_level(logging.WARNING, logger="storage.s3")
    # b is multipart (3 parts of 5 MiB): no half of it may show.
    store = S3Store(
        f"s3://{s3.bucket}/p", endpoint_url=s3_proxy.url, max_attempts=3, backoff_base=0.05,
        multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, connect_timeout=1,
    )
    files = {"a": b"1" * 100, "b": os.urandom(12 * MiB), "c": b"3" * 100}
    local = make_folder(tmp_path / "work", files)
    spy_puts(store, monkeypatch, after_put=lambda n: n == 1 and s3_proxy.down())

    with pytest.raises(StoreError, match=rf"S3 put_file of s3://{s3.bucket}/p/out/v1/b failed after 3 attempts"):
        commit_folder(store, "out/v1", local, {})
    assert len([r for r in caplog.records if r.name == "storage.s3"]) == 2

    s3_proxy.up()
    assert store.list() == ["out/v1/a"]
    assert store.get_bytes("out/v1/a") == files["a"]
    assert read_manifest(store, "out/v1") is None
    assert "Uploads" not in s3.client().list_multipart_uploads(Bucket=s3.bucket)

    manifest = commit_folder(store, "out/v1", local, {})
    assert store.list("out/v1") == ["out/v1/a", "out/v1/b", "out/v1/c", "out/v1/manifest.json"]
    assert read_manifest(store, "out/v1") == manifest


def test_s3_failed_multipart_upload_is_aborted(s3, s3_proxy, tmp_path):
    """Every UploadPart request is reset by the relay: the upload fails, and each attempt's multipart
    upload is aborted, so no object and no pending upload (invisible but billed) remain."""
    store = S3Store(
        f"s3://{s3.bucket}/p", endpoint_url=s3_proxy.url, max_attempts=2, backoff_base=0.05,
        multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB,
    )
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(11 * MiB))
    s3_proxy.block(b"partNumber=")
    with pytest.raises(StoreError, match="failed after 2 attempts"):
        store.put_file("big.bin", src)
    s3_proxy.block(None)
    assert not store.exists("big.bin") and store.list() == []
    assert "Uploads" not in s3.client().list_multipart_uploads(Bucket=s3.bucket)
