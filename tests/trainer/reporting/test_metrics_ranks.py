"""MFU per device on 2 ranks against 1 (torchrun, gloo), and zero-shot evaluation split over the ranks.

MFU is the whole job's tokens/s × FLOPs per token ÷ (world size × one device's peak): with the peak fixed
(metrics.peak_flops), each record's mfu × peak × world size ÷ tokens_per_s must be the model's FLOPs per token,
6N + 12·L·T·d, on 1 rank and on 2 alike (a per-job MFU would read twice that on 2 ranks).
"""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, SHARED_DATA
from tests.trainer.conftest import read_metrics, run_dict, write_run

BIN = os.path.dirname(sys.executable)
ALONE = (sys.executable, "-m", "trainer")
TORCHRUN_2 = (os.path.join(BIN, "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "trainer")
PEAK = 1e12
SETTINGS = {"train_tokens": 4 * 8 * 64, "deepspeed": {"zero_stage": 1, "bf16": False},
            "metrics": {"log_interval": 1, "eval_batches": 1, "tensorboard": False, "peak_flops": PEAK,
                        "downstream_interval": 2, "downstream_tasks": ["lambada_openai", "piqa"], "downstream_limit": 5,
                        "downstream_benchmarks": str(SHARED_DATA / "benchmarks")}}


def _records(tmp_path, name, launcher) -> list[dict]:
    run = write_run(tmp_path / name / "run.json", **SETTINGS)
    result = subprocess.run([*launcher, "--config", str(run)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return read_metrics(run.parent / "out")


@pytest.mark.slow  # two trainer runs (1 and 2 ranks), 4 steps each
def test_mfu_is_per_device_and_zero_shot_splits_over_the_ranks(tmp_path):
    from trainer.model.config import ModelConfig
    from trainer.model.transformer import Transformer

    runs = {1: _records(tmp_path, "one", ALONE), 2: _records(tmp_path, "two", TORCHRUN_2)}
    model = ModelConfig(**run_dict(tmp_path)["model"])
    n_matmul = sum(p.numel() for n, p in Transformer(model).named_parameters() if n != "tok_emb.weight")
    per_token = 6 * n_matmul + 12 * model.n_layers * 64 * model.d_model  # seq_len 64
    for world, records in runs.items():
        train = [r for r in records if r["event"] == "train"]
        assert [r["step"] for r in train] == [1, 2, 3, 4] and all(r["peak"] == "configured peak" for r in train)
        for r in train:
            assert r["mfu"] * PEAK * world / r["tokens_per_s"] == pytest.approx(per_token, rel=1e-9), (world, r)
    # The same global throughput reads as half the MFU per device on 2 ranks.
    ratio = {w: [r["mfu"] / r["tokens_per_s"] for r in rs if r["event"] == "train"] for w, rs in runs.items()}
    assert all(two == pytest.approx(one / 2, rel=1e-9) for one, two in zip(ratio[1], ratio[2]))

    # Zero-shot on 2 ranks: every item scored once (each rank half the requests), as on one rank (fp32 ZeRO-1:
    # the two runs' weights agree to ~1e-6).
    downstream = {w: [r for r in rs if r["event"] == "downstream"] for w, rs in runs.items()}
    assert [r["step"] for r in downstream[2]] == [r["step"] for r in downstream[1]] == [2, 4]
    for one, two in zip(downstream[1], downstream[2]):
        assert two["tokens"] == one["tokens"] == one["step"] * 8 * 64
        for task in ("lambada_openai", "piqa"):
            assert two["tasks"][task]["n"] == 5 and two["tasks"][task]["acc"] == one["tasks"][task]["acc"]
        assert two["tasks"]["lambada_openai"]["perplexity"] == pytest.approx(one["tasks"]["lambada_openai"]["perplexity"], rel=1e-3)
