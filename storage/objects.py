"""Objects addressed by relative POSIX keys under one root, with a sha256 per object: the store's contract.

`ObjectStore` is the interface both backends (storage/local.py, storage/s3.py) implement; `open_store` picks
one from a URL. Keys are relative POSIX paths under the store root and both backends lay objects out the same
way, so a folder can be synced from one to the other. This package imports neither Dagster nor torch: the
asset layer, the data engine and the trainer all use it.

S3 configuration comes from the constructor or else from the environment that boto3 reads itself:
AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3), AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
Credentials stay inside boto3: this package never logs them nor puts them in an error or a repr.
"""

from __future__ import annotations

import abc
import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

CHUNK = 1 << 20
# In-progress local writes are named ".<name>.<random>.store-partial" next to their target; list() hides
# them and keys may not take that shape, so a crashed write can never be mistaken for an object.
_TMP_SUFFIX = ".store-partial"
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")

@dataclass(frozen=True)
class ObjectInfo:
    key: str
    bytes: int
    sha256: str


class StoreError(RuntimeError):
    """A store operation failed; the message names the URI, the operation and the cause."""


class ObjectNotFoundError(StoreError, FileNotFoundError):
    """The key does not exist (also a FileNotFoundError, so callers may catch either)."""


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(_TMP_SUFFIX)


def check_key(key: str, what: str = "key") -> str:
    """Return `key` if it is a relative POSIX path that stays under the store root, else ValueError."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"empty or non-string store {what}: {key!r}")
    if key.startswith("/"):
        raise ValueError(f"store {what} {key!r} is absolute; keys are relative to the store root")
    if "\\" in key or "\x00" in key:
        raise ValueError(f"store {what} {key!r} contains a backslash or NUL; keys are POSIX paths")
    if URL_SCHEME.match(key) or re.match(r"^[A-Za-z]:", key):
        raise ValueError(f"store {what} {key!r} looks like a URI or a drive; keys are relative paths")
    parts = key.split("/")
    # "." and "" would alias another key on disk but not on S3 ("a/./b" vs "a/b"); ".." escapes the root.
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"store {what} {key!r} has an empty, '.' or '..' segment")
    if is_temp_name(parts[-1]):
        raise ValueError(f"store {what} {key!r} is reserved for in-progress writes (*{_TMP_SUFFIX})")
    return key


def check_prefix(prefix: str) -> str:
    """A listing/commit prefix: "" (the root) or a key naming a folder; a trailing '/' is allowed."""
    prefix = prefix.rstrip("/") if isinstance(prefix, str) else prefix
    return "" if prefix == "" else check_key(prefix, "prefix")


def join_key(prefix: str, name: str) -> str:
    prefix = check_prefix(prefix)
    return f"{prefix}/{name}" if prefix else name


def file_chunks(path: str | os.PathLike) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def sha256_file(path: str | os.PathLike) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    for chunk in file_chunks(path):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def temp_path(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.{secrets.token_hex(6)}{_TMP_SUFFIX}"


def create_temp(dest: Path) -> tuple[Path, BinaryIO]:
    """A new temp file next to `dest` (same filesystem, so os.replace is atomic), mode from the umask."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(dest)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    return tmp, os.fdopen(fd, "wb")


def sync_close(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def rename_durably(tmp: Path, dest: Path) -> None:
    """Rename the (fsynced) temp file into place and fsync the folder: after a crash, old or new, never half."""
    os.replace(tmp, dest)
    dir_fd = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_atomic(dest: Path, chunks: Iterable[bytes]) -> tuple[int, str]:
    """Write `chunks` to `dest` atomically, hashing on the way; returns (bytes, sha256)."""
    tmp, f = create_temp(dest)
    digest, size = hashlib.sha256(), 0
    try:
        with f:
            for chunk in chunks:
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            sync_close(f)
        rename_durably(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size, digest.hexdigest()


class ObjectStore(abc.ABC):
    """Objects addressed by relative POSIX keys under one root (`url`)."""

    url: str

    @abc.abstractmethod
    def uri(self, key: str) -> str:
        """The full URI of `key`: file:///abs/root/key or s3://bucket/prefix/key."""

    @abc.abstractmethod
    def put_file(self, key: str, path: str | os.PathLike) -> ObjectInfo: ...

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> ObjectInfo: ...

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """The object's content; ObjectNotFoundError when it does not exist."""

    @abc.abstractmethod
    def download(self, key: str, path: str | os.PathLike) -> None:
        """Copy the object to a local file atomically (temp file, then rename); parents are created."""

    @abc.abstractmethod
    def open_read(self, key: str) -> BinaryIO:
        """A streaming binary reader; close it (use it as a context manager)."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys (relative to the root) of the objects in the folder `prefix` ("" = everything)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error."""

    def local_path(self, key: str) -> Path | None:
        """Where the object or folder `key` already is on this machine's disk, or None (S3)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
