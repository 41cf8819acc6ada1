"""trainer/reporting/config.py: the metrics section and the zero-shot task names it accepts."""

import typing

import pytest

from trainer.reporting.config import MetricsConfig, ZeroShotTask


def test_only_the_known_zero_shot_tasks_are_taken():
    assert "hellaswag" in typing.get_args(ZeroShotTask)
    assert MetricsConfig(downstream_tasks=["mmlu"]).downstream_tasks == ["mmlu"]
    with pytest.raises(ValueError, match="downstream_tasks"):
        MetricsConfig(downstream_tasks=["squad"])


def test_intervals_are_checked():
    with pytest.raises(ValueError, match=r"metrics\.log_interval must be >= 1, got 0"):
        MetricsConfig(log_interval=0)
    with pytest.raises(ValueError, match="downstream_limit"):
        MetricsConfig(downstream_limit=0)
