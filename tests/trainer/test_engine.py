"""trainer.engine: the DeepSpeed config the run's config makes (no engine is built here)."""

import pytest

from tests.trainer.conftest import run_dict
from trainer.config import RunConfig, from_dict
from trainer.engine import deepspeed_config


def _cfg(tmp_path, **sections):
    return from_dict(RunConfig, run_dict(tmp_path, **sections))


def test_accumulation_clipping_and_precision_from_the_run(tmp_path):
    ds = deepspeed_config(_cfg(tmp_path, deepspeed={"zero_stage": 1, "bf16": True}), world_size=2)
    sizes = ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
    assert sizes == (8, 2, 2)
    assert ds["bf16"] == {"enabled": True} and ds["zero_optimization"] == {"stage": 1}
    assert ds["gradient_clipping"] == 1.0 and "checkpoint" not in ds


def test_fp32_zero0_clips_in_the_gate_and_universal_loading_is_asked_for(tmp_path):
    ds = deepspeed_config(_cfg(tmp_path, deepspeed={"zero_stage": 0, "bf16": False}), world_size=1,
                          load_universal=True)
    assert ds["gradient_clipping"] == 0.0 and ds["checkpoint"] == {"load_universal": True}


def test_precision_must_be_resolved_first(tmp_path):
    with pytest.raises(AssertionError, match="resolve deepspeed.bf16"):
        deepspeed_config(_cfg(tmp_path), world_size=1)
