"""trainer.health.layers: the gradient probe and the per-layer figures on a tiny model, on the CPU."""

import torch

from trainer.config import HealthConfig, ModelConfig
from trainer.health.layers import GradientProbe, LayerHealth, layer_of
from trainer.model.transformer import CausalLM

TINY = ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2)


def _backward(model, seed=0):
    tokens = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(seed))
    loss, _ = model(tokens[:, :-1], tokens[:, 1:], torch.zeros(2, 8, dtype=torch.long),
                    torch.arange(8).expand(2, 8))
    loss.backward()


def test_layer_names():
    assert layer_of("transformer.blocks.3.attn.wq.weight") == "block.3"
    assert layer_of("transformer.tok_emb.weight") == "embedding" and layer_of("transformer.head.weight") == "head"


def test_the_probe_sees_this_ranks_gradients_only_when_asked():
    torch.manual_seed(0)
    model = CausalLM(TINY)
    probe = GradientProbe(model)
    probe.start(0, record=False)
    _backward(model)
    assert float(probe.local_norm()) == 0.0
    model.zero_grad()
    probe.start(1)
    _backward(model)
    expected = torch.sqrt(sum(p.grad.float().pow(2).sum() for p in model.parameters()))
    assert torch.allclose(probe.local_norm(), expected, rtol=1e-4)
    assert set(probe.per_layer()) == {"embedding", "block.0", "block.1", "head"}


def test_a_layer_growing_alone_is_flagged():
    torch.manual_seed(0)
    model = CausalLM(TINY)
    probe = GradientProbe(model)
    health = LayerHealth(HealthConfig(interval=1, growth=3.0, history=3), model)
    for step in range(4):
        probe.start(step)
        if step == 3:
            with torch.no_grad():
                for p in model.transformer.blocks[1].parameters():
                    p.mul_(10)
        weights = health.start()
        _backward(model, seed=step)
        record, alarms = health.finish(step, weights, probe.per_layer())
        model.zero_grad()
    assert set(record["layers"]["block.0"]) == {"weight_rms", "act_rms", "grad_norm"}
    assert {(a["layer"], a["metric"]) for a in alarms} >= {("block.1", "weight_rms")}
    assert not any(a["layer"] == "block.0" for a in alarms)
