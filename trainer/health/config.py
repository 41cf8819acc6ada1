"""The health checks' settings: a run.json's `guard` (the loss-spike guard), `watchdog`, `sdc` (silent data
corruption), `straggler` and `health` (per-layer figures, the gradient probe) sections."""

from __future__ import annotations

from trainer.base_config import RunConfigSection


class GuardConfig(RunConfigSection):
    """Spike guard: skip outlier steps, stop for a rollback after repeated strikes."""

    enabled: bool = True
    warmup_steps: int = 10  # applied steps before outliers are judged (running averages settle)
    ema_beta: float = 0.9  # running averages of loss and grad norm over applied steps
    loss_ratio: float = 1.5  # outlier: loss > loss_ratio × running loss
    grad_norm_ratio: float = 5.0  # outlier: pre-clip grad norm > ratio × running grad norm
    max_strikes: int = 3  # this many skipped steps within strike_window steps -> rollback request
    strike_window: int = 50
    max_skipped: int = 20  # more skipped steps than this in a run -> stop loudly

    def _check(self) -> None:
        if not 0 <= self.ema_beta < 1:
            raise ValueError(f"guard.ema_beta must be in [0, 1), got {self.ema_beta}")
        for name in ("loss_ratio", "grad_norm_ratio"):
            if getattr(self, name) <= 1:
                raise ValueError(f"guard.{name} must be > 1, got {getattr(self, name)}")
        for name in ("max_strikes", "strike_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"guard.{name} must be >= 1, got {getattr(self, name)}")


class WatchdogConfig(RunConfigSection):
    """Hangs: a step that does not finish in time ends the job naming the rank and step (trainer.health.watchdog)."""

    enabled: bool = True
    step_factor: float = 20.0  # timeout = step_factor × the median of the recent step times ...
    min_timeout_s: float = 180.0  # ... but never less than this (noise, a slow checkpoint's aftermath)
    first_steps_timeout_s: float = 1800.0  # the first steps (compilation, warm caches, a resume's load)
    first_steps: int = 3
    collective_timeout_s: float = 1800.0  # the NCCL / gloo timeout of every collective: the backstop

    def _check(self) -> None:
        if self.step_factor <= 1:
            raise ValueError(f"watchdog.step_factor must be > 1, got {self.step_factor}")
        for name in ("min_timeout_s", "first_steps_timeout_s", "collective_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"watchdog.{name} must be > 0, got {getattr(self, name)}")


class SDCConfig(RunConfigSection):
    """Silent data corruption (trainer.health.rank_checks): every step each rank's own loss and gradient norm
    (before the all-reduce) against the others'; every canary_interval steps a fixed held-out batch."""

    enabled: bool = True
    grad_norm_ratio: float = 8.0  # outlier: a rank's grad norm off the others' (and recent) median by this factor
    loss_ratio: float = 2.0  # outlier: a rank's loss off by this factor
    history: int = 20  # steps of every rank's figures kept as the reference (a 2-rank job needs it)
    warmup_steps: int = 3  # with 2 ranks and less history than this, a disagreement names no one
    max_offences: int = 3  # this many outlier steps from one rank stop the job naming it (exit 5)
    canary_interval: int = 100  # steps between canary checks (0 = off); needs held-out data
    canary_tolerance: float = 0.25  # alarm: canary loss > (1 + tolerance) × the median of its recent values
    canary_history: int = 5

    def _check(self) -> None:
        for name in ("grad_norm_ratio", "loss_ratio"):
            if getattr(self, name) <= 1:
                raise ValueError(f"sdc.{name} must be > 1, got {getattr(self, name)}")
        for name in ("history", "max_offences", "canary_history"):
            if getattr(self, name) < 1:
                raise ValueError(f"sdc.{name} must be >= 1, got {getattr(self, name)}")
        if self.canary_interval < 0 or self.canary_tolerance <= 0:
            raise ValueError("sdc.canary_interval must be >= 0 and sdc.canary_tolerance > 0")


class StragglerConfig(RunConfigSection):
    """Per-rank step time (its own work, outside the collectives the loop can see) against the other ranks."""

    enabled: bool = True
    factor: float = 1.5  # slow: its time > factor × the median of the other ranks' ...
    min_excess_s: float = 0.02  # ... and more than this many seconds above it (tiny steps are all noise)
    window: int = 10  # reported when slow in `steps` of the last `window` steps
    steps: int = 5
    # Also drain it: checkpoint, stop (exit 6) and let the launcher restart without its node, when the
    # launcher can (Slurm with more than one node: it sets PRETRAIN_LAUNCHER_CAN_DRAIN); else only report.
    drain: bool = False

    def _check(self) -> None:
        if self.factor <= 1:
            raise ValueError(f"straggler.factor must be > 1, got {self.factor}")
        if not 1 <= self.steps <= self.window:
            raise ValueError(f"straggler.steps must be in [1, straggler.window], got {self.steps}")


class HealthConfig(RunConfigSection):
    """Per-layer weight and activation RMS and gradient norms every `interval` steps (trainer.health.layers)."""

    interval: int = 100  # 0 = off
    growth: float = 3.0  # flagged: a figure above growth × the median of its recent values
    history: int = 5

    def _check(self) -> None:
        if self.interval < 0:
            raise ValueError(f"health.interval must be >= 0, got {self.interval}")
        if self.growth <= 1:
            raise ValueError(f"health.growth must be > 1, got {self.growth}")
        if self.history < 1:
            raise ValueError(f"health.history must be >= 1, got {self.history}")
