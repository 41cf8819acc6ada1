"""Sequence parallelism for long contexts: DeepSpeed Ulysses over a group of k ranks that share one batch.

    sp = SequenceParallel.over(group)                      # k = the group's size; None when k = 1
    loss, _ = model(sp.local(inputs), sp.local(targets), doc_ids=sp.local(doc_ids), positions=sp.local(positions),
                    sp=sp)                                 # each rank: its T/k positions of every sequence

Each rank of the group holds T/k consecutive positions of the same sequences. Everything but attention is
per position, so it runs on the local slice as it is; RoPE takes each position's own index (restarting at each
document, as without the split). Attention is DeepSpeed's DistributedAttention: an all-to-all trades the split of
the sequence for a split of the heads (q, k, v: (B, T/k, H, d) -> (B, T, H/k, d), the query heads following their
KV group under GQA), attention runs over the whole sequence on H/k heads with the whole batch's document mask
(every rank gathers the document ids of the full sequence, a few bytes a position), and a second all-to-all
turns the output back. So the result equals the unsplit model's, to fp32 rounding.

The loss of a rank is the mean over its own positions; every rank has as many, so the mean of the group's losses
is the sequence's, and DeepSpeed's gradient averaging over all ranks (data-parallel and sequence-parallel alike)
gives the gradient of that mean: the group counts as k data-parallel ranks that saw the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class SequenceParallel:
    group: object  # the torch.distributed ProcessGroup of the k ranks that split each sequence
    size: int
    rank: int  # this rank's place in the group: it holds positions [rank · T/k, (rank + 1) · T/k)

    @classmethod
    def over(cls, group) -> "SequenceParallel | None":
        size = dist.get_world_size(group)
        return cls(group=group, size=size, rank=dist.get_rank(group)) if size > 1 else None

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the sequence dimension (dim 1) of a (B, T, ...) tensor."""
        if x.shape[1] % self.size:
            raise ValueError(f"sequence parallel: sequence length {x.shape[1]} is not divisible by {self.size}")
        n = x.shape[1] // self.size
        return x[:, self.rank * n:(self.rank + 1) * n]

    def offset(self, local_len: int) -> int:
        return self.rank * local_len

    def full(self, x: torch.Tensor) -> torch.Tensor:
        """The whole sequence of a (B, T/k) tensor that needs no gradient (document ids), from every rank."""
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=1)

    def attention(self, local_attention):
        """DeepSpeed's Ulysses attention around `local_attention(q, k, v, mask)` (tensors (B, T, h, d), batch first)."""
        from deepspeed.sequence.layer import DistributedAttention

        return DistributedAttention(local_attention, self.group, scatter_idx=2, gather_idx=1)


def sequence_groups(world_size: int, rank: int, size: int) -> SequenceParallel | None:
    """This rank's group when every `size` consecutive ranks split each sequence (None for size 1). Consecutive:
    a launcher places them on one node, where the all-to-all of every layer is cheapest. Every rank creates every
    group, as torch.distributed requires."""
    if size == 1:
        return None
    if world_size % size:
        raise ValueError(f"batch.sequence_parallel ({size}) must divide the world size ({world_size})")
    mine = None
    for first in range(0, world_size, size):
        ranks = list(range(first, first + size))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = SequenceParallel(group=group, size=size, rank=rank - first)
    return mine


def data_parallel(rank: int, world_size: int, size: int) -> tuple[int, int]:
    """(data-parallel rank, data-parallel size): the `size` consecutive ranks of a sequence (or tensor-parallel)
    group read the same samples."""
    return rank // size, world_size // size
