"""Benchmark: the trainer's step against a bare PyTorch loop of the identical model and batches.

    .venv/bin/python bench/train_step.py [--steps 10] [--rounds 2] [--two-process]

Model: the Llama-style decoder at d=256, 4 layers, 4 heads, seq 256, batch 8 sequences, vocabulary the
8,192 most frequent GPT-2 tokens of tinyshakespeare (../shared/data). Both sides draw the same samples
from the same source every step, with the same initial weights and bf16 compute.
Bare loop: fp32 weights, torch.autocast(bf16), AdamW, clip_grad_norm_(1.0); no DeepSpeed, no guard, no
metrics. Trainer: trainer.train.Trainer.step() (DeepSpeed bf16 with fp32 master weights, the spike
guard, the LR schedule, the metrics counter), ZeRO-0 and ZeRO-1, one process. Steps of the three interleave one by one
(steps × rounds of each) so load from other processes hits all alike; each figure is from the median step.
--two-process adds ZeRO-1 on 2 processes (torchrun; tokens/s of the whole job from its metrics file).
Last line: `ratio: X.XX` = trainer ZeRO-0 tokens/s ÷ bare-loop tokens/s (target ≥ 0.95).
"""

from __future__ import annotations

import sys
from pathlib import Path

# This folder holds scripts named like stdlib modules (bench/tokenize.py): never import from it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
sys.path.insert(0, str(REPO))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".pretrain" / "torch_extensions"))

import torch  # noqa: E402

from trainer.config import RunConfig, from_dict  # noqa: E402

SEQ, BATCH, VOCAB = 256, 8, 8192


def run_dict(out: Path, zero_stage: int, train_tokens: int, micro_batch: int = BATCH) -> dict:
    return {
        "data": {"text": str(DATA / "books" / "tinyshakespeare.txt"),
                 "tokenizer": str(DATA / "tokenizers" / "gpt2" / "tokenizer.json"), "top_tokens": VOCAB},
        "train_tokens": train_tokens, "output_dir": str(out),
        "model": {"vocab_size": VOCAB, "d_model": 256, "n_layers": 4, "n_heads": 4},
        "schedule": {"kind": "constant"},
        "batch": {"global_batch": BATCH, "micro_batch": micro_batch, "seq_len": SEQ},
        "deepspeed": {"zero_stage": zero_stage, "bf16": True},
        "metrics": {"log_interval": 5, "tensorboard": False, "eval_batches": 0},
        "guard": {"max_skipped": 10**6},
    }


class Bare:
    """The baseline: what one would write by hand for the same model."""

    def __init__(self, cfg: RunConfig, source):
        from trainer.model import CausalLM
        from trainer.optim import param_groups

        torch.manual_seed(cfg.seed)
        self.model = CausalLM(cfg.model)
        self.opt = torch.optim.AdamW(param_groups(self.model, cfg.optim), lr=cfg.optim.lr, betas=cfg.optim.betas,
                                     eps=cfg.optim.eps)
        self.source, self.next = source, 0

    def step(self):
        b = self.source.batch(list(range(self.next, self.next + BATCH)))
        self.next += BATCH
        tokens = b["tokens"]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = self.model(tokens[:, :-1], tokens[:, 1:], b["doc_ids"][:, :-1], b["positions"][:, :-1])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def step_seconds(step) -> float:
    t = time.perf_counter()
    step()
    return time.perf_counter() - t


def two_process(work: Path, steps: int) -> float:
    out = work / "two"
    cfg = work / "two.json"
    cfg.write_text(json.dumps(run_dict(out, 1, (steps + 5) * BATCH * SEQ, micro_batch=BATCH // 2)))
    torchrun = Path(sys.executable).parent / "torchrun"
    subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "trainer", "--config", str(cfg)],
                   cwd=REPO, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    return max(r["tokens_per_s"] for r in records if r["event"] == "train" and r["step"] > 5)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--two-process", action="store_true")
    args = parser.parse_args()

    from trainer.train import Trainer, build_sources

    work = Path(tempfile.mkdtemp(prefix="bench-train-step-"))
    budget = (args.steps * args.rounds + 10) * BATCH * SEQ * 4
    cfgs = {z: from_dict(RunConfig, run_dict(work / f"z{z}", z, budget)) for z in (0, 1)}
    source, _ = build_sources(cfgs[0])
    runners = {"bare PyTorch loop": Bare(cfgs[0], source).step}
    for z, cfg in cfgs.items():
        runners[f"trainer ZeRO-{z}, 1 process"] = Trainer(cfg, train_source=source, val_sources={}).step
    n_params = sum(p.numel() for p in Bare(cfgs[0], source).model.parameters())
    print(f"model: {n_params:,} parameters, batch {BATCH} × {SEQ} tokens, torch threads {torch.get_num_threads()}")
    for step in runners.values():
        for _ in range(3):
            step()  # warm-up: allocator, first Adam step
    # Steps interleave one by one and each runner's figure is its median step: the 2 cores are shared,
    # and load from elsewhere then falls on all three alike.
    times = {name: [] for name in runners}
    for _ in range(args.steps * args.rounds):
        for name, step in runners.items():
            times[name].append(step_seconds(step))
    best = {name: BATCH * SEQ / statistics.median(t) for name, t in times.items()}
    base = best["bare PyTorch loop"]
    for name, rate in best.items():
        print(f"{name:32s} {rate:10,.0f} tokens/s  {rate / base:5.2f}×")
    if args.two_process:
        rate = two_process(work, args.steps)
        print(f"{'trainer ZeRO-1, 2 processes':32s} {rate:10,.0f} tokens/s  {rate / base:5.2f}× (whole job)")
    print(f"ratio: {best['trainer ZeRO-0, 1 process'] / base:.2f}")


if __name__ == "__main__":
    main()
