"""Benchmark (GPU only): MFU of the trainer at ~125M and ~350M parameters (seq 2048), ~1B (seq 4096, activation
checkpointing), bf16; and a long-context run split over every GPU of the machine (DeepSpeed Ulysses).

    .venv/bin/python bench/gpu_mfu.py [--steps 30] [--warmup 8] [--smoke]

For each size the trainer (trainer.train.Trainer: DeepSpeed ZeRO-0 bf16 with fp32 master weights,
compiled FlexAttention with the document mask, the spike guard, metrics) runs `warmup` steps (compile,
allocator) and then `steps` timed steps; tokens/s is from the median step. The baseline is a bare
PyTorch loop of the identical model and batches in the same process: fp32 weights under
torch.autocast(bf16), fused AdamW, clip_grad_norm_, no DeepSpeed, no guard, no metrics.
MFU = (6N + 12·L·T·d) · tokens/s ÷ peak (trainer/reporting/metrics.py; H100/H200 989e12 bf16 dense).
Targets (issues 5, 19) on an H100/H200: trainer MFU ≥ 50% at 125M-350M, ≥ 45% at 1B (whose recomputed forward is
not counted: MFU counts the model's FLOPs, not the hardware's). The long-context run (350M at seq 32768,
batch.sequence_parallel = the GPU count, under torchrun) reports the trainer's own per-device MFU; it needs 2 GPUs.
Last line: `ratio: X.XX` = trainer MFU ÷ bare-loop MFU at ~350M (the trainer's overhead on a GPU).
--smoke: the 125M size only, 2 timed steps: shows the script works, measures nothing worth quoting.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This folder holds scripts named like stdlib modules (bench/tokenize.py): never import from it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import os
import statistics
import tempfile
import time

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
sys.path.insert(0, str(REPO))
os.environ.setdefault("DS_ACCELERATOR", "cuda")

import torch  # noqa: E402

from trainer.config import RunConfig, from_dict  # noqa: E402

VOCAB = 50304
SIZES = {  # name: (d_model, n_layers, n_heads, micro batch, seq_len, activation checkpointing)
    "125M": (768, 12, 12, 8, 2048, "none"),
    "350M": (1024, 24, 16, 8, 2048, "none"),
    "1B": (2048, 16, 16, 4, 4096, "full"),
}
TARGETS = {"125M": 0.50, "350M": 0.50, "1B": 0.45}
LONG = ("350M", 32768)  # the long-context run: size, seq_len


def run_dict(out: Path, size: str, steps: int, *, seq: int | None = None, sequence_parallel: int = 1) -> dict:
    d, layers, heads, micro, seq_len, recompute = SIZES[size]
    if seq is not None:
        seq_len, micro = seq, 1
    return {
        "data": {"text": str(DATA / "books" / "tinyshakespeare.txt"),
                 "tokenizer": str(DATA / "tokenizers" / "gpt2" / "tokenizer.json")},
        "train_tokens": steps * micro * seq_len, "output_dir": str(out),
        "model": {"vocab_size": VOCAB, "d_model": d, "n_layers": layers, "n_heads": heads, "attention": "flex",
                  "activation_checkpointing": recompute},
        "schedule": {"kind": "constant"},
        "batch": {"global_batch": micro, "micro_batch": micro, "seq_len": seq_len, "sequence_parallel": sequence_parallel},
        "deepspeed": {"zero_stage": 0, "bf16": True},
        "metrics": {"log_interval": 10**6, "tensorboard": False, "eval_batches": 0},
        "guard": {"max_skipped": 10**6},
    }


def timed(fn, n: int) -> list[float]:
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def bench_size(size: str, steps: int, warmup: int) -> tuple[float, float, float]:
    """(trainer MFU, bare MFU, parameters) for one model size."""
    from trainer.train import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        cfg = from_dict(RunConfig, run_dict(Path(tmp), size, steps + warmup))
        trainer = Trainer(cfg)
        seq_len = cfg.batch.seq_len
        tokens_per_step = cfg.batch.global_batch * seq_len
        timed(trainer.step, warmup)
        trainer_s = statistics.median(timed(trainer.step, steps))
        fpt, (peak, label) = trainer.metrics.flops_per_token, (trainer.metrics.peak.flops, trainer.metrics.peak.label)
        n_params = trainer.n_params
        source = trainer.train_source

        # The bare loop: the same model class and initial weights, the same batches.
        torch.manual_seed(cfg.seed)
        from trainer.model.transformer import CausalLM

        model = CausalLM(cfg.model).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        index = [0]

        def bare_step():
            b = source.batch(list(range(index[0], index[0] + cfg.batch.global_batch)))
            index[0] += cfg.batch.global_batch
            t = {k: torch.as_tensor(b[k]).cuda(non_blocking=True) for k in ("tokens", "doc_ids", "positions")}
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss, _ = model(t["tokens"][:, :-1], t["tokens"][:, 1:], t["doc_ids"][:, :-1], t["positions"][:, :-1])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        del trainer
        torch.cuda.empty_cache()
        timed(bare_step, warmup)
        bare_s = statistics.median(timed(bare_step, steps))
    trainer_mfu = fpt * tokens_per_step / trainer_s / peak
    bare_mfu = fpt * tokens_per_step / bare_s / peak
    print(f"{size}: {n_params / 1e6:.0f}M parameters, seq {seq_len}, {tokens_per_step} tokens/step, peak {label}, "
          f"activation checkpointing {cfg.model.activation_checkpointing}")
    print(f"  trainer: {tokens_per_step / trainer_s:,.0f} tokens/s, MFU {100 * trainer_mfu:.1f}%")
    print(f"  bare loop: {tokens_per_step / bare_s:,.0f} tokens/s, MFU {100 * bare_mfu:.1f}%")
    return trainer_mfu, bare_mfu, n_params


def long_context(steps: int, warmup: int) -> float | None:
    """Per-device MFU of the long-context run on every GPU (torchrun), from the trainer's own records."""
    import json
    import subprocess

    gpus = torch.cuda.device_count()
    size, seq = LONG
    if gpus < 2:
        print(f"long context ({size}, seq {seq}, Ulysses): skipped, needs 2 GPUs (this machine has {gpus})")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        cfg = run_dict(Path(tmp) / "out", size, steps + warmup, seq=seq, sequence_parallel=gpus)
        cfg["metrics"]["log_interval"] = 1
        (Path(tmp) / "run.json").write_text(json.dumps(cfg))
        torchrun = Path(sys.executable).parent / "torchrun"
        subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", str(gpus), "-m", "trainer", "--config",
                        str(Path(tmp) / "run.json")], cwd=REPO, check=True)
        records = [json.loads(line) for line in (Path(tmp) / "out" / "metrics.jsonl").open()]
    mfu = statistics.median(r["mfu"] for r in records if r.get("event") == "train" and r["step"] >= warmup)
    print(f"long context: {size} at seq {seq} over {gpus} GPUs (Ulysses): per-device MFU {100 * mfu:.1f}%")
    return mfu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="the 125M size, 2 steps: the script works, no figure")
    args = parser.parse_args()
    sizes = ["125M"] if args.smoke else list(SIZES)
    if args.smoke:
        args.steps, args.warmup = 2, 1
    if not torch.cuda.is_available():
        print("bench/gpu_mfu.py needs a CUDA device (issue 5: run it on the device machine)", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    results = {size: bench_size(size, args.steps, args.warmup) for size in sizes}
    for size, (mfu, _, _) in results.items():
        print(f"target {size}: trainer MFU >= {TARGETS[size]:.0%} ({'met' if mfu >= TARGETS[size] else 'NOT met'})")
    if not args.smoke:
        long_context(args.steps, args.warmup)
    trainer_mfu, bare_mfu, _ = results["350M" if "350M" in results else sizes[-1]]
    print(f"ratio: {trainer_mfu / bare_mfu:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
