"""The Trainer's callbacks: named objects it calls at fixed points of each step (OLMo-core's shape).

    model_built(trainer, model)   a new model (start, rollback), before the gradient probe and DeepSpeed wrap it
    pre_step(trainer, rec)        before the step's first micro-batch (the watchdog is armed first)
    pre_update(trainer, rec)      the step's figures gathered, before DeepSpeed's update: return a reason to
                                  refuse the update (every rank decides alike: all see the same figures)
    post_update(trainer, rec)     the update done or refused, the loop state advanced; still inside the step
    post_step(trainer, rec)       in the loop, after the step: logging, evaluation, checkpoints
    step_failed(trainer, rec)     the step raised (a rollback follows, or the run ends)
    post_checkpoint(trainer, step)
    close(trainer, ok)            the run ends; ok: it finished (or stopped on purpose)

The pre hooks (model_built, pre_step, pre_update, step_failed) run in the order of Trainer.callbacks, the
post hooks (post_update, post_step, post_checkpoint, close) in reverse: each callback brackets the ones
after it, as nested context managers do, so the watchdog, first, watches all of the step. A callback
with state_dict() / load_state_dict() is saved in every checkpoint's trainer.json under its name.
Everything a step knows is in its StepRecord, passed explicitly.

Callbacks beyond the built-in ones come from PRETRAIN_TRAINER_CALLBACKS (','-separated import paths,
"package.module:Class" or "path/to/file.py:Class", each built without arguments), placed right after the
watchdog: the failure tests install their fault injection that way (tests/trainer/faults.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.exits import DRAIN_ENV
from trainer.health.guard import SpikeGuard, Verdict
from trainer.health.layers import LayerHealth
from trainer.health.rank_checks import CanaryCheck, DrainRequested, SDCCheck, StragglerCheck, describe
from trainer.health.watchdog import StepWatchdog

if TYPE_CHECKING:
    from trainer.train import Trainer

CALLBACKS_ENV = "PRETRAIN_TRAINER_CALLBACKS"


@dataclass
class StepRecord:
    """One optimizer step as it happens."""

    step: int
    samples: tuple[int, int]  # global sample indices [a, b) of its batch
    batch: int
    lr: float
    loss: float = math.nan  # the global mean loss, once the last micro-batch's figures are gathered
    figures: dict[str, list[float]] = field(default_factory=dict)  # per rank: loss, grad_norm (before reduction)
    busy: list[float] = field(default_factory=list)  # per rank: seconds of its own work (stragglers)
    refused: str | None = None  # a pre_update callback's reason not to apply the update
    verdict: Verdict | None = None  # the spike guard's (or the refusal's), set inside DeepSpeed's step


class Callback:
    name = "callback"

    def model_built(self, trainer: Trainer, model) -> None: ...
    def pre_step(self, trainer: Trainer, rec: StepRecord) -> None: ...
    def pre_update(self, trainer: Trainer, rec: StepRecord) -> str | None: ...
    def post_update(self, trainer: Trainer, rec: StepRecord) -> None: ...
    def post_step(self, trainer: Trainer, rec: StepRecord) -> None: ...
    def step_failed(self, trainer: Trainer, rec: StepRecord | None) -> None: ...
    def post_checkpoint(self, trainer: Trainer, step: int) -> None: ...
    def close(self, trainer: Trainer, ok: bool) -> None: ...


def extra_callbacks() -> list[Callback]:
    """The callbacks named in PRETRAIN_TRAINER_CALLBACKS (none in a production run)."""
    found = []
    for spec in filter(None, (s.strip() for s in os.environ.get(CALLBACKS_ENV, "").split(","))):
        where, _, name = spec.rpartition(":")
        if where.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location(f"_callbacks_{Path(where).stem}", where)
            module = sys.modules[module_spec.name] = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        found.append(getattr(module, name)())
    return found


class WatchdogCallback(Callback):
    """Watches each step from pre_step to post_update (trainer.health.watchdog); first in the list, so it brackets the rest."""

    name = "watchdog"

    def __init__(self, dog: StepWatchdog):
        self.dog = dog

    def pre_step(self, trainer, rec):
        self.dog.arm(rec.step)

    def post_update(self, trainer, rec):
        self.dog.disarm()  # the last post_update hook; logging, evaluation and checkpoints are not the step

    def step_failed(self, trainer, rec):
        self.dog.pause()  # a rollback's reload is not a step

    def close(self, trainer, ok):
        self.dog.close()


class HealthCallback(Callback):
    """Per-layer weight, activation and gradient figures every health.interval steps (trainer.health.layers)."""

    name = "health"

    def __init__(self, trainer: Trainer):
        self.cfg = trainer.cfg.health
        self.health: LayerHealth | None = None
        self.weights: dict | None = None

    def model_built(self, trainer, model):
        self.health = LayerHealth(self.cfg, model, zero_stage=trainer.cfg.deepspeed.zero_stage)

    def pre_step(self, trainer, rec):
        self.weights = None
        if self.health.due(rec.step):
            trainer.module.probe.recording = True
            self.weights = self.health.start()

    def post_update(self, trainer, rec):
        if self.weights is not None:
            record, alarms = self.health.finish(rec.step, self.weights, trainer.module.probe.per_layer())
            trainer.metrics.log_health(record)
            for alarm in alarms:
                trainer.metrics.log_event(alarm)


class StragglerCallback(Callback):
    """Persistently slow ranks (trainer.health.rank_checks); with straggler.drain, the run stops to leave one out."""

    name = "straggler"

    def __init__(self, trainer: Trainer):
        self.check = StragglerCheck(trainer.cfg.straggler, trainer.hosts)
        self.drain = trainer.cfg.straggler.drain and bool(os.environ.get(DRAIN_ENV))

    def post_update(self, trainer, rec):
        for event in self.check.observe(rec.step, rec.busy):
            trainer.metrics.log_event(event)
            if event["event"] == "straggler" and self.drain:
                # Every rank sees the same figures: all stop together, after this step's checkpoint.
                trainer.stop_after_step(
                    {"event": "drain", "rank": event["rank"], "host": event["host"]},
                    DrainRequested(f"straggler: rank {event['rank']} on {event['host']} is persistently slow "
                                   f"({event['message']}); stopping at step {rec.step + 1} (checkpointed) so the "
                                   f"launcher restarts without {event['host']}", rank=event["rank"],
                                   host=event["host"]))


class GuardCallback(Callback):
    """The spike guard's bookkeeping after each step (its verdict is given inside DeepSpeed's step)."""

    name = "guard"

    def __init__(self, guard: SpikeGuard):
        self.guard = guard

    def post_update(self, trainer, rec):
        v = rec.verdict
        if not v.apply:
            trainer.metrics.log_event({"event": "skip", "step": v.step, "samples": list(v.samples),
                                       "reason": v.reason, "loss": v.loss, "grad_norm": v.grad_norm})
        if rec.refused is None:  # refused for the ranks' sake (SDC), not the data's: not a strike
            self.guard.commit(v)  # raises when the run must stop or roll back

    def state_dict(self):
        return self.guard.state_dict()

    def load_state_dict(self, state):
        self.guard.load_state_dict(state)


class SDCCallback(Callback):
    """Silent data corruption: every rank's loss and gradient norm compared before the update."""

    name = "sdc"

    def __init__(self, trainer: Trainer):
        self.check = SDCCheck(trainer.cfg.sdc, trainer.hosts)
        self.outliers: list[dict] = []
        self.needs_gradients = trainer.cfg.sdc.enabled and trainer.dist.world_size > 1

    def pre_step(self, trainer, rec):
        self.outliers = []
        if self.needs_gradients:
            trainer.module.probe.recording = True

    def pre_update(self, trainer, rec):
        self.outliers = self.check.judge(rec.step, rec.figures)
        if self.outliers:
            return "sdc: " + " | ".join(f"rank {o['rank']} {describe(o)}" for o in self.outliers)
        return None

    def post_update(self, trainer, rec):
        for o in self.outliers:
            message = f"rank {o['rank']} (host {o['host']}): {describe(o)}; step {o['step']} not applied"
            trainer.metrics.log_event({"event": "sdc", **o, "message": message})
        self.check.commit(rec.step, rec.figures, self.outliers)  # raises after repeated offences

    def state_dict(self):
        return self.check.state_dict()

    def load_state_dict(self, state):
        self.check.load_state_dict(state)  # {} in checkpoints written before the SDC check


class CanaryCallback(Callback):
    """A fixed held-out batch every sdc.canary_interval steps: all ranks must agree, and stay near history."""

    name = "canary"

    def __init__(self, trainer: Trainer):
        self.check = CanaryCheck(trainer.cfg.sdc)
        self.batch = self.domain = None
        cfg = trainer.cfg
        if cfg.sdc.enabled and cfg.sdc.canary_interval:
            if not trainer.val_sources:
                trainer.metrics.log_event({"event": "canary_off",
                                           "reason": "no held-out data to take the canary batch from"})
            else:  # the first micro-batch of the first held-out domain, the same on every rank
                self.domain, source = next(iter(trainer.val_sources.items()))
                self.batch = source.batch(list(range(cfg.batch.micro_batch)))

    def post_update(self, trainer, rec):
        step = trainer.state.step
        if self.batch is not None and self.check.due(step):
            from trainer.train_module import gather_floats

            losses = [r[0] for r in gather_floats([trainer.module.loss(self.batch).float()], trainer.dist)]
            record = self.check.observe(step, losses, trainer.hosts)
            record["domain"] = self.domain
            trainer.metrics.log_event(record)

    def state_dict(self):
        return self.check.state_dict()

    def load_state_dict(self, state):
        self.check.load_state_dict(state)


class MetricsCallback(Callback):
    """A train record every metrics.log_interval steps (means over the applied steps since the last one),
    the held-out losses every metrics.eval_interval steps and at the end, and zero-shot tasks every
    metrics.downstream_interval steps and at the end (loss can improve while capabilities do not)."""

    name = "metrics"

    def __init__(self):
        self.window: list[dict] = []
        self.downstream = None  # trainer.evaluation.evaluate.Downstream, built at the first evaluation (False: off)

    def post_step(self, trainer, rec):
        cfg, st = trainer.cfg, trainer.state
        self.window.append(trainer.history[-1])
        last = trainer.at_end()
        if st.step % cfg.metrics.log_interval == 0 or last:
            w = self.window
            applied = [h for h in w if h["applied"]] or w
            trainer.metrics.log_step(
                step=st.step, tokens=st.tokens, loss=sum(h["loss"] for h in applied) / len(applied),
                grad_norm=sum(h["grad_norm"] for h in applied) / len(applied), lr=w[-1]["lr"],
                batch=w[-1]["batch"], rank_busy_s=rec.busy)
            self.window = []
        if trainer.val_sources and cfg.metrics.eval_batches and (
                last or (cfg.metrics.eval_interval and st.step % cfg.metrics.eval_interval == 0)):
            trainer.metrics.log_eval(step=st.step, losses=trainer.evaluate())
        every = cfg.metrics.downstream_interval
        # Built at the first step (a missing benchmark file fails the run then, not after the first interval).
        if every and self._downstream(trainer) and (last or st.step % every == 0):
            began = time.perf_counter()
            trainer.module.engine.eval()
            try:
                tasks = self.downstream.run(trainer.model.transformer, rank=trainer.dist.rank,
                                            world_size=trainer.dist.world_size, device=trainer.dist.device)
            finally:
                trainer.module.engine.train()
            trainer.metrics.log_downstream(step=st.step, tokens=st.tokens, tasks=tasks,
                                           seconds=time.perf_counter() - began)

    def _downstream(self, trainer) -> bool:
        """The evaluator, built once; without the benchmark folder or a tokenizer the run goes on without it (a
        mixing proxy inherits the main stage's metrics section, not its benchmarks), saying so once."""
        if self.downstream is None:
            cfg = trainer.cfg
            missing = [name for name, value in (("metrics.downstream_benchmarks", cfg.metrics.downstream_benchmarks),
                                                ("data.tokenizer", cfg.data.tokenizer)) if not value]
            if missing:
                trainer.metrics.log_event({"event": "downstream_off", "reason": f"{' and '.join(missing)} not set"})
                self.downstream = False
                return False
            from trainer.evaluation.evaluate import Downstream

            encoder = getattr(trainer.train_source, "encoder", None)  # a renumbering source (text, top_tokens)
            if encoder is not None:
                tokenizer = encoder()
            else:
                from tokenizers import Tokenizer

                tokenizer = Tokenizer.from_file(cfg.data.tokenizer)
            self.downstream = Downstream(cfg.metrics.downstream_tasks, cfg.metrics.downstream_benchmarks, tokenizer,
                                         limit=cfg.metrics.downstream_limit, max_len=cfg.batch.seq_len,
                                         batch_size=cfg.batch.micro_batch)
        return bool(self.downstream)

    def step_failed(self, trainer, rec):
        self.window = []  # a rollback replays the steps since its checkpoint


class CheckpointCallback(Callback):
    """Saves every checkpoint.interval_steps (or by Young's rule) and at the end (trainer.checkpoint.checkpointer)."""

    name = "checkpointer"

    def post_step(self, trainer, rec):
        ckpt, step = trainer.checkpointer, trainer.state.step
        final = trainer.at_end() and trainer.cfg.checkpoint.save_final and step not in ckpt.saved
        if ckpt.due(step) or final:
            trainer.save_checkpoint()

    def close(self, trainer, ok):
        # A finished run waits for its uploads (a committed step is never abandoned); a failed one does not.
        trainer.checkpointer.close(wait=ok)
