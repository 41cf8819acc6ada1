"""Golden losses (torchtitan's practice): the demo model's first 20 steps on fixed data must not drift.

The model is recipes/demo.yaml's `main` stage (d_model 128, 2 layers, 4 heads / 2 KV heads, z-loss,
8,192-token vocabulary) with its optimizer, WSD schedule and batch ramp (8 -> 16 sequences of 128
tokens), ZeRO-1, on tinyshakespeare (GPT-2 ids renumbered to the 8,192 most frequent: the demo's
vocabulary size) instead of the demo's curated shards, which only a materialized pipeline has.
One process on the CPU, seed 0, one thread.

Precision is pinned to fp32: bf16 is native on some CPUs and emulated on others (different numerics),
fp32 is the same arithmetic everywhere up to the order of accumulation inside the matmul kernels, which
differs between AVX-512 and AVX2 builds of the kernels. Measured when the file was written: identical
losses natively (AVX-512) on repeated runs; under ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 the
largest difference over the 20 steps was 4.8e-7 (2 of 20 losses differ; "avx2_max_abs_diff" in
tests/trainer/golden/demo_main_20_steps.json). TOLERANCE is 20 times that, far below any behaviour
change (a changed data order, schedule or update moves the losses by 1e-3 or more within a few steps).

Regenerate (only for an intended change of the numerics, saying why in the commit):
    PRETRAIN_GOLDEN_WRITE=1 .venv/bin/python -m pytest tests/trainer/test_golden_loss.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import TEXT, TOKENIZER
from trainer.config import RunConfig, from_dict

GOLDEN = Path(__file__).parent / "golden" / "demo_main_20_steps.json"
STEPS = 20
TOLERANCE = 1e-5  # absolute, on losses near ln 8192 ≈ 9: 20× the AVX2 difference measured (4.8e-7)


def demo_main_run(output_dir) -> dict:
    """recipes/demo.yaml's training.main on tinyshakespeare, fp32."""
    return {
        "data": {"text": str(TEXT), "tokenizer": str(TOKENIZER), "top_tokens": 8192},
        "train_tokens": 262144,
        "output_dir": str(output_dir),
        "seed": 0,
        "model": {"vocab_size": 8192, "d_model": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                  "z_loss": 1.0e-4},
        "optim": {"lr": 3.0e-3},
        "schedule": {"kind": "wsd", "warmup_tokens": 16384, "decay_fraction": 0.1},
        "batch": {"global_batch": 16, "micro_batch": 8, "seq_len": 128, "ramp_start": 8, "ramp_tokens": 32768},
        "deepspeed": {"zero_stage": 1, "bf16": False},
        "metrics": {"log_interval": 16, "eval_batches": 0, "tensorboard": False},
        "checkpoint": {"resume": False, "save_final": False},
    }


def first_losses(output_dir, steps: int = STEPS) -> list[float]:
    from trainer.train import Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernels' accumulation order may depend on the thread count
    try:
        trainer = Trainer(from_dict(RunConfig, demo_main_run(output_dir)))
        return [trainer.step().loss for _ in range(steps)]
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow  # ~10 s: DeepSpeed's engine and 20 steps of the demo model
def test_the_demo_models_first_20_losses_match_the_golden_file(tmp_path):
    losses = first_losses(tmp_path / "out")
    if os.environ.get("PRETRAIN_GOLDEN_WRITE"):
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        GOLDEN.write_text(json.dumps({**golden, "steps": STEPS, "losses": losses}, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert len(losses) == golden["steps"] == STEPS
    diffs = [abs(a - b) for a, b in zip(losses, golden["losses"])]
    assert max(diffs) <= TOLERANCE, list(zip(losses, golden["losses"]))
