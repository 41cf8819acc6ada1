"""The S3 backend (storage/s3.py) against a real S3-compatible server on loopback: digests, credentials, retries, outages."""

from __future__ import annotations

import logging
import os
import pickle
import threading

import pytest

from storage.manifest import commit_folder, read_manifest
from storage.objects import ObjectInfo, StoreError
from storage.s3 import S3Store

from tests.storage.store_helpers import MiB, make_folder, sha, spy_puts


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
    # Longer than botocore's own request retries can wait (3 attempts, up to 1 + 2 s of jittered back-off), so
    # the whole operation fails at least once and the store's retries are what ride it out.
    threading.Timer(3.5, s3_proxy.up).start()
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
