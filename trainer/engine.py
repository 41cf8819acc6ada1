"""DeepSpeed around the model: process group, ZeRO stage, bf16 with fp32 master weights, clipping.

    dist = init_distributed()                     # works alone, under torchrun and under `deepspeed`
    engine, optimizer = build_engine(model, cfg, dist)

The optimizer is torch's AdamW handed to DeepSpeed as a client optimizer (DeepSpeed's compiled CPU
Adam drifts after a resume, STACK.md). Gradient clipping is DeepSpeed's, from the config, except in
plain fp32 ZeRO-0 where DeepSpeed clips before the optimizer sees the pre-clip norm: there the gate
clips itself (`PreClipNorm`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as torch_dist

from trainer.config import RunConfig
from trainer.optim import GatedAdamW, build_optimizer


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    created: bool  # this process created the process group (and so destroys it)


def init_distributed(*, timeout_s: float | None = None) -> Dist:
    """Join (or, alone, create) the process group: nccl on CUDA, gloo on CPU. `timeout_s` bounds every
    collective (the backstop of the step watchdog, trainer.watchdog)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    created = False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not torch_dist.is_initialized():
        import deepspeed

        timeout = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
        if "WORLD_SIZE" not in os.environ:
            # Alone (no launcher): a one-rank group on an in-memory store, so the code path is the same
            # as under torchrun without a TCP port that another process could take first.
            # DeepSpeed asserts LOCAL_RANK; WORLD_SIZE stays unset so a child process also runs alone.
            os.environ.setdefault("LOCAL_RANK", "0")
            torch_dist.init_process_group(backend, store=torch_dist.HashStore(), rank=0, world_size=1, **timeout)
        deepspeed.init_distributed(dist_backend=backend, verbose=False, **timeout)
        created = True
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return Dist(rank=torch_dist.get_rank(), world_size=torch_dist.get_world_size(), local_rank=local_rank,
                device=device, created=created)


def deepspeed_config(cfg: RunConfig, world_size: int, *, load_universal: bool = False) -> dict:
    b = cfg.batch
    b.check_world(world_size)
    assert isinstance(cfg.deepspeed.bf16, bool), "resolve deepspeed.bf16 first (trainer.precision)"
    own_clip = _gate_clips(cfg)
    config = {
        "train_batch_size": b.global_batch,
        "train_micro_batch_size_per_gpu": b.micro_batch,
        "gradient_accumulation_steps": b.global_batch // (b.micro_batch * world_size),
        "gradient_clipping": 0.0 if own_clip else cfg.optim.grad_clip,
        "bf16": {"enabled": cfg.deepspeed.bf16},
        "zero_optimization": {"stage": cfg.deepspeed.zero_stage},
        "zero_allow_untested_optimizer": True,  # our client optimizer is torch's AdamW
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }
    if load_universal:
        # A checkpoint written by another number of ranks, converted by trainer.train_module.to_universal.
        config["checkpoint"] = {"load_universal": True}
    return config


def _gate_clips(cfg: RunConfig) -> bool:
    # fp32 ZeRO-0 is the one mode in which DeepSpeed uses the client optimizer unwrapped.
    return cfg.deepspeed.zero_stage == 0 and not cfg.deepspeed.bf16


class PreClipNorm:
    """The pre-clip global grad norm of the step being taken, wherever DeepSpeed keeps it."""

    def __init__(self, engine, optimizer: GatedAdamW, clip: float, self_clip: bool):
        self.engine, self.optimizer, self.clip, self.self_clip = engine, optimizer, clip, self_clip

    def __call__(self) -> float:
        if self.self_clip:
            # Gradients here are full and already averaged over ranks (ZeRO-0 all-reduces at the boundary).
            params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
            max_norm = self.clip if self.clip > 0 else float("inf")
            return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        # ZeRO 1-3 and the bf16 optimizer store it before calling the client optimizer.
        norm = self.engine.optimizer._global_grad_norm
        return float(norm)


def build_engine(model: torch.nn.Module, cfg: RunConfig, dist: Dist, *, load_universal: bool = False):
    import deepspeed

    optimizer = build_optimizer(model, cfg.optim)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           config=deepspeed_config(cfg, dist.world_size, load_universal=load_universal))
    norm = PreClipNorm(engine, optimizer, cfg.optim.grad_clip, _gate_clips(cfg))
    return engine, optimizer, norm
