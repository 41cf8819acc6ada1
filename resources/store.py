"""The object store: a local folder or S3, with sha256 per object and manifests as commit markers.

Shared by the Dagster layer and the trainer, so it imports neither Dagster nor torch:

    from resources.store import open_store, commit_folder, read_manifest
    store = open_store("s3://bucket/prefix")          # or a local path / file:// URI
    manifest = commit_folder(store, "curation/web/filtered/9f3c", work_dir, {"asset": ...})
    read_manifest(store, "curation/web/filtered/9f3c")  # None while the output is missing or incomplete

Keys are relative POSIX paths under the store root; both backends lay objects out the same way, so a
folder can be synced from one to the other. An output is committed when its `manifest.json` exists:
`commit_folder` writes it after every file, so a reader never sees a half-written output.

S3 configuration comes from the constructor or else from the environment that boto3 reads itself:
AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3), AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
Credentials stay inside boto3: this module never logs them nor puts them in an error or a repr.
"""

from __future__ import annotations

import abc
import hashlib
import io
import json
import logging
import os
import random
import re
import secrets
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, TypeVar

log = logging.getLogger("resources.store")

MANIFEST = "manifest.json"
_CHUNK = 1 << 20
# In-progress local writes are named ".<name>.<random>.store-partial" next to their target; list() hides
# them and keys may not take that shape, so a crashed write can never be mistaken for an object.
_TMP_SUFFIX = ".store-partial"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_T = TypeVar("_T")


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    bytes: int
    sha256: str


class StoreError(RuntimeError):
    """A store operation failed; the message names the URI, the operation and the cause."""


class ObjectNotFoundError(StoreError, FileNotFoundError):
    """The key does not exist (also a FileNotFoundError, so callers may catch either)."""


def _is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(_TMP_SUFFIX)


def check_key(key: str, what: str = "key") -> str:
    """Return `key` if it is a relative POSIX path that stays under the store root, else ValueError."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"empty or non-string store {what}: {key!r}")
    if key.startswith("/"):
        raise ValueError(f"store {what} {key!r} is absolute; keys are relative to the store root")
    if "\\" in key or "\x00" in key:
        raise ValueError(f"store {what} {key!r} contains a backslash or NUL; keys are POSIX paths")
    if _SCHEME.match(key) or re.match(r"^[A-Za-z]:", key):
        raise ValueError(f"store {what} {key!r} looks like a URI or a drive; keys are relative paths")
    parts = key.split("/")
    # "." and "" would alias another key on disk but not on S3 ("a/./b" vs "a/b"); ".." escapes the root.
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"store {what} {key!r} has an empty, '.' or '..' segment")
    if _is_temp_name(parts[-1]):
        raise ValueError(f"store {what} {key!r} is reserved for in-progress writes (*{_TMP_SUFFIX})")
    return key


def _check_prefix(prefix: str) -> str:
    """A listing/commit prefix: "" (the root) or a key naming a folder; a trailing '/' is allowed."""
    prefix = prefix.rstrip("/") if isinstance(prefix, str) else prefix
    return "" if prefix == "" else check_key(prefix, "prefix")


def _join(prefix: str, name: str) -> str:
    prefix = _check_prefix(prefix)
    return f"{prefix}/{name}" if prefix else name


def _file_chunks(path: str | os.PathLike) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def _sha256_file(path: str | os.PathLike) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    for chunk in _file_chunks(path):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def _temp_path(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.{secrets.token_hex(6)}{_TMP_SUFFIX}"


def _create_temp(dest: Path) -> tuple[Path, BinaryIO]:
    """A new temp file next to `dest` (same filesystem, so os.replace is atomic), mode from the umask."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_path(dest)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    return tmp, os.fdopen(fd, "wb")


def _sync_close(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def _rename_durably(tmp: Path, dest: Path) -> None:
    """Rename the (fsynced) temp file into place and fsync the folder: after a crash, old or new, never half."""
    os.replace(tmp, dest)
    dir_fd = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write_atomic(dest: Path, chunks: Iterable[bytes]) -> tuple[int, str]:
    """Write `chunks` to `dest` atomically, hashing on the way; returns (bytes, sha256)."""
    tmp, f = _create_temp(dest)
    digest, size = hashlib.sha256(), 0
    try:
        with f:
            for chunk in chunks:
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            _sync_close(f)
        _rename_durably(tmp, dest)
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
        size, sha = _write_atomic(dest, _file_chunks(path))
        return ObjectInfo(key, size, sha)

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        size, sha = _write_atomic(self._path(key), [bytes(data)])
        return ObjectInfo(key, size, sha)

    def get_bytes(self, key: str) -> bytes:
        with self.open_read(key) as f:
            return f.read()

    def download(self, key: str, path: str | os.PathLike) -> None:
        src = self._path(key)
        if not src.is_file():
            raise ObjectNotFoundError(f"no object at {self.uri(key)} (download)")
        _write_atomic(Path(path), _file_chunks(src))

    def open_read(self, key: str) -> BinaryIO:
        path = self._path(key)
        try:
            return open(path, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFoundError(f"no object at {self.uri(key)} (open_read): {exc}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        prefix = _check_prefix(prefix)
        base = self._root / prefix if prefix else self._root
        keys = []
        # os.walk does not follow symlinked folders, so the walk never leaves the root.
        for dirpath, _, filenames in os.walk(base):
            for name in filenames:
                path = Path(dirpath, name)
                if not _is_temp_name(name) and path.is_file():
                    keys.append(path.relative_to(self._root).as_posix())
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


# --- S3 ----------------------------------------------------------------------------------------------

# Error codes S3 (and S3-compatible servers) use for "slow down / try again", whatever the HTTP status.
_TRANSIENT_CODES = {
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled", "SlowDown",
    "TooManyRequestsException", "RequestLimitExceeded", "BandwidthLimitExceeded",
    "RequestTimeout", "RequestTimeoutException", "InternalError", "ServiceUnavailable",
}
_NOT_FOUND_CODES = {"NoSuchKey", "NotFound", "404"}


def _unwrap(exc: BaseException) -> BaseException:
    """The botocore error behind boto3's / s3transfer's wrappers (they hide the type we classify on)."""
    from boto3.exceptions import RetriesExceededError, S3UploadFailedError
    from s3transfer.exceptions import RetriesExceededError as TransferRetriesExceededError

    if isinstance(exc, (RetriesExceededError, TransferRetriesExceededError)) and exc.last_exception:
        return exc.last_exception
    if isinstance(exc, S3UploadFailedError):  # raised inside `except ClientError`, which is its context
        return exc.__cause__ or exc.__context__ or exc
    return exc


def _client_error_status(exc: BaseException) -> tuple[int, str]:
    response = getattr(exc, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return int(status), str(response.get("Error", {}).get("Code", ""))


def _is_transient(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, IncompleteReadError

    # ConnectionError: refused, connect timeout, DNS. HTTPClientError: reset/closed, read timeout, broken stream.
    if isinstance(exc, (ConnectionError, HTTPClientError, IncompleteReadError)):
        return True
    if isinstance(exc, ClientError):
        status, code = _client_error_status(exc)
        return status >= 500 or status == 429 or code in _TRANSIENT_CODES
    return False


def _is_not_found(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError) and _client_error_status(exc)[1] in _NOT_FOUND_CODES


class S3Store(ObjectStore):
    """`s3://bucket/prefix` through boto3: multipart transfers, retries, sha256 in object metadata.

    Two layers of retries: botocore retries single requests (e.g. one part of a multipart upload,
    standard mode, 3 attempts), and `_call` retries whole operations `max_attempts` times with
    exponential backoff, so an outage longer than botocore's few quick tries is still ridden out.
    """

    _REQUEST_ATTEMPTS = 3  # botocore's per-request attempts (standard retry mode)

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        multipart_threshold: int = 8 * 2**20,
        multipart_chunksize: int = 8 * 2**20,
        max_concurrency: int = 4,
        max_attempts: int = 5,
        backoff_base: float = 0.2,
        connect_timeout: float = 5,
        read_timeout: float = 30,
    ):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"not an S3 URL (expected s3://bucket[/prefix]): {url!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if parsed.query or parsed.fragment:
            raise ValueError(f"an S3 URL takes no query or fragment: {url!r}")
        self.bucket = parsed.netloc
        self.prefix = _check_prefix(parsed.path.lstrip("/"))
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.endpoint_url = endpoint_url
        self.region = region
        self.multipart_threshold = multipart_threshold
        self.multipart_chunksize = multipart_chunksize
        self.max_concurrency = max_concurrency
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._client = self._make_client()

    def _make_client(self):
        """Build the boto3 client (and the transfer settings); also called after unpickling."""
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        # An explicit endpoint is usually an S3-compatible server (MinIO, moto, Ceph), which wants
        # path-style addressing (http://host/bucket/key) rather than bucket-named hosts.
        env = os.environ
        custom_endpoint = self.endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        config = Config(
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            retries={"mode": "standard", "total_max_attempts": self._REQUEST_ATTEMPTS},
            s3={"addressing_style": "path"} if custom_endpoint else None,
            max_pool_connections=max(10, self.max_concurrency + 2),
        )
        self._transfer = TransferConfig(
            multipart_threshold=self.multipart_threshold,
            multipart_chunksize=self.multipart_chunksize,
            max_concurrency=self.max_concurrency,
            use_threads=True,
        )
        # A session of our own: boto3's default session is not safe to share between threads.
        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config
        )

    def __getstate__(self):
        # boto3 clients do not pickle; rebuild from the settings (credentials come from the environment).
        state = dict(self.__dict__)
        del state["_client"], state["_transfer"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._client = self._make_client()

    def _full(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._full(key)}"

    def _call(self, op: str, uri: str, fn: Callable[[], _T]) -> _T:
        """Run `fn` (one whole operation), retrying transient failures with exponential backoff."""
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError
        from s3transfer.exceptions import RetriesExceededError as TransferRetriesExceededError

        for attempt in range(1, self.max_attempts + 1):
            try:
                return fn()
            except (BotoCoreError, ClientError, Boto3Error, TransferRetriesExceededError) as exc:
                cause = _unwrap(exc)
                why = f"{type(cause).__name__}: {cause}"
                if _is_not_found(cause):
                    raise ObjectNotFoundError(f"no object at {uri} (S3 {op}): {why}") from exc
                if not _is_transient(cause):
                    raise StoreError(f"S3 {op} of {uri} failed (not retryable, attempt {attempt}): {why}") from exc
                if attempt == self.max_attempts:
                    raise StoreError(f"S3 {op} of {uri} failed after {attempt} attempts: {why}") from exc
                delay = self.backoff_base * 2 ** (attempt - 1)
                delay += random.uniform(0, delay / 2)  # jitter: clients that failed together retry apart
                log.warning(
                    "S3 %s of %s failed (attempt %d/%d): %s; retrying in %.2fs",
                    op, uri, attempt, self.max_attempts, why, delay,
                )
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _upload(self, op: str, key: str, source: bytes | str | os.PathLike, size: int, sha: str) -> ObjectInfo:
        """Upload through the transfer manager: multipart above the threshold, parts in parallel.

        On a failed multipart upload s3transfer aborts it (a failure cleanup), so its parts are
        dropped; S3 never shows an object whose upload was not completed, so nothing half is visible.
        """
        extra = {"Metadata": {"sha256": sha}}
        full = self._full(key)

        def attempt():
            if isinstance(source, bytes):
                # A fresh reader per attempt: a failed attempt may have consumed part of the last one.
                reader = io.BytesIO(source)
                self._client.upload_fileobj(reader, self.bucket, full, extra, Config=self._transfer)
            else:
                self._client.upload_file(os.fspath(source), self.bucket, full, extra, Config=self._transfer)

        self._call(op, self.uri(key), attempt)
        return ObjectInfo(key, size, sha)

    def put_file(self, key: str, path: str | os.PathLike) -> ObjectInfo:
        # The digest goes into the object's metadata, which S3 fixes when the upload is created, so it
        # must be known first: one hashing pass (~1 GB/s) ahead of the upload, which is far slower.
        self._full(key)
        size, sha = _sha256_file(path)
        return self._upload("put_file", key, path, size, sha)

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        data = bytes(data)
        return self._upload("put_bytes", key, data, len(data), hashlib.sha256(data).hexdigest())

    def get_bytes(self, key: str) -> bytes:
        def attempt():
            response = self._client.get_object(Bucket=self.bucket, Key=self._full(key))
            return response["Body"].read(), response.get("Metadata", {}).get("sha256")

        data, sha = self._call("get_bytes", self.uri(key), attempt)
        self._verify(key, "get_bytes", hashlib.sha256(data).hexdigest(), sha)
        return data

    def _verify(self, key: str, op: str, actual: str, recorded: str | None) -> None:
        # Objects written by other tools carry no sha256; those are taken as they are.
        if recorded is not None and actual != recorded:
            raise StoreError(f"S3 {op} of {self.uri(key)}: content sha256 {actual} != recorded {recorded}")

    def download(self, key: str, path: str | os.PathLike) -> None:
        full, dest = self._full(key), Path(path)
        head = self._call("download", self.uri(key), lambda: self._client.head_object(Bucket=self.bucket, Key=full))

        def attempt():
            tmp, f = _create_temp(dest)
            try:
                with f:
                    # Parallel ranged GETs write at their offsets into our temp file.
                    self._client.download_fileobj(self.bucket, full, f, Config=self._transfer)
                    _sync_close(f)
                _, sha = _sha256_file(tmp)
                self._verify(key, "download", sha, head.get("Metadata", {}).get("sha256"))
                _rename_durably(tmp, dest)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise

        self._call("download", self.uri(key), attempt)

    def open_read(self, key: str) -> BinaryIO:
        full = self._full(key)
        response = self._call("open_read", self.uri(key), lambda: self._client.get_object(Bucket=self.bucket, Key=full))
        # Only opening is retried; a reader that breaks mid-stream raises. The buffered wrapper reads
        # through botocore's StreamingBody (its `with` would hand back the raw urllib3 stream, skipping
        # botocore's length check) and gives readline/peek for line-oriented readers.
        return io.BufferedReader(response["Body"], buffer_size=_CHUNK)

    def exists(self, key: str) -> bool:
        full = self._full(key)
        try:
            self._call("exists", self.uri(key), lambda: self._client.head_object(Bucket=self.bucket, Key=full))
        except ObjectNotFoundError:
            return False
        return True

    def list(self, prefix: str = "") -> list[str]:
        prefix = _check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        # A folder, not a string prefix: "a/b" must not match "a/bc/...".
        wanted = f"{root}{prefix}/" if prefix else root

        def attempt():
            keys = []
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=wanted):
                for obj in page.get("Contents", []):
                    assert obj["Key"].startswith(wanted), obj["Key"]
                    if not obj["Key"].endswith("/"):  # "folder" placeholders made by consoles are not objects
                        keys.append(obj["Key"][len(root):])
            return sorted(keys)

        return self._call("list", f"s3://{self.bucket}/{wanted}", attempt)

    def delete(self, key: str) -> None:
        full = self._full(key)
        self._call("delete", self.uri(key), lambda: self._client.delete_object(Bucket=self.bucket, Key=full))


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
    if _SCHEME.match(url):
        raise ValueError(f"unsupported store URL scheme (use a path, file:// or s3://): {url!r}")
    if not url:
        raise ValueError("empty store URL")
    return LocalStore(url)


def data_version_of(files: list[dict]) -> str:
    """Digest of an output's content: sha256 of the sorted "path:sha256" lines of its manifest files."""
    lines = sorted(f"{entry['path']}:{entry['sha256']}\n" for entry in files)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def commit_folder(store: ObjectStore, prefix: str, local_dir: str | os.PathLike, manifest: dict) -> dict:
    """Upload every file under `local_dir` to `prefix/`, then write `prefix/manifest.json` last.

    The manifest is the commit marker: if any upload fails the exception propagates and no manifest
    is written, so readers (read_manifest) keep seeing the output as missing. Per-file fields already
    in manifest["files"] (e.g. "records") are kept; "bytes" and "sha256" come from the upload.
    `manifest` is completed in place ("files", "data_version") and returned.
    """
    local_dir = Path(local_dir)
    if not local_dir.is_dir():
        raise ValueError(f"commit_folder: {local_dir} is not a folder")
    manifest_key = _join(prefix, MANIFEST)

    paths = []
    for dirpath, dirnames, filenames in os.walk(local_dir):
        dirnames.sort()
        paths += [Path(dirpath, name) for name in filenames if Path(dirpath, name).is_file()]
    relpaths = sorted(path.relative_to(local_dir).as_posix() for path in paths)
    if MANIFEST in relpaths:
        raise ValueError(f"commit_folder: {local_dir / MANIFEST} would be overwritten by the commit marker; rename it")
    # Check every key and the given entries before uploading anything, so bad input uploads nothing.
    for rel in relpaths:
        check_key(_join(prefix, rel))
    given = {entry["path"]: entry for entry in manifest.get("files") or []}
    unknown = sorted(set(given) - set(relpaths))
    if unknown:
        raise ValueError(f"commit_folder: manifest lists files that are not in {local_dir}: {unknown}")

    files = []
    for rel in relpaths:
        info = store.put_file(_join(prefix, rel), local_dir / rel)
        files.append({**given.get(rel, {}), "path": rel, "bytes": info.bytes, "sha256": info.sha256})
    manifest["files"] = files
    manifest["data_version"] = data_version_of(files)
    store.put_bytes(manifest_key, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return manifest


def read_manifest(store: ObjectStore, prefix: str) -> dict | None:
    """The committed manifest of `prefix`, or None when the output is missing or incomplete."""
    try:
        return json.loads(store.get_bytes(_join(prefix, MANIFEST)))
    except ObjectNotFoundError:
        return None
