"""trainer/checkpoint/universal.py: a real ZeRO-1 step of a 1-rank run turned into DeepSpeed's universal layout, one
folder per parameter holding its fp32 weights and both Adam moments, equal to what the optimizer held; a folder left
by an earlier conversion is replaced, not merged. (The resume across world sizes through it is
tests/trainer/checkpoint/test_checkpointer.py::test_resume_on_one_rank_from_two.)"""

from __future__ import annotations

import pytest
import torch

from tests.trainer.checkpoint.test_checkpointer import STEPS, _trainer
from trainer.checkpoint.checkpointer import DS_TAG
from trainer.checkpoint.store import step_name
from trainer.checkpoint.universal import to_universal


@pytest.mark.slow  # a 1-rank DeepSpeed run of a tiny model, then the conversion: ~10 s on 2 cores
def test_a_zero1_step_becomes_one_folder_per_parameter_with_its_fp32_weights_and_moments(tmp_path):
    trainer = _trainer(tmp_path / "out", stage=1)
    trainer.fit()
    params = {name: p.detach().clone() for name, p in trainer.module.engine.module.named_parameters()}
    step = tmp_path / "out" / "checkpoints" / step_name(STEPS)
    out = tmp_path / "universal"
    to_universal(step / DS_TAG, out / DS_TAG)
    zero = out / DS_TAG / "zero"
    folders = {p.name: p for p in zero.iterdir() if p.is_dir()}
    assert set(folders) == set(params)
    for name, weight in params.items():
        saved = {f.stem: torch.load(f, weights_only=False) for f in folders[name].glob("*.pt")}
        assert {"fp32", "exp_avg", "exp_avg_sq"} <= set(saved), name
        fp32 = saved["fp32"]["param"] if isinstance(saved["fp32"], dict) else saved["fp32"]
        # The module's weights are the fp32 masters cast to the run's dtype (bf16 where the CPU has it natively).
        assert fp32.dtype == torch.float32 and torch.equal(fp32.to(weight.dtype), weight), name
    # A second conversion into the same folder starts from an empty one.
    marker = out / DS_TAG / "left-over"
    marker.write_text("x")
    to_universal(step / DS_TAG, out / DS_TAG)
    assert not marker.exists()
