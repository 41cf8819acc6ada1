"""Tensor parallelism: DeepSpeed AutoTP training of our CausalLM (parallel.tensor = T ranks, one node's GPUs).

    config["tensor_parallel"] = tensor_parallel_config(T)      # trainer.parallel.engine puts it in DeepSpeed's config
    engine, *_ = deepspeed.initialize(model=model, ...)       # AutoTP shards the blocks' projections in place
    state = merged_weights(ds_folder)                         # CausalLM's whole weights from the T shard files

Megatron's split of a Llama block: the attention's q, k, v and the MLP's gate and up projections are split by output
(column-parallel: each rank computes T-th of the heads and of the hidden units), the attention's output and the
MLP's down projection by input (row-parallel: each rank's partial sum, all-reduced). One all-reduce per half-block
in forward, one in backward. The norms, the embedding and the head stay whole on every rank; the ranks of a group
read the same samples (DeepSpeed checks the first batch), so their losses are equal.

DeepSpeed's mesh is (data parallel, tensor parallel): rank = data-parallel rank × T + tensor-parallel rank, the
layout of a sequence-parallel group's ranks too (trainer.parallel.sequence.data_parallel gives both).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

# Our module names (trainer.model.transformer): Attention.wq/wk/wv/wo, SwiGLU.w1 (gate), w3 (up), w2 (down).
COLUMN = (r".*\.attn\.w[qkv]\.weight$", r".*\.mlp\.w[13]\.weight$")  # split by output: dim 0 of the weight
ROW = (r".*\.attn\.wo\.weight$", r".*\.mlp\.w2\.weight$")  # split by input: dim 1


def tensor_parallel_config(size: int) -> dict:
    """DeepSpeed's "tensor_parallel" section for AutoTP training over `size` ranks with our layer names (its
    heuristic parser knows Hugging Face's module names, not ours)."""
    return {"autotp_size": size, "partition_config": {"use_default_specs": False, "layer_specs": [
        {"patterns": list(COLUMN), "partition_type": "column"},
        {"patterns": list(ROW), "partition_type": "row"},
    ]}}


def is_sharded(param: torch.nn.Parameter) -> bool:
    """Whether AutoTP split this parameter over the tensor-parallel group (each rank holds a part)."""
    return bool(getattr(param, "tensor_model_parallel", False))


def split_dim(name: str) -> int | None:
    """The dimension along which AutoTP splits weight `name` (CausalLM's names), or None: whole on every rank."""
    if any(re.match(p, name) for p in COLUMN):
        return 0
    if any(re.match(p, name) for p in ROW):
        return 1
    return None


def merged_weights(ds_folder: str | Path) -> dict[str, torch.Tensor]:
    """CausalLM's whole state_dict from one step's DeepSpeed files of a tensor-parallel run: mp_rank_<t>_model_states.pt
    holds tensor-parallel rank t's shards (its module weights: fp32 runs, exact; bf16 runs, the bf16 weights the
    model computed with), concatenated in rank order along the dimension AutoTP split."""
    files = sorted(Path(ds_folder).glob("mp_rank_*_model_states.pt"))
    if not files:
        raise ValueError(f"{ds_folder}: no mp_rank_*_model_states.pt: not a tensor-parallel step's DeepSpeed files")
    shards = [torch.load(f, map_location="cpu", weights_only=False)["module"] for f in files]
    state = {}
    for name, first in shards[0].items():
        dim = split_dim(name)
        state[name] = first if dim is None else torch.cat([shard[name] for shard in shards], dim=dim)
    return state
