"""The Llama-style model: document-confined attention, init, losses, parameter groups."""

import math

import pytest
import torch

from trainer.config import OptimConfig, RunConfig, from_dict
from trainer.model.config import ModelConfig
from trainer.model.transformer import CausalLM, Transformer, document_causal_mask, flex_document_mask, lm_loss
from trainer.optim import param_groups

CFG = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, qk_norm=True, rope_base=500.0)


def _packed(lengths, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, vocab, (n,), generator=g) for n in lengths]
    doc_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    positions = torch.cat([torch.arange(n) for n in lengths])
    return docs, torch.cat(docs)[None], doc_ids[None], positions[None]


def test_packed_sequence_logits_equal_each_document_alone():
    torch.manual_seed(0)
    model = Transformer(CFG).eval()
    docs, tokens, doc_ids, positions = _packed([7, 19, 1, 13], CFG.vocab_size)
    with torch.no_grad():
        packed = model(tokens, doc_ids=doc_ids, positions=positions)[0]
        alone = torch.cat([model(d[None])[0] for d in docs])
        leaky = model(tokens)[0]  # plain causal attention over the whole pack
    assert packed.shape == (40, CFG.vocab_size)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    # The first document sees nothing else either way; later ones must differ without the mask.
    torch.testing.assert_close(leaky[:7], alone[:7], rtol=1e-5, atol=1e-5)
    assert (leaky[7:] - alone[7:]).abs().max() > 1e-3


def test_positions_follow_the_batch_only_when_doc_positions():
    torch.manual_seed(0)
    _, tokens, doc_ids, positions = _packed([5, 9], CFG.vocab_size)
    shifted = positions + 1000  # RoPE is relative: only rounding can tell the offsets apart
    for doc_positions in (True, False):
        model = Transformer(ModelConfig(**{**CFG.__dict__, "doc_positions": doc_positions})).eval()
        with torch.no_grad():
            a = model(tokens, doc_ids=doc_ids, positions=positions)
            b = model(tokens, doc_ids=doc_ids, positions=shifted)
            c = model(tokens, doc_ids=doc_ids)
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
        assert torch.equal(a, c) is (not doc_positions)  # ignored -> exactly the default 0..T-1


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_mask_matches_sdpa_mask():
    from torch.nn.attention.flex_attention import flex_attention

    torch.manual_seed(0)
    doc_ids = torch.tensor([[0] * 50 + [1] * 30 + [2] * 48, [0] * 128])
    q, k, v = (torch.randn(2, 4, 128, 16) for _ in range(3))
    mask = document_causal_mask(doc_ids)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    block_mask = flex_document_mask(doc_ids)
    out = flex_attention(q, k, v, block_mask=block_mask)  # eager on CPU: slow, but exact enough to compare
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_init_scales_output_projections_and_has_no_biases():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=4096, d_model=256, n_layers=8, n_heads=4)
    model = Transformer(cfg)
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    assert model.head.weight.data_ptr() != model.tok_emb.weight.data_ptr()  # untied
    out_std = torch.cat([b.mlp.w2.weight.flatten() for b in model.blocks]).std().item()
    in_std = torch.cat([b.mlp.w1.weight.flatten() for b in model.blocks]).std().item()
    assert in_std == pytest.approx(0.02, rel=0.02)
    assert out_std == pytest.approx(0.02 / math.sqrt(2 * 8), rel=0.02)
    assert all(torch.all(b.attn_norm.weight == 1) for b in model.blocks)
    # SwiGLU hidden size: 8/3·d rounded up to 64, and the parameter count that follows from the shape.
    assert cfg.ff_dim == 704
    per_layer = 4 * 256 * 256 + 3 * 256 * 704 + 2 * 256
    assert sum(p.numel() for p in model.parameters()) == 2 * 4096 * 256 + 8 * per_layer + 256


def test_z_loss_adds_coefficient_times_squared_log_normalizer():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11) * 3
    targets = torch.randint(0, 11, (2, 5))
    loss, ce = lm_loss(logits, targets, z_loss=1e-2)
    plain, _ = lm_loss(logits, targets)
    log_z = torch.logsumexp(logits, -1)
    torch.testing.assert_close(ce, plain)
    torch.testing.assert_close(loss, plain + 1e-2 * log_z.pow(2).mean())


def test_weight_decay_only_on_matrices_and_embeddings_by_config():
    model = CausalLM(CFG)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {g["name"]: {names[id(p)] for p in g["params"]} for g in param_groups(model, OptimConfig())}
    assert "transformer.head.weight" in groups["decay"]
    assert "transformer.blocks.0.attn.wq.weight" in groups["decay"]
    assert "transformer.tok_emb.weight" in groups["no_decay"]
    assert "transformer.blocks.0.attn_norm.weight" in groups["no_decay"]
    assert "transformer.blocks.0.attn.q_norm.weight" in groups["no_decay"]
    with_emb = {g["name"]: {names[id(p)] for p in g["params"]}
                for g in param_groups(model, OptimConfig(decay_embeddings=True))}
    assert "transformer.tok_emb.weight" in with_emb["decay"]
    assert all(g["weight_decay"] == 0.1 for g in param_groups(model, OptimConfig()) if g["name"] == "decay")


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_path_of_the_model_matches_sdpa(monkeypatch):
    # The CUDA path, run here with eager FlexAttention (compiling it on CPU takes ~20 s).
    from torch.nn.attention.flex_attention import flex_attention

    import trainer.model.transformer as model_module

    monkeypatch.setattr(model_module, "_compiled_flex", flex_attention)
    torch.manual_seed(0)
    sdpa = Transformer(CFG).eval()
    flex = Transformer(ModelConfig(**{**CFG.__dict__, "attention": "flex"})).eval()
    flex.load_state_dict(sdpa.state_dict())
    _, tokens, doc_ids, positions = _packed([30, 50, 48], CFG.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(flex(tokens, doc_ids=doc_ids, positions=positions),
                                   sdpa(tokens, doc_ids=doc_ids, positions=positions), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode,every", [("full", 1), ("full", 2), ("selective", 1)])
def test_activation_checkpointing_gives_the_same_losses_and_gradients_and_keeps_fewer_activations(mode, every):
    torch.manual_seed(0)
    base = dict(vocab_size=96, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, z_loss=1e-4)
    plain = CausalLM(ModelConfig(**base))
    recomputing = CausalLM(ModelConfig(**base, activation_checkpointing=mode, checkpoint_every=every))
    recomputing.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 96, (2, 33))
    doc_ids = torch.tensor([[0] * 20 + [1] * 13, [0] * 33])  # a packed row: the document mask goes through too

    def step(model):
        saved = []  # every tensor autograd keeps for backward
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            loss, _ = model(tokens[:, :-1], tokens[:, 1:], doc_ids=doc_ids[:, :-1])
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, sum(saved)

    loss, grads, kept = step(plain)
    loss_ac, grads_ac, kept_ac = step(recomputing)
    assert torch.equal(loss, loss_ac)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ac[name], grad, rtol=0, atol=1e-7, msg=name)
    assert kept_ac < kept
    if mode == "full" and every == 1:
        assert kept_ac < kept / 2  # only each block's input (and the head's) stays


def test_activation_checkpointing_settings_are_checked():
    assert Transformer(ModelConfig(vocab_size=8, d_model=8, n_layers=4, n_heads=2, activation_checkpointing="full",
                                   checkpoint_every=2)).recompute(2) == "block"
    with pytest.raises(ValueError, match="checkpoint_every must be >= 1"):
        ModelConfig(checkpoint_every=0)
    with pytest.raises(ValueError, match="activation_checkpointing"):
        from_dict(RunConfig, {"model": {"activation_checkpointing": "some"}, "data": {"shards": {"_": "_"}},
                              "output_dir": "_", "train_tokens": 1})
