"""Checks across ranks: silent data corruption, the canary batch, stragglers.

Every step each rank contributes its own figures, gathered before the step is applied (Trainer.step):
its loss, its gradient norm before the all-reduce (trainer.health.layers.GradientProbe) and its busy time.

    sdc = SDCCheck(cfg.sdc, hosts)
    outliers = sdc.judge(step, losses, grad_norms)      # [] or one record per rank whose figures are off
    sdc.commit(step, outliers)                          # raises SDCStop after repeated offences by one rank

A rank is an outlier when a figure is non-finite or off the median of the other ranks by more than the
configured factor. With two ranks "the others" is one rank, so the two figures disagreeing says only
that one of them is wrong: the one farther from the recent per-step median (history) is named.
A step with an outlier is not applied (the same decision on every rank: all see the same figures).

    canary = CanaryCheck(cfg.sdc)
    record = canary.observe(step, per_rank_losses)      # every rank computed the same batch with the same
                                                        # weights: they must agree, and stay near history
    stragglers = StragglerCheck(cfg.straggler, hosts)
    events = stragglers.observe(step, busy_seconds)     # newly slow / recovered ranks
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from trainer.health.config import SDCConfig, StragglerConfig
from trainer.exits import TrainerExit


class SDCStop(TrainerExit, RuntimeError):
    """One rank produced corrupt figures too often: the job stops, naming it (restarting cannot help)."""

    kind = "sdc"

    def __init__(self, message: str, *, rank: int, host: str):
        super().__init__(message, rank=rank, host=host)
        self.rank, self.host = rank, host


class DrainRequested(TrainerExit, RuntimeError):
    """A straggler's node should leave the job: the trainer checkpoints and stops for the launcher."""

    kind = "straggler"

    def __init__(self, message: str, *, rank: int, host: str):
        super().__init__(message, rank=rank, host=host)
        self.rank, self.host = rank, host


def _off_by(value: float, ref: float) -> float:
    """How many times apart two positive figures are (>= 1); inf when one is zero and the other not."""
    a, b = abs(value), abs(ref)
    if a == b:
        return 1.0
    if min(a, b) == 0:
        return math.inf
    return max(a / b, b / a)


class SDCCheck:
    def __init__(self, cfg: SDCConfig, hosts: list[str]):
        self.cfg, self.hosts = cfg, hosts
        self.world_size = len(hosts)
        self.history: deque[dict[str, float]] = deque(maxlen=cfg.history)  # per clean step: median per figure
        self.offences: dict[int, int] = {}

    def judge(self, step: int, figures: dict[str, list[float]]) -> list[dict]:
        """figures: {"loss": [per rank], "grad_norm": [per rank]} -> outlier records (empty: all agree)."""
        if not self.cfg.enabled or self.world_size < 2:
            return []
        ratios = {"loss": self.cfg.loss_ratio, "grad_norm": self.cfg.grad_norm_ratio}
        found: dict[int, dict] = {}
        for name, values in figures.items():
            for rank, reason, ref in self._outliers(name, values, ratios[name]):
                found.setdefault(rank, {"step": step, "rank": rank, "host": self.hosts[rank], "figures": []})
                found[rank]["figures"].append({"figure": name, "value": values[rank], "reference": ref,
                                               "reason": reason})
        return [found[r] for r in sorted(found)]

    def _outliers(self, name: str, values: list[float], factor: float):
        finite = [math.isfinite(v) for v in values]
        if not any(finite):
            return  # every rank at once: a real divergence, the spike guard's business
        for rank, ok in enumerate(finite):
            if not ok:
                yield rank, "non-finite", None
        good = [(r, v) for r, v in enumerate(values) if finite[r]]
        if len(good) >= 3:
            for rank, v in good:
                ref = statistics.median(o for r, o in good if r != rank)
                if _off_by(v, ref) > factor:
                    yield rank, f"{_off_by(v, ref):.3g}× off the other ranks' median", ref
        elif len(good) == 2:
            (r0, v0), (r1, v1) = good
            if _off_by(v0, v1) <= factor:
                return
            past = [h[name] for h in self.history if name in h]
            if len(past) < self.cfg.warmup_steps:
                # Nothing to tell which one is wrong yet: name both (the step is not applied either way).
                yield r0, f"disagrees with rank {r1} by {_off_by(v0, v1):.3g}× (no history yet)", v1
                yield r1, f"disagrees with rank {r0} by {_off_by(v0, v1):.3g}× (no history yet)", v0
                return
            ref = statistics.median(past)
            rank, v = max(good, key=lambda rv: _off_by(rv[1], ref))
            yield rank, f"{_off_by(v, ref):.3g}× off the recent median ({ref:.4g}); the other rank agrees with it", ref

    def commit(self, step: int, figures: dict[str, list[float]], outliers: list[dict]) -> None:
        if not outliers:
            self.history.append({name: statistics.median(v for v in values if math.isfinite(v))
                                 for name, values in figures.items() if any(math.isfinite(v) for v in values)})
            return
        for o in outliers:
            rank = o["rank"]
            self.offences[rank] = self.offences.get(rank, 0) + 1
            if self.offences[rank] >= self.cfg.max_offences:
                raise SDCStop(
                    f"silent data corruption: rank {rank} (host {self.hosts[rank]}) gave outlier figures in "
                    f"{self.offences[rank]} steps (sdc.max_offences = {self.cfg.max_offences}), last at step {step}: "
                    f"{describe(o)}. Take host {self.hosts[rank]} out of the job and restart it.",
                    rank=rank, host=self.hosts[rank])

    def state_dict(self) -> dict:
        return {"history": list(self.history), "offences": {str(k): v for k, v in self.offences.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.history = deque(state.get("history", []), maxlen=self.cfg.history)
        self.offences = {int(k): v for k, v in state.get("offences", {}).items()}


def describe(outlier: dict) -> str:
    return "; ".join(f"{f['figure']} {f['value']:.4g} ({f['reason']})" for f in outlier["figures"])


class CanaryCheck:
    """A fixed held-out batch, computed by every rank with the same weights every canary_interval steps."""

    AGREE = 1e-3  # relative: ranks computing the same thing may differ only by kernel nondeterminism

    def __init__(self, cfg: SDCConfig):
        self.cfg = cfg
        self.history: deque[float] = deque(maxlen=cfg.canary_history)

    def due(self, step: int) -> bool:
        return bool(self.cfg.enabled and self.cfg.canary_interval and step % self.cfg.canary_interval == 0)

    def observe(self, step: int, losses: list[float], hosts: list[str]) -> dict:
        finite = [v for v in losses if math.isfinite(v)]
        median = statistics.median(finite) if finite else math.nan
        disagree = [r for r, v in enumerate(losses)
                    if not math.isfinite(v) or abs(v - median) > self.AGREE * max(abs(median), 1e-6)]
        alarm = None
        if disagree:
            alarm = (f"canary: rank(s) {disagree} (host(s) {[hosts[r] for r in disagree]}) computed another loss on "
                     f"the same batch and weights ({[losses[r] for r in disagree]} vs {median:.6g})")
        elif not math.isfinite(median):
            alarm = "canary: non-finite loss"
        elif self.history and median > (1 + self.cfg.canary_tolerance) * statistics.median(self.history):
            alarm = (f"canary: loss {median:.4g} > (1 + sdc.canary_tolerance {self.cfg.canary_tolerance:g}) × its "
                     f"recent median {statistics.median(self.history):.4g}")
        if alarm is None:
            self.history.append(median)
        return {"event": "canary", "step": step, "loss": median, "per_rank": losses, "ranks": disagree,
                "alarm": alarm}

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.history = deque(state.get("history", []), maxlen=self.cfg.canary_history)


class StragglerCheck:
    def __init__(self, cfg: StragglerConfig, hosts: list[str]):
        self.cfg, self.hosts = cfg, hosts
        self.slow: list[deque[bool]] = [deque(maxlen=cfg.window) for _ in hosts]
        self.reported: set[int] = set()

    def observe(self, step: int, busy: list[float]) -> list[dict]:
        """Per-rank busy seconds of this step -> events for ranks that became (or stopped being) stragglers."""
        if not self.cfg.enabled or len(busy) < 2:
            return []
        events = []
        for rank, t in enumerate(busy):
            ref = statistics.median(b for r, b in enumerate(busy) if r != rank)
            self.slow[rank].append(t > self.cfg.factor * ref and t - ref > self.cfg.min_excess_s)
            slow_steps = sum(self.slow[rank])
            record = {"step": step, "rank": rank, "host": self.hosts[rank], "busy_s": round(t, 4),
                      "others_median_s": round(ref, 4), "slow_steps": slow_steps, "window": len(self.slow[rank])}
            if rank not in self.reported and slow_steps >= self.cfg.steps:
                self.reported.add(rank)
                events.append({"event": "straggler", **record,
                               "message": f"rank {rank} (host {self.hosts[rank]}) is a straggler: slower than the "
                                          f"other ranks' median by more than {self.cfg.factor:g}× in {slow_steps} of "
                                          f"the last {len(self.slow[rank])} steps ({t:.3f} s vs {ref:.3f} s)"})
            elif rank in self.reported and slow_steps == 0:
                self.reported.discard(rank)
                events.append({"event": "straggler_recovered", **record})
        return events
