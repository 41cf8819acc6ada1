"""Benchmark: how long the training loop stalls per checkpoint with the background commit and upload,
against a synchronous save-and-upload of the same state in the same run.

    .venv/bin/python bench/checkpoint.py [--reps 3] [--d-model 384] [--layers 4] [--smoke]

`--smoke` runs the same paths with a tiny model (d=96, 1 layer) and one rep: it checks that the bench works,
its figures mean nothing.

The trainer itself: trainer.train.Trainer (DeepSpeed ZeRO-1, bf16 where the CPU computes it natively (else
fp32, trainer.parallel.precision) with fp32 master weights, AdamW) on
tinyshakespeare with the 8,192 most frequent GPT-2 tokens, and its Checkpointer writing to a moto_server
subprocess on loopback (S3 API through boto3, multipart, sha256 metadata). Per checkpoint, interleaved so
load from other processes hits both alike, median of --reps:
  stall        = Checkpointer.save(): every rank's DeepSpeed state (model, optimizer shards), RNG and loop
                 state copied in memory (trainer.checkpoint.async_save); the writes of the staging files, the commit
                 (wait for every rank's files, sha256, manifest, rename, latest) and the upload follow in
                 their own threads while training goes on
  synchronous  = the same save, then waiting for the writes, the commit and the upload, as a loop without
                 threads would
Also: the in-memory snapshot's throughput and the background write's against shutil.copyfile of the same
bytes, the upload throughput, and a training step's time while a write and an upload run against one on an
idle machine (they share the CPU).
Last line: `ratio: X.XX` = stall ÷ synchronous (issue 6 target ≤ 0.10).
"""

from __future__ import annotations

import sys
from pathlib import Path

# This folder holds scripts named like stdlib modules (bench/tokenize.py): never import from it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import os
import shutil
import statistics
import tempfile
import time

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))

import boto3  # noqa: E402

from tests.s3_server import MotoServer  # noqa: E402
from trainer.config import RunConfig, from_dict  # noqa: E402

MB = 1e6


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model (d=96, 1 layer), one rep: the bench runs, no figure means anything")
    args = parser.parse_args()
    if args.smoke:
        args.reps, args.d_model, args.layers = 1, 96, 1

    work = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret", AWS_DEFAULT_REGION="us-east-1",
                      NO_PROXY="127.0.0.1,localhost", AWS_CONFIG_FILE="/nonexistent",
                      AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    server = MotoServer(work / "moto_server.log")
    server.start()
    try:
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint
        boto3.session.Session().client("s3", endpoint_url=server.endpoint).create_bucket(Bucket="bench")
        from trainer.train import Trainer

        cfg = from_dict(RunConfig, {
            "data": {"text": str(DATA / "books" / "tinyshakespeare.txt"),
                     "tokenizer": str(DATA / "tokenizers" / "gpt2" / "tokenizer.json"), "top_tokens": 8192},
            "train_tokens": 10**9, "output_dir": str(work / "out"),
            "model": {"vocab_size": 8192, "d_model": args.d_model, "n_layers": args.layers, "n_heads": 6},
            "batch": {"global_batch": 4, "micro_batch": 4, "seq_len": 128},
            # auto: bf16 only where it is native; on an AVX2-only CPU bf16 steps run ~50x slower (STACK.md).
            "deepspeed": {"zero_stage": 1, "bf16": "auto"},
            "metrics": {"log_interval": 10**6, "tensorboard": False, "eval_batches": 0},
            "checkpoint": {"remote": "s3://bench/ckpt", "keep_last": 2, "resume": False}})
        trainer = Trainer(cfg)
        ckpt = trainer.checkpointer
        print(f"trainer: {trainer.n_params / 1e6:.1f} M parameters, ZeRO-1 {trainer.precision.dtype} "
              f"({trainer.precision.reason}); moto_server at {server.endpoint}")

        def step_time() -> float:
            t = time.perf_counter()
            trainer.step()
            return time.perf_counter() - t

        def wait_for_upload() -> dict:
            ckpt._settle()
            assert ckpt.uploader.flush(600)
            ckpt.drain()
            return next(e for e in reversed(events) if e["event"] == "uploaded")

        events: list[dict] = []
        ckpt.on_event = events.append
        step_time()
        stalls, syncs, copies, sizes, uploads, busy, idle = [], [], [], [], [], [], []
        for rep in range(args.reps):
            # (a) the loop as it runs: save, then train on while the commit and the upload go on.
            t0 = time.perf_counter()
            ckpt.save(trainer)
            stalls.append(time.perf_counter() - t0)
            busy += [step_time() for _ in range(2)]
            uploads.append(wait_for_upload())
            idle += [step_time() for _ in range(2)]

            # (b) synchronous: the same save, waiting for the commit and the upload before training on.
            t0 = time.perf_counter()
            ckpt.save(trainer)
            uploads.append(wait_for_upload())
            syncs.append(time.perf_counter() - t0)
            folder = ckpt.local.path(trainer.state.step)
            sizes.append(folder_bytes(folder))

            # A plain copy of the same bytes, file by file, to the same disk.
            dest = work / f"copy-{rep}"
            t0 = time.perf_counter()
            for src in sorted(folder.rglob("*")):
                if src.is_file():
                    (dest / src.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, dest / src.relative_to(folder))
            copies.append(time.perf_counter() - t0)
            shutil.rmtree(dest)
            step_time()
            print(f"rep {rep + 1}: stall {stalls[-1]:.3f} s, synchronous {syncs[-1]:.3f} s, copy {copies[-1]:.3f} s, "
                  f"{sizes[-1] / MB:.0f} MB", flush=True)
        ckpt.close()
        assert not [e for e in events if e["event"] in ("commit_failed", "upload_failed")], events

        size = statistics.median(sizes)
        stall, sync, copy = statistics.median(stalls), statistics.median(syncs), statistics.median(copies)
        up_mbs = statistics.median(e["bytes"] / max(e["seconds"], 1e-9) / MB for e in uploads)
        committed = [e for e in events if e["event"] == "committed"]
        commit_s = statistics.median(e["seconds"] - e["write_wait_seconds"] for e in committed)
        # (a)'s commits start as save() returns: their wait is the background write itself.
        write_s = statistics.median(e["write_wait_seconds"] for e in committed[0::2])
        print(f"checkpoint: {size / MB:.0f} MB (DeepSpeed shards, RNG, loop state)")
        print(f"stall per checkpoint (write, commit, upload in the background): {stall:.3f} s")
        print(f"synchronous save + write + commit + upload:                     {sync:.3f} s")
        print(f"write of the shards (fsynced), in the writer thread:            {write_s:.3f} s")
        print(f"commit (sha256 + manifest + rename + latest), in its thread:    {commit_s:.3f} s")
        print(f"throughput: in-memory snapshot {size / stall / MB:.0f} MB/s, background write "
              f"{size / write_s / MB:.0f} MB/s, plain copy {size / copy / MB:.0f} MB/s "
              f"(write / copy = {copy / write_s:.2f})")
        print(f"upload throughput (moto_server on loopback): {up_mbs:.0f} MB/s")
        print(f"train step while writing and uploading: {statistics.median(busy):.3f} s "
              f"vs idle {statistics.median(idle):.3f} s")
        print(f"ratio: {stall / sync:.2f}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
