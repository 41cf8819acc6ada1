"""The local backend: a plain folder, every write atomic (temp file in the target's folder, fsync, rename)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from storage.objects import (
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    check_key,
    check_prefix,
    file_chunks,
    is_temp_name,
    write_atomic,
)


class LocalStore(ObjectStore):
    """A plain folder. Every write goes to a temp file in the target's folder, is fsynced, then renamed."""

    def __init__(self, root: str | os.PathLike):
        self._root = Path(root).expanduser().resolve()
        self.url = str(self._root)

    def _path(self, key: str) -> Path:
        return self._root / check_key(key)

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def put_file(self, key: str, path: str | os.PathLike) -> ObjectInfo:
        dest = self._path(key)
        size, sha = write_atomic(dest, file_chunks(path))
        return ObjectInfo(key, size, sha)

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        size, sha = write_atomic(self._path(key), [bytes(data)])
        return ObjectInfo(key, size, sha)

    def get_bytes(self, key: str) -> bytes:
        with self.open_read(key) as f:
            return f.read()

    def download(self, key: str, path: str | os.PathLike) -> None:
        src = self._path(key)
        if not src.is_file():
            raise ObjectNotFoundError(f"no object at {self.uri(key)} (download)")
        write_atomic(Path(path), file_chunks(src))

    def open_read(self, key: str) -> BinaryIO:
        path = self._path(key)
        try:
            return open(path, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFoundError(f"no object at {self.uri(key)} (open_read): {exc}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        prefix = check_prefix(prefix)
        base = self._root / prefix if prefix else self._root
        keys = []
        # os.walk does not follow symlinked folders, so the walk never leaves the root.
        for dirpath, _, filenames in os.walk(base):
            for name in filenames:
                path = Path(dirpath, name)
                if not is_temp_name(name) and path.is_file():
                    keys.append(path.relative_to(self._root).as_posix())
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


# --- S3 ----------------------------------------------------------------------------------------------
