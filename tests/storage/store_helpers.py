"""What the storage tests share: digests, a folder of files, and a spy on the keys a store is asked to write."""

from __future__ import annotations

import hashlib

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
