"""storage/factory.py: a URL opens the backend it names, against a local folder and a real S3 server on loopback."""

from __future__ import annotations

import pytest

from storage.factory import open_store
from storage.local import LocalStore
from storage.s3 import S3Store


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

