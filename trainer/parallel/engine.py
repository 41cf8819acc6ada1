"""DeepSpeed around the model: process group, ZeRO stage, bf16 with fp32 master weights and fp32
gradient reduction and accumulation, clipping.

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
from pathlib import Path

import torch
import torch.distributed as torch_dist

from trainer.config import RunConfig
from trainer.optim import GatedAdamW, build_optimizer
from trainer.parallel.tensor import is_sharded, tensor_parallel_config


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    created: bool  # this process created the process group (and so destroys it)


def init_distributed(*, timeout_s: float | None = None) -> Dist:
    """Join (or, alone, create) the process group: nccl on CUDA, gloo on CPU. `timeout_s` bounds every
    collective (the backstop of the step watchdog, trainer.health.watchdog)."""
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
    b, P, T = cfg.batch, cfg.parallel.pipeline, cfg.parallel.tensor
    b.check_world(world_size, P, T)
    assert isinstance(cfg.deepspeed.bf16, bool), "resolve deepspeed.bf16 first (trainer.parallel.precision)"
    own_clip = _gate_clips(cfg)
    # DeepSpeed counts every rank as data-parallel, the ranks of a sequence-parallel or tensor-parallel group too
    # (they reduce their gradients like any others): its batch counts each sequence once per rank of a group.
    copies = b.sequence_parallel * T
    config = {
        "train_batch_size": b.global_batch * copies,
        "train_micro_batch_size_per_gpu": b.micro_batch,
        # The stages of a pipeline share their micro-batches: its m micro-batches are the accumulation steps.
        "gradient_accumulation_steps": b.global_batch * copies * P // (b.micro_batch * world_size),
        "gradient_clipping": 0.0 if own_clip else cfg.optim.grad_clip,
        "bf16": {"enabled": cfg.deepspeed.bf16},
        "zero_optimization": {"stage": cfg.deepspeed.zero_stage},
        **_fp32_gradients(cfg),
        **({"tensor_parallel": tensor_parallel_config(T)} if T > 1 else {}),
        "zero_allow_untested_optimizer": True,  # our client optimizer is torch's AdamW
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }
    if load_universal:
        # A checkpoint written by another number of ranks, converted by trainer.checkpoint.universal.to_universal.
        config["checkpoint"] = {"load_universal": True}
    return config


def _fp32_gradients(cfg: RunConfig) -> dict:
    """Under bf16, gradients are reduced across ranks and accumulated over micro-batches in fp32 (the
    method's rule; DeepSpeed's default does both in bf16, whose 8-bit mantissa loses small gradients in
    a sum). ZeRO-1 then runs DeepSpeed's BF16_Optimizer, ZeRO-2/3 keep fp32 gradient partitions. ZeRO-0
    gets the fp32 reduction only: DeepSpeed 0.19.8 has no fp32 accumulation there (its optimizer check
    raises NotImplementedError for bf16 weights with fp32 accumulation without ZeRO)."""
    if not cfg.deepspeed.bf16:
        return {}  # fp32 throughout already
    if cfg.deepspeed.zero_stage == 0:
        return {"communication_data_type": "fp32"}
    return {"communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"}}


def _gate_clips(cfg: RunConfig) -> bool:
    # fp32 ZeRO-0 is the one mode in which DeepSpeed uses the client optimizer unwrapped.
    return cfg.deepspeed.zero_stage == 0 and not cfg.deepspeed.bf16


class PreClipNorm:
    """The pre-clip global grad norm of the step being taken, wherever DeepSpeed keeps it."""

    def __init__(self, engine, optimizer: GatedAdamW, clip: float, self_clip: bool, split=None, sharded=None):
        self.engine, self.optimizer, self.clip, self.self_clip = engine, optimizer, clip, self_clip
        # A split model's process group (a pipeline's stages, a tensor-parallel group), whose ranks each hold a part
        # of the gradients: `sharded(p)` says whether p is such a part (else every rank of the group has all of it).
        self.split, self.sharded = split, sharded

    def __call__(self) -> float:
        if self.split is not None and self.self_clip:
            return self._clip_over_split()
        if self.self_clip:
            # Gradients here are full and already averaged over ranks (ZeRO-0 all-reduces at the boundary).
            params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
            max_norm = self.clip if self.clip > 0 else float("inf")
            return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        # ZeRO 1-3 and the bf16 optimizer store it before calling the client optimizer (counting each tensor-parallel
        # shard once: DeepSpeed knows AutoTP's parameters).
        norm = self.engine.optimizer._global_grad_norm
        return float(norm)

    def _clip_over_split(self) -> float:
        """The global norm of a split model's gradients (the parts' sums of squares summed over the group, what every
        rank holds whole counted once) and the clip by it. DeepSpeed 0.19.8's own clip (runtime.utils.clip_grad_norm_
        with the pipeline's grid) counts only the gradients of the stage whose model-parallel rank is 0, so it would
        clip a pipeline by the first stage's norm."""
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        square = lambda ps: sum((p.grad.detach().float().pow(2).sum() for p in ps),
                                torch.zeros((), device=params[0].grad.device))
        parts = square([p for p in params if self.sharded(p)])
        torch_dist.all_reduce(parts, group=self.split)
        norm = (parts + square([p for p in params if not self.sharded(p)])).sqrt()
        if self.clip > 0:
            coef = torch.clamp(self.clip / (norm + 1e-6), max=1.0)  # torch's clip_grad_norm_ rule
            for p in params:
                p.grad.mul_(coef)
        return float(norm)


def _import_deepspeed_muon_uncompiled() -> None:
    """DeepSpeed's ZeRO sanity check (is_zero_supported_optimizer) imports its Muon optimizer, whose module decorates
    kernels with torch.compile at import: inductor's configuration is imported for that, 1.3-1.7 s of each rank's
    start-up on CPU (a tiny run's engine took 2.6-3.0 s, 1.3 s without). No run here uses Muon: its module is
    imported once with TorchDynamo off for that import alone, so those decorators are no-ops, and nothing compiled
    later (flex attention, compiled blocks) is affected."""
    import contextlib
    import importlib
    from unittest import mock

    # TORCHDYNAMO_DISABLE is read by torch._dynamo.optimize at each call; patch.dict puts the environment back after.
    with mock.patch.dict(os.environ, TORCHDYNAMO_DISABLE="1"), contextlib.suppress(ImportError):  # Muon is optional
        importlib.import_module("deepspeed.runtime.zero.muon.muon_optimizer")


def build_engine(model: torch.nn.Module, cfg: RunConfig, dist: Dist, *, load_universal: bool = False):
    import gc

    import deepspeed

    _import_deepspeed_muon_uncompiled()
    # torch's optimizer imports TorchDynamo at its first parameter group (torch._disable_dynamo), unless Muon did.
    optimizer = build_optimizer(model, cfg.optim)  # a pipeline stage: only its own layers' parameters
    # DeepSpeed's BF16_Optimizer calls gc.collect() six times while it builds (see_memory_usage(force=True)), each
    # walking every object torch, TorchDynamo and DeepSpeed created at import: 1.9 of a tiny run's 9 s on CPU. Frozen
    # (after the imports above, or TorchDynamo's 0.3 s of walks stay), those objects are skipped; they are long-lived
    # anyway, and come back under the collector afterwards.
    gc.freeze()
    try:
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer,
            config=deepspeed_config(cfg, dist.world_size, load_universal=load_universal))
    finally:
        gc.unfreeze()
    if dist.world_size == 1 and cfg.deepspeed.zero_stage < 2 and not hasattr(engine.optimizer, "reduce_gradients"):
        # Alone, DeepSpeed's gradient all-reduce at the accumulation boundary (ZeRO-0 and the bf16 optimizer's path)
        # flattens every gradient into a buffer, scales it by 1/1, reduces it over one rank and copies it back: the
        # same gradients, bit for bit, after 1 ms of a 100 ms step on 2 CPU cores. ZeRO-1's own optimizer
        # (reduce_gradients) moves the gradients into its partition there, and ZeRO-2/3 partition them: those keep it.
        engine.enable_backward_allreduce = False
    split = sharded = None
    if cfg.parallel.pipeline > 1:  # every parameter belongs to one stage
        split, sharded = engine.grid.get_pipe_parallel_group(), lambda p: True
    elif cfg.parallel.tensor > 1:  # AutoTP's shards; the norms, embedding and head are whole on every rank
        from deepspeed.utils import groups

        split, sharded = groups.get_tensor_model_parallel_group(), is_sharded
    norm = PreClipNorm(engine, optimizer, cfg.optim.grad_clip, _gate_clips(cfg), split=split, sharded=sharded)
    return engine, optimizer, norm


def zero_fp32_weights(ds_folder: Path) -> dict[str, torch.Tensor]:
    """Full fp32 weights from one step's ZeRO optimizer shards (every rank's *optim_states.pt).

    DeepSpeed's zero_to_fp32 reads ZeRO 1-3's own optimizers; ZeRO-1 under bf16 runs DeepSpeed's BF16_Optimizer
    instead (fp32 accumulation, _fp32_gradients), whose shards zero_to_fp32 refuses ("not a zero checkpoint": they
    record no ZeRO stage). Those hold each rank's slice of every parameter group's flat fp32 master weights and
    where each parameter lies in it; the module file gives the shapes, in the groups' order."""
    import contextlib
    import io

    shards = sorted(ds_folder.glob("*zero_pp_rank_*_optim_states.pt"),
                    key=lambda f: int(f.name.split("zero_pp_rank_")[1].split("_")[0]))
    first = torch.load(shards[0], map_location="cpu", mmap=True, weights_only=False)["optimizer_state_dict"]
    if "param_slice_mappings" not in first or "zero_stage" in first:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with contextlib.redirect_stdout(io.StringIO()):  # it prints a progress line per shard
            return get_fp32_state_dict_from_zero_checkpoint(str(ds_folder.parent), tag=ds_folder.name)
    [model_file] = sorted(ds_folder.glob("*model_states.pt"))
    module = torch.load(model_file, map_location="cpu", weights_only=False)
    ranks = [first] + [torch.load(f, map_location="cpu", mmap=True, weights_only=False)["optimizer_state_dict"]
                       for f in shards[1:]]
    state = {name: module["module"][name].float() for name in module.get("buffer_names", [])}
    for group, shapes in enumerate(module["param_shapes"]):
        for name, shape in shapes.items():
            pieces = [r["single_partition_of_fp32_groups"][group].narrow(0, m.start, m.numel)
                      for r in ranks if (m := r["param_slice_mappings"][group].get(name)) is not None]
            state[name] = torch.cat(pieces).view(shape).float().clone()
    return state
