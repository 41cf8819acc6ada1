"""Sequence parallelism (DeepSpeed Ulysses, trainer/parallel/sequence.py): 2 ranks equal 1 on packed sequences."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


REPO = Path(__file__).resolve().parents[3]
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


@pytest.mark.slow  # two ranks under torchrun: ~20 s on 2 cores
@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_ulysses_on_two_ranks_equals_one_rank_with_document_masks_and_restarting_positions(tmp_path, attention):
    out = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(REPO)}
    done = subprocess.run([TORCHRUN, "--standalone", "--nproc_per_node", "2", str(REPO / "tests/trainer/parallel/ulysses_worker.py"),
                           str(out), attention], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mask_matters"] > 1e-3  # the packed documents change the logits: the mask is exercised
    assert report["logits"] < 1e-5
    assert report["split_loss"] == pytest.approx(report["loss"], abs=1e-6)
    if attention == "sdpa":  # FlexAttention has no backward on CPU: its gradients are the GPU tests' (gpu marker)
        assert len(report["grads"]) == 1 + 2 * 9 + 2  # every parameter: embedding, 2 blocks of 9, norm, head
        assert max(report["grads"].values()) < 1e-5 * max(1.0, report["grad_scale"]), report["grads"]


def test_a_sequence_not_divisible_by_the_group_is_refused():
    from trainer.parallel.sequence import SequenceParallel

    sp = SequenceParallel(group=None, size=2, rank=1)
    assert torch.equal(sp.local(torch.arange(8)[None]), torch.arange(4, 8)[None])
    with pytest.raises(ValueError, match="sequence length 7 is not divisible by 2"):
        sp.local(torch.arange(7)[None])


@pytest.mark.slow  # a 2-rank trainer under torchrun and a 1-rank one, per ZeRO stage: ~a minute on 2 cores
@pytest.mark.parametrize("zero_stage", [1, 3])
def test_a_trainer_whose_two_ranks_split_each_sequence_trains_as_one_rank(tmp_path, zero_stage):
    """batch.sequence_parallel 2 on 2 ranks (one data-parallel rank) against 1 rank on the same samples: the same
    losses step by step (fp32), with ZeRO sharding over both ranks of the group."""
    from tests.trainer.conftest import read_metrics, run_dict

    def run(name: str, ranks: int) -> list[float]:
        settings = run_dict(tmp_path / name, train_tokens=4 * 4 * 64, deepspeed={"zero_stage": zero_stage, "bf16": False},
                            batch={"global_batch": 4, "micro_batch": 2, "seq_len": 64, "sequence_parallel": ranks},
                            metrics={"log_interval": 1, "eval_batches": 0, "tensorboard": False},
                            checkpoint={"save_final": False})
        config = tmp_path / f"{name}.json"
        config.write_text(json.dumps(settings))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
        launcher = [TORCHRUN, "--standalone", "--nproc_per_node", str(ranks)] if ranks > 1 else [sys.executable]
        done = subprocess.run([*launcher, "-m", "trainer", "--config", str(config)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return [r["loss"] for r in read_metrics(tmp_path / name) if r.get("event") == "train"]

    split, whole = run("split", 2), run("whole", 1)
    assert len(whole) == 4
    assert split == pytest.approx(whole, rel=1e-5)
