"""trainer/parallel/config.py: the parallel and deepspeed sections refuse what they cannot run, in run.json's words."""

import pytest

from trainer.parallel.config import DeepSpeedConfig, ParallelConfig


def test_the_defaults_split_nothing_and_pick_bf16_by_the_hardware():
    assert (ParallelConfig().pipeline, ParallelConfig().tensor) == (1, 1)
    assert (DeepSpeedConfig().zero_stage, DeepSpeedConfig().bf16) == (0, "auto")


@pytest.mark.parametrize("fields, message", [
    (dict(zero_stage=True), r"deepspeed\.zero_stage: must be one of \[0, 1, 2, 3\], got True"),  # not stage 1
    (dict(bf16="yes"), r'deepspeed\.bf16: expected true, false or "auto", got \'yes\''),
])
def test_deepspeed_refuses_values_a_literal_would_take_or_misname(fields, message):
    with pytest.raises(ValueError, match=message):
        DeepSpeedConfig(**fields)


def test_a_split_below_one_is_refused():
    with pytest.raises(ValueError, match=r"parallel\.tensor must be >= 1, got 0"):
        ParallelConfig(tensor=0)
