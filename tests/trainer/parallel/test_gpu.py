"""The CUDA paths: compiled FlexAttention with the document mask, bf16 DeepSpeed on nccl (marker gpu).

Skipped where CUDA is absent (CI); run on the device machine with `pytest -m gpu tests/trainer/parallel/test_gpu.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from tests.trainer.conftest import read_metrics, write_run
from trainer.model.config import ModelConfig
from trainer.model.transformer import Transformer

pytestmark = pytest.mark.gpu

CFG = ModelConfig(vocab_size=512, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2)


def test_compiled_flex_attention_keeps_documents_apart_on_cuda():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**CFG.__dict__, "attention": "flex"})).cuda().eval()
    lengths = [300, 500, 224]
    tokens = torch.randint(0, CFG.vocab_size, (1, sum(lengths)), device="cuda")
    doc_ids = torch.cat([torch.full((n,), i, device="cuda") for i, n in enumerate(lengths)])[None]
    positions = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    with torch.no_grad():
        packed = model(tokens, doc_ids=doc_ids, positions=positions)
        start = 0
        for n in lengths:
            alone = model(tokens[:, start:start + n])
            torch.testing.assert_close(packed[:, start:start + n], alone, rtol=2e-3, atol=2e-3)
            start += n


def test_bf16_training_on_cuda_with_nccl(tmp_path):
    run = write_run(tmp_path / "run.json", deepspeed={"zero_stage": 1, "bf16": True},
                    metrics={"log_interval": 1, "eval_batches": 1, "tensorboard": False})
    env = {**os.environ, "DS_ACCELERATOR": "cuda"}
    result = subprocess.run([sys.executable, "-m", "trainer", "--config", str(run)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    train = [r for r in read_metrics(tmp_path / "out") if r["event"] == "train"]
    assert train and all(r["loss"] == r["loss"] for r in train)
    assert "bf16 peak" in train[-1]["peak"]  # an H100/H200/A100 from the device table


def test_compiled_blocks_give_the_eager_models_loss_and_gradients_and_keep_parameter_names():
    torch.manual_seed(0)
    cfg = ModelConfig(**{**CFG.__dict__, "attention": "flex", "activation_checkpointing": "selective"})
    from trainer.model.transformer import CausalLM

    eager, compiled = CausalLM(cfg).cuda(), CausalLM(cfg).cuda()
    compiled.load_state_dict(eager.state_dict())
    compiled.transformer.compile_blocks()
    assert [n for n, _ in compiled.named_parameters()] == [n for n, _ in eager.named_parameters()]
    tokens = torch.randint(0, CFG.vocab_size, (2, 257), device="cuda")
    doc_ids = torch.cat([torch.zeros(2, 100), torch.ones(2, 157)], dim=1).long().cuda()
    for model in (eager, compiled):
        loss, _ = model(tokens[:, :-1], tokens[:, 1:], doc_ids=doc_ids[:, :-1])
        loss.backward()
        model.loss = loss.detach()
    torch.testing.assert_close(compiled.loss, eager.loss, rtol=1e-4, atol=1e-4)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-4, msg=name)
