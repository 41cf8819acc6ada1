"""Sequence parallelism (DeepSpeed Ulysses, trainer/sequence_parallel.py): 2 ranks equal 1 on packed sequences."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.config import ModelConfig
from trainer.model import Transformer

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


@pytest.mark.slow  # two ranks under torchrun: ~20 s on 2 cores
@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_ulysses_on_two_ranks_equals_one_rank_with_document_masks_and_restarting_positions(tmp_path, attention):
    out = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(REPO)}
    done = subprocess.run([TORCHRUN, "--standalone", "--nproc_per_node", "2", str(REPO / "tests/trainer/ulysses_worker.py"),
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
    from trainer.sequence_parallel import SequenceParallel

    sp = SequenceParallel(group=None, size=2, rank=1)
    assert torch.equal(sp.local(torch.arange(8)[None]), torch.arange(4, 8)[None])
    with pytest.raises(ValueError, match="sequence length 7 is not divisible by 2"):
        sp.local(torch.arange(7)[None])
    model = Transformer(ModelConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=2))
    assert model.sequence_parallel is None  # unsplit unless the trainer sets a group
