"""The TrainModule: the model, its gradient probe, the DeepSpeed engine and the optimizer, and what is done
with them (forward, backward, the gated update, DeepSpeed's checkpoint files). The loop (trainer.train)
owns neither weights nor optimizer state; a rollback builds a fresh TrainModule.

    module = TrainModule(cfg, dist, on_model=lambda model: ...)   # seeded model; on_model before any hook
    module.build_engine(load_universal=False)
    loss = module.forward(batch, last=True); module.backward(loss)   # one micro-batch
    module.update(gate)                                          # DeepSpeed's step; `gate()` says apply or not
    shards, zipfile = module.snapshot(folder, tag)               # this rank's DeepSpeed files, in memory
    module.load(folder, tag, universal=False)
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as torch_dist

from trainer.checkpoint.async_save import SnapshotEngine
from trainer.checkpoint.store import CorruptCheckpoint
from trainer.config import RunConfig
from trainer.parallel.engine import Dist, build_engine
from trainer.health.layers import GradientProbe
from trainer.model.transformer import CausalLM
from trainer.parallel.sequence import data_parallel, sequence_groups


def to_device(batch: dict, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(inputs, targets, doc_ids, positions) of a source's batch (numpy arrays or tensors)."""
    t = {k: torch.as_tensor(batch[k]).to(device, non_blocking=True) for k in ("tokens", "doc_ids", "positions")}
    # Inputs are the first T tokens, targets the last T; mask and positions follow the inputs.
    return t["tokens"][:, :-1], t["tokens"][:, 1:], t["doc_ids"][:, :-1], t["positions"][:, :-1]


def gather_floats(figures: list[torch.Tensor], dist: Dist) -> list[list[float]]:
    """Every rank's figures, by rank, as floats (one collective and one device sync)."""
    mine = torch.stack([f.detach().to(torch.float64).reshape(()) for f in figures])
    if dist.world_size == 1:
        return [mine.tolist()]
    everyone = [torch.empty_like(mine) for _ in range(dist.world_size)]
    torch_dist.all_gather(everyone, mine)
    return [t.tolist() for t in everyone]


class TrainModule:
    def __init__(self, cfg: RunConfig, dist: Dist, *, on_model: Callable[[torch.nn.Module], None] = lambda m: None):
        self.cfg, self.dist = cfg, dist
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        self.model = CausalLM(cfg.model).to(dist.device)
        if cfg.model.compile if cfg.model.compile is not None else dist.device.type == "cuda":
            self.model.transformer.compile_blocks()
        # Callbacks' hooks on the new model go first (a test's gradient corruption must be seen by the probe).
        on_model(self.model)
        # This rank's own gradients (SDC check, per-layer health) are read by hooks on the model's parameters.
        self.probe = GradientProbe(self.model)
        self.engine = self.optimizer = self.grad_norm = None
        self.batch_size = cfg.batch.global_batch  # what the DeepSpeed engine is configured for
        # Sequence parallelism: this rank's group, and the data-parallel coordinates that choose its samples.
        self.sp = sequence_groups(dist.world_size, dist.rank, cfg.batch.sequence_parallel)
        # A tensor-parallel group's ranks (consecutive, as a sequence group's) read the same samples too.
        self.dp_rank, self.dp_size = data_parallel(dist.rank, dist.world_size,
                                                   cfg.batch.sequence_parallel * cfg.parallel.tensor)
        # Pipeline parallelism (trainer.parallel.pipeline): DeepSpeed's grid puts rank = stage × dp_size + dp_rank, so the
        # stages of one pipeline read the same samples.
        self.pipeline = cfg.parallel.pipeline > 1
        if self.pipeline:
            self.dp_size = dist.world_size // cfg.parallel.pipeline
            self.dp_rank = dist.rank % self.dp_size

    def build_engine(self, *, load_universal: bool = False) -> None:
        """The engine must know before it is built whether it loads shards of another world size."""
        model = self.model
        if self.pipeline:
            from trainer.parallel.pipeline import pipeline_module

            model = pipeline_module(self.model, stages=self.cfg.parallel.pipeline)
        self.engine, self.optimizer, self.grad_norm = build_engine(model, self.cfg, self.dist,
                                                                   load_universal=load_universal)
        self.batch_size = self.cfg.batch.global_batch

    def set_batch_size(self, batch: int) -> None:
        if batch != self.batch_size:
            # Changes only the gradient-accumulation steps (DeepSpeed counts a sequence per rank of a sequence- or
            # tensor-parallel group).
            self.engine.set_train_batch_size(batch * self.cfg.batch.sequence_parallel * self.cfg.parallel.tensor)
            self.batch_size = batch

    def forward(self, batch: dict, *, last: bool) -> torch.Tensor:
        """One micro-batch's training loss. `last`: the step's accumulation boundary comes with its backward."""
        inputs, targets, doc_ids, positions = to_device(batch, self.dist.device)
        # DeepSpeed counts micro-steps over the whole run, so after a ramp changes the accumulation
        # its own boundary would fall mid-step: say where the boundary is.
        self.engine.set_gradient_accumulation_boundary(last)
        if self.sp is not None:  # this rank's T/k positions of each sequence; its loss is their mean
            inputs, targets, doc_ids, positions = (self.sp.local(t) for t in (inputs, targets, doc_ids, positions))
            loss, _ = self.engine(inputs, targets, doc_ids, positions, sp=self.sp)
            return loss
        loss, _ = self.engine(inputs, targets, doc_ids, positions)
        return loss

    def train_pipeline(self, batches: list[dict], gate: Callable[[], bool]) -> None:
        """One optimizer step of a pipeline: DeepSpeed's 1F1B schedule over the step's micro-batches (forward,
        backward, gradient reduction, then the step, whose client optimizer asks `gate()`). Every stage passes the
        same micro-batches: the first stage reads the inputs, the last the targets."""
        micro = []
        for batch in batches:
            inputs, targets, doc_ids, positions = to_device(batch, self.dist.device)
            micro.append(((inputs, doc_ids, positions), targets))
        self.optimizer.gate = gate
        self.engine.train_batch(iter(micro))

    def pipeline_loss_sum(self) -> torch.Tensor:
        """This rank's summed training loss over the micro-batches of the pipeline step in progress (0 but on the
        last stage, which computes the losses)."""
        total = self.engine.total_loss if self.engine.is_last_stage() else None
        return total.detach().float() if total is not None else torch.zeros((), device=self.dist.device)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def update(self, gate: Callable[[], bool]) -> None:
        """DeepSpeed's boundary step; the client optimizer asks `gate()` whether to apply it."""
        self.optimizer.gate = gate
        self.engine.step()

    @torch.no_grad()
    def loss(self, batch: dict) -> torch.Tensor:
        """The cross-entropy of a batch in eval mode (evaluation, the canary)."""
        if self.pipeline:
            # The last stage's cross-entropy, broadcast to every stage. With several data-parallel replicas DeepSpeed
            # also averages it over them; their micro-batches are equal in size, so the sum over ranks that
            # Trainer.evaluate takes is unchanged.
            inputs, targets, doc_ids, positions = to_device(batch, self.dist.device)
            loss = self.engine.eval_batch(iter([((inputs, doc_ids, positions), targets)]), num_micro_batches=1)
            return loss.reshape(())  # DeepSpeed's broadcast gives it shape (1,)
        self.engine.eval()
        try:
            _, ce = self.engine(*to_device(batch, self.dist.device))
        finally:
            self.engine.train()
        return ce

    # -- DeepSpeed's checkpoint files (trainer.checkpoint.checkpointer lays out the step folder) -----------------

    def snapshot(self, folder, tag: str) -> tuple[list, bool]:
        """This rank's DeepSpeed files for <folder>/<tag>, copied in memory (trainer.checkpoint.async_save), not written."""
        self.engine.checkpoint_engine = snapshots = SnapshotEngine.replacing(self.engine.checkpoint_engine)
        snapshots.take()  # nothing left over from a save that raised half-way
        self.engine.save_checkpoint(str(folder), tag=tag, save_latest=False)
        return snapshots.take(), snapshots.zipfile_serialization

    def load(self, folder, tag: str, *, universal: bool = False) -> None:
        """Load <folder>/<tag> into the freshly built engine (universal: converted from another world size)."""
        if not universal:
            path, _ = self.engine.load_checkpoint(str(folder), tag=tag, load_lr_scheduler_states=False)
            if path is None:
                raise CorruptCheckpoint(f"DeepSpeed found no checkpoint in {folder / tag}")
            return
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        self.engine.load_checkpoint(str(folder), tag=tag, load_lr_scheduler_states=False)
        # DeepSpeed 0.19.8's ZeRO-3 universal load (stage3.load_hp_checkpoint_state_from_checkpoint_dir_stage3)
        # gives every param group group 0's hyperparameters (weight decay on the norm gains) and one
        # shared `step` tensor to all groups (so Adam's step advances once per group): undo both.
        for group, saved in zip(self.optimizer.param_groups, hyper):
            group.update(saved)
        for state in self.optimizer.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].clone()
