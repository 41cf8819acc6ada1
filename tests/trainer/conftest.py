"""Shared set-up for the trainer tests: DeepSpeed on CPU, a tiny model on real text."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import REPO, SHARED_DATA

# Every trainer a test starts, in this process or in a subprocess (the launcher's and Slurm's tests import this
# module too), loads the test-only fault injection (tests/trainer/faults.py); it acts only where a test sets
# PRETRAIN_TEST_FAULT. A file path, so a trainer started in any working directory finds it.
os.environ.setdefault("PRETRAIN_TRAINER_CALLBACKS", f"{REPO / 'tests' / 'trainer' / 'faults.py'}:Faults")

TEXT = SHARED_DATA / "books" / "tinyshakespeare.txt"
TOKENIZER = SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json"
TOP_TOKENS = 512  # GPT-2 ids renumbered to the 510 most frequent + EOS + "other": a tiny head on CPU


@pytest.fixture(autouse=True)
def deepspeed_on_cpu(monkeypatch):
    # DeepSpeed compiles a C++ op on its first run (~40 s); the shared cache makes later runs reuse it.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Two cores shared by everything: one thread per process keeps 2-rank runs from thrashing.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def run_dict(output_dir, **sections) -> dict:
    """A tiny run on tinyshakespeare: override any section with a dict (model={"n_layers": 1})."""
    base = {
        "data": {"text": str(TEXT), "tokenizer": str(TOKENIZER), "top_tokens": TOP_TOKENS},
        "train_tokens": 8 * 8 * 64,
        "output_dir": str(output_dir),
        "model": {"vocab_size": TOP_TOKENS, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2},
        "optim": {"lr": 3e-3},
        "schedule": {"kind": "constant"},
        "batch": {"global_batch": 8, "micro_batch": 2, "seq_len": 64},
        "metrics": {"log_interval": 1, "eval_batches": 1, "tensorboard": False},
    }
    for key, value in sections.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return base


def write_run(path, **sections):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run_dict(path.parent / "out", **sections)))
    return path


def read_metrics(output_dir) -> list[dict]:
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]
