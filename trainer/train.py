"""The training loop: batch-size ramp, LR schedule, DeepSpeed step behind the spike guard, metrics.

    python -m trainer --config run.json                 # or under torchrun / deepspeed

The loop's replayable state apart from model, optimizer and RNG is `Trainer.state_dict()`: step,
tokens, the global sample index (the data loader's whole state), the skipped data windows and the
spike guard. trainer.checkpoint saves it with the rest, resumes from it at start, and carries out the
guard's rollback: restore the newest checkpoint before the spike, then jump the data over the window.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Protocol

import torch
import torch.distributed as torch_dist

from trainer.checkpoint import Checkpointer, saved_precision
from trainer.config import RunConfig
from trainer.data import rank_indices
from trainer.engine import Dist, build_engine, init_distributed
from trainer.faults import Faults
from trainer.guard import GuardStop, RollbackRequested, SpikeGuard, TooManySkips, Verdict
from trainer.health import GradientProbe, LayerHealth
from trainer.metrics import Metrics, flops_per_token
from trainer.model import CausalLM
from trainer.optim import batch_at, lr_at, set_lr
from trainer.peak import device_peak
from trainer.precision import resolve_precision
from trainer.rank_checks import DRAIN_ENV, CanaryCheck, DrainRequested, SDCCheck, StragglerCheck, describe
from trainer.watchdog import StepWatchdog


class BatchSource(Protocol):
    """trainer.data.MixtureDataset, trainer.text_source.TextSource or anything alike."""

    def batch(self, indices: list[int]) -> dict:  # tokens / doc_ids / positions: (B, T+1) int64
        ...


def build_sources(cfg: RunConfig) -> tuple[BatchSource, dict[str, BatchSource]]:
    """(training mixture, {domain: held-out source}) from the run's data section."""
    d, T = cfg.data, cfg.batch.seq_len
    if d.text is not None:
        from trainer.text_source import TextSource, TextSourceConfig

        def text(split):
            return TextSource(TextSourceConfig(path=d.text, tokenizer=d.tokenizer, seq_len=T, seed=cfg.seed,
                                               split=split, val_fraction=d.val_fraction,
                                               top_tokens=d.top_tokens))

        return text("train"), {"text": text("val")}
    from trainer.data import DataConfig, MixtureDataset

    from trainer.data import NoDocuments

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

    def skip_to(self, batch: int) -> None:
        """Move sample_index past every recorded window the next batch [i, i + batch) would overlap."""
        moved = True
        while moved:
            moved = False
            for a, b in self.skip_windows:
                if self.sample_index < b and a < self.sample_index + batch:
                    self.sample_index, moved = b, True


class Trainer:
    def __init__(self, cfg: RunConfig, *, dist: Dist | None = None, train_source: BatchSource | None = None,
                 val_sources: dict[str, BatchSource] | None = None):
        begun = time.perf_counter()
        self.cfg = cfg
        self.dist = dist or init_distributed(timeout_s=cfg.watchdog.collective_timeout_s)
        self.faults = Faults.from_env(self.dist.rank)
        if train_source is None:
            train_source, built_val = build_sources(cfg)
            val_sources = built_val if val_sources is None else val_sources
        self.train_source, self.val_sources = train_source, val_sources or {}
        vocab = getattr(train_source, "vocab_size", None)
        if vocab is not None and vocab > cfg.model.vocab_size:
            raise ValueError(
                f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the data's vocabulary ({vocab})")
        self._new_model()
        n_matmul = self.model.transformer.num_params(exclude_embedding=True)  # before ZeRO-3 partitions it
        self.n_params = self.model.transformer.num_params()
        self.guard = SpikeGuard(cfg.guard)
        self.state = TrainState()
        self.metrics = Metrics(cfg.metrics, cfg.output_dir, rank=self.dist.rank, world_size=self.dist.world_size,
                               flops_per_token=flops_per_token(n_matmul, cfg.model, cfg.batch.seq_len),
                               train_tokens=cfg.train_tokens)
        if getattr(train_source, "left_out", None):
            self.metrics.log_event({"event": "sources_left_out", "sources": train_source.left_out,
                                    "reason": f"no document of {cfg.data.min_doc_tokens} tokens or more"})
        self.checkpointer = Checkpointer.for_run(cfg, self.dist, on_event=self.metrics.log_event)
        self.hosts = self._hosts()
        self.sdc = SDCCheck(cfg.sdc, self.hosts)
        self.canary = CanaryCheck(cfg.sdc)
        self.stragglers = StragglerCheck(cfg.straggler, self.hosts)
        self.watchdog = StepWatchdog(cfg.watchdog, rank=self.dist.rank, world_size=self.dist.world_size,
                                     output_dir=cfg.output_dir, on_fire=self.metrics.log_event)
        self._canary_batch = self._pick_canary()
        self._rank_busy: list[float] = []
        self._drain: dict | None = None  # a straggler to drain, once the step is done
        self._pending: dict = {}
        self.history: list[dict] = []  # per step: step, loss, grad_norm, lr, batch, applied, samples
        point = self.checkpointer.find_resume() if cfg.checkpoint.resume else None
        try:
            # bf16 or fp32, by the hardware unless forced; a resumed run keeps what it started with. From here on
            # cfg says which (true / false), so the engine, the checkpoints and the evaluation all see one answer.
            self.precision = resolve_precision(cfg.deepspeed.bf16, self.dist.device,
                                               resumed=saved_precision(point.manifest) if point is not None else None)
            self.cfg = cfg = replace(cfg, deepspeed=replace(cfg.deepspeed, bf16=self.precision.bf16))
            self.metrics.set_peak(device_peak(self.dist.device, self.precision.dtype, cfg.metrics.peak_flops))
            self.metrics.log_event({"event": "precision", **self.precision.record()})
            if point is not None:
                self.checkpointer.check_batch(point, cfg)
            if point is None and cfg.init_from:
                # A new stage continues from the stage before: its weights, a fresh optimizer and schedule.
                from trainer.checkpoint_store import local_step
                from trainer.weights import load_initial_weights

                cache = Path(cfg.output_dir) / "init_from"
                if self.dist.rank == 0:
                    local_step(cfg.init_from, cache)  # one download from the object store, then every rank reads it
                if self.dist.world_size > 1:
                    torch_dist.barrier()
                source = load_initial_weights(self.model, cfg.init_from, cache)
                self.metrics.log_event({"event": "initialized", "from": cfg.init_from, "step": source["step"]})
            # The engine must know before it is built whether it loads shards of another world size.
            universal = self.checkpointer.needs_universal(point, cfg)
            engine_begun = time.perf_counter()
            self._build_engine(load_universal=universal)
            engine_s = time.perf_counter() - engine_begun
            if point is not None:
                self.checkpointer.restore(self, point, universal=universal)
                self.metrics.log_event({"event": "resumed", "step": point.step, "source": point.source,
                                        "path": str(point.path), "world_size": point.manifest["world_size"],
                                        "universal": universal})
            self.metrics.log_event(self._startup(begun, engine_s))
        except BaseException:
            self.watchdog.close()
            self.checkpointer.close(wait=False)
            self.metrics.close()
            raise

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

    def _new_model(self) -> None:
        torch.manual_seed(self.cfg.seed)  # identical initial weights on every rank
        self.model = CausalLM(self.cfg.model).to(self.dist.device)
        # This rank's own gradients (SDC check, per-layer health) are read by hooks on the model's parameters.
        self.probe = GradientProbe(self.model, self.faults)
        self.health = LayerHealth(self.cfg.health, self.model, self.probe, zero_stage=self.cfg.deepspeed.zero_stage)

    def _hosts(self) -> list[str]:
        """Each rank's node, by rank (stragglers and corrupt ranks are reported with it): Slurm's node name
        when under Slurm (what `srun --exclude` takes), else the host name."""
        mine = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        hosts = [mine]
        if self.dist.world_size > 1:
            hosts = [None] * self.dist.world_size
            torch_dist.all_gather_object(hosts, mine)
        return hosts

    def _pick_canary(self) -> dict | None:
        """The canary: the first micro-batch of the first held-out domain, the same on every rank."""
        if not (self.cfg.sdc.enabled and self.cfg.sdc.canary_interval):
            return None
        if not self.val_sources:
            self.metrics.log_event({"event": "canary_off", "reason": "no held-out data to take the canary batch from"})
            return None
        name, source = next(iter(self.val_sources.items()))
        return {"domain": name, "batch": source.batch(list(range(self.cfg.batch.micro_batch)))}

    def _build_engine(self, *, load_universal: bool = False) -> None:
        self.engine, self.optimizer, self.grad_norm = build_engine(self.model, self.cfg, self.dist,
                                                                   load_universal=load_universal)
        self.optimizer.gate = self._gate
        self._batch_size = self.cfg.batch.global_batch  # what the DeepSpeed engine is configured for

    # -- the guard's hook inside DeepSpeed's step -------------------------------------------------
    def _gate(self) -> bool:
        # Called by the client optimizer once per parameter group; judge once per step.
        p = self._pending
        if p.get("verdict") is None:
            p["verdict"] = self.guard.judge(step=p["step"], loss=p["loss"], grad_norm=self.grad_norm(),
                                            samples=p["samples"])
        elif math.isnan(p["verdict"].grad_norm) and math.isfinite(p["verdict"].loss):
            # Refused before DeepSpeed's step (an SDC outlier): its global grad norm is known only now.
            p["verdict"] = replace(p["verdict"], grad_norm=self.grad_norm())
        return p["verdict"].apply

    def _to_device(self, batch: dict) -> tuple[torch.Tensor, ...]:
        # Sources give numpy arrays (MixtureDataset) or tensors (TextSource).
        t = {k: torch.as_tensor(batch[k]).to(self.dist.device, non_blocking=True)
             for k in ("tokens", "doc_ids", "positions")}
        # Inputs are the first T tokens, targets the last T; mask and positions follow the inputs.
        return t["tokens"][:, :-1], t["tokens"][:, 1:], t["doc_ids"][:, :-1], t["positions"][:, :-1]

    def step(self) -> Verdict:
        """One optimizer step over one global batch (gradient accumulation inside), under the watchdog."""
        self.watchdog.arm(self.state.step)
        try:
            verdict = self._step()
        except BaseException:
            self.watchdog.pause()
            raise
        self.watchdog.disarm()
        return verdict

    def _step(self) -> Verdict:
        cfg, st, d = self.cfg, self.state, self.dist
        T, micro = cfg.batch.seq_len, cfg.batch.micro_batch
        B = batch_at(st.tokens, cfg.batch)
        if B != self._batch_size:
            self.engine.set_train_batch_size(B)  # changes only the gradient-accumulation steps
            self._batch_size = B
        accum = B // (micro * d.world_size)
        st.skip_to(B)
        indices = rank_indices(st.sample_index, B, d.rank, d.world_size)
        lr = lr_at(st.tokens + B * T, peak_lr=cfg.optim.lr, train_tokens=cfg.train_tokens, cfg=cfg.schedule)
        set_lr(self.optimizer, lr)
        self._pending = {"step": st.step, "samples": (st.sample_index, st.sample_index + B), "verdict": None}
        loss_sum = torch.zeros((), dtype=torch.float32, device=d.device)
        self.engine.train()
        # Busy time: this rank's own work (data, forward, backward outside the accumulation boundary), not
        # the time it waits for the others inside the boundary's gradient reduction: the straggler figure.
        started = time.perf_counter()
        self.faults.in_step(st.step)
        self.faults.blow_up(st.step, self.model.transformer.blocks)
        health_due = self.health.due(st.step)
        # This rank's gradient norms feed the SDC check (several ranks) and the health figures (their steps).
        self.probe.start(st.step, record=health_due or (cfg.sdc.enabled and d.world_size > 1))
        health_weights = self.health.start() if health_due else None
        busy = 0.0
        for m in range(accum):
            last = m == accum - 1
            batch = self.train_source.batch(indices[m * micro:(m + 1) * micro])
            inputs, targets, doc_ids, positions = self._to_device(batch)
            # DeepSpeed counts micro-steps over the whole run, so after a ramp changes the accumulation
            # its own boundary would fall mid-step: say where the boundary is.
            self.engine.set_gradient_accumulation_boundary(last)
            loss, _ = self.engine(inputs, targets, doc_ids, positions)
            if last:
                busy = time.perf_counter() - started
            self.engine.backward(loss)
            loss_sum += loss.detach().float()
            if last:
                # The guard needs the global mean loss before DeepSpeed's boundary step calls the gate; the
                # SDC and straggler checks need every rank's own loss, gradient norm and busy time.
                per_rank = self._gather([loss_sum, self.probe.local_norm(), torch.tensor(busy, device=d.device)])
                self._pending["loss"] = sum(r[0] for r in per_rank) / (accum * d.world_size)
                self._pending["figures"] = {"loss": [r[0] / accum for r in per_rank],
                                            "grad_norm": [r[1] for r in per_rank]}
                self._rank_busy = [r[2] for r in per_rank]
                self._pending["outliers"] = self.sdc.judge(st.step, self._pending["figures"])
                self._refuse_early(st.step)
            self.engine.step()
        if health_weights is not None:
            record, alarms = self.health.finish(st.step, health_weights)
            self.metrics.log_health(record)
            for alarm in alarms:
                self.metrics.log_event(alarm)
        for event in self.stragglers.observe(st.step, self._rank_busy):
            self.metrics.log_event(event)
            if event["event"] == "straggler" and cfg.straggler.drain and os.environ.get(DRAIN_ENV):
                self._drain = self._drain or event  # every rank sees the same figures: all stop together
        verdict = self._pending["verdict"]
        if verdict is None:
            # DeepSpeed found the gradients non-finite and skipped the update without asking the gate.
            verdict = self.guard.judge(step=st.step, loss=self._pending["loss"], grad_norm=float("nan"),
                                       samples=self._pending["samples"])
            assert not verdict.apply
        self.history.append({"step": st.step, "loss": verdict.loss, "grad_norm": verdict.grad_norm, "lr": lr,
                             "batch": B, "applied": verdict.apply, "samples": list(verdict.samples)})
        st.step += 1
        st.tokens += B * T
        st.sample_index += B
        self.metrics.count(B * T)
        if not verdict.apply:
            self.metrics.log_event({"event": "skip", "step": verdict.step, "samples": list(verdict.samples),
                                    "reason": verdict.reason, "loss": verdict.loss, "grad_norm": verdict.grad_norm})
        outliers = self._pending["outliers"]
        if self._pending.get("refused"):
            # Refused for the ranks' sake (SDC), not the data's: not a strike for the spike guard.
            for o in outliers:
                self.metrics.log_event({"event": "sdc", **o, "message": f"rank {o['rank']} (host {o['host']}): "
                                                                         f"{describe(o)}; step {o['step']} not applied"})
            self.sdc.commit(verdict.step, self._pending["figures"], outliers)  # raises after repeated offences
        else:
            self.sdc.commit(verdict.step, self._pending["figures"], [])
            self.guard.commit(verdict)  # raises when the run must stop
        if self._canary_batch is not None and self.canary.due(st.step):
            self._check_canary()
        return verdict

    def _refuse_early(self, step: int) -> None:
        """Decide before DeepSpeed's step that it must not be applied: a rank's figures are corrupt (or
        the test asked for a skip). Every rank decides alike: they all see the same gathered figures."""
        outliers = self._pending["outliers"]
        reason = None
        if outliers:
            reason = "sdc: " + " | ".join(f"rank {o['rank']} {describe(o)}" for o in outliers)
        elif self.faults.skip(step):
            reason = "skipped on purpose (PRETRAIN_TEST_FAULT)"
        if reason is not None:
            self._pending["refused"] = True
            self._pending["verdict"] = Verdict(step=step, apply=False, reason=reason, loss=self._pending["loss"],
                                               grad_norm=math.nan, samples=self._pending["samples"])

    def _gather(self, figures: list[torch.Tensor]) -> list[list[float]]:
        """Every rank's figures, by rank, as floats (one collective and one device sync per step)."""
        mine = torch.stack([f.detach().to(torch.float64).reshape(()) for f in figures])
        if self.dist.world_size == 1:
            return [mine.tolist()]
        everyone = [torch.empty_like(mine) for _ in range(self.dist.world_size)]
        torch_dist.all_gather(everyone, mine)
        return [t.tolist() for t in everyone]

    @torch.no_grad()
    def _check_canary(self) -> None:
        inputs, targets, doc_ids, positions = self._to_device(self._canary_batch["batch"])
        self.engine.eval()
        _, ce = self.engine(inputs, targets, doc_ids, positions)
        self.engine.train()
        losses = [r[0] for r in self._gather([ce.float()])]
        record = self.canary.observe(self.state.step, losses, self.hosts)
        record["domain"] = self._canary_batch["domain"]
        self.metrics.log_event(record)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean held-out loss per domain over eval_batches global batches (the same samples every time)."""
        cfg, d = self.cfg, self.dist
        n, micro = cfg.metrics.eval_batches * cfg.batch.global_batch, cfg.batch.micro_batch
        losses = {}
        self.engine.eval()
        for name, source in self.val_sources.items():
            indices = rank_indices(0, n, d.rank, d.world_size)
            total = torch.zeros((), dtype=torch.float64, device=d.device)
            for i in range(0, len(indices), micro):
                inputs, targets, doc_ids, positions = self._to_device(source.batch(indices[i:i + micro]))
                _, ce = self.engine(inputs, targets, doc_ids, positions)
                total += ce.double() * len(indices[i:i + micro])
            if d.world_size > 1:
                torch_dist.all_reduce(total)
            losses[name] = total.item() / n
        self.engine.train()
        return losses

    def fit(self) -> dict:
        cfg, st = self.cfg, self.state
        window: list[dict] = []
        val: dict[str, float] = {}
        ckpt = self.checkpointer
        finished = False
        try:
            while st.tokens < cfg.train_tokens:
                try:
                    self.step()
                except RollbackRequested as e:
                    self.rollback(e)
                    st, window = self.state, []
                    continue
                window.append(self.history[-1])
                last = st.tokens >= cfg.train_tokens
                if st.step % cfg.metrics.log_interval == 0 or last:
                    applied = [h for h in window if h["applied"]] or window
                    self.metrics.log_step(
                        step=st.step, tokens=st.tokens, loss=sum(h["loss"] for h in applied) / len(applied),
                        grad_norm=sum(h["grad_norm"] for h in applied) / len(applied), lr=window[-1]["lr"],
                        batch=window[-1]["batch"], rank_busy_s=self._rank_busy)
                    window = []
                if self.val_sources and cfg.metrics.eval_batches and (
                        last or (cfg.metrics.eval_interval and st.step % cfg.metrics.eval_interval == 0)):
                    val = self.evaluate()
                    self.metrics.log_eval(step=st.step, losses=val)
                if ckpt.due(st.step) or (last and cfg.checkpoint.save_final and st.step not in ckpt.saved):
                    ckpt.save(self)
                if self._drain is not None and not last:
                    self._stop_for_drain(ckpt)
            finished = True
        except GuardStop as e:
            self.metrics.log_event({"event": "guard_stop", "step": st.step, "message": str(e)})
            raise
        except DrainRequested:
            finished = True  # its checkpoint is what the next attempt starts from: upload it
            raise
        finally:
            # A finished run waits for its uploads (a committed step is never abandoned); a failed one does not.
            self.watchdog.close()
            ckpt.close(wait=finished)
            self.metrics.close()
        summary = {"steps": st.step, "tokens": st.tokens, "sample_index": st.sample_index, "val_loss": val,
                   "skipped": self.guard.skipped, "losses": [h["loss"] for h in self.history]}
        if self.dist.rank == 0:
            Path(cfg.output_dir, "summary.json").write_text(json.dumps(summary, indent=1))
        return summary

    def _stop_for_drain(self, ckpt: Checkpointer) -> None:
        """Checkpoint this step and stop, so the launcher restarts the job without the straggler's node."""
        event = self._drain
        if self.state.step not in ckpt.saved:
            ckpt.save(self)
        self.metrics.log_event({"event": "drain", "step": self.state.step, "rank": event["rank"], "host": event["host"]})
        raise DrainRequested(f"straggler: rank {event['rank']} on {event['host']} is persistently slow "
                             f"({event['message']}); stopping at step {self.state.step} (checkpointed) so the "
                             f"launcher restarts without {event['host']}", rank=event["rank"], host=event["host"])

    def rollback(self, e: RollbackRequested) -> None:
        """The guard's rollback: restore the newest checkpoint taken before the spike's data window,
        record the window (later checkpoints carry it, so a resume skips it too) and go on."""
        a, b = e.skip_window
        at = self.state.step
        point = self.checkpointer.before(a)
        if point is None:
            raise GuardStop(f"{e} No committed checkpoint was taken before global sample {a} to roll back to "
                            f"(see checkpoint.interval_steps / checkpoint.mtbf_hours).") from e
        # A fresh engine: ZeRO-3 cannot load into the partitioned module of a running one. The step may
        # come from another world size (the one this run resumed from).
        universal = self.checkpointer.needs_universal(point, self.cfg)
        self._new_model()
        self._build_engine(load_universal=universal)
        self.checkpointer.restore(self, point, universal=universal)
        self.state.skip_windows.append([a, b])
        if len(self.state.skip_windows) > self.cfg.guard.max_skipped:
            raise TooManySkips(f"spike guard: {len(self.state.skip_windows)} rollbacks, more than guard.max_skipped = "
                               f"{self.cfg.guard.max_skipped}; the run is unstable") from e
        self.history = [h for h in self.history if h["step"] < self.state.step]
        dropped = self.checkpointer.discard_after(point.step)
        self.metrics.log_event({"event": "rollback", "step": at, "to_step": point.step, "skip_window": [a, b],
                                "reason": str(e), "discarded_checkpoints": dropped})

    def state_dict(self) -> dict:
        """The loop's replayable state apart from model, optimizer and RNG (trainer.checkpoint adds those)."""
        return {"train": asdict(self.state), "guard": self.guard.state_dict(), "sdc": self.sdc.state_dict(),
                "canary": self.canary.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        train = dict(state["train"])
        train["skip_windows"] = [list(w) for w in train.get("skip_windows", [])]
        self.state = TrainState(**train)
        self.guard.load_state_dict(state["guard"])
        self.sdc.load_state_dict(state.get("sdc", {}))  # absent in checkpoints written before the SDC check
        self.canary.load_state_dict(state.get("canary", {}))


def train(cfg: RunConfig, *, train_source: BatchSource | None = None,
          val_sources: dict[str, BatchSource] | None = None,
          model_hook: Callable[[Trainer], None] | None = None) -> dict:
    """Run `cfg` to its token budget; returns a summary (also written to output_dir/summary.json)."""
    trainer = Trainer(cfg, train_source=train_source, val_sources=val_sources)
    if model_hook is not None:
        model_hook(trainer)
    return trainer.fit()
