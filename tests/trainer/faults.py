"""Faults on purpose, for the failure-detection tests: a trainer callback (trainer.callbacks) that only tests
install, with PRETRAIN_TEST_FAULT in the trainer's environment saying which faults.

    env = {**os.environ, **fault_env("hang:rank=1,step=6")}   # for a `python -m trainer` subprocess

    PRETRAIN_TEST_FAULT="hang:rank=1,step=6,seconds=600,once=/tmp/x"   # rank 1 sleeps inside step 6
    PRETRAIN_TEST_FAULT="slow:rank=1,seconds=0.3"                      # rank 1 slower every step
    PRETRAIN_TEST_FAULT="corrupt:rank=1,step=5,mode=scale"             # rank 1's gradients × 1000 (or
                                                                       # mode=bitflip: an exponent bit)
    PRETRAIN_TEST_FAULT="skip:step=5"                                  # the step is not applied (a reference)
    PRETRAIN_TEST_FAULT="blowup:layer=1,step=8,factor=10"              # block 1's weights × 10
    PRETRAIN_TEST_FAULT="save_delay:seconds=2"                         # every rank's checkpoint writer
                                                                       # sleeps between DeepSpeed's shards
                                                                       # and the rest (the kill-mid-save test)
    PRETRAIN_TEST_FAULT="slow:rank=1,seconds=0.3;corrupt:rank=0,step=4"   # several, ';'-separated

`once=PATH` makes a fault happen only in the first process that reaches it (it creates PATH), so a
restarted job runs clean. The trainer loads this file through PRETRAIN_TRAINER_CALLBACKS (CALLBACKS,
set for every test process by tests/trainer/conftest.py); without PRETRAIN_TEST_FAULT it does nothing.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch

from trainer.callbacks import Callback

FAULT_ENV = "PRETRAIN_TEST_FAULT"
KINDS = ("hang", "slow", "corrupt", "skip", "blowup", "save_delay")
CALLBACKS = f"{__file__}:Faults"  # PRETRAIN_TRAINER_CALLBACKS: a file path, so any working directory loads it


def fault_env(spec: str) -> dict[str, str]:
    """The environment of a trainer subprocess that injects `spec`."""
    return {"PRETRAIN_TRAINER_CALLBACKS": CALLBACKS, FAULT_ENV: spec}


@dataclass(frozen=True)
class Fault:
    kind: str
    args: dict[str, str] = field(default_factory=dict)

    def int(self, name: str, default: int | None = None) -> int | None:
        return int(self.args[name]) if name in self.args else default

    def float(self, name: str, default: float) -> float:
        return float(self.args.get(name, default))

    def hits(self, *, rank: int | None = None, step: int | None = None) -> bool:
        """Whether this fault applies to this rank at this step (and, with once=, has not happened yet)."""
        if rank is not None and self.int("rank", rank) != rank:
            return False
        if step is not None and self.int("step", step) != step:
            return False
        once = self.args.get("once")
        if once:
            try:
                fd = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # the first process to get here
            except FileExistsError:
                return False
            os.close(fd)
        return True


def parse(spec: str) -> list[Fault]:
    faults = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        kind, _, rest = part.partition(":")
        if kind not in KINDS:
            raise ValueError(f"{FAULT_ENV}: unknown fault {kind!r} (known: {', '.join(KINDS)})")
        args = dict(item.split("=", 1) for item in filter(None, rest.split(",")))
        faults.append(Fault(kind, args))
    return faults


class Faults(Callback):
    """The faults this process was asked for, as a trainer callback (the hook names: trainer.callbacks)."""

    name = "faults"

    def __init__(self, faults: list[Fault] | None = None):
        self.faults = parse(os.environ.get(FAULT_ENV, "")) if faults is None else faults
        self.step = 0
        for f in self._of("save_delay"):
            _delay_checkpoint_writes(f.float("seconds", 2.0))

    def _of(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]

    def model_built(self, trainer, model) -> None:
        if self._of("corrupt"):
            # Before the gradient probe's hooks: this rank's figures and the all-reduce both see the corruption.
            first = next(p for p in model.parameters() if p.requires_grad)
            first.register_hook(lambda g: self.corrupt_gradient(trainer.dist.rank, self.step, g))

    def pre_step(self, trainer, rec) -> None:
        """Before the step's first micro-batch: the slow rank, the hang, a layer blowing up."""
        self.step, rank = rec.step, trainer.dist.rank
        for f in self._of("slow"):
            if f.hits(rank=rank):
                time.sleep(f.float("seconds", 0.3))
        for f in self._of("hang"):
            if f.hits(rank=rank, step=rec.step):
                time.sleep(f.float("seconds", 3600.0))
        self.blow_up(rec.step, trainer.model.transformer.blocks)

    def pre_update(self, trainer, rec) -> str | None:
        if any(f.hits(step=rec.step) for f in self._of("skip")):
            return "skipped on purpose (PRETRAIN_TEST_FAULT)"
        return None

    def corrupt_gradient(self, rank: int, step: int, grad: torch.Tensor) -> torch.Tensor:
        """Called on one parameter's gradient of this rank's micro-batches before any reduction."""
        for f in self._of("corrupt"):
            if f.int("rank", rank) == rank and f.int("step", step) == step:
                if f.args.get("mode", "scale") == "bitflip":
                    grad = grad.clone()
                    flat = grad.view(-1)
                    i = int(flat.abs().argmax())  # a non-zero element: flipping a zero's exponent gives 2.0
                    if grad.dtype in (torch.bfloat16, torch.float16):
                        bits = flat[i:i + 1].view(torch.int16)
                        bits ^= 1 << 14  # the top exponent bit: |x| < 2 becomes x × 2^128 (bf16) or inf
                    else:
                        bits = flat[i:i + 1].view(torch.int32)
                        bits ^= 1 << 30
                    return grad
                return grad * f.float("factor", 1000.0)
        return grad

    @torch.no_grad()
    def blow_up(self, step: int, blocks: torch.nn.ModuleList) -> None:
        for f in self._of("blowup"):
            if f.hits(step=step):
                for p in blocks[f.int("layer", 0)].parameters():
                    p.mul_(f.float("factor", 10.0))


def _delay_checkpoint_writes(seconds: float) -> None:
    """Every rank's background writer sleeps after writing DeepSpeed's shards (the one write_files call with
    zipfile_serialization, trainer.checkpoint.checkpointer.Checkpointer.save) and before the RNG file, the trainer state
    and its done marker, so a kill lands while step-<N>.partial holds shards but cannot yet be committed."""
    import trainer.checkpoint.checkpointer as checkpoint

    write_files = checkpoint.write_files

    def slow(files, **kwargs):
        written = write_files(files, **kwargs)
        if "zipfile_serialization" in kwargs:
            time.sleep(seconds)
        return written

    checkpoint.write_files = slow
