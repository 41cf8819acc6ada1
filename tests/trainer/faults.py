"""Faults on purpose, for the failure-detection tests: PRETRAIN_TEST_FAULT in the trainer's environment.

    PRETRAIN_TEST_FAULT="hang:rank=1,step=6,seconds=600,once=/tmp/x"   # rank 1 sleeps inside step 6
    PRETRAIN_TEST_FAULT="slow:rank=1,seconds=0.3"                      # rank 1 slower every step
    PRETRAIN_TEST_FAULT="corrupt:rank=1,step=5,mode=scale"             # rank 1's gradients × 1000 (or
                                                                       # mode=bitflip: an exponent bit)
    PRETRAIN_TEST_FAULT="skip:step=5"                                  # the step is not applied (a reference)
    PRETRAIN_TEST_FAULT="blowup:layer=1,step=8,factor=10"              # block 1's weights × 10
    PRETRAIN_TEST_FAULT="slow:rank=1,seconds=0.3;corrupt:rank=0,step=4"   # several, ';'-separated

`once=PATH` makes a fault happen only in the first process that reaches it (it creates PATH), so a
restarted job runs clean. A production run never sets the variable; then every hook here is a no-op.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch

FAULT_ENV = "PRETRAIN_TEST_FAULT"
KINDS = ("hang", "slow", "corrupt", "skip", "blowup")


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


class Faults:
    """The faults this process was asked for; each hook is called by the trainer at its place."""

    def __init__(self, faults: list[Fault], rank: int):
        self.faults, self.rank = faults, rank

    @classmethod
    def from_env(cls, rank: int) -> Faults:
        return cls(parse(os.environ.get(FAULT_ENV, "")), rank)

    def _of(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]

    def in_step(self, step: int) -> None:
        """Inside a step, before its first micro-batch: the hang and the slow rank."""
        for f in self._of("slow"):
            if f.hits(rank=self.rank):
                time.sleep(f.float("seconds", 0.3))
        for f in self._of("hang"):
            if f.hits(rank=self.rank, step=step):
                time.sleep(f.float("seconds", 3600.0))

    def skip(self, step: int) -> bool:
        return any(f.hits(step=step) for f in self._of("skip"))

    def corrupt_gradient(self, step: int, grad: torch.Tensor) -> torch.Tensor:
        """Called on one parameter's gradient of this rank's micro-batches before any reduction."""
        for f in self._of("corrupt"):
            if f.int("rank", self.rank) == self.rank and f.int("step", step) == step:
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

    def wants_corruption(self) -> bool:
        return bool(self._of("corrupt"))

    @torch.no_grad()
    def blow_up(self, step: int, blocks: torch.nn.ModuleList) -> None:
        for f in self._of("blowup"):
            if f.hits(step=step):
                for p in blocks[f.int("layer", 0)].parameters():
                    p.mul_(f.float("factor", 10.0))
