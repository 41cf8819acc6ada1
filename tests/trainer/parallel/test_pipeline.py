"""Pipeline parallelism (parallel.pipeline, trainer/parallel/pipeline.py on DeepSpeed's PipelineEngine): a 2-stage pipeline
on 2 ranks trains as the unpipelined model on 1 rank, resumes bit for bit after kill -9, and what it cannot do is
refused by name."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import read_metrics, run_dict

REPO = Path(__file__).resolve().parents[3]
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def _settings(out, pipeline: int, **sections) -> dict:
    """10 steps of 8 sequences of 64 tokens, 4 blocks (2 a stage), z_loss on, fp32 ZeRO-0; `sections` override."""
    base = {"train_tokens": 10 * 8 * 64, "model": {"n_layers": 4, "z_loss": 1e-4},
            "deepspeed": {"zero_stage": 0, "bf16": False}, "parallel": {"pipeline": pipeline},
            "batch": {"global_batch": 8, "micro_batch": 2, "seq_len": 64},
            "metrics": {"log_interval": 1, "eval_batches": 1, "tensorboard": False}}
    for key, value in sections.items():
        base[key] = {**base[key], **value} if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return run_dict(out, **base)


def _run(tmp_path, name: str, ranks: int, pipeline: int, env=None, **sections) -> list[dict]:
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps(_settings(tmp_path / name, pipeline, **sections)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", **(env or {})}
    launcher = [TORCHRUN, "--standalone", "--nproc_per_node", str(ranks)] if ranks > 1 else [sys.executable]
    done = subprocess.run([*launcher, "-m", "trainer", "--config", str(config)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return read_metrics(tmp_path / name)


@pytest.mark.slow  # a 2- or 4-rank pipeline under torchrun and a 1-rank run: ~20-30 s each on 2 cores
@pytest.mark.parametrize("ranks, zero_stage, bf16", [(2, 0, False), (4, 1, False), (2, 1, True)])
def test_a_two_stage_pipeline_trains_as_the_unpipelined_model(tmp_path, ranks, zero_stage, bf16):
    """parallel.pipeline 2 on 2 ranks (one data-parallel replica, m = 4 micro-batches a step, 2 blocks a stage) or 4
    (two replicas of 2 micro-batches, ZeRO-1 partitioning each stage's optimizer state over them) against 1 rank
    without a pipeline on the same samples and the same initial weights, every step clipped (grad_clip 0.2): in
    fp32 the same losses and pre-clip gradient norms for 10 steps (document masks, restarting positions and z_loss
    included), the same held-out loss at the end; in bf16 the same within bf16's rounding."""
    from tests.trainer.faults import fault_env

    # Step 4 is refused before the update (as the spike guard refuses a spike): the pipeline's gate must leave
    # every stage's weights and Adam state untouched, as the unpipelined step does.
    skip = fault_env("skip:step=4")
    # Held-out losses every 3 steps too: DeepSpeed's eval_batch between train_batch calls must not disturb them.
    sections = dict(env=skip, metrics={"eval_interval": 3}, checkpoint={"save_final": False},
                    deepspeed={"zero_stage": zero_stage, "bf16": bf16}, optim={"grad_clip": 0.2})
    piped = _run(tmp_path, "piped", ranks, 2, **sections)
    whole = _run(tmp_path, "whole", 1, 1, **sections)
    # bf16: measured 2e-5 (loss) and 9e-4 (norm) at most over these 10 steps.
    loss_tol, norm_tol = (1e-3, 1e-2) if bf16 else (1e-5, 1e-4)
    steps = lambda records, key: [r[key] for r in records if r.get("event") == "train"]
    assert len(steps(whole, "loss")) == 10
    assert min(steps(whole, "grad_norm")) > 0.2  # the clip acted on every step
    skipped = lambda records: [r["step"] for r in records if r.get("event") == "skip"]
    assert skipped(piped) == skipped(whole) == [4]
    assert steps(piped, "loss") == pytest.approx(steps(whole, "loss"), rel=loss_tol)
    assert steps(piped, "grad_norm") == pytest.approx(steps(whole, "grad_norm"), rel=norm_tol)
    val = lambda records: [(r["step"], r["val_loss"]["text"]) for r in records if r.get("event") == "eval"]
    assert [step for step, _ in val(whole)] == [3, 6, 9, 10]
    assert val(piped) == [(step, pytest.approx(loss, rel=loss_tol)) for step, loss in val(whole)]
    [off] = [r for r in piped if r.get("event") == "checks_off"]
    assert off["fields"] == ["sdc.enabled", "straggler.enabled", "health.interval"]


@pytest.mark.slow  # three 2-rank pipeline runs (one uninterrupted, one killed twice and resumed): ~35 s on 2 cores
def test_a_pipeline_killed_mid_step_then_mid_save_resumes_bit_identically(tmp_path):
    """As tests/trainer/checkpoint/test_checkpointer.py's kill -9 test, on a 2-stage pipeline: killed mid-step after the first
    save, then mid-save (a partial step never commits), then run to the end; every logged loss equals the
    uninterrupted run's bit for bit."""
    from tests.trainer.checkpoint.test_checkpointer import EVERY, STEPS, kill_mid_step_then_mid_save

    local = kill_mid_step_then_mid_save(tmp_path, lambda out: _settings(
        out, 2, train_tokens=STEPS * 8 * 64, metrics={"eval_batches": 0},
        checkpoint={"interval_steps": EVERY, "keep_last": 4}))
    manifest = local.verify(STEPS)
    assert manifest["world_size"] == 2 and manifest["config"]["parallel"]["pipeline"] == 2

    # Its weights read back as CausalLM's (export, init_from): every parameter, named as the unpipelined model's.
    from trainer.model.transformer import CausalLM
    from trainer.checkpoint.weights import checkpoint_weights, model_config

    weights, _ = checkpoint_weights(local.path(STEPS))
    CausalLM(model_config(manifest)).load_state_dict(weights, strict=True)


def _config(**sections):
    from trainer.config import RunConfig, from_dict

    return from_dict(RunConfig, _settings("/tmp/unused", 2, **sections))


def test_the_pipeline_settings_are_accepted_and_the_data_parallel_size_follows_from_them():
    from trainer.config import BatchConfig
    from trainer.parallel.engine import deepspeed_config

    cfg = _config()
    assert cfg.parallel.pipeline == 2
    # 4 ranks, 2 stages: 2 data-parallel replicas, each with global_batch / (micro_batch × 2) = 2 micro-batches.
    ds = deepspeed_config(cfg, 4)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (8, 2, 2)
    assert ds["gradient_clipping"] == 0.0  # the gate clips, by the norm over every stage (trainer.parallel.engine.PreClipNorm)
    with pytest.raises(ValueError, match=r"parallel.pipeline \(2\) must divide the world size \(3\)"):
        BatchConfig(global_batch=8, micro_batch=2).check_world(3, pipeline=2)
    BatchConfig(global_batch=8, micro_batch=4).check_world(4, pipeline=2)  # 4 × 2 replicas = 8: fine
    with pytest.raises(ValueError, match=r"batch.global_batch \(8\) must be a multiple of .* \(4 × 4 = 16\)"):
        BatchConfig(global_batch=8, micro_batch=4).check_world(4, pipeline=1)


@pytest.mark.parametrize("sections, message", [
    ({"parallel": {"pipeline": 0}}, r"parallel.pipeline must be >= 1, got 0"),
    ({"parallel": {"stages": 2}}, r"parallel.stages: unknown field \(known: pipeline, tensor\)"),
    ({"parallel": {"pipeline": 8}}, r"model.n_layers \(4\) must be >= parallel.pipeline \(8\)"),
    ({"batch": {"sequence_parallel": 2}}, r"batch.sequence_parallel > 1 cannot be combined with parallel.pipeline"),
    ({"model": {"activation_checkpointing": "full"}}, r"model.activation_checkpointing must be \"none\""),
    ({"deepspeed": {"zero_stage": 2}}, r"deepspeed.zero_stage must be 0 or 1 with parallel.pipeline"),
    ({"batch": {"ramp_start": 4, "ramp_tokens": 1024}}, r"batch.ramp_start: a batch-size ramp cannot be combined"),
    ({"sdc": {"enabled": True}}, r"sdc.enabled must be false with parallel.pipeline"),
    ({"straggler": {"enabled": True}}, r"straggler.enabled must be false with parallel.pipeline"),
    ({"health": {"interval": 10}}, r"health.interval must be 0 with parallel.pipeline"),
    ({"metrics": {"downstream_interval": 5}}, r"metrics.downstream_interval must be 0 with parallel.pipeline"),
])
def test_what_a_pipeline_cannot_do_is_refused_naming_the_field(sections, message):
    with pytest.raises(ValueError, match=message):
        _config(**sections)


def test_the_checks_a_pipeline_cannot_run_are_turned_off_when_left_at_their_defaults():
    cfg, off = _config().checks_off()
    assert off == ["sdc.enabled", "straggler.enabled", "health.interval"]
    assert not cfg.sdc.enabled and not cfg.straggler.enabled and cfg.health.interval == 0
    _, off = _config(sdc={"enabled": False}).checks_off()
    assert off == ["straggler.enabled", "health.interval"]


def test_without_a_pipeline_nothing_is_refused():
    from trainer.config import RunConfig, from_dict

    cfg = from_dict(RunConfig, run_dict("/tmp/unused", model={"activation_checkpointing": "full"},
                                        deepspeed={"zero_stage": 3, "bf16": True}))
    assert cfg.parallel.pipeline == 1 and cfg.sdc.enabled and cfg.checks_off() == (cfg, [])


@pytest.mark.slow  # a 2-rank pipeline trainer under torchrun: ~40 s on 2 cores
def test_the_spike_guard_rolls_a_pipeline_back_and_skips_the_window(tmp_path):
    """As test_checkpoint's rollback test, on a 2-stage pipeline: noise in samples 56..79 (steps 7-9) is skipped
    three times, the guard rolls back to step 6's checkpoint in a freshly built pipeline engine, the data jump the
    window and the run reaches its token budget."""
    settings = _settings(tmp_path / "out", 2, train_tokens=14 * 8 * 64, optim={"lr": 1e-2},
                         metrics={"eval_batches": 0}, checkpoint={"interval_steps": 2, "keep_last": 10},
                         guard={"warmup_steps": 4, "loss_ratio": 1.2, "max_strikes": 3, "strike_window": 5})
    (tmp_path / "run.json").write_text(json.dumps(settings))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(REPO)}
    done = subprocess.run([TORCHRUN, "--standalone", "--nproc_per_node", "2",
                           str(REPO / "tests/trainer/parallel/pipeline_rollback_worker.py"), str(tmp_path / "report.json"),
                           str(tmp_path / "run.json")], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    records = read_metrics(tmp_path / "out")
    assert [r["step"] for r in records if r["event"] == "skip"] == [7, 8, 9]
    (rollback,) = [r for r in records if r["event"] == "rollback"]
    assert rollback["skip_window"] == [56, 80] and rollback["to_step"] == 6 and rollback["step"] == 10
    assert [h["samples"] for h in report["history"] if h["step"] >= 6][:2] == [[48, 56], [80, 88]]
    summary = report["summary"]
    assert summary["steps"] == 14 and summary["sample_index"] == 14 * 8 + 24 and summary["skipped"] == []


def test_a_split_models_step_resumes_only_with_the_same_split():
    from trainer.checkpoint.checkpointer import ResumeRefused, check_layout
    from trainer.checkpoint.store import ResumePoint

    def point(world_size: int, **parallel) -> ResumePoint:
        config = _config(parallel={"pipeline": 1, **parallel}).to_dict() if parallel else {}
        return ResumePoint(step=3, path=Path("/ckpt/step-00000003"), source="local",
                           manifest={"world_size": world_size, "config": config})

    check_layout(point(2, pipeline=2), _config())
    check_layout(point(4), _config(parallel={"pipeline": 1}))  # no split (the world size is the engine's concern)
    check_layout(point(2, tensor=2), _config(parallel={"pipeline": 1, "tensor": 2}))
    with pytest.raises(ResumeRefused, match=r"written with parallel.pipeline = 1, parallel.tensor = 1; this run has "
                                            r"parallel.pipeline = 2, parallel.tensor = 1: a checkpoint resumes only "
                                            r"with the same parallel settings"):
        check_layout(point(2), _config())
    with pytest.raises(ResumeRefused, match=r"parallel.tensor = 2; this run has parallel.pipeline = 2, "
                                            r"parallel.tensor = 1"):
        check_layout(point(4, tensor=2), _config())


@pytest.mark.slow  # per split: a 2-rank run of 8 steps, then 4 of them resumed on 4 ranks: ~40 s on 2 cores
@pytest.mark.parametrize("parallel, zero_stage", [({"pipeline": 2}, 1), ({"pipeline": 1, "tensor": 2}, 0)],
                         ids=["pipeline-zero1", "tensor-zero0"])
def test_a_split_models_step_resumes_on_another_data_parallel_size(tmp_path, parallel, zero_stage):
    """A 2-stage pipeline (ZeRO-1: each stage's optimizer state partitioned over the replicas, so through the
    universal checkpoint) or a 2-rank tensor-parallel group (ZeRO-0: each new replica loads its shard's files as they
    are), checkpointed at step 4 on 2 ranks (one replica) and resumed on 4 (two replicas): steps 5-8 give the
    uninterrupted 2-rank run's losses and gradient norms (fp32; the replicas' gradients are summed in another order)."""
    import shutil

    from tests.trainer.checkpoint.test_checkpointer import _write

    def run(name: str, ranks: int) -> list[dict]:
        out = tmp_path / name / "out"
        settings = _settings(out, 1, train_tokens=8 * 8 * 64, parallel=parallel, optim={"grad_clip": 0.2},
                             deepspeed={"zero_stage": zero_stage}, metrics={"eval_batches": 0},
                             checkpoint={"interval_steps": 4, "keep_last": 4})
        config = _write(tmp_path / name, settings)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
        done = subprocess.run([TORCHRUN, "--standalone", "--nproc_per_node", str(ranks), "-m", "trainer", "--config",
                               str(config)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return read_metrics(out)

    reference = run("two", 2)
    # The resumed run starts from a copy of the 2-rank run's step 4, its only step.
    (tmp_path / "four" / "out" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "two" / "out" / "checkpoints" / "step-00000004",
                    tmp_path / "four" / "out" / "checkpoints" / "step-00000004")
    resumed = run("four", 4)
    [event] = [r for r in resumed if r["event"] == "resumed"]
    assert (event["step"], event["world_size"], event["universal"]) == (4, 2, zero_stage > 0)
    figures = lambda records: {r["step"]: (r["loss"], r["grad_norm"]) for r in records if r["event"] == "train"}
    after = figures(resumed)
    assert sorted(after) == [5, 6, 7, 8]
    for step, (loss, norm) in after.items():
        assert (loss, norm) == pytest.approx(figures(reference)[step], rel=1e-6), step


@pytest.mark.parametrize("doc_positions", [True, False])
def test_the_stages_in_a_row_compute_the_models_logits_and_loss(doc_positions):
    """The pipeline's layers (embedding, blocks, norm + head, loss) chained by hand equal CausalLM on packed
    sequences, document masks, restarting positions and z_loss included: what the 2-rank tests rely on."""
    import torch

    from trainer.model.config import ModelConfig
    from trainer.model.transformer import CausalLM
    from trainer.parallel.pipeline import BlockStage, EmbeddingStage, HeadStage, PipelineLoss

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, z_loss=1e-3,
                      doc_positions=doc_positions)
    model = CausalLM(cfg)
    tokens = torch.randint(0, 97, (2, 17))
    doc_ids = torch.tensor([[0] * 5 + [1] * 12, [0] * 17])
    positions = torch.stack([torch.cat([torch.arange(5), torch.arange(12)]), torch.arange(17)])
    inputs, targets, docs, pos = tokens[:, :-1], tokens[:, 1:], doc_ids[:, :-1], positions[:, :-1]
    expected, _ = model(inputs, targets, docs, pos)
    layers = [EmbeddingStage(model), *(BlockStage(model, i) for i in range(3)), HeadStage(model)]
    x = (inputs, docs, pos)
    for layer in layers:
        x = layer(x)
    assert torch.equal(x, model.transformer(inputs, doc_ids=docs, positions=pos))
    assert torch.equal(PipelineLoss(cfg.z_loss)(x, targets), expected)
    with torch.no_grad():  # evaluation reports the cross-entropy alone, as CausalLM's second output
        assert torch.equal(PipelineLoss(cfg.z_loss)(x, targets), model(inputs, targets, docs, pos)[1])
