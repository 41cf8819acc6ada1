"""Benchmark: the trainer's step against a plain GPT-style PyTorch loop of the same model and batches.

    .venv/bin/python bench/train_step.py [--steps 10] [--rounds 3] [--d-model 128] [--layers 4] [--seq 64]
                                         [--batch 16] [--two-process] [--smoke]

Model: the Llama-style decoder (trainer.model.transformer), by default 4 layers, d=128, 4 heads, seq 64, 16 sequences a
step, vocabulary the 8,192 most frequent GPT-2 tokens of tinyshakespeare (../shared/data). Every runner
draws the same samples from the same source with the same initial weights, in the precision the trainer
picks on this machine (deepspeed.bf16: auto; the baseline autocasts to bf16 exactly when the trainer runs in
bf16), one process, the same torch threads.

- baseline: what one writes by hand: `is_causal` SDPA (no document mask, positions 0..T-1), AdamW,
  clip_grad_norm_(1.0); no DeepSpeed, no per-step checks.
- baseline + document mask: the same loop with the packed documents' mask and restarting positions.
- trainer: trainer.train.Trainer.step() as the demo runs it (ZeRO-1 with one process, document mask, the
  spike guard, the SDC/straggler figures, the watchdog, health every health.interval steps), then the same
  with one check turned off at a time (what each costs), with ZeRO-0 (what ZeRO-1's buffers cost), and with
  activation checkpointing full and selective (the time each costs; the activation bytes autograd keeps for one
  step's backward, with and without, are printed as the memory saved).
Steps of every runner interleave one by one (steps × rounds each) so load from other processes hits all alike;
each figure is the median step. --two-process adds the trainer's ZeRO-1 on 2 processes (torchrun).
Last line: `ratio: X.XX` = trainer tokens/s ÷ baseline tokens/s (target ≥ 0.90).
"""

from __future__ import annotations

import sys
from pathlib import Path

# This folder holds scripts named like stdlib modules (bench/tokenize.py): never import from it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import contextlib
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
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))

import torch  # noqa: E402

from trainer.config import RunConfig, from_dict  # noqa: E402

VOCAB = 8192
# Each trainer variant turns one check off, to show what it costs (run-config sections merged over the default).
CHECKS = {
    "spike guard": {"guard": {"enabled": False}},
    "SDC figures": {"sdc": {"enabled": False}},
    "straggler figures": {"straggler": {"enabled": False}},
    "step watchdog": {"watchdog": {"enabled": False}},
    "layer health": {"health": {"interval": 0}},
}


def run_dict(out: Path, args, train_tokens: int, *, zero_stage: int = 1, micro_batch: int | None = None,
             **sections) -> dict:
    run = {
        "data": {"text": str(DATA / "books" / "tinyshakespeare.txt"),
                 "tokenizer": str(DATA / "tokenizers" / "gpt2" / "tokenizer.json"), "top_tokens": VOCAB},
        "train_tokens": train_tokens, "output_dir": str(out),
        "model": {"vocab_size": VOCAB, "d_model": args.d_model, "n_layers": args.layers, "n_heads": 4},
        "schedule": {"kind": "constant"},
        "batch": {"global_batch": args.batch, "micro_batch": micro_batch or args.batch, "seq_len": args.seq},
        "deepspeed": {"zero_stage": zero_stage, "bf16": "auto"},
        "metrics": {"log_interval": 5, "tensorboard": False, "eval_batches": 0},
        "guard": {"max_skipped": 10**6},
        "health": {"interval": 100},  # the default: one step in a hundred gathers per-layer figures
    }
    for key, value in sections.items():
        run[key] = {**run.get(key, {}), **value}
    return run


class Baseline:
    """The baseline: what one would write by hand for the same model (optionally with the document mask)."""

    def __init__(self, cfg: RunConfig, source, *, batch: int, bf16: bool, doc_mask: bool):
        from trainer.model.transformer import CausalLM
        from trainer.optim import param_groups

        torch.manual_seed(cfg.seed)
        self.model = CausalLM(cfg.model)
        self.opt = torch.optim.AdamW(param_groups(self.model, cfg.optim), lr=cfg.optim.lr, betas=cfg.optim.betas,
                                     eps=cfg.optim.eps)
        self.source, self.next, self.batch = source, 0, batch
        self.bf16, self.doc_mask = bf16, doc_mask

    def step(self):
        b = self.source.batch(list(range(self.next, self.next + self.batch)))
        self.next += self.batch
        tokens = torch.as_tensor(b["tokens"])
        doc_ids = torch.as_tensor(b["doc_ids"])[:, :-1] if self.doc_mask else None
        positions = torch.as_tensor(b["positions"])[:, :-1] if self.doc_mask else None
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()
        with autocast:
            loss, _ = self.model(tokens[:, :-1], tokens[:, 1:], doc_ids, positions)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


RECOMPUTE = ("full", "selective")


def kept_activation_bytes(cfg: RunConfig, source, batch: int, bf16: bool, mode: str) -> int:
    """Bytes of the tensors autograd keeps for backward in one forward of the model (parameters not counted)."""
    from trainer.model.transformer import CausalLM

    model = CausalLM(cfg.model.model_copy(update={"activation_checkpointing": mode}))
    params = {p.data_ptr() for p in model.parameters()}
    b = source.batch(list(range(batch)))
    tokens = torch.as_tensor(b["tokens"])
    kept: dict[int, int] = {}

    def pack(t):
        if t.data_ptr() not in params:
            kept[t.data_ptr()] = t.numel() * t.element_size()  # a tensor saved twice is held once
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        loss, _ = model(tokens[:, :-1], tokens[:, 1:], torch.as_tensor(b["doc_ids"])[:, :-1],
                        torch.as_tensor(b["positions"])[:, :-1])
    loss.backward()
    return sum(kept.values())


def step_seconds(step) -> float:
    t = time.perf_counter()
    step()
    return time.perf_counter() - t


def two_process(work: Path, args) -> float:
    out = work / "two"
    cfg = work / "two.json"
    cfg.write_text(json.dumps(run_dict(out, args, (args.steps + 6) * args.batch * args.seq,
                                       micro_batch=args.batch // 2)))
    torchrun = Path(sys.executable).parent / "torchrun"
    subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "trainer", "--config", str(cfg)],
                   cwd=REPO, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    return max(r["tokens_per_s"] for r in records if r["event"] == "train" and r["step"] > 5)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--two-process", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that only shows the script works")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.rounds, args.d_model, args.layers, args.seq, args.batch = 2, 1, 64, 1, 32, 4

    from trainer.train import Trainer, build_sources

    work = Path(tempfile.mkdtemp(prefix="bench-train-step-"))
    os.environ.setdefault("PRETRAIN_HOME", str(work / "home"))  # the measured CPU peak is cached there
    tokens = args.batch * args.seq
    budget = (args.steps * args.rounds + 10) * tokens * 4
    base_cfg = from_dict(RunConfig, run_dict(work / "base", args, budget))
    source, _ = build_sources(base_cfg)
    trainers = {"trainer": Trainer(base_cfg, train_source=source, val_sources={})}
    for check, section in CHECKS.items():
        cfg = from_dict(RunConfig, run_dict(work / check.replace(" ", "-"), args, budget, **section))
        trainers[f"trainer without {check}"] = Trainer(cfg, train_source=source, val_sources={})
    # ZeRO-1 on one process shards nothing: what its flat buffers and copies cost against plain DeepSpeed.
    trainers["trainer, ZeRO-0"] = Trainer(from_dict(RunConfig, run_dict(work / "zero0", args, budget, zero_stage=0)),
                                          train_source=source, val_sources={})
    for mode in RECOMPUTE:
        cfg = from_dict(RunConfig, run_dict(work / f"ac-{mode}", args, budget, model={"activation_checkpointing": mode}))
        trainers[f"trainer, {mode} recompute"] = Trainer(cfg, train_source=source, val_sources={})
    precision = trainers["trainer"].precision
    runners = {
        "baseline": Baseline(base_cfg, source, batch=args.batch, bf16=precision.bf16, doc_mask=False).step,
        "baseline + document mask": Baseline(base_cfg, source, batch=args.batch, bf16=precision.bf16,
                                             doc_mask=True).step,
        **{name: t.step for name, t in trainers.items()},
    }
    n_params = trainers["trainer"].n_params
    print(f"model: {n_params:,} parameters, {args.layers} layers, d={args.d_model}, batch {args.batch} × {args.seq} "
          f"tokens; {precision.dtype} ({precision.reason}); torch threads {torch.get_num_threads()}")
    for step in runners.values():
        for _ in range(3):
            step()  # warm-up: allocator, first Adam step
    # Steps interleave one by one and each runner's figure is its median step: the 2 cores are shared,
    # and load from elsewhere then falls on all alike.
    times = {name: [] for name in runners}
    for _ in range(args.steps * args.rounds):
        for name, step in runners.items():
            times[name].append(step_seconds(step))
    median = {name: statistics.median(t) for name, t in times.items()}
    rate = {name: tokens / s for name, s in median.items()}
    base = rate["baseline"]
    for name, r in rate.items():
        print(f"{name:36s} {r:10,.0f} tokens/s  {r / base:5.2f}×  {1e3 * median[name]:7.2f} ms/step")
    print(f"document mask costs {1e3 * (median['baseline + document mask'] - median['baseline']):+.2f} ms/step "
          f"in the baseline")
    for check in CHECKS:
        cost = median["trainer"] - median[f"trainer without {check}"]
        print(f"{check:20s} costs {1e3 * cost:+.2f} ms/step in the trainer")
    plain = kept_activation_bytes(base_cfg, source, args.batch, precision.bf16, "none")
    for mode in RECOMPUTE:
        kept = kept_activation_bytes(base_cfg, source, args.batch, precision.bf16, mode)
        cost = median[f"trainer, {mode} recompute"] - median["trainer"]
        print(f"{mode} recompute keeps {kept / 2**20:.1f} MiB of activations for backward instead of "
              f"{plain / 2**20:.1f} MiB ({1 - kept / plain:.0%} saved) and costs {1e3 * cost:+.2f} ms/step "
              f"({cost / median['trainer']:+.0%})")
    if args.two_process:
        two = two_process(work, args)
        print(f"{'trainer ZeRO-1, 2 processes':36s} {two:10,.0f} tokens/s  {two / base:5.2f}× (whole job)")
    for t in trainers.values():
        t.watchdog.close()
        t.checkpointer.close(wait=False)
        t.metrics.close()
    print(f"ratio: {rate['trainer'] / base:.2f}")


if __name__ == "__main__":
    main()
