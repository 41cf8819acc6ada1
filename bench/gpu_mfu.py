"""Benchmark (GPU only): MFU of the trainer at ~125M and ~350M parameters, seq 2048, bf16.

    .venv/bin/python bench/gpu_mfu.py [--steps 30] [--warmup 8] [--smoke]

For each size the trainer (trainer.train.Trainer: DeepSpeed ZeRO-0 bf16 with fp32 master weights,
compiled FlexAttention with the document mask, the spike guard, metrics) runs `warmup` steps (compile,
allocator) and then `steps` timed steps; tokens/s is from the median step. The baseline is a bare
PyTorch loop of the identical model and batches in the same process: fp32 weights under
torch.autocast(bf16), fused AdamW, clip_grad_norm_, no DeepSpeed, no guard, no metrics.
MFU = (6N + 12·L·T·d) · tokens/s ÷ peak (trainer/metrics.py; H100/H200 989e12 bf16 dense).
Target (issue 5): trainer MFU ≥ 50% on an H100/H200.
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

SEQ, VOCAB = 2048, 50304
SIZES = {  # name: (d_model, n_layers, n_heads, micro batch)
    "125M": (768, 12, 12, 8),
    "350M": (1024, 24, 16, 8),
}


def run_dict(out: Path, size: str, steps: int) -> dict:
    d, layers, heads, micro = SIZES[size]
    return {
        "data": {"text": str(DATA / "books" / "tinyshakespeare.txt"),
                 "tokenizer": str(DATA / "tokenizers" / "gpt2" / "tokenizer.json")},
        "train_tokens": steps * micro * SEQ, "output_dir": str(out),
        "model": {"vocab_size": VOCAB, "d_model": d, "n_layers": layers, "n_heads": heads, "attention": "flex"},
        "schedule": {"kind": "constant"},
        "batch": {"global_batch": micro, "micro_batch": micro, "seq_len": SEQ},
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
        tokens_per_step = cfg.batch.global_batch * SEQ
        timed(trainer.step, warmup)
        trainer_s = statistics.median(timed(trainer.step, steps))
        fpt, (peak, label) = trainer.metrics.flops_per_token, (trainer.metrics.peak.flops, trainer.metrics.peak.label)
        n_params = trainer.n_params
        source = trainer.train_source

        # The bare loop: the same model class and initial weights, the same batches.
        torch.manual_seed(cfg.seed)
        from trainer.model import CausalLM

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
    print(f"{size}: {n_params / 1e6:.0f}M parameters, seq {SEQ}, {tokens_per_step} tokens/step, peak {label}")
    print(f"  trainer: {tokens_per_step / trainer_s:,.0f} tokens/s, MFU {100 * trainer_mfu:.1f}%")
    print(f"  bare loop: {tokens_per_step / bare_s:,.0f} tokens/s, MFU {100 * bare_mfu:.1f}%")
    return trainer_mfu, bare_mfu, n_params


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
    trainer_mfu, bare_mfu, _ = results[sizes[-1]]
    print(f"target: trainer MFU >= 50% ({'met' if min(r[0] for r in results.values()) >= 0.5 else 'NOT met'})")
    print(f"ratio: {trainer_mfu / bare_mfu:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
