"""The training loop: batch-size ramp, LR schedule, DeepSpeed step behind the spike guard, metrics.

    python -m trainer --config run.json                 # or under torchrun / deepspeed

The loop (Trainer) owns the run's state and calls its callbacks (trainer.callbacks: watchdog, health,
stragglers, spike guard, SDC, canary, metrics, checkpoints) at fixed points of each step; the model,
the DeepSpeed engine and the optimizer are the TrainModule's (trainer.train_module). A checkpoint holds
the TrainModule's DeepSpeed files and, in trainer.json, the state_dict() of TrainState (step, tokens,
the global sample index, which is the data loader's whole state, the skipped data windows) and of every
callback that has one (guard, sdc, canary). The guard's rollback restores the newest checkpoint before
the spike, or the run's initial state where there is none (rebuilt from the seed), then jumps the data over the
window.

SIGINT or SIGTERM (a stopped Dagster run, scancel, a Slurm time limit or preemption) asks the run to stop: each
rank notes it, the ranks agree on it through the step's one gather of per-rank figures (a rank that stopped a step
before the others would leave them waiting in a collective), and every rank checkpoints after that step and exits
with STOP_EXIT. A second signal, seconds after the first, stops at once.

Long because a step is one sequence to read (data, forward and backward or a pipeline's schedule, the gate, the
callbacks), and resume, rollback and evaluation change the same state it does; split, the order would be scattered.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as torch_dist

from trainer.callbacks import (Callback, CanaryCallback, CheckpointCallback, GuardCallback, HealthCallback,
                               MetricsCallback, SDCCallback, StepRecord, StragglerCallback, WatchdogCallback,
                               extra_callbacks)
from trainer.checkpoint.checkpointer import Checkpointer, Contents, check_layout, saved_precision
from trainer.config import RunConfig
from trainer.data.mixture import rank_indices
from trainer.parallel.engine import Dist, init_distributed
from trainer.exits import TrainerExit, node_name
from trainer.health.guard import GuardStop, RollbackRequested, SpikeGuard, TooManySkips, Verdict
from trainer.reporting.metrics import Metrics, flops_per_token
from trainer.optim import batch_at, lr_at, set_lr
from trainer.reporting.peak import device_peak
from trainer.parallel.precision import Precision, resolve_precision
from trainer.train_module import TrainModule, gather_floats
from trainer.health.watchdog import StepWatchdog
from trainer.checkpoint.weights import continue_run, continued_step


class BatchSource(Protocol):
    """trainer.data.mixture.MixtureDataset, trainer.data.text_source.TextSource or anything alike."""

    def batch(self, indices: list[int]) -> dict:  # tokens / doc_ids / positions: (B, T+1) int64
        ...


def build_sources(cfg: RunConfig) -> tuple[BatchSource, dict[str, BatchSource]]:
    """(training mixture, {domain: held-out source}) from the run's data section."""
    d, T = cfg.data, cfg.batch.seq_len
    if d.text is not None:
        from trainer.data.text_source import TextSource, TextSourceConfig

        def text(split):
            return TextSource(TextSourceConfig(path=d.text, tokenizer=d.tokenizer, seq_len=T, seed=cfg.seed,
                                               split=split, val_fraction=d.val_fraction,
                                               top_tokens=d.top_tokens))

        return text("train"), {"text": text("val")}
    from trainer.data.mixture import DataConfig, MixtureDataset

    from trainer.data.mixture import NoDocuments

    weights = d.weights or {name: 1.0 for name in d.shards}
    train = MixtureDataset(DataConfig(shards=dict(d.shards), weights=weights, seq_len=T, seed=cfg.seed, split="train",
                                      min_doc_tokens=d.min_doc_tokens))
    val = {}
    for name, folder in d.shards.items():
        try:
            val[name] = MixtureDataset(DataConfig(shards={name: folder}, weights={name: 1.0}, seq_len=T, seed=cfg.seed,
                                                  split="val", min_doc_tokens=d.min_doc_tokens))
        except NoDocuments as exc:  # a small source may hold out no document (or none that long)
            print(f"validation: {name} left out: {exc}", flush=True)
    return train, val


@dataclass
class TrainState:
    step: int = 0  # optimizer steps taken (applied or skipped)
    tokens: int = 0  # tokens consumed
    sample_index: int = 0  # global index of the next sample: the data loader's whole state
    # Global sample windows [a, b) left out after a rollback: a batch never starts inside one.
    skip_windows: list[list[int]] = field(default_factory=list)
    # The run's token count when this stage began: 0, or that of the run it continues (continue_from). The
    # stage ends at start_tokens + train_tokens; its LR schedule is placed on the same cumulative count.
    start_tokens: int = 0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.step, self.tokens, self.sample_index = state["step"], state["tokens"], state["sample_index"]
        self.skip_windows = [list(w) for w in state.get("skip_windows", [])]
        self.start_tokens = state.get("start_tokens", 0)

    def skip_to(self, batch: int) -> None:
        """Move sample_index past every recorded window the next batch [i, i + batch) would overlap."""
        moved = True
        while moved:
            moved = False
            for a, b in self.skip_windows:
                if self.sample_index < b and a < self.sample_index + batch:
                    self.sample_index, moved = b, True


def _with_bf16(cfg: RunConfig, bf16: bool) -> RunConfig:
    """cfg with deepspeed.bf16 resolved ("auto" becomes what the hardware does natively)."""
    return cfg.model_copy(update={"deepspeed": cfg.deepspeed.model_copy(update={"bf16": bf16})})


class Trainer:
    def __init__(self, cfg: RunConfig, *, dist: Dist | None = None, train_source: BatchSource | None = None,
                 val_sources: dict[str, BatchSource] | None = None):
        begun = time.perf_counter()
        cfg, checks_off = cfg.checks_off()  # the per-rank checks a split model cannot run (logged below)
        self.cfg = cfg
        self.dist = dist or init_distributed(timeout_s=cfg.watchdog.collective_timeout_s)
        if train_source is None:
            train_source, built_val = build_sources(cfg)
            val_sources = built_val if val_sources is None else val_sources
        self.train_source, self.val_sources = train_source, val_sources or {}
        vocab = getattr(train_source, "vocab_size", None)
        if vocab is not None and vocab > cfg.model.vocab_size:
            raise ValueError(
                f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the data's vocabulary ({vocab})")
        self.state = TrainState()
        self.history: list[dict] = []  # per step: step, loss, grad_norm, lr, batch, applied, samples
        self.val_loss: dict[str, float] = {}
        self._stop: tuple[dict, TrainerExit] | None = None  # stop_after_step()
        self._signalled: str | None = None  # SIGINT / SIGTERM seen by this rank, not yet agreed on
        self._signalled_at = 0.0
        self.hosts = self._hosts()
        self.guard = SpikeGuard(cfg.guard)
        self.watchdog = StepWatchdog(cfg.watchdog, rank=self.dist.rank, world_size=self.dist.world_size,
                                     output_dir=cfg.output_dir)
        self.metrics = None
        try:
            # The callbacks (trainer.callbacks: pre hooks in this order, post hooks in reverse): the watchdog
            # first (it brackets the others), then a test's (they act on the step before the checks see it).
            self.callbacks: list[Callback] = [WatchdogCallback(self.watchdog), *extra_callbacks()]
            self._new_module()
            self.n_params = cfg.model.parameter_count().total  # the config's count: a rank may hold a part (PP, TP)
            self.metrics = Metrics(cfg.metrics, cfg.output_dir, rank=self.dist.rank,
                                   world_size=self.dist.world_size,
                                   flops_per_token=flops_per_token(cfg.model, cfg.batch.seq_len),
                                   train_tokens=cfg.train_tokens)
            self.watchdog.on_fire = self.metrics.log_event
            if checks_off:
                self.metrics.log_event({"event": "checks_off", "fields": checks_off,
                                        "reason": f"{cfg.model_split} > 1: a rank holds a part of the model"})
            if getattr(train_source, "left_out", None):
                self.metrics.log_event({"event": "sources_left_out", "sources": train_source.left_out,
                                        "reason": f"no document of {cfg.data.min_doc_tokens} tokens or more"})
            self.checkpointer = Checkpointer.for_run(cfg, self.dist, on_event=self.metrics.log_event)
            health = HealthCallback(self)
            health.model_built(self, self.model)  # the first model came before this callback
            # post_update runs health, stragglers, guard, SDC, canary; post_step logs, then checkpoints.
            self.callbacks += [CanaryCallback(self), SDCCallback(self), GuardCallback(self.guard),
                               StragglerCallback(self), health, CheckpointCallback(), MetricsCallback()]
            # The named states before the first step: a rollback with no checkpoint before its spike goes back to
            # them (rollback_to_start), so the state at step 0 never needs a checkpoint of its own.
            self._initial_states = {name: copy.deepcopy(obj.state_dict()) for name, obj in self.stateful().items()}
            self._resume_or_start(begun)
        except BaseException:
            self.close(ok=False)
            raise

    def _resume_or_start(self, begun: float) -> None:
        cfg = self.cfg
        point = self.checkpointer.find_resume() if cfg.checkpoint.resume else None
        # A stage that continues another run starts from that run's step, unless it has steps of its own.
        source = (continued_step(cfg.continue_from, Path(cfg.output_dir) / "continue_from", cfg.model, self.dist)
                  if point is None and cfg.continue_from else None)
        # bf16 or fp32, by the hardware unless forced; a resumed (or continued) run keeps what it started with.
        # From here on cfg says which (true / false), so the engine, checkpoints and evaluation see one answer.
        start = point or source
        if cfg.fp32_only:  # tensor parallelism under ZeRO-0 (RunConfig refuses bf16 true there)
            self.precision = Precision(bf16=False, requested=str(cfg.deepspeed.bf16).lower(), reason=cfg.fp32_only)
        else:
            self.precision = resolve_precision(cfg.deepspeed.bf16, self.dist.device,
                                               resumed=saved_precision(start.manifest) if start is not None else None)
        self.cfg = cfg = self.module.cfg = _with_bf16(cfg, self.precision.bf16)
        self.metrics.set_peak(device_peak(self.dist.device, self.precision.dtype, cfg.metrics.peak_flops))
        # With the dtype, the CPU threads: both decide the numerics a run's losses come out of.
        self.metrics.log_event({"event": "precision", **self.precision.record(), "threads": torch.get_num_threads()})
        if point is not None:
            self.checkpointer.check_batch(point, cfg)
        if point is None and cfg.init_from:
            self._load_init_from()
        if start is not None:  # a split model's step loads into the same split only
            check_layout(start, cfg)
        # The engine must know before it is built whether it loads shards of another world size.
        universal = self.checkpointer.needs_universal(start, cfg)
        engine_begun = time.perf_counter()
        self.module.build_engine(load_universal=universal)
        engine_s = time.perf_counter() - engine_begun
        if source is not None:
            continue_run(self, source, universal=universal)
        if point is not None:
            self.checkpointer.restore(point, self, universal=universal)
            self.metrics.log_event({"event": "resumed", "step": point.step, "source": point.source,
                                    "path": str(point.path), "world_size": point.manifest["world_size"],
                                    "universal": universal})
        self.metrics.train_tokens = self.end_tokens  # progress and ETA on the run's cumulative token count
        self.metrics.log_event(self._startup(begun, engine_s))

    def _load_init_from(self) -> None:
        """A new stage starts from the stage before's weights (init_from), with a fresh optimizer and schedule."""
        from trainer.checkpoint.store import local_step
        from trainer.checkpoint.weights import load_initial_weights

        cfg = self.cfg
        cache = Path(cfg.output_dir) / "init_from"
        if self.dist.rank == 0:
            local_step(cfg.init_from, cache)  # one download from the object store (kept), then every rank reads it
        if self.dist.world_size > 1:
            torch_dist.barrier()
        weights_of = load_initial_weights(self.model, cfg.init_from, cache)
        self.metrics.log_event({"event": "initialized", "from": cfg.init_from, "step": weights_of["step"]})

    @staticmethod
    def _startup(begun: float, engine_s: float) -> dict:
        """What starting this trainer cost (the demo starts one a dozen times): imports when this process is
        `python -m trainer`, then set-up (process group, data, model, checks) and the DeepSpeed engine."""
        import sys

        import trainer

        now = time.perf_counter()
        record = {"event": "startup", "setup_s": round(now - begun - engine_s, 3), "engine_s": round(engine_s, 3)}
        main = getattr(sys.modules.get("__main__"), "__spec__", None)
        if main is not None and main.name == "trainer.__main__":
            record["imports_s"] = round(begun - trainer.IMPORTED_AT, 3)
            record["total_s"] = round(now - trainer.IMPORTED_AT, 3)
        return record

    def _new_module(self) -> None:
        """A fresh TrainModule (start, rollback); the callbacks' hooks on the model go in first."""
        self.module = TrainModule(self.cfg, self.dist,
                                  on_model=lambda model: [cb.model_built(self, model) for cb in self.callbacks])

    # The TrainModule's parts, by their old names (tests, benches, trainer.evaluation.evaluate).
    model = property(lambda self: self.module.model)
    engine = property(lambda self: self.module.engine)
    optimizer = property(lambda self: self.module.optimizer)

    def _hosts(self) -> list[str]:
        """Each rank's node, by rank (stragglers and corrupt ranks are reported with it): Slurm's node name
        when under Slurm (what `srun --exclude` takes), else the host name."""
        mine = node_name()
        hosts = [mine]
        if self.dist.world_size > 1:
            hosts = [None] * self.dist.world_size
            torch_dist.all_gather_object(hosts, mine)
        return hosts

    def stateful(self) -> dict:
        """What a checkpoint's trainer.json holds, by name: the loop state and every callback with a state."""
        return {"train": self.state,
                **{cb.name: cb for cb in self.callbacks if hasattr(cb, "state_dict")}}

    @property
    def end_tokens(self) -> int:  # where this stage ends on the run's cumulative token count
        return self.state.start_tokens + self.cfg.train_tokens

    def at_end(self) -> bool:
        return self.state.tokens >= self.end_tokens

    def stop_after_step(self, event: dict, error: TrainerExit) -> None:
        """Stop the run once this step is done and checkpointed (a straggler's drain): log `event`, raise
        `error`. Not at the run's last step: that one simply finishes."""
        self._stop = self._stop or (event, error)

    # -- one step ----------------------------------------------------------------------------------

    def step(self) -> Verdict:
        """One optimizer step over one global batch (gradient accumulation inside), under the watchdog."""
        return self.run_step().verdict

    def run_step(self) -> StepRecord:
        rec = None
        try:
            rec = self._step()
            for cb in reversed(self.callbacks):
                cb.post_update(self, rec)
        except BaseException:
            for cb in self.callbacks:
                cb.step_failed(self, rec)
            raise
        return rec

    def _step(self) -> StepRecord:
        cfg, st, d, module = self.cfg, self.state, self.dist, self.module
        T, micro = cfg.batch.seq_len, cfg.batch.micro_batch
        B = batch_at(st.tokens, cfg.batch)
        module.set_batch_size(B)
        accum = B // (micro * module.dp_size)
        st.skip_to(B)
        indices = rank_indices(st.sample_index, B, module.dp_rank, module.dp_size)
        lr = lr_at(st.tokens + B * T, peak_lr=cfg.optim.lr, train_tokens=self.end_tokens, cfg=cfg.schedule,
                   start_tokens=st.start_tokens)
        set_lr(module.optimizer, lr)
        rec = StepRecord(step=st.step, samples=(st.sample_index, st.sample_index + B), batch=B, lr=lr)
        loss_sum = torch.zeros((), dtype=torch.float32, device=d.device)
        module.engine.train()
        # Busy time: this rank's own work (data, forward, backward outside the accumulation boundary), not
        # the time it waits for the others inside the boundary's gradient reduction: the straggler figure.
        started = time.perf_counter()
        # The gradient probe records only when a callback reads this step's figures (SDC, health): it asks, and
        # the probe's hooks are on the model for this step's backward only then.
        module.probe.start(st.step, record=False)
        for cb in self.callbacks:
            cb.pre_step(self, rec)
        module.probe.arm()
        if module.pipeline:
            return self._pipeline_step(rec, indices, accum, started)
        for m in range(accum):
            last = m == accum - 1
            loss = module.forward(self.train_source.batch(indices[m * micro:(m + 1) * micro]), last=last)
            busy = time.perf_counter() - started
            module.backward(loss)
            loss_sum += loss.detach().float()
        # The guard needs the global mean loss before DeepSpeed's boundary step calls the gate; the
        # SDC and straggler checks need every rank's own loss, gradient norm and busy time.
        per_rank = gather_floats([loss_sum, module.probe.local_norm(), torch.tensor(busy, device=d.device),
                                  self._signal_flag()], d)
        self._pre_update(rec, per_rank, accum=accum, replicas=d.world_size)
        module.update(lambda: self._gate(rec))
        return self._after_update(rec)

    def _pre_update(self, rec: StepRecord, per_rank: list, *, accum: int, replicas: int) -> None:
        """From every rank's (loss sum, gradient norm, busy seconds, signalled): the global mean loss over the
        `replicas`' micro-batches, the per-rank figures, the callbacks' pre-update checks (a refusal becomes the step's
        verdict), and whether any rank was asked to stop (then every rank stops after this step)."""
        if any(r[3] for r in per_rank):
            ranks = [rank for rank, r in enumerate(per_rank) if r[3]]
            self.stop_after_step({"event": "stopped", "ranks": ranks}, StopRequested(
                f"stopped by a signal ({self._signalled or 'on another rank'}; rank(s) {ranks}) after step "
                f"{rec.step + 1}, checkpointed: a restart resumes there"))
        rec.loss = sum(r[0] for r in per_rank) / (accum * replicas)
        rec.figures = {"loss": [r[0] / accum for r in per_rank], "grad_norm": [r[1] for r in per_rank]}
        rec.busy = [r[2] for r in per_rank]
        reasons = [cb.pre_update(self, rec) for cb in self.callbacks]
        rec.refused = next((r for r in reasons if r is not None), None)
        if rec.refused is not None:
            rec.verdict = Verdict(step=rec.step, apply=False, reason=rec.refused, loss=rec.loss,
                                  grad_norm=math.nan, samples=rec.samples)

    def _after_update(self, rec: StepRecord) -> StepRecord:
        st = self.state
        if rec.verdict is None:
            # DeepSpeed found the gradients non-finite and skipped the update without asking the gate.
            rec.verdict = self.guard.judge(step=rec.step, loss=rec.loss, grad_norm=float("nan"), samples=rec.samples)
            assert not rec.verdict.apply
        v = rec.verdict
        B, T = rec.batch, self.cfg.batch.seq_len
        self.history.append({"step": rec.step, "loss": v.loss, "grad_norm": v.grad_norm, "lr": rec.lr, "batch": B,
                             "applied": v.apply, "samples": list(v.samples)})
        st.step += 1
        st.tokens += B * T
        st.sample_index += B
        self.metrics.count(B * T)
        return rec

    def _pipeline_step(self, rec: StepRecord, indices: list[int], accum: int, started: float) -> StepRecord:
        """One step through DeepSpeed's pipeline schedule (trainer.parallel.pipeline). Forward, backward and the update are
        one call there, so what the loop does between backward and update elsewhere (the global loss, the
        pre-update checks) happens in the gate, which every rank's optimizer calls once, after the gradients are
        reduced and before any weight changes."""
        module, micro = self.module, self.cfg.batch.micro_batch

        def gate() -> bool:
            if not rec.figures:  # the first of the optimizer's calls this step
                # The last stage holds the losses; summed over every rank and divided by the data-parallel
                # replicas' micro-batches, the global mean loss, as the unpipelined step's.
                busy = torch.tensor(time.perf_counter() - started, device=self.dist.device)
                nan = torch.tensor(math.nan, device=self.dist.device)  # no per-rank gradient norm: a stage's is partial
                per_rank = gather_floats([module.pipeline_loss_sum(), nan, busy, self._signal_flag()], self.dist)
                self._pre_update(rec, per_rank, accum=accum, replicas=module.dp_size)
            return self._gate(rec)

        module.train_pipeline([self.train_source.batch(indices[m * micro:(m + 1) * micro]) for m in range(accum)],
                              gate)
        return self._after_update(rec)

    def _gate(self, rec: StepRecord) -> bool:
        """Inside DeepSpeed's step, once the pre-clip grad norm is known. Called by the client optimizer once
        per parameter group: judge once per step."""
        if rec.verdict is None:
            rec.verdict = self.guard.judge(step=rec.step, loss=rec.loss, grad_norm=self.module.grad_norm(),
                                           samples=rec.samples)
        elif math.isnan(rec.verdict.grad_norm) and math.isfinite(rec.verdict.loss):
            # Refused before DeepSpeed's step (an SDC outlier): its global grad norm is known only now.
            rec.verdict = dataclasses.replace(rec.verdict, grad_norm=self.module.grad_norm())
        return rec.verdict.apply

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean held-out loss per domain over eval_batches global batches (the same samples every time)."""
        cfg, d = self.cfg, self.dist
        n, micro = cfg.metrics.eval_batches * cfg.batch.global_batch, cfg.batch.micro_batch
        losses = {}
        # The ranks holding parts of one model (a pipeline's stages, a tensor-parallel group) evaluate the same
        # samples (the loss comes back on each), counted once below.
        split = cfg.model_split is not None
        ranks, world = (self.module.dp_rank, self.module.dp_size) if split else (d.rank, d.world_size)
        copies = d.world_size // world
        for name, source in self.val_sources.items():
            indices = rank_indices(0, n, ranks, world)
            total = torch.zeros((), dtype=torch.float64, device=d.device)
            for i in range(0, len(indices), micro):
                total += self.module.loss(source.batch(indices[i:i + micro])).double() * len(indices[i:i + micro])
            if d.world_size > 1:
                torch_dist.all_reduce(total)
            losses[name] = total.item() / (n * copies)
        self.val_loss = losses
        return losses

    # -- the run -----------------------------------------------------------------------------------

    def _signal_flag(self) -> torch.Tensor:
        return torch.tensor(1.0 if self._signalled else 0.0, device=self.dist.device)

    def _on_signal(self, signum, _frame) -> None:
        # The same stop often arrives twice within milliseconds (Slurm signals every process of the step, then
        # torchrun passes it on to its ranks): one request. A second one asked for later means now.
        if self._signalled and time.monotonic() - self._signalled_at > SIGNAL_AGAIN_S:
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} again")
        if not self._signalled:
            self._signalled, self._signalled_at = signal.Signals(signum).name, time.monotonic()

    def fit(self) -> dict:
        cfg, st = self.cfg, self.state
        ok = False
        handlers = {}
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread only
            handlers = {signum: signal.signal(signum, self._on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not self.at_end():
                try:
                    rec = self.run_step()
                except RollbackRequested as e:
                    self.rollback(e)
                    continue
                for cb in reversed(self.callbacks):
                    cb.post_step(self, rec)
                if self._stop is not None and not self.at_end():
                    ok = True  # its checkpoint is what the next attempt starts from: upload it
                    self._stop_now()
            ok = True
        except GuardStop as e:
            self.metrics.log_event({"event": "guard_stop", "step": st.step, "message": str(e)})
            raise
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            self.close(ok=ok)
        summary = {"steps": st.step, "tokens": st.tokens, "start_tokens": st.start_tokens,
                   "sample_index": st.sample_index, "val_loss": self.val_loss,
                   "skipped": self.guard.skipped, "losses": [h["loss"] for h in self.history]}
        if self.dist.rank == 0:
            Path(cfg.output_dir, "summary.json").write_text(json.dumps(summary, indent=1))
        return summary

    def _stop_now(self) -> None:
        event, error = self._stop
        if self.state.step not in self.checkpointer.saved:
            self.save_checkpoint()
        self.metrics.log_event({"event": event["event"], "step": self.state.step,
                                **{k: v for k, v in event.items() if k != "event"}})
        error.agreed = True
        raise error

    def save_checkpoint(self) -> None:
        """Every rank: the TrainModule's files and the named states, behind the checkpointer's threads."""
        self.checkpointer.save(self)
        for cb in reversed(self.callbacks):
            cb.post_checkpoint(self, self.state.step)

    def checkpoint_contents(self) -> Contents:
        """What a checkpoint holds (trainer.checkpoint.checkpointer): the module, the named states, the manifest's header."""
        cfg, st = self.cfg, self.state
        header = {"tokens": st.tokens, "global_batch": cfg.batch.global_batch, "data_position": st.sample_index,
                  "stage": cfg.stage, "zero_stage": cfg.deepspeed.zero_stage, "precision": self.precision.record(),
                  "config": cfg.to_dict(), "tokenizer_sha256": cfg.tokenizer_sha256, "lineage": list(cfg.lineage),
                  "skip_windows": [list(w) for w in st.skip_windows]}
        return Contents(step=st.step, module=self.module, states=self.stateful(), header=header, seed=cfg.seed)

    def rollback(self, e: RollbackRequested) -> None:
        """The guard's rollback: restore the newest checkpoint taken before the spike's data window,
        record the window (later checkpoints carry it, so a resume skips it too) and go on."""
        a, b = e.skip_window
        at = self.state.step
        # Every window left out so far stays left out: the point restored may predate some of them.
        windows = [w for w in self.state.skip_windows] + [[a, b]]
        point = self.checkpointer.before(a)
        if point is None:
            # No checkpoint before the spike (a run's first steps, a proxy that keeps none): the initial state.
            self.rollback_to_start()
        else:
            # A fresh engine: ZeRO-3 cannot load into the partitioned module of a running one. The step may
            # come from another world size (the one this run resumed from).
            universal = self.checkpointer.needs_universal(point, self.cfg)
            self._new_module()
            self.module.build_engine(load_universal=universal)
            self.checkpointer.restore(point, self, universal=universal)
        self.state.skip_windows = sorted({tuple(w): list(w) for w in self.state.skip_windows + windows}.values())
        if len(self.state.skip_windows) > self.cfg.guard.max_skipped:
            raise TooManySkips(f"spike guard: {len(self.state.skip_windows)} rollbacks, more than guard.max_skipped = "
                               f"{self.cfg.guard.max_skipped}; the run is unstable") from e
        self.history = [h for h in self.history if h["step"] < self.state.step]
        dropped = self.checkpointer.discard_after(self.state.step)
        self.metrics.log_event({"event": "rollback", "step": at, "to_step": self.state.step,
                                "to": "checkpoint" if point is not None else "initial state", "skip_window": [a, b],
                                "reason": str(e), "discarded_checkpoints": dropped})

    def rollback_to_start(self) -> None:
        """Back to the state the run started from, rebuilt rather than saved (a step-0 checkpoint would cost every
        run a save; this costs only the rare rollback a model build): the seeded initialization (or init_from's
        weights), or the step of the run it continues (continue_from); the named states as before the first step."""
        cfg = self.cfg
        self._new_module()  # seeded: the same initial weights and RNG state as at the start
        if cfg.init_from:
            self._load_init_from()
        source = (continued_step(cfg.continue_from, Path(cfg.output_dir) / "continue_from", cfg.model, self.dist)
                  if cfg.continue_from else None)
        universal = self.checkpointer.needs_universal(source, cfg)
        self.module.build_engine(load_universal=universal)
        for name, obj in self.stateful().items():
            obj.load_state_dict(copy.deepcopy(self._initial_states[name]))
        if source is not None:
            continue_run(self, source, universal=universal)

    def close(self, *, ok: bool = True) -> None:
        """End the run's threads and files: each callback's, then the metrics (the others log to them)."""
        try:
            for cb in reversed(getattr(self, "callbacks", [WatchdogCallback(self.watchdog)])):
                cb.close(self, ok)
        finally:
            if self.metrics is not None:
                self.metrics.close()


SIGNAL_AGAIN_S = 2.0  # a stop signal this long after the first stops the run at once, not after its step


class StopRequested(TrainerExit):
    """A signal asked the run to stop: it checkpointed after the step every rank agreed on (a restart resumes)."""

    kind = "stopped"


def train(cfg: RunConfig, *, train_source: BatchSource | None = None,
          val_sources: dict[str, BatchSource] | None = None) -> dict:
    """Run `cfg` to its token budget; returns a summary (also written to output_dir/summary.json)."""
    return Trainer(cfg, train_source=train_source, val_sources=val_sources).fit()
