"""The store a URL names: `open_store` picks the backend, so every caller opens a store the same way.

    store = open_store("s3://bucket/prefix", endpoint_url="http://127.0.0.1:5000")   # S3Store
    store = open_store("/data/store")  # or file:///data/store: LocalStore

It lives apart from storage/objects.py (the contract both backends implement) so that the contract imports no
backend and the backends import only the contract: the modules form no import circle.
"""

from __future__ import annotations

import os
import urllib.parse

from storage.local import LocalStore
from storage.objects import URL_SCHEME, ObjectStore
from storage.s3 import S3Store


def open_store(url: str, **s3_options) -> ObjectStore:
    """s3://bucket/prefix -> S3Store(url, **s3_options); a path or file:// URI -> LocalStore.

    S3 options are ignored for a local store, so callers can pass one set of settings for either.
    """
    url = os.fspath(url)
    if url.startswith("s3://"):
        return S3Store(url, **s3_options)
    if url.startswith("file://"):
        parsed = urllib.parse.urlsplit(url)
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"a file:// store URL must name a local path (file:///abs/path): {url!r}")
        return LocalStore(urllib.parse.unquote(parsed.path))
    if URL_SCHEME.match(url):
        raise ValueError(f"unsupported store URL scheme (use a path, file:// or s3://): {url!r}")
    if not url:
        raise ValueError("empty store URL")
    return LocalStore(url)
