"""Where checkpoints live: committed step folders on local disk and in the object store (trainer.checkpoint.uploader).

This module knows files, hashes and the object store, not DeepSpeed (trainer/checkpoint/checkpointer.py writes
the files). A step folder is committed when its manifest (per-file sha256) is written and the folder
renamed from `step-<N>.partial` to `step-<N>`; `latest` moves only after that.

    local = LocalCheckpoints(root)
    folder = local.staging_dir(step)            # every rank writes its files in here
    manifest = local.commit(step, header)       # rank 0, after a barrier: hashes, manifest, rename, latest
    point = find_resume(local, RemoteCheckpoints(store, prefix))   # newest verified, local else remote

Layout (docs/architecture.md): <root>/step-<N:08d>/{..., manifest.json}, <root>/latest (text: the step number);
remotely <prefix>/step-<N:08d>/{..., manifest.json} with the manifest uploaded last, and <prefix>/latest.
Several ranks share one `root` (one filesystem): rank 0 calls staging_dir() (which clears a crash's
leftover), the others call staging_dir(step, fresh=False) after a barrier; only rank 0 commits,
retains, uploads and downloads (then a barrier before the others read); without one, trainer.checkpoint.rank_upload.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from storage.manifest import data_version_of
from storage.objects import ObjectNotFoundError, ObjectStore, StoreError

MANIFEST = "manifest.json"
LATEST = "latest"
PARTIAL = ".partial"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")
_PARTIAL_DIR = re.compile(r"^step-(\d{8,})\.partial$")
# A committed folder being deleted is renamed to this shape first, so it leaves the listing at once.
_TRASH_SUFFIX = ".deleting"
_CHUNK = 1 << 20

logger = logging.getLogger("trainer.checkpoint.store")


class CorruptCheckpoint(RuntimeError):
    """A committed step whose files do not match its manifest (the message names the file)."""

    def __init__(self, message: str, *, step: int | None = None, file: str | None = None):
        super().__init__(message)
        self.step, self.file = step, file


def _corrupt(step: int, file: str, why: str, where: str = "") -> CorruptCheckpoint:
    return CorruptCheckpoint(f"checkpoint {where}{step_name(step)} is corrupt: {file}: {why}", step=step, file=file)


def step_name(step: int) -> str:
    return f"step-{step:08d}"


@dataclass(frozen=True)
class ResumePoint:
    step: int
    path: Path  # the committed local folder (downloaded first if it came from the object store)
    manifest: dict
    source: str  # "local" or "remote"


# --- files -------------------------------------------------------------------------------------------


def _hash_file(path: Path, fsync: bool) -> tuple[int, str]:
    """(bytes, sha256) of a file; with `fsync` its data is also forced to disk (it was just written)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        if fsync:
            os.fsync(f.fileno())
    return size, digest.hexdigest()


def _hash_files(folder: Path, relpaths: list[str], fsync: bool) -> list[tuple[int, str]]:
    # hashlib releases the GIL on large buffers: ranks' shards hash in parallel on several cores.
    workers = max(1, min(len(relpaths), os.cpu_count() or 1, 8))
    if workers == 1:
        return [_hash_file(folder / rel, fsync) for rel in relpaths]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda rel: _hash_file(folder / rel, fsync), relpaths))


def _files_under(folder: Path) -> list[str]:
    """Sorted POSIX paths of the regular files under `folder`, relative to it (symlinks are refused)."""
    relpaths = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in filenames:
            path = Path(dirpath, name)
            if path.is_symlink() or not path.is_file():
                raise ValueError(f"checkpoint staging folder {folder} holds {path}, which is not a regular file")
            relpaths.append(path.relative_to(folder).as_posix())
    return sorted(relpaths)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(dest: Path, data: bytes) -> None:
    """Write `dest` atomically: a temp file next to it, fsynced, os.replace'd, the folder fsynced."""
    tmp = dest.parent / f".{dest.name}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(dest.parent)


def _manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def _read_manifest(data: bytes, step: int, where: str) -> dict:
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise _corrupt(step, MANIFEST, f"not valid JSON ({exc})", where) from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise _corrupt(step, MANIFEST, "no 'files' list", where)
    if manifest.get("step") != step:
        raise _corrupt(step, MANIFEST, f"names step {manifest.get('step')!r}", where)
    return manifest


def _keep(steps: list[int], keep_last: int, keep_every: int) -> set[int]:
    """The steps retention keeps: the newest keep_last, and every multiple of keep_every."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    if keep_every < 0:
        raise ValueError(f"keep_every must be >= 0, got {keep_every}")
    kept = set(sorted(steps)[-keep_last:])
    if keep_every:
        kept |= {s for s in steps if s % keep_every == 0}
    return kept


# --- local -------------------------------------------------------------------------------------------


class LocalCheckpoints:
    def __init__(self, root: str | Path, *, fsync: bool = True):
        self.root = Path(root)
        # fsync: the data files too (the manifest, the renames and `latest` always are). Without it a
        # power loss can tear a committed step; verify() then catches it and resume takes an older one.
        self.fsync = fsync

    def path(self, step: int) -> Path:
        return self.root / step_name(step)

    def partial_path(self, step: int) -> Path:
        return self.root / (step_name(step) + PARTIAL)

    def staging_dir(self, step: int, *, fresh: bool = True) -> Path:
        """An empty `step-<N>.partial` folder (a leftover from a crash is removed first).

        fresh=False only makes sure it exists: for ranks other than the one that cleared it."""
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0, got {step}")
        staging = self.partial_path(step)
        if fresh and staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True, exist_ok=True)
        return staging

    def commit(self, step: int, header: dict) -> dict:
        """Hash every file in the staging folder, write the manifest (header + files), rename, move latest."""
        staging = self.partial_path(step)
        if not staging.is_dir():
            raise FileNotFoundError(
                f"commit of {step_name(step)}: no staging folder {staging} (call staging_dir first)")
        if header.get("step", step) != step:
            raise ValueError(f"commit of {step_name(step)}: the header names step {header['step']!r}")
        relpaths = _files_under(staging)
        if MANIFEST in relpaths:
            raise ValueError(f"commit of {step_name(step)}: {staging / MANIFEST} is reserved for the manifest")
        if not relpaths:
            raise ValueError(f"commit of {step_name(step)}: the staging folder {staging} is empty")
        hashes = _hash_files(staging, relpaths, self.fsync)
        files = [{"path": rel, "bytes": size, "sha256": sha} for rel, (size, sha) in zip(relpaths, hashes)]
        manifest = {k: v for k, v in header.items() if k not in ("files", "data_version")}
        manifest.setdefault("created", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        manifest.update(step=step, files=files, data_version=data_version_of(files))
        try:
            data = _manifest_bytes(manifest)
        except TypeError as exc:
            raise ValueError(f"commit of {step_name(step)}: the header is not JSON-serializable: {exc}") from exc
        _write_durably(staging / MANIFEST, data)
        if self.fsync:  # every subfolder's entries, so the files are found under their names after a crash
            subfolders = {p for rel in relpaths for p in (staging / rel).parents if staging in p.parents}
            for folder in subfolders:
                _fsync_dir(folder)

        final = self.path(step)
        if final.exists():
            # The same step saved again (a resumed run re-reaching it, or replacing a corrupt copy):
            # a non-empty folder cannot be renamed over, so the old one leaves the listing first.
            self._remove(final)
        os.rename(staging, final)
        _fsync_dir(self.root)
        _write_durably(self.root / LATEST, f"{step}\n".encode())
        return manifest

    def latest(self) -> int | None:
        """The step `latest` names (the last commit), or None."""
        try:
            return int((self.root / LATEST).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def committed(self) -> list[int]:
        """Steps with a committed folder, ascending."""
        if not self.root.is_dir():
            return []
        steps = []
        for entry in self.root.iterdir():
            match = _STEP_DIR.match(entry.name)
            if match and (entry / MANIFEST).is_file():
                steps.append(int(match.group(1)))
        return sorted(steps)

    def partials(self) -> list[int]:
        """Steps with a leftover (or in-progress) staging folder, ascending."""
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(1)) for e in self.root.iterdir() if (m := _PARTIAL_DIR.match(e.name)) and e.is_dir())

    def manifest(self, step: int) -> dict:
        """The step's manifest as written (no re-hashing)."""
        try:
            data = (self.path(step) / MANIFEST).read_bytes()
        except FileNotFoundError as exc:
            raise _corrupt(step, MANIFEST, "missing") from exc
        return _read_manifest(data, step, "")

    def verify(self, step: int) -> dict:
        """The step's manifest, after re-hashing every file; CorruptCheckpoint naming the first bad file."""
        manifest = self.manifest(step)
        folder = self.path(step)
        entries = manifest["files"]
        # Sizes first: cheap, and a truncated file is named as such rather than as a hash mismatch.
        for entry in entries:
            path = folder / entry["path"]
            if not path.is_file():
                raise _corrupt(step, entry["path"], "missing")
            size = path.stat().st_size
            if size != entry["bytes"]:
                raise _corrupt(step, entry["path"], f"size {size} bytes, manifest says {entry['bytes']}")
        hashes = _hash_files(folder, [e["path"] for e in entries], fsync=False)
        for entry, (_, sha) in zip(entries, hashes):
            if sha != entry["sha256"]:
                raise _corrupt(step, entry["path"],
                               f"sha256 mismatch (file {sha[:12]}…, manifest {entry['sha256'][:12]}…)")
        return manifest

    def newest_valid(self, log: Callable[[str], None] = print) -> ResumePoint | None:
        """The newest committed step that verifies; each corrupt one is reported through `log` and skipped."""
        steps = self.committed()
        for i in range(len(steps) - 1, -1, -1):
            try:
                manifest = self.verify(steps[i])
            except CorruptCheckpoint as exc:
                log(f"{exc}; {'using an older one' if i else 'no older local checkpoint'}")
                continue
            return ResumePoint(steps[i], self.path(steps[i]), manifest, "local")
        return None

    def retain(self, keep_last: int, keep_every: int = 0, *, protect: set[int] | frozenset[int] = frozenset(),
               all_partials: bool = False) -> list[int]:
        """Delete committed steps beyond the newest keep_last (except multiples of keep_every) and stale
        partial folders; returns the deleted steps.

        protect: steps not to delete yet (e.g. trainer.checkpoint.uploader.Uploader.pending(): still to be uploaded). A partial is
        stale when it is older than the newest committed step (a crash's leftover; the one being written
        is newer); all_partials=True removes every partial (only when no save is in progress).
        """
        steps = self.committed()
        kept = _keep(steps, keep_last, keep_every) | set(protect)
        deleted = [s for s in steps if s not in kept]
        for step in deleted:
            self._remove(self.path(step))
        newest = steps[-1] if steps else -1
        for step in self.partials():
            if (all_partials or step < newest) and step not in protect:
                shutil.rmtree(self.partial_path(step), ignore_errors=True)
        for entry in self.root.glob(f"*{_TRASH_SUFFIX}"):  # a deletion a crash interrupted
            shutil.rmtree(entry, ignore_errors=True)
        return deleted

    def _remove(self, folder: Path) -> None:
        # Renamed first (atomic): the step leaves committed() at once even if the rmtree is interrupted.
        trash = folder.with_name(f".{folder.name}.{secrets.token_hex(4)}{_TRASH_SUFFIX}")
        os.rename(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)


# --- remote ------------------------------------------------------------------------------------------


def _remote_steps(store: ObjectStore, prefix: str) -> tuple[list[int], list[int]]:
    """(committed steps, steps with objects but no manifest) under `prefix`, both ascending."""
    seen, committed = set(), set()
    for key in store.list(prefix):
        rel = key[len(prefix) + 1:] if prefix else key
        folder, _, rest = rel.partition("/")
        match = _STEP_DIR.match(folder)
        if match and rest:
            seen.add(int(match.group(1)))
            if rest == MANIFEST:
                committed.add(int(match.group(1)))
    return sorted(committed), sorted(seen - committed)


def _content_mismatch(exc: StoreError) -> bool:
    return "content sha256" in str(exc)  # S3Store checks each read against the sha256 recorded at upload


class RemoteCheckpoints:
    def __init__(self, store: ObjectStore, prefix: str):
        self.store, self.prefix = store, prefix.strip("/")

    def key(self, step: int, rel: str = MANIFEST) -> str:
        return "/".join(p for p in (self.prefix, step_name(step), rel) if p)

    def committed(self) -> list[int]:
        """Steps whose manifest exists (it is uploaded last), ascending."""
        return _remote_steps(self.store, self.prefix)[0]

    def latest(self) -> int | None:
        try:
            return int(self.store.get_bytes("/".join(p for p in (self.prefix, LATEST) if p)).decode().strip())
        except (ObjectNotFoundError, ValueError):
            return None

    def manifest(self, step: int) -> dict:
        try:
            data = self.store.get_bytes(self.key(step))
        except ObjectNotFoundError as exc:
            raise _corrupt(step, MANIFEST, "missing", "remote ") from exc
        except StoreError as exc:
            if not _content_mismatch(exc):  # the network, not the content
                raise
            raise _corrupt(step, MANIFEST, str(exc), "remote ") from exc
        return _read_manifest(data, step, "remote ")

    def download(self, step: int, local: LocalCheckpoints) -> ResumePoint:
        """Download a committed remote step into `local` (verified against its manifest) and commit it there.

        CorruptCheckpoint when an object is missing or differs from the manifest; StoreError (the network)
        propagates: an unreachable store must not look like "nothing to resume from"."""
        manifest = self.manifest(step)
        staging = local.staging_dir(step)
        try:
            for entry in manifest["files"]:
                self.fetch(step, entry, staging / entry["path"])
            local_manifest = local.commit(step, manifest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        assert local_manifest["files"] == manifest["files"], "downloaded files changed after verification"
        return ResumePoint(step, local.path(step), local_manifest, "remote")

    def fetch(self, step: int, entry: dict, dest: Path) -> None:
        """One file of the step's manifest (path, bytes, sha256) to `dest`, verified; CorruptCheckpoint if not."""
        try:
            self.store.download(self.key(step, entry["path"]), dest)
        except ObjectNotFoundError as exc:
            raise _corrupt(step, entry["path"], "missing", "remote ") from exc
        except StoreError as exc:
            if not _content_mismatch(exc):
                raise
            raise _corrupt(step, entry["path"], str(exc), "remote ") from exc
        (size, sha), want = _hash_file(dest, fsync=False), entry["sha256"]
        if size != entry["bytes"]:
            raise _corrupt(step, entry["path"], f"size {size} bytes, manifest says {entry['bytes']}", "remote ")
        if sha != want:
            raise _corrupt(step, entry["path"], f"sha256 mismatch (object {sha[:12]}…, manifest {want[:12]}…)", "remote ")


# --- resume ------------------------------------------------------------------------------------------


def find_resume(local: LocalCheckpoints, remote: RemoteCheckpoints | None,
                log: Callable[[str], None] = print) -> ResumePoint | None:
    """Newest committed and verified local step, else the newest remote one (downloaded and verified),
    falling back past corrupt ones (each reported); None when there is nothing to resume from.

    Kept simple on purpose: a verified local step wins even when the remote holds a newer one (the
    remote is only asked when the local folder has nothing usable, e.g. a fresh machine). A network
    error reaching the remote propagates (StoreError) rather than passing for "nothing to resume from".
    Call it on one rank (it may download and commit), then barrier."""
    point = local.newest_valid(log)
    if point is not None or remote is None:
        return point
    steps = remote.committed()
    for i in range(len(steps) - 1, -1, -1):
        try:
            return remote.download(steps[i], local)
        except CorruptCheckpoint as exc:
            log(f"{exc}; {'using an older one' if i else 'no older remote checkpoint'}")
    return None


def local_copy(store: ObjectStore, key: str, cache_dir: str | Path) -> Path:
    """A verified local copy of the committed checkpoint step `key` (…/step-<N>) of `store`: the folder itself
    when the store is on this machine, else downloaded once into cache_dir (one cache folder per run)."""
    run, _, name = key.rstrip("/").rpartition("/")
    if not name.startswith("step-") or not name[5:].isdigit():
        raise ValueError(f"{store.uri(key)}: give a checkpoint step folder (…/step-<N>)")
    here = store.local_path(key)
    if here is not None:
        return Path(here)
    local = LocalCheckpoints(Path(cache_dir))
    step = int(name[5:])
    if step in local.committed():
        return local.path(step)
    return RemoteCheckpoints(store, run).download(step, local).path


def local_step(uri: str, cache_dir: str | Path) -> Path:
    """local_copy of the checkpoint step at `uri` (a path, file:// or s3://…/step-<N>)."""
    from storage.factory import open_store

    parent, _, name = str(uri).rstrip("/").rpartition("/")
    if not name.startswith("step-") or not name[5:].isdigit():
        raise ValueError(f"{uri}: give a checkpoint step folder (…/step-<N>)")
    return local_copy(open_store(parent), name, cache_dir)
