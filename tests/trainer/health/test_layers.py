"""trainer.health.layers: the gradient probe and the per-layer figures on a tiny model, on the CPU."""

import torch

from trainer.health.config import HealthConfig
from trainer.model.config import ModelConfig
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


def test_the_hooks_are_on_the_model_only_on_the_steps_whose_figures_are_read():
    """A step no one reads the figures of calls no hook (autograd and the blocks' forward run no Python for them);
    a check that reads every step asks again before arm(), so its hooks are not taken off and put back each step."""
    torch.manual_seed(0)
    model = CausalLM(TINY)
    probe = GradientProbe(model)
    health = LayerHealth(HealthConfig(interval=2), model)
    params = [p for p in model.parameters() if p.requires_grad]
    gradient_hooks = lambda: sum(bool(p._backward_hooks) for p in params)
    activation_hooks = lambda: sum(bool(b._forward_hooks) for b in model.transformer.blocks)

    probe.start(0, record=False)
    probe.arm()
    assert gradient_hooks() == activation_hooks() == 0  # nothing asked: nothing on the model
    _backward(model)
    assert float(probe.local_norm()) == 0.0

    probe.start(1, record=False)
    probe.recording = True  # a reader asks (the health callback on a health step)
    probe.arm()
    weights = health.start()
    assert gradient_hooks() == len(params) and activation_hooks() == len(model.transformer.blocks)
    _backward(model)
    record, _ = health.finish(1, weights, probe.per_layer())
    assert activation_hooks() == 0 and all(record["layers"][f"block.{i}"]["act_rms"] > 0 for i in range(2))

    probe.start(2, record=False)
    assert gradient_hooks() == len(params)  # kept until arm(): a reader may ask again for this step
    probe.recording = True
    probe.arm()
    assert gradient_hooks() == len(params)
    probe.start(3, record=False)
    probe.arm()
    assert gradient_hooks() == 0
