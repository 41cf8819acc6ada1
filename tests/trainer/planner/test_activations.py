"""Activation memory per GPU (trainer/planner/activations.py), worked out by hand for a small shape."""

from trainer.planner.activations import activation_bytes_per_gpu
from trainer.planner.plan import Layout, ModelShape


# A small shape whose activation bytes are worked out by hand below: h = 64, 4 heads of 16, 2 kv heads (kv_dim 32),
# f = 128, 4 layers, vocab 100, s = 8 tokens, micro-batch 2 (16 tokens).
SMALL = ModelShape(layers=4, d_model=64, d_ff=128, heads=4, kv_heads=2, vocab=100, seq_len=8)


def test_activation_memory_by_hand():
    tokens = 16
    # A layer keeps, per token: x, norm(x), x', norm(x') = 4·64 = 256; q 64, k 32, v 32, attention output 64 = 192;
    # gate, up, silu(gate), product = 4·128 = 512: 960 elements, 1920 bytes. The head: 2·64 bf16 + 100 fp32 log-probs.
    layer, head = 960 * 2, 2 * 64 * 2 + 100 * 4
    one = Layout()
    assert activation_bytes_per_gpu(SMALL, micro_batch=2, layout=one) == tokens * (4 * layer + head)
    # Full recomputation keeps each layer's input (64 elements) and recomputes one layer at a time.
    assert activation_bytes_per_gpu(SMALL, micro_batch=2, layout=one, recompute="full") == \
        tokens * (4 * 64 * 2 + layer + head)
    # Selective: a layer keeps x, x', norm(x') and the MLP's 512; the attention half (2·64 + 192) is recomputed.
    assert activation_bytes_per_gpu(SMALL, micro_batch=2, layout=one, recompute="selective") == \
        tokens * (4 * (3 * 64 + 512) * 2 + (128 + 192) * 2 + head)
    # Tensor parallel 2 splits q, k, v, the attention output, the MLP's intermediates and the vocabulary.
    assert activation_bytes_per_gpu(SMALL, micro_batch=2, layout=Layout(tp=2)) == \
        tokens * (4 * (256 + 704 / 2) * 2 + 2 * 64 * 2 + 50 * 4)
    # Ulysses over 2 GPUs: each holds half the sequence.
    assert activation_bytes_per_gpu(SMALL, micro_batch=2, layout=one, sequence_parallel=2) == 8 * (4 * layer + head)
    # Without a fused attention kernel, the softmax output: a·s = 4·8 elements a token a layer.
    assert activation_bytes_per_gpu(SMALL, micro_batch=2, layout=one, flash=False) == \
        tokens * (4 * (960 + 32) * 2 + head)
    # 1F1B over 2 stages with 4 micro-batches: the first stage keeps its 2 layers for 2 micro-batches in flight.
    assert activation_bytes_per_gpu(SMALL, micro_batch=2, layout=Layout(pp=2, micro_batches=4)) == \
        tokens * (2 * 2 * layer)
