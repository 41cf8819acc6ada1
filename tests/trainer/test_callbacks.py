"""trainer.callbacks: loading a test's callbacks by path, and the built-in callbacks on a stand-in trainer."""

import math
from types import SimpleNamespace

import pytest

from trainer.callbacks import CALLBACKS_ENV, GuardCallback, MetricsCallback, SDCCallback, StepRecord, extra_callbacks
from trainer.health.config import GuardConfig, SDCConfig
from trainer.reporting.config import MetricsConfig
from trainer.health.guard import RollbackRequested, SpikeGuard, Verdict


class Log:
    def __init__(self):
        self.events, self.steps = [], []

    def log_event(self, record):
        self.events.append(record)

    def log_step(self, **record):
        self.steps.append(record)


def test_extra_callbacks_by_file_path_or_module(tmp_path, monkeypatch):
    # A dataclass: the loaded module must be in sys.modules while it runs.
    (tmp_path / "mine.py").write_text("from dataclasses import dataclass\n\n\n@dataclass\nclass Mine:\n"
                                      "    name: str = 'mine'\n")
    monkeypatch.setenv(CALLBACKS_ENV, f"{tmp_path / 'mine.py'}:Mine, trainer.reporting.metrics:MetricsCallbackMissing")
    with pytest.raises(AttributeError, match="MetricsCallbackMissing"):
        extra_callbacks()
    monkeypatch.setenv(CALLBACKS_ENV, f"{tmp_path / 'mine.py'}:Mine,trainer.callbacks:MetricsCallback")
    mine, metrics = extra_callbacks()
    assert mine.name == "mine" and isinstance(metrics, MetricsCallback)
    monkeypatch.setenv(CALLBACKS_ENV, "")
    assert extra_callbacks() == []


def _verdict(step, apply, loss=2.0):
    return Verdict(step=step, apply=apply, reason="ok" if apply else "loss spike", loss=loss, grad_norm=1.0,
                   samples=(step, step + 1))


def test_the_guard_callback_logs_skips_and_strikes_only_for_the_data():
    trainer = SimpleNamespace(metrics=Log())
    cb = GuardCallback(SpikeGuard(GuardConfig(max_strikes=2)))
    refused = StepRecord(step=3, samples=(3, 4), batch=1, lr=0.1, refused="sdc: rank 1", verdict=_verdict(3, False))
    cb.post_update(trainer, refused)
    assert cb.guard.skipped == [] and trainer.metrics.events[0]["event"] == "skip"  # the ranks' fault, no strike
    cb.post_update(trainer, StepRecord(step=4, samples=(4, 5), batch=1, lr=0.1, verdict=_verdict(4, False)))
    with pytest.raises(RollbackRequested):
        cb.post_update(trainer, StepRecord(step=5, samples=(5, 6), batch=1, lr=0.1, verdict=_verdict(5, False)))
    restored = GuardCallback(SpikeGuard(GuardConfig()))
    restored.load_state_dict(cb.state_dict())
    assert [s["step"] for s in restored.guard.skipped] == [4, 5]


def test_the_sdc_callback_refuses_an_outlier_before_the_update_and_logs_it_after():
    trainer = SimpleNamespace(metrics=Log(), hosts=["a", "b", "c", "d"], dist=SimpleNamespace(world_size=4),
                              cfg=SimpleNamespace(sdc=SDCConfig()))
    cb = SDCCallback(trainer)
    rec = StepRecord(step=2, samples=(0, 4), batch=4, lr=0.1,
                     figures={"loss": [2.0] * 4, "grad_norm": [1.0, 1.0, math.inf, 1.0]})
    assert cb.pre_update(trainer, rec).startswith("sdc: rank 2 grad_norm inf (non-finite)")
    cb.post_update(trainer, rec)
    [event] = trainer.metrics.events
    assert event["event"] == "sdc" and event["rank"] == 2 and "step 2 not applied" in event["message"]
    assert cb.state_dict()["offences"] == {"2": 1}


def test_the_metrics_callback_averages_the_applied_steps_of_its_window():
    history = []
    trainer = SimpleNamespace(metrics=Log(), history=history, val_sources={}, at_end=lambda: False,
                              cfg=SimpleNamespace(metrics=MetricsConfig(log_interval=3, eval_batches=0)),
                              state=SimpleNamespace(step=0, tokens=0))
    cb = MetricsCallback()
    for step, (loss, applied) in enumerate([(3.0, True), (99.0, False), (2.0, True)]):
        history.append({"step": step, "loss": loss, "grad_norm": 1.0, "lr": 0.1, "batch": 8, "applied": applied})
        trainer.state.step, trainer.state.tokens = step + 1, 8 * (step + 1)
        cb.post_step(trainer, StepRecord(step=step, samples=(0, 8), batch=8, lr=0.1, busy=[0.5]))
    [record] = trainer.metrics.steps
    assert record["step"] == 3 and record["loss"] == 2.5 and record["rank_busy_s"] == [0.5]
