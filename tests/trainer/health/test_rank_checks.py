"""trainer.health.rank_checks: the SDC check, the canary and the straggler check, on made-up per-rank figures."""

import math

import pytest

from trainer.health.config import SDCConfig, StragglerConfig
from trainer.health.rank_checks import CanaryCheck, SDCCheck, SDCStop, StragglerCheck, describe

HOSTS = ["n0", "n1", "n2", "n3"]  # with 3 ranks "the others' median" of 2 is their mean


def test_three_ranks_name_the_one_off_the_others_median():
    sdc = SDCCheck(SDCConfig(), HOSTS)
    [o] = sdc.judge(4, {"loss": [2.0, 2.01, 2.0, 2.0], "grad_norm": [1.0, 1000.0, 1.1, 0.9]})
    assert (o["rank"], o["host"], o["step"]) == (1, "n1", 4)
    assert "grad_norm" in describe(o) and "off the other ranks' median" in describe(o)
    assert sdc.judge(5, {"loss": [2.0] * 4, "grad_norm": [1.0, 1.1, 0.9, 1.0]}) == []


def test_non_finite_figures_are_outliers_unless_every_rank_has_them():
    sdc = SDCCheck(SDCConfig(), HOSTS)
    assert [o["rank"] for o in sdc.judge(0, {"loss": [2.0, math.nan, 2.0, 2.0], "grad_norm": [1.0] * 4})] == [1]
    assert sdc.judge(0, {"loss": [math.nan] * 4, "grad_norm": [1.0] * 4}) == []  # the spike guard's business


def test_two_ranks_need_history_to_tell_which_one_is_wrong():
    sdc = SDCCheck(SDCConfig(warmup_steps=2), HOSTS[:2])
    both = sdc.judge(0, {"loss": [2.0, 2.0], "grad_norm": [1.0, 50.0]})
    assert [o["rank"] for o in both] == [0, 1]  # no history yet: both named
    for step in range(2):
        sdc.commit(step, {"loss": [2.0, 2.0], "grad_norm": [1.0, 1.0]}, [])
    [o] = sdc.judge(3, {"loss": [2.0, 2.0], "grad_norm": [1.0, 50.0]})
    assert o["rank"] == 1 and "recent median" in describe(o)


def test_repeated_offences_stop_the_job_naming_the_rank_and_state_survives_a_checkpoint():
    sdc = SDCCheck(SDCConfig(max_offences=2), HOSTS)
    figures = {"loss": [2.0] * 4, "grad_norm": [1.0, 1e4, 1.0, 1.0]}
    sdc.commit(1, figures, sdc.judge(1, figures))
    again = SDCCheck(SDCConfig(max_offences=2), HOSTS)
    again.load_state_dict(sdc.state_dict())
    assert again.offences == {1: 1}
    with pytest.raises(SDCStop, match="rank 1 \\(host n1\\)") as e:
        again.commit(2, figures, again.judge(2, figures))
    assert (e.value.rank, e.value.host) == (1, "n1")


def test_canary_ranks_must_agree_and_stay_near_history():
    canary = CanaryCheck(SDCConfig(canary_interval=2, canary_tolerance=0.25))
    assert canary.due(4) and not canary.due(3)
    assert canary.observe(2, [3.0, 3.0, 3.0, 3.0], HOSTS)["alarm"] is None
    assert "rank(s) [2]" in canary.observe(4, [3.0, 3.0, 3.5, 3.0], HOSTS)["alarm"]
    assert "canary_tolerance" in canary.observe(6, [4.0] * 4, HOSTS)["alarm"]
    restored = CanaryCheck(SDCConfig())
    restored.load_state_dict(canary.state_dict())
    assert list(restored.history) == [3.0]


def test_a_persistently_slow_rank_is_reported_once_then_recovers():
    check = StragglerCheck(StragglerConfig(factor=1.5, window=4, steps=3, min_excess_s=0.05), HOSTS)
    events = [e for step in range(4) for e in check.observe(step, [0.1, 0.1, 0.5, 0.1])]
    assert [(e["event"], e["rank"], e["step"]) for e in events] == [("straggler", 2, 2)]
    events = [e for step in range(4, 8) for e in check.observe(step, [0.1] * 4)]
    assert [(e["event"], e["rank"]) for e in events] == [("straggler_recovered", 2)]
    assert check.observe(9, [0.1]) == []  # one rank: nothing to compare with
