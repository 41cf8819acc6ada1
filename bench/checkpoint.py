"""Benchmark: how long the training loop stalls per checkpoint with the background upload, against a
synchronous save-and-upload of the same state in the same run.

    .venv/bin/python bench/checkpoint.py [--reps 3] [--layers 4]

State: trainer.model.CausalLM (Llama-style, d=512, 4 layers, vocabulary 32,000: ~46 M parameters) after
one AdamW step, so both moments exist; saved the way a DeepSpeed checkpoint lays it out (model states,
optimizer states, RNG) with torch.save into the staging folder of trainer.checkpoint_store.
Object store: a moto_server subprocess on loopback (S3 API through boto3, multipart, sha256 metadata).
Per checkpoint, interleaved so load from other processes hits both alike, median of --reps:
  stall        = torch.save into staging + commit (sha256 + fsync + manifest + rename + latest) + submit()
  synchronous  = the same save + commit + the upload of every file and the manifest, inline
  stall with the commit in the upload thread too (Uploader.commit_and_submit) = save + that call
Also: save+commit write throughput against shutil.copyfile of the same bytes, the upload throughput,
and one training step's time while an upload runs in the background against one on an idle machine
(the upload thread and the server share the CPU with the loop; the stall alone does not show that).
Last line: `ratio: X.XX` = stall ÷ synchronous (target ≤ 0.10), the stall with commit() in the loop.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This folder holds scripts named like stdlib modules (bench/tokenize.py): never import from it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import os
import pickle
import random
import shutil
import statistics
import tempfile
import time

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import boto3  # noqa: E402
import torch  # noqa: E402

from resources.store import S3Store  # noqa: E402
from tests.s3_server import MotoServer  # noqa: E402
from trainer.checkpoint_store import LocalCheckpoints, Uploader  # noqa: E402
from trainer.config import ModelConfig  # noqa: E402
from trainer.model import CausalLM  # noqa: E402

MB = 1e6


def build_state(layers: int):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32_000, d_model=512, n_layers=layers, n_heads=8, attention="sdpa")
    model = CausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, cfg.vocab_size, (1, 65))

    def train_step():
        loss, _ = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    train_step()  # AdamW's exp_avg / exp_avg_sq exist from here on
    return model, opt, train_step, sum(p.numel() for p in model.parameters())


def save_state(folder: Path, model, opt, step: int) -> None:
    """What a checkpoint writes: DeepSpeed-style model and optimizer files, and this rank's RNG states."""
    (folder / "ds").mkdir(parents=True, exist_ok=True)
    torch.save({"module": model.state_dict(), "global_steps": step}, folder / "ds" / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": opt.state_dict()}, folder / "ds" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
    (folder / "rng").mkdir(exist_ok=True)
    (folder / "rng" / "rank-0.pkl").write_bytes(pickle.dumps(rng))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret", AWS_DEFAULT_REGION="us-east-1",
                      NO_PROXY="127.0.0.1,localhost", AWS_CONFIG_FILE="/nonexistent",
                      AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    server = MotoServer(work / "moto_server.log")
    server.start()
    try:
        store = S3Store("s3://bench/ckpt", endpoint_url=server.endpoint)
        boto3.session.Session().client("s3", endpoint_url=server.endpoint).create_bucket(Bucket="bench")
        model, opt, train_step, n_params = build_state(args.layers)
        print(f"state: CausalLM {n_params / 1e6:.1f} M params + AdamW moments; moto_server at {server.endpoint}")

        local = LocalCheckpoints(work / "local")
        events: list[dict] = []
        uploader = Uploader(store, "checkpoints/main/bench", keep_last=1, on_event=events.append)
        stalls, syncs, saves, commits, copies, uploads, sizes, bg_stalls = [], [], [], [], [], [], [], []
        busy_steps, idle_steps = [], []
        step = 0
        for rep in range(args.reps):
            # (a) background: the loop waits for save + commit + submit only.
            step += 1
            t0 = time.perf_counter()
            save_state(local.staging_dir(step), model, opt, step)
            t1 = time.perf_counter()
            local.commit(step, {"tokens": step * 64, "world_size": 1, "global_batch": 1, "data_position": step})
            t2 = time.perf_counter()
            uploader.submit(step, local.path(step))
            stalls.append(time.perf_counter() - t0)
            saves.append(t1 - t0)
            commits.append(t2 - t1)
            size = folder_bytes(local.path(step))
            sizes.append(size)
            # The loop goes on training while the upload runs: how much slower is a step meanwhile?
            # (a few steps only: they slow the upload down too, and the bench has to stay short)
            for _ in range(3 if uploader.pending() else 0):
                t = time.perf_counter()
                train_step()
                busy_steps.append(time.perf_counter() - t)
            assert uploader.flush(600)
            uploads.append(next(e for e in reversed(events) if e["event"] == "uploaded" and e["step"] == step))

            for _ in range(2):
                t = time.perf_counter()
                train_step()
                idle_steps.append(time.perf_counter() - t)

            # (b) synchronous: the same save and commit, then the upload inline (the same code path, waited on).
            step += 1
            t0 = time.perf_counter()
            save_state(local.staging_dir(step), model, opt, step)
            local.commit(step, {"tokens": step * 64, "world_size": 1, "global_batch": 1, "data_position": step})
            uploader.submit(step, local.path(step))
            assert uploader.flush(600)
            syncs.append(time.perf_counter() - t0)
            uploads.append(next(e for e in reversed(events) if e["event"] == "uploaded" and e["step"] == step))

            # (c) the commit in the upload thread as well: the loop waits for the files to be written only.
            step += 1
            t0 = time.perf_counter()
            save_state(local.staging_dir(step), model, opt, step)
            uploader.commit_and_submit(local, step, {"tokens": step * 64, "world_size": 1, "global_batch": 1,
                                                     "data_position": step})
            bg_stalls.append(time.perf_counter() - t0)
            assert uploader.flush(600)
            uploads.append(next(e for e in reversed(events) if e["event"] == "uploaded" and e["step"] == step))

            # A plain copy of the same bytes, file by file, to the same disk.
            dest = work / f"copy-{rep}"
            t0 = time.perf_counter()
            for src in sorted(local.path(step).rglob("*")):
                if src.is_file():
                    (dest / src.relative_to(local.path(step))).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, dest / src.relative_to(local.path(step)))
            copies.append(time.perf_counter() - t0)
            shutil.rmtree(dest)
            local.retain(keep_last=1, protect=uploader.pending())
            print(f"rep {rep + 1}: stall {stalls[-1]:.3f} s (save {saves[-1]:.3f} + commit {commits[-1]:.3f}), "
                  f"synchronous {syncs[-1]:.3f} s, stall with background commit {bg_stalls[-1]:.3f} s, "
                  f"copy {copies[-1]:.3f} s, {size / MB:.0f} MB", flush=True)
        uploader.close(60)
        assert not uploader.failed and [e for e in events if e["event"] == "upload_retry"] == [], events

        size = statistics.median(sizes)
        stall, sync = statistics.median(stalls), statistics.median(syncs)
        save_commit = statistics.median(s + c for s, c in zip(saves, commits))
        copy = statistics.median(copies)
        up_mbs = statistics.median(e["bytes"] / e["seconds"] / MB for e in uploads)
        print(f"checkpoint: {size / MB:.0f} MB in 3 files")
        print(f"stall per checkpoint (background upload): {stall:.3f} s  (save {statistics.median(saves):.3f} s, "
              f"commit {statistics.median(commits):.3f} s)")
        print(f"synchronous save + commit + upload:       {sync:.3f} s")
        bg_stall = statistics.median(bg_stalls)
        print(f"stall with the commit in the upload thread too (commit_and_submit): {bg_stall:.3f} s "
              f"({bg_stall / sync:.2f} of synchronous)")
        print(f"write throughput: save+commit {size / save_commit / MB:.0f} MB/s, plain copy {size / copy / MB:.0f} MB/s "
              f"(save+commit / copy = {copy / save_commit:.2f})")
        print(f"upload throughput (moto_server on loopback): {up_mbs:.0f} MB/s")
        if busy_steps and idle_steps:
            busy, idle = statistics.median(busy_steps), statistics.median(idle_steps)
            print(f"train step while uploading: {busy:.3f} s vs idle {idle:.3f} s ({busy / idle:.2f}x, "
                  f"{len(busy_steps)} steps during uploads)")
        print(f"ratio: {stall / sync:.2f}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
