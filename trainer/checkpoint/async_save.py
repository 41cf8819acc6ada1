"""Asynchronous shard writes: the loop copies the state in memory, a background thread writes the files.

    engine.checkpoint_engine = SnapshotEngine.replacing(engine.checkpoint_engine)   # once per DeepSpeed engine
    engine.save_checkpoint(folder, tag="ds")   # DeepSpeed's save() calls now only snapshot: (path, copy) pairs
    files = engine.checkpoint_engine.take()    # [(path, snapshot)], nothing written yet
    writer.submit(lambda: write_files(files) ...)   # BackgroundWriter: one job in flight, errors re-raised
    mark_written(folder, rank)                 # last act of a rank's job, after its files are fsynced
    wait_written(folder, world_size)           # rank 0's commit thread: every rank's files are complete

As torchtitan's async checkpointing and DeepSpeed's decoupled engine do: each tensor is copied on the
training thread into a CPU buffer kept for the next save (pinned when the tensor is on CUDA), so training
may change the originals as soon as save_checkpoint returns, and torch.save of the copies runs in a
thread. Only the copy stalls the loop. At most one snapshot is in flight per rank: the next one waits
for the previous write (BackgroundWriter.wait, then .submit).

Completion is a file per rank (`.written-rank-<r>` in the staging folder, after the rank's files are
fsynced), not a barrier, so no collective runs off the training thread. A failed job leaves
`.failed-rank-<r>` with its error instead, so rank 0's commit fails rather than waiting. The commit
removes the markers before hashing: they are never part of a committed step.
"""

from __future__ import annotations

import copy
import os
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

WRITTEN = ".written-rank-{rank:05d}"
FAILED = ".failed-rank-{rank:05d}"
# How long rank 0's commit waits for the other ranks' files after its own: far more than a write takes
# (a rank that died is reported by the launcher long before this).
WAIT_WRITTEN_S = 3600.0


class WriteFailed(RuntimeError):
    """A rank's background checkpoint write failed (the message names the rank and the error)."""


# -- snapshots -------------------------------------------------------------------------------------


class Snapshotter:
    """Copies of the tensors in a nested state (dicts, lists, tuples) that nothing else refers to.

    The copies go into CPU buffers kept from one save to the next (pinned when the tensor is on CUDA): the
    shapes repeat, and copying into memory already mapped is ~5x faster than a fresh clone(), whose page
    faults dominate. The buffers hold one checkpoint's worth of host memory between saves, which a save
    needs anyway while it is written. The caller must wait for the previous write before the next snapshot
    (Checkpointer.save does: its writer's previous job is done before engine.save_checkpoint runs). A tensor
    that appears twice in one state is copied once, so the file still stores it once (torch.save keeps
    object identity)."""

    def __init__(self):
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._used: set[tuple] = set()
        self._cuda = False

    @torch.no_grad()
    def __call__(self, state, key: str = ""):
        self._cuda, self._used = False, set()
        out = self._copy(state, {}, [key, 0])
        for stale in [k for k in self._buffers if k[0] == key and k not in self._used]:  # the state changed shape
            del self._buffers[stale]
        if self._cuda:
            torch.cuda.synchronize()  # the non-blocking device-to-host copies are done before anyone reads them
        return out

    def _copy(self, obj, memo: dict, slot: list):
        if torch.is_tensor(obj):
            if id(obj) in memo:
                return memo[id(obj)]
            copied = self._tensor(obj, slot)
            memo[id(obj)] = copied
            return copied
        if isinstance(obj, dict):
            out = copy.copy(obj)  # keeps the type (OrderedDict, defaultdict) and its attributes
            for k, v in obj.items():
                out[k] = self._copy(v, memo, slot)
            return out
        if isinstance(obj, list):
            out = copy.copy(obj)
            out[:] = [self._copy(v, memo, slot) for v in obj]
            return out
        if type(obj) is tuple:
            return tuple(self._copy(v, memo, slot) for v in obj)
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
            return type(obj)(*(self._copy(v, memo, slot) for v in obj))
        if isinstance(obj, (str, bytes, int, float, bool, type(None), torch.Size, torch.dtype, torch.device)):
            return obj
        return copy.deepcopy(obj)  # anything else that is mutable (a set, a config object): small

    def _tensor(self, t: torch.Tensor, slot: list) -> torch.Tensor:
        data = t.detach()
        on_cuda = data.device.type == "cuda"
        if data.layout != torch.strided:  # a sparse tensor (none in this trainer): a plain copy, not kept
            buf = data.to("cpu", copy=True)
        else:
            slot[1] += 1  # the n-th tensor of this file: the same one at every save
            key = (slot[0], slot[1], tuple(data.shape), data.dtype)
            self._used.add(key)
            buf = self._buffers.get(key)
            if buf is None:
                buf = self._buffers[key] = torch.empty(data.shape, dtype=data.dtype, pin_memory=on_cuda)
            buf.copy_(data, non_blocking=on_cuda)
            self._cuda |= on_cuda
        if isinstance(t, torch.nn.Parameter):  # the same pickled type as torch.save of the original
            return torch.nn.Parameter(buf, requires_grad=t.requires_grad)
        if t.requires_grad:
            return buf.detach().requires_grad_(True)  # an alias: the kept buffer itself never requires grad
        return buf


class SnapshotEngine(CheckpointEngine):
    """DeepSpeed's checkpoint engine, except that save() snapshots the state instead of writing it;
    take() hands the (path, snapshot) pairs over. Loading is torch.load, as TorchCheckpointEngine."""

    def __init__(self, zipfile_serialization: bool = True):
        super().__init__(None)
        self.name = "SnapshotEngine"
        self.zipfile_serialization = zipfile_serialization
        self.snapshot = Snapshotter()
        self._taken: list[tuple[str, object]] = []

    @classmethod
    def replacing(cls, engine: CheckpointEngine) -> SnapshotEngine:
        if isinstance(engine, SnapshotEngine):
            return engine
        if type(engine) is not TorchCheckpointEngine:
            raise ValueError(f"asynchronous checkpoint writes replace DeepSpeed's TorchCheckpointEngine, but this "
                             f"engine uses {type(engine).__name__} (the DeepSpeed config's 'checkpoint' section "
                             f"sets a writer or datastates): remove it from the config")
        return cls(getattr(engine, "zipfile_serialization", True))

    def create(self, info: CheckpointCommitInfo):
        pass

    def save(self, state_dict, path: str):
        self._taken.append((path, self.snapshot(state_dict, key=os.path.basename(path))))

    def take(self) -> list[tuple[str, object]]:
        taken, self._taken = self._taken, []
        return taken

    def load(self, path: str, map_location=None):
        return torch.load(path, map_location=map_location, weights_only=False)

    def commit(self, info: CheckpointCommitInfo):
        return True

    def preserves_storage_sharing(self):
        # DeepSpeed clones views before some saves when this is True; the snapshot is a compact copy already.
        return False


def state_bytes(obj) -> int:
    """Bytes of the tensors in a nested state (each tensor once)."""
    seen, total, stack = set(), 0, [obj]
    while stack:
        o = stack.pop()
        if torch.is_tensor(o):
            if id(o) not in seen:
                seen.add(id(o))
                total += o.numel() * o.element_size()
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
    return total


# -- writing ---------------------------------------------------------------------------------------


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: str | Path, obj, *, zipfile_serialization: bool = True) -> None:
    """Write one file (bytes as they are, anything else with torch.save) and force it to disk."""
    if isinstance(obj, bytes):
        with open(path, "wb") as f:
            f.write(obj)
            f.flush()
            os.fsync(f.fileno())
        return
    torch.save(obj, str(path), _use_new_zipfile_serialization=zipfile_serialization)
    _fsync(path)


def write_files(files: list[tuple[str | Path, object]], *, zipfile_serialization: bool = True) -> None:
    for path, obj in files:
        write_file(path, obj, zipfile_serialization=zipfile_serialization)
    for folder in {os.path.dirname(str(p)) for p, _ in files}:  # their names survive a crash too
        _fsync(folder)


def mark_written(folder: Path, rank: int) -> None:
    """The rank's files in `folder` are complete and on disk (call after they are fsynced).

    The marker is only a signal to rank 0's commit thread, never part of a committed step (a crash leaves
    a partial folder that is discarded whatever it holds), so it needs no fsync. Rank 0 may commit, and so
    rename the folder, as soon as the file exists: the writer touches nothing in `folder` after this."""
    (folder / WRITTEN.format(rank=rank)).touch()


def mark_failed(folder: Path, rank: int, error: BaseException) -> None:
    """The rank's write failed: its error, under a name rank 0's commit reads instead of waiting forever."""
    tmp = folder / f".{FAILED.format(rank=rank)}.tmp"
    try:  # written whole, then renamed: the reader never sees half a message
        tmp.write_text("".join(traceback.format_exception_only(error)))
        os.rename(tmp, folder / FAILED.format(rank=rank))
    except OSError:
        pass  # the folder itself is gone or the disk is full: rank 0's commit then times out, loudly


def wait_written(folder: Path, world_size: int, *, timeout: float = WAIT_WRITTEN_S, poll: float = 0.005) -> None:
    """Block until every rank has marked its files in `folder` written; WriteFailed if one failed or the
    time runs out. Then remove the markers, which are not part of the checkpoint."""
    start = time.monotonic()
    waiting = set(range(world_size))
    while waiting:
        for rank in sorted(waiting):
            failed = folder / FAILED.format(rank=rank)
            if failed.exists():
                raise WriteFailed(f"rank {rank} failed to write its checkpoint files in {folder}: "
                                  f"{failed.read_text().strip()}")
            if (folder / WRITTEN.format(rank=rank)).exists():
                waiting.discard(rank)
        if waiting:
            if time.monotonic() - start > timeout:
                raise WriteFailed(f"ranks {sorted(waiting)} did not finish writing their checkpoint files in {folder} "
                                  f"within {timeout:.0f} s")
            time.sleep(poll)
    for rank in range(world_size):
        (folder / WRITTEN.format(rank=rank)).unlink()


class BackgroundWriter:
    """One thread that runs write jobs, one at a time, at most one queued or running: submit() first
    waits for the job before it. A job's error is raised in the caller by the next wait(), check() or
    submit(): a failed write is never silent."""

    def __init__(self, name: str = "checkpoint-write"):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._future: Future | None = None

    def submit(self, job: Callable[[], None]) -> None:
        self.wait()
        self._future = self._pool.submit(job)

    def busy(self) -> bool:
        return self._future is not None and not self._future.done()

    def wait(self) -> None:
        future, self._future = self._future, None
        if future is not None:
            future.result()

    def check(self) -> None:
        """Raise the finished job's error now, without waiting for a running one."""
        if self._future is not None and self._future.done():
            self.wait()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
