"""Spike guard: NaN/inf steps never applied, outliers skipped and logged, strikes stop the run."""

import math

import pytest
import torch

from tests.trainer.conftest import read_metrics, run_dict
from trainer.config import from_dict, RunConfig
from trainer.health.config import GuardConfig
from trainer.health.guard import RollbackRequested, SpikeGuard, TooManySkips


def _feed(guard, steps):
    """steps: (loss, grad_norm) per step of 4 samples; returns the verdicts."""
    out = []
    for i, (loss, norm) in enumerate(steps):
        v = guard.judge(step=i, loss=loss, grad_norm=norm, samples=(4 * i, 4 * i + 4))
        guard.commit(v)
        out.append(v)
    return out


def test_a_large_grad_norm_on_a_step_that_lowers_the_loss_is_applied():
    """The norm grows as a small model leaves its first plateau while the loss keeps falling (its update is clipped):
    that is no spike. The same norm with the loss at or above its running average is one."""
    guard = SpikeGuard(GuardConfig(warmup_steps=3, grad_norm_ratio=5.0))
    v = _feed(guard, [(6.2, 0.5), (6.1, 0.5), (6.0, 0.5), (5.9, 5.0), (5.8, 5.0), (6.3, 50.0)])
    assert [x.apply for x in v] == [True, True, True, True, True, False]
    assert v[5].reason.startswith("grad-norm spike") and guard.skipped[0]["step"] == 5


def test_non_finite_never_applied_even_during_warmup_or_disabled():
    for cfg in (GuardConfig(warmup_steps=100), GuardConfig(enabled=False)):
        guard = SpikeGuard(cfg)
        v = _feed(guard, [(3.0, 1.0), (math.nan, 1.0), (3.0, math.inf)])
        assert [x.apply for x in v] == [True, False, False]
        assert [s["reason"] for s in guard.skipped] == ["non-finite loss", "non-finite grad norm"]
        assert guard.skipped[0]["step"] == 1 and guard.skipped[0]["samples"] == [4, 8]


def test_outliers_skipped_after_warmup_and_averages_move_only_on_applied_steps():
    guard = SpikeGuard(GuardConfig(warmup_steps=3, loss_ratio=1.5, grad_norm_ratio=4.0, max_strikes=5))
    v = _feed(guard, [(4.0, 1.0)] * 3 + [(7.0, 1.0), (4.0, 10.0), (4.1, 1.1)])
    assert [x.apply for x in v] == [True, True, True, False, False, True]
    assert v[3].reason.startswith("loss spike") and v[4].reason.startswith("grad-norm spike")
    assert guard.skipped[1] == {"step": 4, "samples": [16, 20], "reason": v[4].reason, "loss": 4.0, "grad_norm": 10.0}
    assert guard.applied == 4 and guard.loss_avg == pytest.approx(0.9 * 4.0 + 0.1 * 4.1)
    # The state round-trips (a checkpoint will carry it).
    other = SpikeGuard(guard.cfg)
    other.load_state_dict(guard.state_dict())
    assert other.state_dict() == guard.state_dict()


def test_strikes_in_a_window_request_a_rollback_naming_the_data_window():
    guard = SpikeGuard(GuardConfig(warmup_steps=2, max_strikes=3, strike_window=10))
    _feed(guard, [(4.0, 1.0)] * 2)
    for step in (2, 5):
        guard.commit(guard.judge(step=step, loss=50.0, grad_norm=1.0, samples=(4 * step, 4 * step + 4)))
    with pytest.raises(RollbackRequested, match=r"Roll back to the last checkpoint and skip .*\[8, 36\)") as e:
        guard.commit(guard.judge(step=8, loss=math.nan, grad_norm=1.0, samples=(32, 36)))
    assert e.value.skip_window == (8, 36)


def test_strikes_outside_the_window_do_not_add_up_but_the_total_is_capped():
    guard = SpikeGuard(GuardConfig(warmup_steps=0, max_strikes=2, strike_window=3, max_skipped=3))
    for step in (0, 5, 10):
        guard.commit(guard.judge(step=step, loss=math.nan, grad_norm=1.0, samples=(step, step + 1)))
    with pytest.raises(TooManySkips, match="4 steps skipped, more than guard.max_skipped = 3"):
        guard.commit(guard.judge(step=15, loss=math.nan, grad_norm=1.0, samples=(15, 16)))


class GarbageAt:
    """The real text source, except that the batch of the given global samples is uniform noise."""

    def __init__(self, source, garbage: set[int]):
        self.source, self.garbage, self.vocab_size = source, garbage, source.vocab_size

    def batch(self, indices):
        b = self.source.batch(indices)
        for row, i in enumerate(indices):
            if i in self.garbage:
                g = torch.Generator().manual_seed(i)
                b["tokens"][row] = torch.randint(0, self.vocab_size, b["tokens"][row].shape, generator=g)
        return b


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_training_skips_an_injected_nan_and_a_garbage_batch(tmp_path):
    from trainer.train import Trainer, build_sources

    cfg = from_dict(RunConfig, run_dict(
        tmp_path / "out", train_tokens=16 * 8 * 64,
        guard={"warmup_steps": 6, "loss_ratio": 1.3, "max_strikes": 3},
        optim={"lr": 1e-2}))
    train, val = build_sources(cfg)
    trainer = Trainer(cfg, train_source=GarbageAt(train, set(range(12 * 8, 13 * 8))), val_sources=val)
    params = lambda: torch.cat([p.detach().float().flatten() for p in trainer.engine.module.parameters()])

    # NaN injected at step 9 through the output head (a hook, so the rest of the step is real).
    def nan_at_step_9(module, inputs, output):
        return output * math.nan if trainer.state.step == 9 else output

    trainer.model.transformer.head.register_forward_hook(nan_at_step_9)
    seen = {}
    while trainer.state.tokens < cfg.train_tokens:
        before = params()
        verdict = trainer.step()
        seen[verdict.step] = (verdict, torch.equal(before, params()))
    assert {s for s, (v, _) in seen.items() if not v.apply} == {9, 12}
    for step in (9, 12):
        verdict, unchanged = seen[step]
        assert unchanged, f"step {step} was skipped but the weights moved"
    assert not seen[10][1]  # a normal step does change them
    nan, garbage = trainer.guard.skipped
    assert nan["step"] == 9 and nan["samples"] == [72, 80] and "non-finite" in nan["reason"]
    assert garbage["step"] == 12 and garbage["samples"] == [96, 104] and garbage["reason"].startswith("loss spike")
    trainer.metrics.close()
    skips = [r for r in read_metrics(tmp_path / "out") if r.get("event") == "skip"]
    assert [r["step"] for r in skips] == [9, 12] and skips[1]["samples"] == [96, 104]
