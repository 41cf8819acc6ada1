"""trainer.reporting.metrics and trainer.reporting.pipes: the JSONL records, MFU against the peak, Pipes-safe values."""

import json
import math

import pytest

from trainer.model.config import ModelConfig
from trainer.reporting.config import MetricsConfig
from trainer.reporting.metrics import Metrics, flops_per_token
from trainer.reporting.peak import Peak
from trainer.reporting.pipes import PIPES_ENV, PipesReporter, _plain


def test_flops_per_token_is_6n_plus_attention_with_n_every_weight_a_token_is_multiplied_through():
    """MFU's N is every weight of the real model but the input embedding (a lookup): the head's matmul counts."""
    from trainer.model.transformer import Transformer

    cfg = ModelConfig(vocab_size=10, d_model=8, n_layers=2, n_heads=2)
    n = sum(p.numel() for name, p in Transformer(cfg).named_parameters() if not name.startswith("tok_emb."))
    assert n == cfg.parameter_count().matmul
    assert flops_per_token(cfg, seq_len=4) == 6 * n + 12 * 2 * 4 * 8


def test_rank_0_writes_records_and_the_others_write_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(PIPES_ENV, raising=False)
    m = Metrics(MetricsConfig(tensorboard=False), tmp_path / "r0", rank=0, flops_per_token=1e6, train_tokens=1000)
    m.set_peak(Peak(1e18, "test peak"))
    m.count(100)
    record = m.log_step(step=1, tokens=100, loss=2.5, grad_norm=1.0, lr=1e-3, batch=4, rank_busy_s=[0.1, 0.2])
    m.log_event({"event": "skip", "step": 1})
    m.close()
    lines = [json.loads(line) for line in (tmp_path / "r0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in lines] == ["train", "skip"]
    assert 0 < record["mfu"] <= 1 and record["peak"] == "test peak" and lines[0]["rank_busy_s"] == [0.1, 0.2]
    other = Metrics(MetricsConfig(tensorboard=False), tmp_path / "r1", rank=1, flops_per_token=1.0, train_tokens=1)
    other.log_event({"event": "skip"})
    other.close()
    assert not (tmp_path / "r1").exists()


def test_a_measured_peak_that_training_beats_is_raised(tmp_path):
    peak = Peak(1.0, "measured", cache=tmp_path / "peak.json", key="cpu")
    peak.raise_to(5.0)
    assert peak.flops == 5.0 and json.loads((tmp_path / "peak.json").read_text()) == {"cpu": 5.0}
    fixed = Peak(1.0, "table")
    fixed.raise_to(5.0)
    assert fixed.flops == 1.0


def test_pipes_only_on_rank_0_under_pipes_and_values_stay_json(monkeypatch):
    monkeypatch.delenv(PIPES_ENV, raising=False)
    assert PipesReporter.open(0) is None
    monkeypatch.setenv(PIPES_ENV, "x")
    assert PipesReporter.open(1) is None
    assert _plain({"loss": math.nan, "l": [math.inf, 1.0], "n": 2}) == {"loss": "nan", "l": ["inf", 1.0], "n": 2}
    assert json.dumps(_plain({"x": -math.inf}))


@pytest.mark.parametrize("value", [0.0, 1.5, "a", None])
def test_plain_values_pass_through(value):
    assert _plain(value) == value
