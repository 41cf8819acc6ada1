"""The S3 backend: any S3-compatible server through boto3, with retries and sha256 in object metadata."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import time
import urllib.parse
from pathlib import Path
from typing import BinaryIO, Callable, TypeVar

from storage.objects import (
    CHUNK,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    StoreError,
    check_key,
    check_prefix,
    create_temp,
    rename_durably,
    sha256_file,
    sync_close,
)

log = logging.getLogger("storage.s3")

_T = TypeVar("_T")

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
    from s3transfer.exceptions import (
        RetriesExceededError as TransferRetriesExceededError,
    )

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
    from botocore.exceptions import (
        ClientError,
        ConnectionError,
        HTTPClientError,
        IncompleteReadError,
    )

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
        self.prefix = check_prefix(parsed.path.lstrip("/"))
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
        from s3transfer.exceptions import (
            RetriesExceededError as TransferRetriesExceededError,
        )

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
        size, sha = sha256_file(path)
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
            tmp, f = create_temp(dest)
            try:
                with f:
                    # Parallel ranged GETs write at their offsets into our temp file.
                    self._client.download_fileobj(self.bucket, full, f, Config=self._transfer)
                    sync_close(f)
                _, sha = sha256_file(tmp)
                self._verify(key, "download", sha, head.get("Metadata", {}).get("sha256"))
                rename_durably(tmp, dest)
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
        return io.BufferedReader(response["Body"], buffer_size=CHUNK)

    def exists(self, key: str) -> bool:
        full = self._full(key)
        try:
            self._call("exists", self.uri(key), lambda: self._client.head_object(Bucket=self.bucket, Key=full))
        except ObjectNotFoundError:
            return False
        return True

    def list(self, prefix: str = "") -> list[str]:
        prefix = check_prefix(prefix)
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
