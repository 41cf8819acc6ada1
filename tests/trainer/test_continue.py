"""continue_from: a stage that continues another run (weights, Adam's moments, step and token count, the LR
schedule going on), as a WSD anneal branches off the stable phase of the main run (trainer.checkpoint.weights.continue_run,
trainer.optim.lr_at)."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.trainer.conftest import read_metrics, run_dict
from trainer.config import RunConfig, from_dict

STEP_TOKENS = 8 * 64  # run_dict's global batch × seq_len
MAIN_STEPS, ANNEAL_STEPS = 6, 2
PEAK, FLOOR_RATIO, WARMUP = 3e-3, 0.1, 2 * STEP_TOKENS


def _run(out, train_tokens: int, schedule: dict, bf16: bool = False, **sections) -> RunConfig:
    # ZeRO 1 (the demo's stage): the optimizer state lives in DeepSpeed's ZeRO shards (BF16_Optimizer's under
    # bf16). fp32 makes a continued run equal to an uninterrupted one bit for bit.
    return from_dict(RunConfig, run_dict(out, train_tokens=train_tokens, optim={"lr": PEAK},
                                         schedule={"kind": "wsd", "min_lr_ratio": FLOOR_RATIO, **schedule},
                                         deepspeed={"zero_stage": 1, "bf16": bf16}, **sections))


def _main(out, bf16: bool = False) -> RunConfig:
    """The stable phase: warmup, then the peak LR until the branch point (decay_fraction 0)."""
    return _run(out, MAIN_STEPS * STEP_TOKENS, {"warmup_tokens": WARMUP, "decay_fraction": 0.0}, bf16)


def _anneal(out, branch, bf16: bool = False, **sections) -> RunConfig:
    """The decay: from the branch point to the floor over this stage's own tokens, no warmup."""
    return _run(out, ANNEAL_STEPS * STEP_TOKENS, {"warmup_tokens": 0, "decay_fraction": 1.0}, bf16,
                continue_from=str(branch), **sections)


def _moments(optimizer) -> list[dict[str, torch.Tensor]]:
    """Adam's state per parameter, in parameter order (DeepSpeed's ZeRO-1 flat fp32 partitions)."""
    return [{k: v.clone() for k, v in optimizer.state[p].items()} for g in optimizer.param_groups for p in g["params"]]


@pytest.mark.slow  # three tiny DeepSpeed runs: ~a minute on 2 cores
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_an_anneal_that_continues_the_main_run_is_the_tail_of_one_wsd_schedule(tmp_path, bf16):
    from trainer.train import Trainer

    main = Trainer(_main(tmp_path / "main", bf16))
    main.fit()
    at_branch = _moments(main.optimizer)
    branch = tmp_path / "main" / "checkpoints" / f"step-{MAIN_STEPS:08d}"
    assert branch.is_dir() and all(h["lr"] == PEAK for h in main.history[2:])  # warmup, then stable: no decay

    anneal = Trainer(_anneal(tmp_path / "anneal", branch, bf16))
    # It starts where main stopped: step, tokens and data position, and Adam's moments tensor by tensor.
    assert (anneal.state.step, anneal.state.tokens, anneal.state.start_tokens) == (
        MAIN_STEPS, MAIN_STEPS * STEP_TOKENS, MAIN_STEPS * STEP_TOKENS)
    assert anneal.state.sample_index == main.state.sample_index
    continued = _moments(anneal.optimizer)
    assert len(continued) == len(at_branch) and all(at_branch)
    for theirs, ours in zip(at_branch, continued):
        assert set(theirs) == set(ours) == {"step", "exp_avg", "exp_avg_sq"}
        for key in theirs:
            torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0)
        assert float(ours["step"]) == MAIN_STEPS  # bias correction goes on from the main run's step
    anneal.fit()

    # Its first step's LR is the WSD schedule's one step past the branch point, by the formula: linear from
    # the peak to the floor over the anneal's tokens.
    decay = ANNEAL_STEPS * STEP_TOKENS
    lrs = [h["lr"] for h in anneal.history]
    assert lrs[0] == pytest.approx(PEAK * (1 - (1 - FLOOR_RATIO) * STEP_TOKENS / decay), rel=1e-12)
    assert lrs[-1] == pytest.approx(PEAK * FLOOR_RATIO, rel=1e-12)
    assert [h["step"] for h in anneal.history] == [MAIN_STEPS, MAIN_STEPS + 1]
    # It checkpoints under its own run's folder, numbering on from the main run's steps.
    assert (tmp_path / "anneal" / "checkpoints" / f"step-{MAIN_STEPS + ANNEAL_STEPS:08d}").is_dir()
    events = [e for e in read_metrics(tmp_path / "anneal") if e.get("event") == "continued"]
    assert events == [{"event": "continued", "from": str(branch), "step": MAIN_STEPS,
                       "tokens": MAIN_STEPS * STEP_TOKENS, "same_data": True, "universal": False}]

    # One uninterrupted WSD run over the same tokens (decaying over the last quarter) is the same run, step
    # for step: the same LRs and the same losses (the continued run restores the fp32 master weights and
    # moments, and its bf16 weights are their rounding, as in the uninterrupted run).
    total = MAIN_STEPS + ANNEAL_STEPS
    whole = Trainer(_run(tmp_path / "whole", total * STEP_TOKENS,
                         {"warmup_tokens": WARMUP, "decay_fraction": ANNEAL_STEPS / total}, bf16))
    whole.fit()
    joined = main.history + anneal.history
    assert [h["step"] for h in joined] == [h["step"] for h in whole.history]
    assert [h["lr"] for h in joined] == pytest.approx([h["lr"] for h in whole.history], rel=1e-12)
    assert [h["loss"] for h in joined] == pytest.approx([h["loss"] for h in whole.history], rel=1e-6, abs=0)
    assert [h["samples"] for h in joined] == [h["samples"] for h in whole.history]


@pytest.mark.slow
def test_a_continued_stage_resumes_from_its_own_checkpoints_and_init_from_does_not_continue(tmp_path):
    from trainer.train import Trainer

    main = Trainer(_main(tmp_path / "main"))
    main.fit()
    branch = tmp_path / "main" / "checkpoints" / f"step-{MAIN_STEPS:08d}"
    first = Trainer(_anneal(tmp_path / "anneal", branch, checkpoint={"interval_steps": 1}))
    first.fit()
    # Lose its last step (a kill before that checkpoint was committed): the rerun resumes from its own step 7,
    # not from the main run's branch point, and takes the same last step.
    shutil.rmtree(tmp_path / "anneal" / "checkpoints" / f"step-{MAIN_STEPS + ANNEAL_STEPS:08d}")
    again = Trainer(_anneal(tmp_path / "anneal", branch, checkpoint={"interval_steps": 1}))
    assert (again.state.step, again.state.start_tokens) == (MAIN_STEPS + 1, MAIN_STEPS * STEP_TOKENS)
    again.fit()
    assert again.history[0]["lr"] == first.history[-1]["lr"]
    assert again.history[0]["loss"] == pytest.approx(first.history[-1]["loss"], rel=1e-6, abs=0)

    # init_from takes the weights only: a fresh optimizer, step 0, and this stage's schedule from its start.
    fresh = Trainer(_run(tmp_path / "fresh", ANNEAL_STEPS * STEP_TOKENS, {"warmup_tokens": 0, "decay_fraction": 1.0},
                         init_from=str(branch)))
    assert (fresh.state.step, fresh.state.tokens) == (0, 0) and not fresh.optimizer.state
    fresh.close()
    with pytest.raises(ValueError, match=r"continue_from .*step-00000006: the checkpoint's model does not match "
                                         r"model config \(d_model 64 vs 32, ff_dim 192 vs 128\)"):
        Trainer(_anneal(tmp_path / "bad", branch, model={"d_model": 32}))


def test_a_stable_phase_and_its_anneal_are_one_wsd_schedule_at_every_token():
    from trainer.config import ScheduleConfig
    from trainer.optim import lr_at

    stable, decay, warmup = 3000, 1000, 200
    whole = ScheduleConfig(kind="wsd", warmup_tokens=warmup, decay_fraction=decay / (stable + decay), min_lr_ratio=0.1)
    main = ScheduleConfig(kind="wsd", warmup_tokens=warmup, decay_fraction=0.0, min_lr_ratio=0.1)
    anneal = ScheduleConfig(kind="wsd", warmup_tokens=0, decay_fraction=1.0, min_lr_ratio=0.1)
    for t in range(1, stable + decay + 1, 7):
        piece = (lr_at(t, peak_lr=2.0, train_tokens=stable, cfg=main) if t <= stable else
                 lr_at(t, peak_lr=2.0, train_tokens=stable + decay, cfg=anneal, start_tokens=stable))
        assert piece == pytest.approx(lr_at(t, peak_lr=2.0, train_tokens=stable + decay, cfg=whole), rel=1e-12), t
        by_hand = 2.0 * t / warmup if t < warmup else 2.0 if t <= stable else 2.0 - 1.8 * (t - stable) / decay
        assert piece == pytest.approx(by_hand, rel=1e-12), t
    # A long-context stage's own warmup counts from where it starts, to its own (low) LR.
    own = ScheduleConfig(kind="constant", warmup_tokens=100)
    assert [lr_at(stable + t, peak_lr=0.5, train_tokens=stable + 500, cfg=own, start_tokens=stable)
            for t in (25, 100, 400)] == [0.125, 0.5, 0.5]


def test_continue_from_and_init_from_exclude_each_other(tmp_path):
    with pytest.raises(ValueError, match="init_from and continue_from: give one"):
        from_dict(RunConfig, run_dict(tmp_path, init_from="a/step-00000001", continue_from="a/step-00000001"))


@pytest.mark.slow  # one 2-rank trainer under torchrun, then one rank here: ~a minute on 2 cores
def test_an_anneal_on_one_rank_continues_a_two_rank_run_through_a_universal_checkpoint(tmp_path):
    """The branch point of an uninterrupted 2-rank WSD run (its step 6: the stable phase ends there) continued on
    one rank: DeepSpeed's universal checkpoint reshards the fp32 weights and Adam's moments, and the anneal's
    steps are that run's own steps 7 and 8 (fp32: only the order of the sums differs)."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    from trainer.train import Trainer

    total = MAIN_STEPS + ANNEAL_STEPS
    whole = _run(tmp_path / "whole", total * STEP_TOKENS,
                 {"warmup_tokens": WARMUP, "decay_fraction": ANNEAL_STEPS / total},
                 checkpoint={"interval_steps": MAIN_STEPS}, metrics={"eval_batches": 0, "tensorboard": False})
    run_json = tmp_path / "whole.json"
    run_json.write_text(json.dumps(whole.to_dict()))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "trainer",
                           "--config", str(run_json)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reference = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "whole") if r.get("event") == "train"}

    branch = tmp_path / "whole" / "checkpoints" / f"step-{MAIN_STEPS:08d}"
    anneal = Trainer(_anneal(tmp_path / "anneal", branch, metrics={"eval_batches": 0, "tensorboard": False}))
    assert (anneal.state.step, anneal.state.tokens) == (MAIN_STEPS, MAIN_STEPS * STEP_TOKENS)
    losses = anneal.fit()["losses"]
    assert [e["universal"] for e in read_metrics(tmp_path / "anneal") if e.get("event") == "continued"] == [True]
    assert losses == pytest.approx([reference[MAIN_STEPS + 1], reference[MAIN_STEPS + 2]], abs=1e-4)
