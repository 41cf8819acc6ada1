"""trainer/model/config.py: the model's section and the one parameter and FLOP count (held to the real model's
weights in test_transformer.py); here against counts done by hand."""

import pytest

from trainer.model.config import ModelConfig, count_parameters, flops_per_token


def test_the_defaults_resolve_as_llamas_rules():
    model = ModelConfig()
    assert (model.kv_heads, model.head_dim, model.ff_dim) == (4, 64, 704)  # 8/3 * 256 rounded up to 64
    assert ModelConfig(n_kv_heads=2).kv_heads == 2


def test_a_shape_that_cannot_split_is_refused_naming_the_fields():
    with pytest.raises(ValueError, match=r"model\.d_model \(100\) must be divisible by model\.n_heads \(3\)"):
        ModelConfig(d_model=100, n_heads=3)
    with pytest.raises(ValueError, match=r"model\.n_heads \(4\) must be divisible by model\.n_kv_heads \(3\)"):
        ModelConfig(n_kv_heads=3)


def test_the_count_by_hand():
    # vocab 10, d 8, 1 layer, 2 heads of 4, 1 kv head, d_ff 16: q and o 2*64, k and v 2*8*4, MLP 3*8*16, norms 2*8.
    count = count_parameters(vocab=10, d_model=8, layers=1, heads=2, kv_heads=1, d_ff=16)
    assert (count.embedding, count.head, count.body) == (80, 80, 128 + 64 + 384 + 16 + 8)
    assert (count.total, count.non_embedding, count.matmul) == (80 + 80 + 600, 600, 680)
    tied = count_parameters(vocab=10, d_model=8, layers=1, heads=2, kv_heads=1, d_ff=16, tied=True)
    assert (tied.total, tied.matmul) == (680, 680)  # the head shares the embedding, but is still multiplied through
    assert flops_per_token(count, layers=1, d_model=8, seq_len=32) == 6 * 680 + 12 * 1 * 32 * 8
    assert flops_per_token(count, layers=1, d_model=8, seq_len=32, attention=False) == 6 * 680
