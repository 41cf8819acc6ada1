"""AdamW with decoupled weight decay on matrices only, the LR schedules and the batch-size ramp.

All schedules are functions of tokens, not steps: a batch-size ramp changes how many steps a token
budget takes, never which LR or batch size a given token sees.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from trainer.config import BatchConfig, OptimConfig, ScheduleConfig
from trainer.model.transformer import Transformer


def param_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    """Two groups: decayed matrices, and undecayed norm gains / biases (and embeddings unless asked).

    Under μP (a Transformer with model.parametrization "mup" in `model`) the hidden matrices come first, a group per
    fan-in ratio r to the base model (Transformer.fan_in_ratios: "hidden" for r = m, "hidden_mlp_out" for mlp.w2
    where the MLP width grows by another ratio): its `lr_scale` 1/r is μP's Adam LR for hidden weights (TP5 Table 8;
    the embedding, head and norm gains keep the base width's LR), and set_lr multiplies the schedule's LR by it at
    every step. Its weight decay is × r, so AdamW's decoupled decay per step (LR × weight_decay) is the base width's,
    as the mup package's MuAdamW does for torch's AdamW (decoupled_wd=False): the decay's timescale does not grow
    with width."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    mup = [t for t in model.modules() if isinstance(t, Transformer) and t.cfg.parametrization == "mup"]
    ratios = {k: v for t in mup for k, v in t.fan_in_ratios().items()}
    hidden: dict[float, list] = {}
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        is_matrix = p.ndim >= 2 and (cfg.decay_embeddings or id(p) not in embeddings)
        if id(p) in ratios:
            hidden.setdefault(ratios[id(p)], []).append(p)
        else:
            (decay if is_matrix else no_decay).append(p)
    m = mup[0].width_mult if mup else 1.0
    groups = [{"params": params, "lr": cfg.lr / r, "weight_decay": cfg.weight_decay * r, "lr_scale": 1.0 / r,
               "name": "hidden" if r == m else "hidden_mlp_out"} for r, params in hidden.items()]
    groups.append({"params": decay, "weight_decay": cfg.weight_decay, "name": "decay"})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "name": "no_decay"})
    return groups


class GatedAdamW(torch.optim.AdamW):
    """torch's AdamW that asks a gate before updating.

    DeepSpeed computes the pre-clip global grad norm inside its own step and then calls this
    optimizer (once per parameter group under ZeRO); the spike guard decides there whether the
    step is applied. A skipped step leaves weights and moments untouched (the fp32 master copy is
    unchanged, so DeepSpeed's copy back to the bf16 weights is a no-op).

    The gate starts closed: DeepSpeed's bf16 ZeRO-0 wrapper runs a zero-gradient step at construction
    to allocate the optimizer state, which would count as Adam's step 1 (bias correction) and apply one
    weight decay, so that run would differ from ZeRO 1-3 and from a bare loop. State is then created
    lazily at the first real step, as in plain PyTorch.
    """

    def __init__(self, params, *, gate: Callable[[], bool] = lambda: False, **kwargs):
        super().__init__(params, **kwargs)
        self.gate = gate

    @torch.no_grad()
    def step(self, closure=None):
        if not self.gate():
            return None
        return super().step(closure)


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> GatedAdamW:
    return GatedAdamW(param_groups(model, cfg), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


def lr_at(tokens: int, *, peak_lr: float, train_tokens: int, cfg: ScheduleConfig, start_tokens: int = 0) -> float:
    """LR for the step that ends at `tokens` tokens (so the first step's LR is not 0).

    Positions are on the run's cumulative token count: a stage that continues another run
    (RunConfig.continue_from) spans [start_tokens, train_tokens), a fresh one [0, train_tokens). Its warmup
    and decay are its own: the warmup counts from start_tokens, the WSD decay covers the last decay_fraction
    of the stage's span. So a WSD stable phase (decay_fraction 0) continued by an anneal (warmup 0,
    decay_fraction 1) is the same schedule as one run over both spans that decays from the branch point."""
    floor = peak_lr * cfg.min_lr_ratio
    own = tokens - start_tokens
    if cfg.warmup_tokens and own < cfg.warmup_tokens:
        return peak_lr * own / cfg.warmup_tokens
    if cfg.kind == "constant":
        return peak_lr
    if cfg.kind == "cosine":
        span = max(train_tokens - start_tokens - cfg.warmup_tokens, 1)
        progress = min(max(own - cfg.warmup_tokens, 0) / span, 1.0)
        return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    # wsd: stable at the peak, then linear decay to the floor over the last decay_fraction of the stage.
    decay_start = max(start_tokens + (train_tokens - start_tokens) * (1.0 - cfg.decay_fraction),
                      start_tokens + cfg.warmup_tokens)
    if tokens <= decay_start:
        return peak_lr
    progress = min((tokens - decay_start) / max(train_tokens - decay_start, 1), 1.0)
    return peak_lr + (floor - peak_lr) * progress


def batch_at(tokens_seen: int, cfg: BatchConfig) -> int:
    """Global batch (sequences) of the step that starts after `tokens_seen` tokens."""
    if cfg.ramp_start is None or tokens_seen >= cfg.ramp_tokens:
        return cfg.global_batch
    k = cfg.global_batch // cfg.ramp_start
    return cfg.ramp_start * min(k, 1 + int(tokens_seen / cfg.ramp_tokens * k))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's LR on every group, times the group's own `lr_scale` (μP's hidden group; 1 elsewhere)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"] if "lr_scale" in group else lr
