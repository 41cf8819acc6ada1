"""StoreResource (resources/store_resource.py): the configured URL opens the matching backend."""

from __future__ import annotations

from resources.store_resource import StoreResource
from storage.local import LocalStore
from storage.s3 import S3Store


def test_a_path_opens_a_local_store(tmp_path):
    store = StoreResource(url=str(tmp_path / "store")).open()
    assert isinstance(store, LocalStore) and store.url == str((tmp_path / "store").resolve())


def test_an_s3_url_opens_the_server_it_names(s3):
    store = StoreResource(url=f"s3://{s3.bucket}/outputs", endpoint_url=s3.endpoint).open()
    assert isinstance(store, S3Store)
    store.put_bytes("k", b"v")
    assert s3.client().get_object(Bucket=s3.bucket, Key="outputs/k")["Body"].read() == b"v"
