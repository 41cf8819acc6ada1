"""LR schedules, the batch-size ramp and run.json loading."""

import json

import pytest

from trainer.config import BatchConfig, RunConfig, ScheduleConfig, load_run_config
from trainer.optim import batch_at, lr_at


def test_warmup_then_cosine_to_floor():
    cfg = ScheduleConfig(kind="cosine", warmup_tokens=100, min_lr_ratio=0.1)
    lr = lambda t: lr_at(t, peak_lr=1.0, train_tokens=1100, cfg=cfg)
    assert lr(50) == pytest.approx(0.5)
    assert lr(100) == pytest.approx(1.0)
    assert lr(600) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the cosine
    assert lr(1100) == pytest.approx(0.1)
    assert lr(5000) == pytest.approx(0.1)  # past the end: the floor
    values = [lr(t) for t in range(100, 1101, 50)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_warmup_stable_decay():
    cfg = ScheduleConfig(kind="wsd", warmup_tokens=100, decay_fraction=0.2, min_lr_ratio=0.0)
    lr = lambda t: lr_at(t, peak_lr=2.0, train_tokens=1000, cfg=cfg)
    assert lr(10) == pytest.approx(0.2)
    assert lr(500) == lr(800) == 2.0
    assert lr(900) == pytest.approx(1.0)
    assert lr(1000) == pytest.approx(0.0)


def test_batch_ramp_is_exact_in_tokens():
    cfg = BatchConfig(global_batch=32, micro_batch=2, seq_len=16, ramp_start=4, ramp_tokens=4096)
    tokens, sample, sizes, starts = 0, 0, [], []
    while tokens < 10_000:
        b = batch_at(tokens, cfg)
        sizes.append(b)
        starts.append(sample)
        tokens += b * cfg.seq_len
        sample += b
    assert sizes[0] == 4 and sizes[-1] == 32
    assert all(s % 4 == 0 for s in sizes) and sizes == sorted(sizes)  # multiples of the start, growing
    # Each step's batch is the one the ramp prescribes for the tokens seen before it, and the
    # global sample indices are contiguous: every token is consumed exactly once.
    assert tokens == sum(sizes) * cfg.seq_len
    assert all(b == a + s for a, b, s in zip(starts, starts[1:], sizes))
    # Linear in tokens, in buckets of ramp_start: 4 sequences over the first 1/8 of ramp_tokens, 8 over
    # the next 1/8, ..., the full 32 from 7/8 on.
    assert [batch_at(t, cfg) for t in (0, 511, 512, 2047, 2048, 3583, 3584, 4096)] == [4, 4, 8, 16, 20, 28, 32, 32]


def test_ramp_must_fit_the_world_size():
    cfg = BatchConfig(global_batch=32, micro_batch=4, ramp_start=4, ramp_tokens=100)
    cfg.check_world(1)
    with pytest.raises(ValueError, match=r"batch.ramp_start \(4\) must be a multiple of batch.micro_batch"):
        cfg.check_world(2)
    with pytest.raises(ValueError, match="batch.ramp_start"):
        BatchConfig(global_batch=32, ramp_start=5, ramp_tokens=100)


def _write(tmp_path, data):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    return path


BASE = {"data": {"text": "t.txt", "tokenizer": "tok.json"}, "train_tokens": 1000, "output_dir": "out"}


def test_run_json_loads_nested_configs(tmp_path):
    cfg = load_run_config(_write(tmp_path, {**BASE, "model": {"d_model": 64, "n_heads": 2, "qk_norm": True},
                                            "optim": {"betas": [0.9, 0.99]}, "deepspeed": {"zero_stage": 2}}))
    assert isinstance(cfg, RunConfig)
    assert cfg.model.d_model == 64 and cfg.model.qk_norm is True
    assert cfg.optim.betas == (0.9, 0.99) and cfg.deepspeed.zero_stage == 2
    assert cfg.optim.weight_decay == 0.1 and cfg.batch.global_batch == 32


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"model": {"n_layer": 2}}, r"model.n_layer: unknown field"),
        ({"model": {"d_model": "big"}}, r"model.d_model: expected an integer"),
        ({"model": {"d_model": 100, "n_heads": 3}}, r"model.d_model \(100\) must be divisible by model.n_heads"),
        ({"deepspeed": {"zero_stage": 4}}, r"deepspeed.zero_stage: must be one of \[0, 1, 2, 3\]"),
        ({"optim": {"betas": [0.9]}}, r"optim.betas: expected a list of 2 items"),
        ({"train_tokens": None}, r"train_tokens: expected an integer"),
        ({"data": {"text": "t.txt"}}, r"data.tokenizer"),
        ({"guard": {"loss_ratio": 0.5}}, r"guard.loss_ratio must be > 1"),
    ],
)
def test_run_json_errors_name_the_field(tmp_path, patch, message):
    path = _write(tmp_path, {**BASE, **patch})
    with pytest.raises(ValueError, match=message) as e:
        load_run_config(path)
    assert str(path) in str(e.value)


def test_missing_required_field(tmp_path):
    data = dict(BASE)
    del data["output_dir"]
    with pytest.raises(ValueError, match="output_dir: required field missing"):
        load_run_config(_write(tmp_path, data))
