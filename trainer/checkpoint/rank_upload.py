"""Checkpoints without a shared filesystem (checkpoint.shared_local_dir = false): each rank keeps its own files
on its own disk and uploads them itself; rank 0 commits the step in the object store once every rank's upload
is confirmed. A resume on any nodes fetches each rank's files from the store.

    local = LocalCheckpoints(rank_dir(local_dir, rank))   # <local_dir>/rank-<r:05d>/: nobody else writes there
    uploader = RankUploader(store, prefix, rank=r, confirm=Confirmations.create(r, n), local=local, keep_last=3)
    uploader.commit_and_submit(local, step, header)    # the rank's writer thread, once its files are on disk
    uploader.submit_failed(step, error)                # or: its files could not be written
    point = find_committed(remote, local, rank, world_size, log=print)   # every rank: resume from the store

Per step, in each rank's upload thread, in step order:
 1. the rank's own files are committed locally (hashed, a manifest of those files, renamed: trainer.checkpoint.store)
    and local retention runs (steps still to upload are kept);
 2. they are uploaded, retried through an outage (trainer.checkpoint.uploader);
 3. the rank confirms: its file entries (path, bytes, sha256, rank), or why it has none, go to rank 0;
 4. rank 0 only, once every rank has confirmed: the step's manifest (every rank's files: the output manifest's
    schema, each file entry with the `rank` that wrote it) is uploaded, then `latest`, then remote retention runs.
    A step some rank could not upload gets no manifest: it is not committed, and a resume never sees it.

The confirmations go through torch.distributed's key-value store (the one the process group was made from), not a
collective: rank 0 polls for them, so waiting out another rank's long outage needs no collective timeout, and a run
that stops while a confirmation is outstanding can leave (a thread blocked in a gloo gather cannot be abandoned:
destroying the group would wait for it).

A rank's local step folder is a cache: what it wrote, plus what a resume fetched. The step's commit is its manifest
in the store, so a resume asks the store which steps are committed and every rank then checks (by sha256) or fetches
the files it loads: all but the other ranks' own shards and RNG states; all of them for a universal conversion.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Callable

import torch.distributed as torch_dist

from storage.manifest import data_version_of
from storage.objects import ObjectStore, StoreError
from trainer.checkpoint.store import (CorruptCheckpoint, LocalCheckpoints, RemoteCheckpoints, ResumePoint, _hash_file,
                                      _manifest_bytes)
from trainer.checkpoint.uploader import Uploader

# Per-rank files: the checkpointer's RNG states (rank-<r>.pt) and DeepSpeed's ZeRO shards (*zero_pp_rank_<r>_*).
_OF_RANK = re.compile(r"^rank-(\d+)\.pt$|zero_pp_rank_(\d+)_")
POLL_S = 0.05  # rank 0's wait for the other ranks' confirmations


def rank_dir(local_dir: str | Path, rank: int) -> Path:
    """This rank's local checkpoint root: a folder of its own even when several ranks share a node's disk."""
    return Path(local_dir) / f"rank-{rank:05d}"


def expand_local_dir(local_dir: str) -> str:
    """checkpoint.local_dir with its environment variables expanded on this rank ($TMPDIR, ${SLURM_JOB_ID}: each
    node its own disk or folder); a variable that is not set is an error, not a folder named after it."""
    expanded = os.path.expandvars(local_dir)
    left = re.findall(r"\$\{?(\w+)", expanded)
    if left:
        raise ValueError(f"checkpoint.local_dir = {local_dir!r}: environment variable {left[0]} is not set "
                         f"on this node")
    return expanded


def needed(entries: list[dict], rank: int) -> list[dict]:
    """The files of a step that `rank` loads: all but the other ranks' own shards and RNG states."""
    def other_rank(path: str) -> bool:
        match = _OF_RANK.search(path.rsplit("/", 1)[-1])
        return match is not None and int(match.group(1) or match.group(2)) != rank

    return [e for e in entries if not other_rank(e["path"])]


def fetch(remote: RemoteCheckpoints, local: LocalCheckpoints, step: int, manifest: dict, rank: int, *,
          everything: bool = False) -> int:
    """The files of the committed step that `rank` loads (every file with `everything`) into local.path(step),
    each verified against the step's manifest, committed there; returns the bytes downloaded. A file already in
    the local folder with the manifest's size and sha256 is kept, so a restart on the same node downloads only
    what other ranks wrote. CorruptCheckpoint names a missing or mismatching object; StoreError is the network."""
    entries = manifest["files"] if everything else needed(manifest["files"], rank)
    have, staging = local.path(step), local.staging_dir(step)
    downloaded = 0
    try:
        for entry in entries:
            src, dest = have / entry["path"], staging / entry["path"]
            if src.is_file() and _hash_file(src, fsync=False) == (entry["bytes"], entry["sha256"]):
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:  # a second name for the same data: the old folder goes when the new one replaces it
                    os.link(src, dest)
                except OSError:
                    shutil.copyfile(src, dest)
            else:
                remote.fetch(step, entry, dest)
                downloaded += entry["bytes"]
        local.commit(step, {k: v for k, v in manifest.items() if k not in ("files", "data_version")})
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return downloaded


def find_committed(remote: RemoteCheckpoints, local: LocalCheckpoints, rank: int, world_size: int, *,
                   log: Callable[[str], None], data_position: int | None = None) -> ResumePoint | None:
    """Every rank, on the training thread (collectives): the newest step committed in the store (with its data
    position at or before `data_position` when given) whose files every rank could fetch and verify. A step that
    some rank could not is reported through `log` and the one before tried; None when there is none. The
    ResumePoint holds the store's manifest (every rank's files) and this rank's local folder; its source is
    "local" when no rank had to download anything. A network error on any rank raises StoreError on every rank."""
    steps = _from_rank0(remote.committed() if rank == 0 else None, world_size)
    for i in range(len(steps) - 1, -1, -1):
        step, manifest, error = steps[i], None, None
        if rank == 0:
            try:
                manifest = remote.manifest(step)
            except CorruptCheckpoint as exc:
                error = str(exc)
        manifest, error = _from_rank0((manifest, error), world_size)
        if manifest is not None and data_position is not None and manifest["data_position"] > data_position:
            continue
        outcome = ("corrupt", error, 0) if error else _fetch_outcome(remote, local, step, manifest, rank)
        outcomes = _all_gather(outcome, world_size)
        network = [msg for kind, msg, _ in outcomes if kind == "network"]
        if network:
            raise StoreError(f"resume from {remote.store.uri(remote.prefix)}: {network[0]}")
        errors = [msg for kind, msg, _ in outcomes if kind == "corrupt"]
        if not errors:
            source = "remote" if any(n for _, _, n in outcomes) else "local"
            return ResumePoint(step, local.path(step), manifest, source)
        log(f"{'; '.join(dict.fromkeys(errors))}; {'using an older one' if i else 'no older remote checkpoint'}")
    return None


def _fetch_outcome(remote, local, step, manifest, rank) -> tuple[str, str | None, int]:
    try:
        return "ok", None, fetch(remote, local, step, manifest, rank)
    except CorruptCheckpoint as exc:
        return "corrupt", f"rank {rank}: {exc}", 0
    except StoreError as exc:
        return "network", f"rank {rank}: {exc}", 0


def _from_rank0(obj, world_size: int):
    if world_size == 1:
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]


def _all_gather(obj, world_size: int) -> list:
    if world_size == 1:
        return [obj]
    out = [None] * world_size
    torch_dist.all_gather_object(out, obj)
    return out


class Confirmations:
    """Each rank's word on each step (its file entries, or why it has none) for rank 0, through a key-value store
    (torch.distributed's: the rendezvous's TCPStore). Keys carry a token rank 0 draws for this run, so a restarted
    job never reads an earlier attempt's confirmations."""

    def __init__(self, store, token: str, world_size: int):
        self.store, self.token, self.world_size = store, token, world_size

    @classmethod
    def create(cls, rank: int, world_size: int) -> Confirmations | None:
        """Every rank, together (a broadcast); None alone (one rank confirms to itself)."""
        if world_size == 1:
            return None
        from torch.distributed.distributed_c10d import _get_default_store

        token = _from_rank0(secrets.token_hex(8) if rank == 0 else None, world_size)
        return cls(_get_default_store(), token, world_size)

    def _key(self, step: int, rank: int) -> str:
        return f"checkpoint-confirm/{self.token}/{step}/{rank}"

    def confirm(self, step: int, rank: int, part: list[dict] | str) -> None:
        self.store.set(self._key(step, rank), json.dumps(part))

    def collect(self, step: int, stop: Callable[[], bool]) -> list[list[dict] | str] | None:
        """Rank 0: every rank's confirmation of `step`, by rank, once all are in (their keys then removed);
        None if `stop()` turned true first."""
        keys = [self._key(step, r) for r in range(self.world_size)]
        while not self.store.check(keys):
            if stop():
                return None
            time.sleep(POLL_S)
        parts = [json.loads(self.store.get(k)) for k in keys]
        for key in keys:
            self.store.delete_key(key)
        return parts


class RankUploader(Uploader):
    """One rank's part of every step: the local commit of its own files, their upload and its confirmation; on
    rank 0 also the remote commit (the manifest of every rank's files, then `latest`) and remote retention.

    Every step is confirmed by every rank, uploaded or not (submit_failed), so rank 0 never waits for a step a
    rank gave up on. Events as Uploader's (on rank 0 "uploaded" is the remote commit, with every rank's bytes),
    plus {"event": "part_uploaded", step, rank, seconds, bytes} and, on rank 0, {"event": "not_committed", step,
    reasons: {rank: why}} for a step some rank could not upload."""

    def __init__(self, store: ObjectStore, prefix: str, *, rank: int, confirm: Confirmations | None,
                 local: LocalCheckpoints, keep_last: int, keep_every: int = 0, **kwargs):
        self.rank, self.confirm, self.local = rank, confirm, local
        self._write_errors: dict[int, str] = {}
        super().__init__(store, prefix, keep_last=keep_last, keep_every=keep_every, **kwargs)

    def submit_failed(self, step: int, error: str) -> None:
        """The rank's files of `step` could not be written: confirm that (rank 0 then commits nothing)."""
        with self._cv:
            self._write_errors[step] = error
        self.submit(step, self.local.path(step))

    def _process(self, step: int, folder: Path, commit: tuple[LocalCheckpoints, dict] | None) -> None:
        start = time.monotonic()
        part: list[dict] | str = self._write_errors.pop(step, None) or "its local commit failed"
        if commit is not None and self._commit(step, *commit):  # None: submit_failed()
            # Local retention here, in order with the commits: steps still to upload are kept.
            self.local.retain(self.keep_last, self.keep_every, protect=self.pending())
            entries = self._retrying(step, folder, lambda: self._put_part(step, folder))
            if entries is None:
                part = "its upload failed"
            else:
                part = entries
                self.on_event({"event": "part_uploaded", "step": step, "rank": self.rank, "bytes":
                               sum(e["bytes"] for e in entries), "seconds": round(time.monotonic() - start, 3)})
        if self.confirm is not None:
            self.confirm.confirm(step, self.rank, part)
        if self.rank == 0:
            parts = [part] if self.confirm is None else self.confirm.collect(step, self._stop.is_set)
            if parts is not None:
                self._commit_remote(step, folder, parts, start)

    def _put_part(self, step: int, folder: Path) -> list[dict]:
        """This rank's files of the step (its local manifest lists them), each entry tagged with the rank."""
        entries = [{**e, "rank": self.rank} for e in self.local.manifest(step)["files"]]
        self._put_files(step, folder, entries)
        return entries

    def _commit_remote(self, step: int, folder: Path, parts: list, start: float) -> None:
        """Rank 0: the manifest of every rank's files (after all of them are in the store), then `latest`."""
        reasons = {r: p for r, p in enumerate(parts) if isinstance(p, str)}
        files = sorted((e for p in parts if not isinstance(p, str) for e in p), key=lambda e: e["path"])
        paths = [e["path"] for e in files]
        if not reasons and len(set(paths)) != len(paths):
            reasons = {0: f"two ranks wrote {sorted(p for p in paths if paths.count(p) > 1)[0]}"}
        if reasons:
            self.failed.append(step)
            self.on_event({"event": "not_committed", "step": step, "reasons": reasons})
            return
        header = {k: v for k, v in self.local.manifest(step).items() if k not in ("files", "data_version", "rank")}
        data = _manifest_bytes({**header, "files": files, "data_version": data_version_of(files)})
        if self._retrying(step, folder, lambda: self._put_manifest(step, data) or len(data)) is None:
            return  # stopped (the run is leaving), or the local folder is gone
        self.uploaded.append(step)
        self.on_event({"event": "uploaded", "step": step, "seconds": round(time.monotonic() - start, 3),
                       "bytes": sum(e["bytes"] for e in files) + len(data)})
        self._retain()
