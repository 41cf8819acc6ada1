"""Checkpointer: save the whole replayable state of a run, resume from it, roll back to it.

Long because saving, committing, resuming and rolling back share one set of threads and folders, for both
layouts (one local_dir shared by every rank, or one per rank: trainer.checkpoint.rank_upload); split, each part would
reach into the others' state.

    ckpt = Checkpointer.for_run(cfg, dist, on_event=metrics.log_event)
    point = ckpt.find_resume()               # newest verified local step, else remote (downloaded); or None
    ckpt.check_batch(point, cfg)             # a changed global batch is refused unless allowed
    ... build the DeepSpeed engine, with load_universal=ckpt.needs_universal(point) ...
    ckpt.restore(point, trainer)             # DeepSpeed's shards (load_module), each named state, RNG
    if ckpt.due(step): ckpt.save(trainer)    # every rank calls it; rank 0 commits, uploads, retains

What is saved and restored comes from `trainer.checkpoint_contents()` (Contents): the TrainModule
(trainer.train_module: it snapshots and loads DeepSpeed's files), the named objects with state_dict() /
load_state_dict() that trainer.json holds (the loop state, the spike guard, the SDC and canary checks)
and the run's part of the manifest. The checkpointer knows no other field of the trainer.

save() only copies the state in memory (trainer.checkpoint.async_save): each rank's writer thread writes its files
into step-<N>.partial and marks them written; rank 0's commit thread waits for every rank's mark, then
commits; the uploader thread uploads. A step is visible only once all of that is done, so a kill at any
point leaves the previous step as the newest. The next save, before(), discard_after(), restore() and
close() wait for the write in flight and raise its error, as they do for the commit.

A step folder (<local_dir>/step-<N:08d>/, committed by trainer.checkpoint.store):

    ds/...                     DeepSpeed's own files, engine.save_checkpoint(folder, tag="ds"): model states
                               (mp_rank_00_model_states.pt; per rank under ZeRO-3) and, under ZeRO 1-3 and
                               bf16, each rank's optimizer shard (*zero_pp_rank_<r>_mp_rank_00_optim_states.pt)
    zero_to_fp32.py ...        DeepSpeed's scripts to turn the shards into full weights
    rank-<r:05d>.pt            each rank: its RNG states (python `random`, numpy, torch CPU, CUDA if any)
    trainer.json               rank 0: {name: state_dict()} of the named states: "train" (step, tokens,
                               sample_index, skip windows), "guard", "sdc", "canary"
    manifest.json              written last: step, tokens, world_size, global_batch, data_position, the
                               resolved config, tokenizer_sha256, lineage, skip_windows, files with sha256

Several ranks (and nodes) see one local_dir (a shared filesystem, or a single node), unless
checkpoint.shared_local_dir is false: then each rank has <local_dir>/rank-<r>/ on its own disk, commits and
uploads its own files, and rank 0 commits the step in the object store (trainer.checkpoint.rank_upload).

Resuming on another world size at the same global batch uses DeepSpeed's universal checkpoint: rank 0
converts the step's shards (deepspeed.checkpoint.ds_to_universal) into a scratch folder, the engine
is built with {"checkpoint": {"load_universal": true}} and loads it; every rank then takes its new
share of the fp32 master weights and Adam moments. The token stream depends only on the global sample
index, so the same tokens follow. RNG: a rank that existed in the old world restores its own states,
a new rank is seeded from (seed, step, rank). The model has no dropout and the data are indexed, not
sampled, so the RNG does not touch the numerics; it is kept for components that may use it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np
import torch
import torch.distributed as torch_dist

from trainer.checkpoint.async_save import (BackgroundWriter, mark_failed, mark_written, state_bytes,
                                wait_written, write_files)
from trainer.checkpoint.store import CorruptCheckpoint, LocalCheckpoints, RemoteCheckpoints, ResumePoint, find_resume
from trainer.checkpoint.config import CheckpointConfig
from trainer.config import RunConfig
from trainer.exits import TrainerExit
from trainer.planner.plan import young_checkpoint_interval
from trainer.checkpoint.rank_upload import Confirmations, RankUploader, expand_local_dir, fetch, find_committed, rank_dir
from trainer.checkpoint.universal import to_universal
from trainer.checkpoint.weights import parametrization_change
from trainer.checkpoint.uploader import Uploader

if TYPE_CHECKING:
    from trainer.parallel.engine import Dist
    from trainer.train_module import TrainModule

DS_TAG = "ds"  # DeepSpeed's files go to <step folder>/ds/
TRAINER_FILE = "trainer.json"
FIRST_AUTO_SAVE_STEPS = 100  # Young's rule needs a measured save time: the first save comes after this many steps


@dataclass
class Contents:
    """What one checkpoint holds, as the trainer hands it over."""

    step: int
    module: TrainModule  # DeepSpeed's files: snapshot() / load()
    states: dict  # name -> an object with state_dict() / load_state_dict(): trainer.json
    header: dict  # the run's part of the manifest (tokens, data_position, config, precision, ...)
    seed: int  # a rank the saving world did not have seeds its RNG from (seed, step, rank)


class Checkpointable(Protocol):
    def checkpoint_contents(self) -> Contents: ...


class ResumeRefused(TrainerExit, ValueError):
    """The checkpoint cannot continue this run as configured (the message names the field)."""

    kind = "config"


def saved_precision(manifest: dict) -> dict | None:
    """The precision record a step was written in; steps from before the record existed have the resolved
    bool in their config (None: not known)."""
    if manifest.get("precision"):
        return manifest["precision"]
    bf16 = manifest.get("config", {}).get("deepspeed", {}).get("bf16")
    if isinstance(bf16, bool):
        return {"dtype": "bf16" if bf16 else "fp32", "requested": str(bf16).lower(), "reason": "from the config"}
    return None


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def remote_prefix(cfg: RunConfig) -> str:
    return f"checkpoints/{cfg.stage}/{cfg.checkpoint.run_name}"


def young_interval_steps(save_seconds: float, step_seconds: float, mtbf_hours: float) -> int:
    """Steps between saves by Young's rule √(2·δ·M), δ the measured save time, M the MTBF."""
    tau = young_checkpoint_interval(max(save_seconds, 1e-3), mtbf_hours * 3600.0)
    return max(1, round(tau / max(step_seconds, 1e-6)))


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_rng(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def check_layout(point: ResumePoint, cfg: RunConfig) -> None:
    """A split model's DeepSpeed files (a pipeline's per stage, a tensor-parallel group's per shard) load into the
    same split only: each rank of a new data-parallel replica loads its stage's or shard's files (ZeRO-0), and ZeRO-1
    partitions go through the universal checkpoint as without a split; no conversion between splits is built.
    Nor between parametrizations (model.parametrization, model.mup_base_width): the weights would compute another
    function, and μP's optimizer has another parameter group. ResumeRefused else, naming both."""
    changed = parametrization_change(point.manifest, cfg.model)
    if changed:
        raise ResumeRefused(f"checkpoint {point.path}: {changed}: a checkpoint resumes or is continued only with the "
                            "parametrization it was trained in")
    saved = point.manifest.get("config", {}).get("parallel", {})
    layout = lambda parallel: {name: parallel.get(name, 1) for name in ("pipeline", "tensor")}
    before, now = layout(saved), layout(cfg.parallel.model_dump())
    if before != now:
        said = lambda split: ", ".join(f"parallel.{name} = {size}" for name, size in split.items())
        raise ResumeRefused(
            f"checkpoint {point.path} was written with {said(before)}; this run has {said(now)}: a checkpoint "
            f"resumes only with the same parallel settings (on any number of data-parallel replicas)")


class Checkpointer:
    """One config (CheckpointConfig); the folders and this process's rank come from the run."""

    def __init__(self, cfg: CheckpointConfig, *, local_dir: str | Path, remote_prefix: str, rank: int,
                 world_size: int, on_event: Callable[[dict], None] = print):
        self.cfg = cfg
        self.rank, self.world_size = rank, world_size
        self.on_event = on_event
        self.shared = cfg.shared_local_dir
        self.local = LocalCheckpoints(local_dir if self.shared else rank_dir(local_dir, rank))
        self.remote: RemoteCheckpoints | None = None
        self.store = None
        if cfg.remote:
            from storage.factory import open_store

            self.store = open_store(cfg.remote)
            self.remote = RemoteCheckpoints(self.store, remote_prefix)
        self.remote_prefix = remote_prefix
        self.uploader: Uploader | None = None  # rank 0 (every rank without a shared folder), at the first save
        # Without a shared folder the ranks confirm their uploads to rank 0 (every rank creates this, together).
        self._confirm = None if self.shared else Confirmations.create(rank, world_size)
        # Uploader events arrive on its thread; the training thread writes them (metrics are not thread-safe).
        self._events: deque[dict] = deque()
        self.saved: list[int] = []  # steps saved by this process
        if cfg.interval_steps:
            self.interval = cfg.interval_steps
        elif cfg.mtbf_hours:
            self.interval = FIRST_AUTO_SAVE_STEPS
        else:
            self.interval = 0
        self._next_save: int | None = None
        self._mark: tuple[float, int] | None = None  # (time, step) after the last save / the start
        # Rank 0 commits (hashing, manifest, rename, latest) in this thread so the loop waits only for the
        # files to be written; commits never wait on the network (uploads have their own thread).
        self._committer: ThreadPoolExecutor | None = None
        self._commit_future: Future | None = None
        # Every rank: the shards are snapshotted in memory by save() and written by this thread (async_save).
        self._writer: BackgroundWriter | None = None

    @classmethod
    def for_run(cls, cfg: RunConfig, dist: Dist, on_event: Callable[[dict], None] = print) -> Checkpointer:
        local = expand_local_dir(cfg.checkpoint.local_dir or os.path.join(cfg.output_dir, "checkpoints"))
        return cls(cfg.checkpoint, local_dir=local, remote_prefix=remote_prefix(cfg), rank=dist.rank,
                   world_size=dist.world_size, on_event=on_event)

    # -- finding a step to resume from -----------------------------------------------------------

    def find_resume(self) -> ResumePoint | None:
        """Rank 0 looks (local, else remote: downloaded and verified); every rank gets its answer. Without a
        shared folder the store says which steps are committed and every rank fetches its files (rank_upload)."""
        if not self.shared:
            return find_committed(self.remote, self.local, self.rank, self.world_size, log=self._corrupt_event)
        point = None
        if self.rank == 0:
            point = find_resume(self.local, self.remote, log=self._corrupt_event)
        return self._broadcast(point)

    def before(self, sample_index: int) -> ResumePoint | None:
        """The newest committed, verified local step whose data position is at or before `sample_index`; without a
        shared folder, the newest such step committed in the store (the uploads in flight are waited for first)."""
        point = None
        self._wait_writes()
        if not self.shared:  # the steps in flight are committed in the store (or not) before one is chosen
            self._flush_uploads()
            return find_committed(self.remote, self.local, self.rank, self.world_size, log=self._corrupt_event,
                                  data_position=sample_index)
        if self.rank == 0:
            self._settle()  # a step whose commit is in flight counts
            for step in reversed(self.local.committed()):
                try:
                    if self.local.manifest(step)["data_position"] > sample_index:
                        continue
                    point = ResumePoint(step, self.local.path(step), self.local.verify(step), "local")
                    break
                except CorruptCheckpoint as e:
                    self._corrupt_event(str(e))
        return self._broadcast(point)

    def check_batch(self, point: ResumePoint, cfg: RunConfig) -> None:
        old, new = point.manifest["global_batch"], cfg.batch.global_batch
        if old == new:
            return
        if not self.cfg.allow_batch_change:
            raise ResumeRefused(
                f"checkpoint {point.path} was written with batch.global_batch = {old}, this run has "
                f"batch.global_batch = {new}: resuming would change the token schedule. Set "
                f"checkpoint.allow_batch_change = true to resume anyway, or use batch.global_batch = {old}.")
        self._event({"event": "batch_change", "step": point.step, "from": old, "to": new})

    def needs_universal(self, point: ResumePoint | None, cfg: RunConfig) -> bool:
        """Whether the engine must load the step as a universal checkpoint (another world size or precision:
        bf16 and fp32 engines keep their optimizer state in different shapes)."""
        if point is None:
            return False
        before = saved_precision(point.manifest)
        now = "bf16" if cfg.deepspeed.bf16 else "fp32"
        changed = before is not None and before["dtype"] != now
        if changed and (cfg.deepspeed.zero_stage == 0 or point.manifest.get("zero_stage", 0) == 0):
            # ZeRO-0 in fp32 keeps Adam's state inside the model file, where no universal conversion reads it.
            raise ResumeRefused(
                f"checkpoint {point.path} was written in {before['dtype']}, this run forces {now} "
                f"(deepspeed.bf16): changing precision on resume needs deepspeed.zero_stage >= 1 on both sides. "
                f"Set deepspeed.bf16 to \"auto\" to continue in {before['dtype']}.")
        if point.manifest["world_size"] == self.world_size and not changed:
            return False
        # fp32 ZeRO-0 keeps the whole optimizer state in the one model-states file: it loads as it is.
        return cfg.deepspeed.zero_stage > 0 or cfg.deepspeed.bf16

    # -- restoring -------------------------------------------------------------------------------

    def restore(self, point: ResumePoint, source: Checkpointable, *, universal: bool = False) -> None:
        """Load the step into the source's module (its engine freshly built), each named state, this rank's RNG."""
        contents = source.checkpoint_contents()
        self.load_module(point, contents.module, universal=universal)
        saved = json.loads((point.path / TRAINER_FILE).read_text())
        for name, obj in contents.states.items():
            # A state newer than the checkpoint (the SDC check, say) starts from {}: it takes its defaults.
            obj.load_state_dict(saved[name] if name in ("train", "guard") else saved.get(name, {}))
        own = point.path / rank_file(self.rank)
        if own.is_file():
            set_rng_state(torch.load(own, weights_only=False))
        else:  # a rank the saving world did not have
            seed_rng(hash((contents.seed, point.step, self.rank)) % 2**63)
        self._mark = None

    def load_module(self, point: ResumePoint, module: TrainModule, *, universal: bool = False) -> None:
        """The step's DeepSpeed files into the fresh engine (converted first when universal); continue_from too."""
        self._wait_writes()  # nothing of this process is still being written when the state changes under it
        if not universal:
            return module.load(point.path, DS_TAG)
        scratch = self.local.root / f".universal-{point.path.name}"
        if not self.shared:  # no rank sees another's folder: each one fetches every shard and converts them
            fetch(self.remote, self.local, point.step, point.manifest, self.rank, everything=True)
        if self.rank == 0 or not self.shared:
            to_universal(point.path / DS_TAG, scratch / DS_TAG)
        self._barrier()
        module.load(scratch, DS_TAG, universal=True)
        self._barrier()
        if self.rank == 0 or not self.shared:
            shutil.rmtree(scratch, ignore_errors=True)

    # -- saving ----------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether to save after `step` steps (the same answer on every rank). Also writes pending events.

        A fixed interval saves at its multiples (the same steps whether or not the run was resumed);
        Young's rule saves `interval` steps after the last save, the interval recomputed at each save."""
        self.drain()
        if self._writer is not None:
            self._writer.check()  # a failed background write stops the loop at once, on the rank it failed on
        if self._mark is None:
            self._mark = (time.perf_counter(), step)
        if not self.interval:
            return False
        if self._next_save is None or not self.cfg.mtbf_hours:
            return step % self.interval == 0
        return step >= self._next_save

    def save(self, source: Checkpointable) -> None:
        """Every rank snapshots its state in memory and hands the files to its writer thread; rank 0 queues the
        commit (it waits for every rank's files, then hashes, writes the manifest, renames, hands the step to
        the uploader and applies local retention). The loop waits only for the in-memory copies."""
        t0 = time.perf_counter()
        contents = source.checkpoint_contents()
        step = contents.step
        # One snapshot in flight per rank: the previous step's files are written before this one is copied.
        self._wait_writes()
        if not self.shared:
            folder = self._own_staging(step)
        else:
            if self.rank == 0:
                # And committed: its commit waited for every rank's files, so no rank still writes into a folder
                # that staging_dir() may clear (the same step saved again after a rollback). A failed one raises.
                self._settle()
                folder = self.local.staging_dir(step)
            self._barrier()
            if self.rank != 0:
                folder = self.local.staging_dir(step, fresh=False)
        shards, zipfile = contents.module.snapshot(folder, DS_TAG)  # DeepSpeed's files, copied in memory
        rest = [(folder / rank_file(self.rank), rng_state())]
        if self.rank == 0:
            trainer_state = {name: obj.state_dict() for name, obj in contents.states.items()}
            rest.append((folder / TRAINER_FILE, json.dumps(trainer_state, indent=1).encode()))
        nbytes = state_bytes(shards)
        rank, header = self.rank, {"step": step, "world_size": self.world_size, "run_name": self.cfg.run_name,
                                   **contents.header}
        own = None if self.shared else self.uploader  # without a shared folder: this rank commits its own files

        def write() -> None:
            try:
                write_files(shards, zipfile_serialization=zipfile)
                write_files(rest)
                if own is None:
                    mark_written(folder, rank)  # the commit on rank 0 waits for this file from every rank
            except BaseException as e:
                if own is None:
                    mark_failed(folder, rank, e)
                else:  # confirmed as failed: rank 0 then commits nothing of this step
                    own.submit_failed(step, f"{type(e).__name__}: {e}")
                raise
            if own is not None:  # then uploads them and confirms to rank 0 (trainer.checkpoint.rank_upload)
                own.commit_and_submit(self.local, step, {**header, "rank": rank})

        if self._writer is None:
            self._writer = BackgroundWriter()
        self._writer.submit(write)
        if self.rank == 0 and self.shared:
            if self._committer is None:
                self._committer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-commit")
            self._commit_future = self._committer.submit(self._commit, step, header)
        seconds = time.perf_counter() - t0
        now = time.perf_counter()
        # Every rank must agree on the next save step: take rank 0's figures.
        mark_time, mark_step = self._mark or (t0, step)
        step_seconds = (t0 - mark_time) / max(step - mark_step, 1)
        figures = self._broadcast((seconds, step_seconds))
        if self.cfg.mtbf_hours:
            self.interval = young_interval_steps(figures[0], figures[1], self.cfg.mtbf_hours)
        self._next_save = step + self.interval if self.cfg.mtbf_hours else None
        self._mark = (now, step)
        self.saved.append(step)
        if self.rank == 0:
            # `seconds` is the loop's stall, `bytes` rank 0's snapshot of DeepSpeed's state; the write, the commit
            # and the upload go on in their threads, which report their own events when done.
            self._event({"event": "checkpoint_saved", "step": step, "seconds": round(seconds, 3), "bytes": nbytes,
                         "interval_steps": self.interval})
        return None

    def _commit(self, step: int, header: dict) -> dict:
        """Rank 0, in the commit thread: wait for every rank's files, commit the step, hand it to the uploader,
        apply local retention."""
        start = time.perf_counter()
        wait_written(self.local.partial_path(step), self.world_size)
        written = time.perf_counter()
        manifest = self.local.commit(step, header)
        self._events.append({"event": "committed", "step": step, "seconds": round(time.perf_counter() - start, 3),
                             "write_wait_seconds": round(written - start, 3),
                             "bytes": sum(f["bytes"] for f in manifest["files"])})
        if self.remote is not None:
            if self.uploader is None:
                self.uploader = Uploader(self.store, self.remote_prefix, keep_last=self.cfg.keep_last,
                                         keep_every=self.cfg.keep_every,
                                         retry_max_s=self.cfg.upload_retry_max_s, on_event=self._events.append)
            self.uploader.submit(step, self.local.path(step))
        # A step still waiting for its upload is kept (nothing committed is lost while S3 is down).
        self.local.retain(self.cfg.keep_last, self.cfg.keep_every,
                          protect=self.uploader.pending() if self.uploader else frozenset())
        return manifest

    def _own_staging(self, step: int) -> Path:
        """No shared folder: this rank's staging folder; its uploader (trainer.checkpoint.rank_upload) starts at the first save."""
        if self.uploader is None:
            self.uploader = RankUploader(self.store, self.remote_prefix, rank=self.rank, confirm=self._confirm,
                                         local=self.local, keep_last=self.cfg.keep_last, keep_every=self.cfg.keep_every,
                                         retry_max_s=self.cfg.upload_retry_max_s, on_event=self._events.append)
        if step in self.uploader.pending():  # the same step saved again (a rollback): its last save settles first
            self._flush_uploads()
        return self.local.staging_dir(step)

    def _flush_uploads(self) -> None:
        while self.uploader is not None and not self.uploader.flush(timeout=1.0):
            self.drain()  # the retries show while the run waits

    def _wait_writes(self) -> None:
        """Wait for this rank's background write; its error (a full disk, say) surfaces in the loop, loudly."""
        if self._writer is not None:
            self._writer.wait()

    def _settle(self) -> None:
        """Wait for the commit in flight; its error (a full disk, say) surfaces in the loop, loudly."""
        future, self._commit_future = self._commit_future, None
        if future is not None:
            future.result()

    def discard_after(self, step: int) -> list[int]:
        """After a rollback to `step`: the local steps past it hold the path that was rolled back, so a
        resume must never pick them. (Their remote copies are replaced when the run reaches them again; without a
        shared folder, where a resume reads the store, their remote manifests are deleted at once.)"""
        dropped = []
        self._wait_writes()
        if not self.shared:
            self._flush_uploads()
        if self.rank == 0 or not self.shared:
            self._settle()
            pending = self.uploader.pending() if self.uploader else set()
            for s in self.local.committed():
                if s > step and s not in pending:
                    trash = self.local.path(s).with_name(f".{self.local.path(s).name}.rolled-back.deleting")
                    os.rename(self.local.path(s), trash)
                    shutil.rmtree(trash, ignore_errors=True)
                    dropped.append(s)
        if self.rank == 0 and not self.shared:  # the store is where a resume looks: those steps leave it first
            for s in (s for s in self.remote.committed() if s > step):
                self.store.delete(self.remote.key(s))  # the manifest: the step is no longer committed
        self._barrier()
        self.saved = [s for s in self.saved if s <= step]
        self._next_save = None
        self._mark = None
        return dropped

    def close(self, *, wait: bool = True) -> None:
        """Wait for the commit in flight, then the uploads (forever when `wait`: a committed step is never
        abandoned), then stop. This rank's write in flight is always waited for (it is local and bounded)."""
        try:
            if self._writer is not None:
                try:
                    self._writer.close()
                finally:
                    self._writer = None
        finally:  # a failed write fails rank 0's commit too (its marker says why): settle that as well
            if self._committer is not None:
                try:
                    self._settle()
                finally:
                    self._committer.shutdown(wait=True)
                    self._committer = None
        if self.uploader is not None:
            pending = sorted(self.uploader.pending())
            if pending and wait:
                self._event({"event": "upload_wait", "steps": pending})
            if wait:
                self._flush_uploads()
            self.uploader.close(None if wait else 0)
            self.uploader = None
            if wait:  # the steps local retention kept for their uploads can go now
                self.local.retain(self.cfg.keep_last, self.cfg.keep_every)
        self.drain()

    def drain(self) -> None:
        while self._events:
            self.on_event(self._events.popleft())

    # -- plumbing --------------------------------------------------------------------------------

    def _corrupt_event(self, message: str) -> None:
        self._event({"event": "corrupt_checkpoint", "message": message})

    def _event(self, record: dict) -> None:
        self.drain()
        self.on_event(record)

    def _barrier(self) -> None:
        if self.world_size > 1:
            torch_dist.barrier()

    def _broadcast(self, obj):
        if self.world_size == 1:
            return obj
        box = [obj]
        torch_dist.broadcast_object_list(box, src=0)
        return box[0]
