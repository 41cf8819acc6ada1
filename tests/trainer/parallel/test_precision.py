"""Precision chosen by the hardware (deepspeed.bf16: auto) and the CPU peak behind MFU.

A CPU without AVX-512 BF16 / AMX emulates bf16 ~50× slower than fp32: `auto` must pick fp32 there. The
environment ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 brings any x86 machine down to that level, so
the end-to-end test runs the real trainer under it; the probe's other answers are patched in-process.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from tests.trainer.conftest import read_metrics, run_dict, write_run
from trainer.reporting import peak as peak_module
from trainer.config import RunConfig, from_dict
from trainer.reporting.peak import device_peak
from trainer.parallel.precision import resolve_precision

AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
CPU = torch.device("cpu")


def _probe(monkeypatch, kernels: str, onednn_bf16: bool):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: kernels)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn_bf16)


@pytest.mark.parametrize("kernels, onednn_bf16, expected", [
    ("AVX512", True, True),    # Zen 4/5, Sapphire Rapids: AVX-512 BF16
    ("AMX", True, True),
    ("AVX2", False, False),    # AVX2 only
    ("AVX512", False, False),  # Skylake-X: AVX-512 without its bf16 instructions
    ("AVX2", True, False),     # kernels limited by ATEN_CPU_CAPABILITY on a bf16 machine
])
def test_auto_picks_bf16_only_where_the_cpu_has_it_natively(monkeypatch, kernels, onednn_bf16, expected):
    _probe(monkeypatch, kernels, onednn_bf16)
    precision = resolve_precision("auto", CPU)
    assert precision.bf16 is expected and precision.requested == "auto"
    assert f"kernels {kernels}" in precision.reason and precision.dtype in precision.reason


def test_forced_precision_wins_over_the_hardware_and_the_checkpoint(monkeypatch):
    _probe(monkeypatch, "AVX2", False)
    assert resolve_precision(True, CPU, resumed={"dtype": "fp32"}).bf16 is True
    _probe(monkeypatch, "AVX512", True)
    assert resolve_precision(False, CPU).bf16 is False
    # auto on a resumed run keeps what the run started with, whatever this machine has.
    kept = resolve_precision("auto", CPU, resumed={"dtype": "fp32"})
    assert kept.bf16 is False and "started with" in kept.reason


def test_a_bad_bf16_value_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="deepspeed.bf16"):
        from_dict(RunConfig, run_dict(tmp_path, deepspeed={"bf16": "yes"}))


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_on_an_avx2_only_cpu_the_run_is_fp32_recorded_everywhere_and_mfu_at_most_one(tmp_path):
    run = write_run(tmp_path / "run.json", train_tokens=6 * 8 * 64, deepspeed={"zero_stage": 1},
                    checkpoint={"interval_steps": 3})
    env = {**os.environ, **AVX2_ONLY, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    result = subprocess.run([sys.executable, "-m", "trainer", "--config", str(run)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = run.parent / "out"
    records = read_metrics(out)
    precision = [r for r in records if r["event"] == "precision"]
    assert len(precision) == 1 and precision[0]["dtype"] == "fp32" and precision[0]["requested"] == "auto"
    assert "kernels AVX2" in precision[0]["reason"]
    assert result.stdout.count("event precision") == 1  # said once, at start
    train = [r for r in records if r["event"] == "train"]
    assert train and all(0 < r["mfu"] <= 1 and r["peak"] == "CPU fp32 matmul peak, measured" for r in train)
    for step in (3, 6):
        manifest = json.loads((out / "checkpoints" / f"step-{step:08d}" / "manifest.json").read_text())
        assert manifest["precision"] == {k: precision[0][k] for k in ("dtype", "requested", "reason")}
    # The peak was measured once and cached under PRETRAIN_HOME for the next start.
    cached = json.loads((peak_module.cache_path()).read_text())
    assert any("kernels AVX2 | fp32 | 1 threads" in key for key in cached), cached


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_a_resumed_run_keeps_its_precision_unless_forced(tmp_path, monkeypatch):
    from trainer.train import Trainer

    # Started in fp32 (forced) ...
    first = from_dict(RunConfig, run_dict(tmp_path / "out", train_tokens=4 * 8 * 64, deepspeed={"zero_stage": 1,
                                                                                                "bf16": False},
                                          checkpoint={"interval_steps": 2}))
    Trainer(first).fit()
    # ... resumed with auto on a machine that has native bf16: it stays fp32.
    _probe(monkeypatch, "AVX512", True)
    longer = {"train_tokens": 6 * 8 * 64, "checkpoint": {"interval_steps": 2}}
    resumed = Trainer(from_dict(RunConfig, run_dict(tmp_path / "out", deepspeed={"zero_stage": 1}, **longer)))
    assert resumed.state.step == 4 and resumed.precision.bf16 is False and resumed.cfg.deepspeed.bf16 is False
    assert "started with" in resumed.precision.reason
    resumed.fit()
    # Forced to bf16 on resume (ZeRO-1 both sides): DeepSpeed's universal checkpoint converts the optimizer state.
    _probe(monkeypatch, "AVX2", False)
    longest = {"train_tokens": 8 * 8 * 64, "checkpoint": {"interval_steps": 2}}
    forced = Trainer(from_dict(RunConfig, run_dict(tmp_path / "out", deepspeed={"zero_stage": 1, "bf16": True},
                                                   **longest)))
    assert forced.state.step == 6 and forced.precision.bf16 is True
    assert {p.dtype for p in forced.engine.module.parameters()} == {torch.bfloat16}
    summary = forced.fit()
    assert summary["steps"] == 8 and all(loss == loss for loss in summary["losses"])
    manifest = json.loads((tmp_path / "out" / "checkpoints" / "step-00000008" / "manifest.json").read_text())
    assert manifest["precision"]["dtype"] == "bf16" and manifest["precision"]["requested"] == "true"


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_a_forced_precision_change_at_zero_0_is_refused_naming_the_field(tmp_path):
    from trainer.checkpoint.checkpointer import ResumeRefused
    from trainer.train import Trainer

    run = dict(deepspeed={"zero_stage": 0, "bf16": False}, checkpoint={"interval_steps": 2})
    Trainer(from_dict(RunConfig, run_dict(tmp_path / "out", train_tokens=2 * 8 * 64, **run))).fit()
    run["deepspeed"] = {"zero_stage": 0, "bf16": True}
    with pytest.raises(ResumeRefused, match=r"written in fp32, this run forces bf16 \(deepspeed.bf16\)"):
        Trainer(from_dict(RunConfig, run_dict(tmp_path / "out", train_tokens=4 * 8 * 64, **run)))


def test_the_cpu_peak_is_measured_once_then_read_from_the_cache(monkeypatch):
    first = device_peak(CPU, "fp32")
    assert first.flops > 0 and first.label == "CPU fp32 matmul peak, measured"

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again although the cache holds this machine's peak")

    monkeypatch.setattr(peak_module, "measure_matmul_peak", no_measuring)
    again = device_peak(CPU, "fp32")
    assert again.flops == first.flops
    # A rate seen in training above the measured peak means it was measured low: it becomes the peak.
    again.raise_to(first.flops * 1.5)
    assert device_peak(CPU, "fp32").flops == pytest.approx(first.flops * 1.5)
    # A configured peak is taken as it is.
    assert device_peak(CPU, "fp32", override=1e12).label == "configured peak"
