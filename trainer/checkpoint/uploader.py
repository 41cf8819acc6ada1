"""The background upload of committed local steps to the object store, and remote retention.

    uploader = Uploader(open_store(url), "checkpoints/main/run", keep_last=3, keep_every=0)
    uploader.submit(step, local.path(step))     # returns at once; uploads in a thread, retrying forever
    uploader.commit_and_submit(local, step, header)  # or: commit in that thread too (the loop only writes)
    retain_remote(store, prefix, keep_last, keep_every)

The step folders and their manifests are trainer.checkpoint.store's; this module only moves them.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from pathlib import Path
from typing import Callable

from storage.objects import ObjectStore, StoreError
from trainer.checkpoint.store import (_STEP_DIR, LATEST, MANIFEST, CorruptCheckpoint, LocalCheckpoints,
                                      RemoteCheckpoints, _corrupt, _keep, _read_manifest, _remote_steps, logger,
                                      step_name)


def _retryable() -> tuple[type[BaseException], ...]:
    kinds: tuple[type[BaseException], ...] = (StoreError, OSError)
    try:  # boto is optional for a local-only store
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        kinds += (BotoCoreError, ClientError, Boto3Error)
    except ImportError:
        pass
    return kinds


def _log_event(event: dict) -> None:
    logger.info("%s", json.dumps(event, sort_keys=True))


class Uploader:
    """Uploads committed local steps in a background thread, in order; the training loop never waits on it.

    A failed upload (server down) is retried with exponential backoff capped at retry_max_s, forever,
    so nothing committed is lost; the remote manifest goes last, so a partial upload is never committed.
    After each upload, remote retention (keep_last / keep_every) runs. Events (uploaded, retry, deleted)
    go to `on_event` as dicts.

    Events: {"event": "uploaded", step, seconds (from the first attempt), bytes}, {"event": "upload_retry", step, error, attempt,
    delay}, {"event": "deleted", step, where: "remote"}, {"event": "upload_skipped", step, reason} (the
    local folder was removed, e.g. by local retention, before it could be uploaded), {"event":
    "upload_failed", step, error} (not retryable: the local files no longer match their manifest),
    {"event": "retention_failed", error} (retried after the next upload); with commit_and_submit also
    {"event": "committed", step, seconds} and {"event": "commit_failed", step, error}.
    """

    def __init__(self, store: ObjectStore, prefix: str, *, keep_last: int, keep_every: int = 0,
                 retry_max_s: float = 30.0, on_event: Callable[[dict], None] | None = None,
                 retry_base_s: float = 0.2):
        _keep([], keep_last, keep_every)  # validates both
        if retry_max_s <= 0 or retry_base_s <= 0:
            raise ValueError(f"retry_base_s and retry_max_s must be > 0, got {retry_base_s}, {retry_max_s}")
        self.store, self.prefix = store, prefix.strip("/")
        self.remote = RemoteCheckpoints(store, self.prefix)
        self.keep_last, self.keep_every = keep_last, keep_every
        self.retry_base_s, self.retry_max_s = retry_base_s, retry_max_s
        self.on_event = on_event or _log_event
        self.uploaded: list[int] = []  # steps uploaded by this uploader, in order
        self.failed: list[int] = []  # steps given up on (upload_failed / upload_skipped)
        # (step, folder, (local, header) when the commit itself is left to this thread, else None)
        self._queue: collections.deque[tuple[int, Path, tuple[LocalCheckpoints, dict] | None]] = collections.deque()
        self._current: int | None = None
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._closed = False
        self._retryable = _retryable()
        self._thread = threading.Thread(target=self._run, name=f"checkpoint-upload:{self.prefix}", daemon=True)
        self._thread.start()

    def submit(self, step: int, folder: Path) -> None:
        """Queue a committed local step folder for upload; returns at once."""
        with self._cv:
            if self._closed:
                raise RuntimeError(f"Uploader({self.store.url}/{self.prefix}) is closed; cannot submit step {step}")
            self._queue.append((step, Path(folder), None))
            self._cv.notify_all()

    def commit_and_submit(self, local: LocalCheckpoints, step: int, header: dict) -> None:
        """Like local.commit(step, header) then submit(), but the commit (hashing, manifest, rename,
        latest) runs in the upload thread too, so the loop stalls only for writing the files.

        For rank 0 after the barrier that follows every rank's writes. Until the commit is done the
        step is a partial: a crash meanwhile leaves it unlisted and resume takes the previous one. A
        failed commit is reported as {"event": "commit_failed", step, error} and the step is skipped."""
        if not local.partial_path(step).is_dir():
            raise FileNotFoundError(f"commit of {step_name(step)}: no staging folder {local.partial_path(step)}")
        with self._cv:
            if self._closed:
                raise RuntimeError(f"Uploader({self.store.url}/{self.prefix}) is closed; cannot submit step {step}")
            self._queue.append((step, local.path(step), (local, dict(header))))
            self._cv.notify_all()

    def pending(self) -> set[int]:
        """Steps submitted and not yet uploaded (including the one in flight): local retention keeps them."""
        with self._cv:
            return {item[0] for item in self._queue} | ({self._current} if self._current is not None else set())

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted step is uploaded; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and self._current is None, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to `timeout`), then stop the thread; steps still pending are reported and dropped
        (they stay committed locally)."""
        done = self.flush(timeout)
        with self._cv:
            self._closed = True
            left = sorted(self.pending())
            self._queue.clear()
            self._cv.notify_all()
        self._stop.set()
        if not done:
            self.on_event({"event": "upload_abandoned", "steps": left})
        self._thread.join(None if done else 5)

    # The worker thread.

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                step, folder, commit = self._queue[0]
                self._current = step
            try:
                self._process(step, folder, commit)
            except BaseException as exc:  # a bug: report it rather than die silently with steps queued
                logger.exception("checkpoint upload of %s crashed", step_name(step))
                self.failed.append(step)
                self.on_event({"event": "upload_failed", "step": step, "error": f"{type(exc).__name__}: {exc}"})
            finally:
                with self._cv:
                    if self._queue and self._queue[0][0] == step:
                        self._queue.popleft()
                    self._current = None
                    self._cv.notify_all()

    def _process(self, step: int, folder: Path, commit: tuple[LocalCheckpoints, dict] | None) -> None:
        """One queued step: its commit when left to this thread, then its upload (trainer.checkpoint.rank_upload overrides)."""
        if commit is None or self._commit(step, *commit):
            self._upload_with_retries(step, folder)

    def _commit(self, step: int, local: LocalCheckpoints, header: dict) -> bool:
        start = time.monotonic()
        try:
            local.commit(step, header)
        except (OSError, ValueError) as exc:
            self.failed.append(step)
            self.on_event({"event": "commit_failed", "step": step, "error": f"{type(exc).__name__}: {exc}"})
            return False
        self.on_event({"event": "committed", "step": step, "seconds": round(time.monotonic() - start, 3)})
        return True

    def _upload_with_retries(self, step: int, folder: Path) -> None:
        start = time.monotonic()
        nbytes = self._retrying(step, folder, lambda: self._upload(step, folder))
        if nbytes is not None:
            self.uploaded.append(step)
            self.on_event({"event": "uploaded", "step": step, "seconds": round(time.monotonic() - start, 3),
                           "bytes": nbytes})
            self._retain()

    def _retrying(self, step: int, folder: Path, action: Callable[[], int]) -> int | None:
        """action()'s result, retried with backoff through network errors; None when the step was given up on
        (reported: its local files changed, or its folder is gone) or the uploader was stopped."""
        attempt = 0
        while not self._stop.is_set():
            try:
                return action()
            except CorruptCheckpoint as exc:
                self.failed.append(step)
                self.on_event({"event": "upload_failed", "step": step, "error": str(exc)})
                return None
            except self._retryable as exc:
                if not (folder / MANIFEST).is_file():
                    # Local retention removed it while the network was down: a newer step supersedes it.
                    self.failed.append(step)
                    self.on_event({"event": "upload_skipped", "step": step,
                                   "reason": f"{folder} no longer exists ({type(exc).__name__})"})
                    return None
                attempt += 1
                delay = min(self.retry_max_s, self.retry_base_s * 2 ** (attempt - 1))
                self.on_event({"event": "upload_retry", "step": step, "attempt": attempt, "delay": round(delay, 3),
                               "error": f"{type(exc).__name__}: {exc}"})
                self._stop.wait(delay)
        return None

    def _upload(self, step: int, folder: Path) -> int:
        """Every file, then the manifest (the remote commit), then `latest`; returns the bytes uploaded."""
        manifest_data = (folder / MANIFEST).read_bytes()
        total = self._put_files(step, folder, _read_manifest(manifest_data, step, "")["files"])
        self._put_manifest(step, manifest_data)
        return total + len(manifest_data)

    def _put_files(self, step: int, folder: Path, entries: list[dict]) -> int:
        """The files of `entries` (path, bytes, sha256) from `folder`; returns the bytes uploaded."""
        total = 0
        for entry in entries:
            info = self.store.put_file(self.remote.key(step, entry["path"]), folder / entry["path"])
            # The store hashed what it sent: a local file changed since commit must not be committed remotely.
            if info.sha256 != entry["sha256"] or info.bytes != entry["bytes"]:
                raise _corrupt(step, entry["path"], "changed on local disk since commit; not uploaded")
            total += info.bytes
        return total

    def _put_manifest(self, step: int, manifest_data: bytes) -> None:
        """The remote commit: the manifest (after every file), then `latest`."""
        self.store.put_bytes(self.remote.key(step), manifest_data)
        self.store.put_bytes("/".join(p for p in (self.prefix, LATEST) if p), f"{step}\n".encode())

    def _retain(self) -> None:
        try:
            for step in retain_remote(self.store, self.prefix, self.keep_last, self.keep_every,
                                      protect=self.pending()):
                self.on_event({"event": "deleted", "step": step, "where": "remote"})
        except self._retryable as exc:
            self.on_event({"event": "retention_failed", "error": f"{type(exc).__name__}: {exc}"})


def retain_remote(store: ObjectStore, prefix: str, keep_last: int, keep_every: int = 0, *,
                  protect: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Remote retention: delete committed steps beyond the newest keep_last (except multiples of
    keep_every), each manifest FIRST so a half-deleted step is never listed as committed; also the
    objects of uncommitted steps older than the newest committed one (an upload that was cut off
    or a deletion that was). Returns the committed steps deleted."""
    prefix = prefix.strip("/")
    committed, orphans = _remote_steps(store, prefix)
    kept = _keep(committed, keep_last, keep_every) | set(protect)
    deleted = [s for s in committed if s not in kept]
    newest = committed[-1] if committed else -1
    remote = RemoteCheckpoints(store, prefix)
    doomed = set(deleted) | {s for s in orphans if s < newest and s not in protect}
    if not doomed:
        return deleted
    for step in sorted(doomed):
        store.delete(remote.key(step))
    for key in store.list(prefix):
        rel = key[len(prefix) + 1:] if prefix else key
        match = _STEP_DIR.match(rel.partition("/")[0])
        if match and int(match.group(1)) in doomed:
            store.delete(key)
    return deleted
