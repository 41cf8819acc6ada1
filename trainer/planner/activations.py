"""Activation memory per GPU of the Llama block in training, for the planner: what autograd keeps between the
forward and the backward pass, with and without recomputation, under tensor and sequence parallelism.

    bytes = activation_bytes_per_gpu(shape, micro_batch=1, layout=Layout(tp=8), recompute="selective")

Pure arithmetic (no torch). The method is Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models"), redone for this model (trainer/model/transformer.py: RMSNorm, GQA with kv_dim = kv_heads · head_dim,
SwiGLU of width f, no dropout), in 16-bit elements per token of one layer:

    attention half   x, norm(x) (replicated under TP) + q, k, v, attention output (split by TP) = 2h + (2h + 2kv)
    MLP half         x', norm(x') (replicated) + gate, up, silu(gate), gate·up (split by TP)    = 2h + 4f
    scores           2·a·s bytes a token, only without a fused (flash) attention kernel (softmax output, a heads)

Recomputation keeps less and recomputes one layer at a time in the backward pass (its working set added once):
  full        only each layer's input (h), every layer recomputed;
  selective   the attention half is recomputed: a layer keeps its input and the MLP half (3h + 4f/t).
Sequence parallelism (DeepSpeed Ulysses, degree k) splits the sequence: every term of a layer is divided by k.
The head keeps the final norm's input and output (2h) and the loss's fp32 log-probabilities (4 bytes × vocab/t).
With pipeline parallelism (1F1B), the first stage holds its L/P layers for min(m, P) micro-batches in flight; the
head is on the last stage, which holds one. Estimates: allocator fragmentation and temporary buffers come on top.
"""

from __future__ import annotations

from typing import Literal

Recompute = Literal["none", "full", "selective"]
ELEMENT_BYTES = 2  # bf16 activations
LOGPROB_BYTES = 4  # the loss's log-softmax is kept in fp32


def layer_elements(shape, *, tp: int = 1, flash: bool = True) -> float:
    """16-bit elements one layer keeps per token, without recomputation (scores given as elements too)."""
    h, f = shape.d_model, shape.d_ff
    kv = shape.n_kv_heads * (h // shape.heads)
    replicated = 2 * h + 2 * h  # the two norms' inputs and outputs
    split = (2 * h + 2 * kv) + 4 * f  # q, k, v, attention output; the MLP's four intermediates
    scores = 0 if flash else shape.heads * shape.seq_len  # 2·a·s bytes = a·s elements
    return replicated + (split + scores) / tp


def activation_bytes_per_gpu(shape, *, micro_batch: int, layout, recompute: Recompute = "none",
                             sequence_parallel: int = 1, flash: bool = True) -> float:
    """Bytes of activations one GPU holds at the peak of a step (the first pipeline stage's, or the last's when the
    head makes it larger). `shape` is a planner.ModelShape; `layout` a planner.Layout (tp, pp, micro_batches)."""
    if recompute not in ("none", "full", "selective"):
        raise ValueError(f"recompute: must be none, full or selective, got {recompute!r}")
    if micro_batch < 1 or sequence_parallel < 1:
        raise ValueError(f"micro_batch and sequence_parallel must be >= 1, got {micro_batch} and {sequence_parallel}")
    if shape.seq_len % sequence_parallel:
        raise ValueError(f"sequence_parallel: seq_len {shape.seq_len} is not divisible by {sequence_parallel}")
    h, f, tp = shape.d_model, shape.d_ff, layout.tp
    tokens = micro_batch * shape.seq_len / sequence_parallel  # a micro-batch's tokens on this GPU
    full_layer = layer_elements(shape, tp=tp, flash=flash)
    if recompute == "none":
        kept, working = full_layer, 0.0
    elif recompute == "full":
        kept, working = h, full_layer
    else:
        kv = shape.n_kv_heads * (h // shape.heads)
        kept = 3 * h + 4 * f / tp
        working = 2 * h + (2 * h + 2 * kv + (0 if flash else shape.heads * shape.seq_len)) / tp
    layers = shape.layers / layout.pp
    in_flight = min(layout.micro_batches, layout.pp)
    first = (layers * in_flight * kept + working) * tokens * ELEMENT_BYTES
    head = (2 * h * ELEMENT_BYTES + shape.vocab / tp * LOGPROB_BYTES) * tokens
    if layout.pp == 1:
        return first + head
    last = (layers * kept + working) * tokens * ELEMENT_BYTES + head
    return max(first, last)
