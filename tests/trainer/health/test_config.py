"""trainer/health/config.py: each health check's section refuses settings under which it would never or always
fire, naming the field."""

import pytest

from trainer.health.config import GuardConfig, HealthConfig, SDCConfig, StragglerConfig, WatchdogConfig


@pytest.mark.parametrize("section, fields, message", [
    (GuardConfig, dict(ema_beta=1.0), r"guard\.ema_beta must be in \[0, 1\), got 1\.0"),
    (GuardConfig, dict(loss_ratio=1.0), r"guard\.loss_ratio must be > 1, got 1\.0"),
    (WatchdogConfig, dict(step_factor=1.0), r"watchdog\.step_factor must be > 1, got 1\.0"),
    (SDCConfig, dict(grad_norm_ratio=0.5), r"sdc\.grad_norm_ratio must be > 1, got 0\.5"),
    (SDCConfig, dict(canary_interval=-1), r"sdc\.canary_interval must be >= 0"),
    (StragglerConfig, dict(steps=11), r"straggler\.steps must be in \[1, straggler\.window\], got 11"),
    (HealthConfig, dict(history=0), r"health\.history must be >= 1, got 0"),
])
def test_a_setting_that_makes_a_check_meaningless_is_refused(section, fields, message):
    with pytest.raises(ValueError, match=message):
        section(**fields)


def test_every_check_is_on_by_default_but_the_drain():
    assert GuardConfig().enabled and WatchdogConfig().enabled and SDCConfig().enabled and StragglerConfig().enabled
    assert not StragglerConfig().drain and HealthConfig().interval == 100
