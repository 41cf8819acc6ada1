"""Tensor parallelism (parallel.tensor, trainer/parallel/tensor.py on DeepSpeed AutoTP): 2 tensor-parallel ranks train
as 1 rank does (the same losses, gradient norms and clipping, and whole weights read back from the shards), a run
killed -9 resumes bit for bit, and what it cannot do is refused by name."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import read_metrics, run_dict

REPO = Path(__file__).resolve().parents[3]
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def _settings(out, tensor: int, **sections) -> dict:
    """10 steps of 8 sequences of 64 tokens, 2 blocks of 4 heads (2 key/value heads), fp32 ZeRO-0; the gradient
    clip (0.2) below the norms of these steps, so every step is clipped; `sections` override."""
    base = {"train_tokens": 10 * 8 * 64, "model": {"z_loss": 1e-4}, "optim": {"lr": 3e-3, "grad_clip": 0.2},
            "deepspeed": {"zero_stage": 0, "bf16": False}, "parallel": {"tensor": tensor},
            "batch": {"global_batch": 8, "micro_batch": 2, "seq_len": 64},
            "metrics": {"log_interval": 1, "eval_batches": 1, "tensorboard": False}}
    for key, value in sections.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return run_dict(out, **base)


def _run(tmp_path, name: str, ranks: int, tensor: int, **sections) -> list[dict]:
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps(_settings(tmp_path / name, tensor, **sections)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    launcher = [TORCHRUN, "--standalone", "--nproc_per_node", str(ranks)] if ranks > 1 else [sys.executable]
    done = subprocess.run([*launcher, "-m", "trainer", "--config", str(config)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return read_metrics(tmp_path / name)


def _steps(records, key: str) -> list[float]:
    return [r[key] for r in records if r.get("event") == "train"]


@pytest.mark.slow  # a 2- or 4-rank AutoTP run under torchrun and a 1-rank run: ~15-25 s each on 2 cores
@pytest.mark.parametrize("ranks, zero_stage, bf16, recompute", [(2, 0, False, "full"), (4, 1, False, "none"),
                                                                (2, 1, True, "none")])
def test_tensor_parallel_ranks_train_as_one_rank(tmp_path, ranks, zero_stage, bf16, recompute):
    """parallel.tensor 2 on 2 ranks (one replica; ZeRO-0, where the gate clips by the norm it sums over the group;
    every block recomputed in backward, its all-reduces with it) or 4 (two replicas of 2 tensor-parallel ranks;
    ZeRO-1, where DeepSpeed clips) against 1 rank on the same samples from the same initial weights: in fp32 the same
    losses and pre-clip gradient norms for 10 clipped steps, the same held-out loss, and the final step's weights
    merged from its shards equal to the 1-rank run's; in bf16 (ZeRO-1) the same within bf16's rounding of the split
    matmuls."""
    import torch

    from trainer.checkpoint.store import LocalCheckpoints
    from trainer.checkpoint.weights import checkpoint_weights

    sections = {"deepspeed": {"zero_stage": zero_stage, "bf16": bf16}, "model": {"activation_checkpointing": recompute}}
    split = _run(tmp_path, "split", ranks, 2, **sections)
    whole = _run(tmp_path, "whole", 1, 1, **sections)
    # bf16: measured 1.2e-4 (loss) and 1.7e-3 (norm) at most over these 10 steps.
    loss_tol, norm_tol = (1e-3, 1e-2) if bf16 else (1e-5, 1e-4)
    assert len(_steps(whole, "loss")) == 10
    assert min(_steps(whole, "grad_norm")) > 0.2  # the clip acted on every step
    assert _steps(split, "loss") == pytest.approx(_steps(whole, "loss"), rel=loss_tol)
    assert _steps(split, "grad_norm") == pytest.approx(_steps(whole, "grad_norm"), rel=norm_tol)
    val = lambda records: [r["val_loss"]["text"] for r in records if r.get("event") == "eval"]
    assert val(split) == pytest.approx(val(whole), rel=loss_tol)
    [off] = [r for r in split if r.get("event") == "checks_off"]
    assert off["fields"] == ["sdc.enabled", "straggler.enabled", "health.interval"]

    local = LocalCheckpoints(tmp_path / "split" / "checkpoints")
    manifest = local.verify(10)
    assert manifest["world_size"] == ranks and manifest["config"]["parallel"]["tensor"] == 2
    shards = sorted(p.name for p in (local.path(10) / "ds").glob("mp_rank_*_model_states.pt"))
    assert shards == ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"]
    merged, _ = checkpoint_weights(local.path(10))
    reference, _ = checkpoint_weights(LocalCheckpoints(tmp_path / "whole" / "checkpoints").path(10))
    assert sorted(merged) == sorted(reference)
    for name, tensor in reference.items():
        assert merged[name].shape == tensor.shape, name
        # Compared as wholes: shards put together in the wrong order would be ~1.4 × the norm apart. fp32: where
        # Adam's gradients are tiny (embedding rows of rare tokens) the split matmuls' summation order shows, up to
        # 2e-5 of the norm after 10 steps (AVX2 kernels; 7e-5 in one element). bf16: a bf16 run's shards hold the
        # bf16 weights the model computed with (checkpoint_weights: the module's), the 1-rank run's are fp32 masters,
        # and Adam moves a weight by about lr a step whatever its gradient's size, so where rounding flips a tiny
        # gradient's sign the runs part by up to 2·lr: up to 3% of the norm measured (AVX2's emulated bf16).
        assert (merged[name] - tensor).norm() <= (0.1 if bf16 else 1e-4) * tensor.norm(), name


@pytest.mark.slow  # three 2-rank AutoTP runs (one uninterrupted, one killed twice and resumed): ~35 s on 2 cores
def test_a_tensor_parallel_run_killed_mid_step_then_mid_save_resumes_bit_identically(tmp_path):
    """As tests/trainer/checkpoint/test_checkpointer.py's kill -9 test, on 2 tensor-parallel ranks: killed mid-step after the
    first save, then mid-save (a partial step never commits), then run to the end; every logged loss equals the
    uninterrupted run's bit for bit."""
    from tests.trainer.checkpoint.test_checkpointer import EVERY, STEPS, kill_mid_step_then_mid_save

    local = kill_mid_step_then_mid_save(tmp_path, lambda out: _settings(
        out, 2, train_tokens=STEPS * 8 * 64, metrics={"eval_batches": 0},
        checkpoint={"interval_steps": EVERY, "keep_last": 4}))
    assert sorted(p.name for p in (local.path(STEPS) / "ds").glob("mp_rank_*_model_states.pt")) == [
        "mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"]


def _config(**sections):
    from trainer.config import RunConfig, from_dict

    return from_dict(RunConfig, _settings("/tmp/unused", 2, **sections))


def test_deepspeed_gets_autotp_with_our_layer_names_and_counts_a_sequence_once_per_group_rank():
    from trainer.parallel.engine import deepspeed_config
    from trainer.parallel.tensor import split_dim

    # 4 ranks, 2 a group: 2 data-parallel replicas, each with global_batch / (micro_batch × 2) = 2 micro-batches.
    ds = deepspeed_config(_config(), 4)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (16, 2, 2)
    assert ds["tensor_parallel"]["autotp_size"] == 2
    assert "tensor_parallel" not in deepspeed_config(_config(parallel={"tensor": 1}), 4)
    # Every projection of a block is split, along the dimension Megatron splits it; norms, embedding, head are not.
    from trainer.model.config import ModelConfig
    from trainer.model.transformer import CausalLM

    names = CausalLM(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4)).state_dict()
    dims = {name.removeprefix("transformer.blocks.0."): split_dim(name) for name in names}
    assert dims == {"attn_norm.weight": None, "attn.wq.weight": 0, "attn.wk.weight": 0, "attn.wv.weight": 0,
                    "attn.wo.weight": 1, "mlp_norm.weight": None, "mlp.w1.weight": 0, "mlp.w3.weight": 0,
                    "mlp.w2.weight": 1, "transformer.tok_emb.weight": None, "transformer.norm.weight": None,
                    "transformer.head.weight": None}


@pytest.mark.parametrize("sections, message", [
    ({"parallel": {"tensor": 0}}, r"parallel.tensor must be >= 1, got 0"),
    ({"parallel": {"tensor": 3}, "model": {"n_heads": 3, "n_kv_heads": 3, "d_model": 48}},
     r"model.d_ff \(128\) must be divisible by parallel.tensor \(3\)"),
    ({"parallel": {"tensor": 4}}, r"model.n_kv_heads \(2\) must be divisible by parallel.tensor \(4\)"),
    ({"parallel": {"tensor": 8}, "model": {"n_kv_heads": None}},
     r"model.n_heads \(4\) must be divisible by parallel.tensor \(8\)"),
    ({"parallel": {"tensor": 2, "pipeline": 2}}, r"parallel.tensor > 1 cannot be combined with parallel.pipeline"),
    ({"batch": {"sequence_parallel": 2}}, r"batch.sequence_parallel > 1 cannot be combined with parallel.tensor"),
    ({"deepspeed": {"zero_stage": 3}}, r"deepspeed.zero_stage must be 0, 1 or 2 with parallel.tensor"),
    ({"deepspeed": {"bf16": True}}, r"deepspeed.bf16 true with parallel.tensor > 1 needs deepspeed.zero_stage 1 or 2"),
    ({"sdc": {"enabled": True}}, r"sdc.enabled must be false with parallel.tensor"),
    ({"straggler": {"enabled": True}}, r"straggler.enabled must be false with parallel.tensor"),
    ({"health": {"interval": 10}}, r"health.interval must be 0 with parallel.tensor"),
    ({"metrics": {"downstream_interval": 5}}, r"metrics.downstream_interval must be 0 with parallel.tensor"),
])
def test_what_tensor_parallelism_cannot_do_is_refused_naming_the_field(sections, message):
    with pytest.raises(ValueError, match=message):
        _config(**sections)


def test_the_world_must_hold_whole_tensor_parallel_groups():
    from trainer.parallel.engine import deepspeed_config

    with pytest.raises(ValueError, match=r"parallel.tensor \(2\) must divide the world size \(3\)"):
        deepspeed_config(_config(), 3)
    with pytest.raises(ValueError, match=r"batch.global_batch \(8\) must be a multiple of .* \(4 × 4 = 16\)"):
        deepspeed_config(_config(batch={"micro_batch": 4}), 8)


def test_bf16_auto_trains_in_fp32_where_deepspeed_would_clip_a_tensor_parallel_model_by_another_norm():
    assert "ZeRO-0 trains in fp32" in _config(deepspeed={"bf16": "auto"}).fp32_only
    assert _config(deepspeed={"zero_stage": 1, "bf16": "auto"}).fp32_only is None
    assert _config(deepspeed={"zero_stage": 1, "bf16": True}).deepspeed.bf16 is True  # ZeRO-1 and 2 may


def test_the_checks_a_split_model_cannot_run_are_turned_off_when_left_at_their_defaults():
    cfg, off = _config().checks_off()
    assert cfg.model_split == "parallel.tensor"
    assert off == ["sdc.enabled", "straggler.enabled", "health.interval"]
    assert not cfg.sdc.enabled and not cfg.straggler.enabled and cfg.health.interval == 0
