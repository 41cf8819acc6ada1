"""The training loop: batch-size ramp, LR schedule, DeepSpeed step behind the spike guard, metrics.

    python -m trainer --config run.json                 # or under torchrun / deepspeed

Everything a checkpoint must carry to replay the run is in `Trainer.state_dict()`: step, tokens,
the global sample index (the data loader's whole state), the spike guard and the RNG.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Protocol

import torch
import torch.distributed as torch_dist

from trainer.config import RunConfig
from trainer.data import rank_indices
from trainer.engine import Dist, build_engine, init_distributed
from trainer.guard import GuardStop, SpikeGuard, Verdict
from trainer.metrics import Metrics, device_peak, flops_per_token
from trainer.model import CausalLM
from trainer.optim import batch_at, lr_at, set_lr


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

    weights = d.weights or {name: 1.0 for name in d.shards}
    train = MixtureDataset(DataConfig(shards=dict(d.shards), weights=weights, seq_len=T, seed=cfg.seed, split="train"))
    val = {name: MixtureDataset(DataConfig(shards={name: folder}, weights={name: 1.0}, seq_len=T, seed=cfg.seed,
                                           split="val"))
           for name, folder in d.shards.items()}
    return train, val


@dataclass
class TrainState:
    step: int = 0  # optimizer steps taken (applied or skipped)
    tokens: int = 0  # tokens consumed
    sample_index: int = 0  # global index of the next sample: the data loader's whole state


class Trainer:
    def __init__(self, cfg: RunConfig, *, dist: Dist | None = None, train_source: BatchSource | None = None,
                 val_sources: dict[str, BatchSource] | None = None):
        self.cfg = cfg
        self.dist = dist or init_distributed()
        if train_source is None:
            train_source, built_val = build_sources(cfg)
            val_sources = built_val if val_sources is None else val_sources
        self.train_source, self.val_sources = train_source, val_sources or {}
        vocab = getattr(train_source, "vocab_size", None)
        if vocab is not None and vocab > cfg.model.vocab_size:
            raise ValueError(
                f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the data's vocabulary ({vocab})")
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        self.model = CausalLM(cfg.model).to(self.dist.device)
        n_matmul = self.model.transformer.num_params(exclude_embedding=True)  # before ZeRO-3 partitions it
        self.n_params = self.model.transformer.num_params()
        self.engine, self.optimizer, self.grad_norm = build_engine(self.model, cfg, self.dist)
        self.optimizer.gate = self._gate
        self.guard = SpikeGuard(cfg.guard)
        self.state = TrainState()
        self.metrics = Metrics(cfg.metrics, cfg.output_dir, rank=self.dist.rank,
                               flops_per_token=flops_per_token(n_matmul, cfg.model, cfg.batch.seq_len),
                               peak=device_peak(self.dist.device, cfg.metrics.peak_flops),
                               train_tokens=cfg.train_tokens)
        self._batch_size = cfg.batch.global_batch  # what the DeepSpeed engine is configured for
        self._pending: dict = {}
        self.history: list[dict] = []  # per step: step, loss, grad_norm, lr, batch, applied, samples

    # -- the guard's hook inside DeepSpeed's step -------------------------------------------------
    def _gate(self) -> bool:
        # Called by the client optimizer once per parameter group; judge once per step.
        if self._pending.get("verdict") is None:
            p = self._pending
            p["verdict"] = self.guard.judge(step=p["step"], loss=p["loss"], grad_norm=self.grad_norm(),
                                            samples=p["samples"])
        return self._pending["verdict"].apply

    def _to_device(self, batch: dict) -> tuple[torch.Tensor, ...]:
        # Sources give numpy arrays (MixtureDataset) or tensors (TextSource).
        t = {k: torch.as_tensor(batch[k]).to(self.dist.device, non_blocking=True)
             for k in ("tokens", "doc_ids", "positions")}
        # Inputs are the first T tokens, targets the last T; mask and positions follow the inputs.
        return t["tokens"][:, :-1], t["tokens"][:, 1:], t["doc_ids"][:, :-1], t["positions"][:, :-1]

    def step(self) -> Verdict:
        """One optimizer step over one global batch (gradient accumulation inside)."""
        cfg, st, d = self.cfg, self.state, self.dist
        T, micro = cfg.batch.seq_len, cfg.batch.micro_batch
        B = batch_at(st.tokens, cfg.batch)
        if B != self._batch_size:
            self.engine.set_train_batch_size(B)  # changes only the gradient-accumulation steps
            self._batch_size = B
        accum = B // (micro * d.world_size)
        indices = rank_indices(st.sample_index, B, d.rank, d.world_size)
        lr = lr_at(st.tokens + B * T, peak_lr=cfg.optim.lr, train_tokens=cfg.train_tokens, cfg=cfg.schedule)
        set_lr(self.optimizer, lr)
        self._pending = {"step": st.step, "samples": (st.sample_index, st.sample_index + B), "verdict": None}
        loss_sum = torch.zeros((), dtype=torch.float32, device=d.device)
        self.engine.train()
        for m in range(accum):
            batch = self.train_source.batch(indices[m * micro:(m + 1) * micro])
            inputs, targets, doc_ids, positions = self._to_device(batch)
            # DeepSpeed counts micro-steps over the whole run, so after a ramp changes the accumulation
            # its own boundary would fall mid-step: say where the boundary is.
            self.engine.set_gradient_accumulation_boundary(m == accum - 1)
            loss, _ = self.engine(inputs, targets, doc_ids, positions)
            self.engine.backward(loss)
            loss_sum += loss.detach().float()
            if m == accum - 1:
                # The guard needs the global mean loss before DeepSpeed's boundary step calls the gate.
                if d.world_size > 1:
                    torch_dist.all_reduce(loss_sum)
                self._pending["loss"] = loss_sum.item() / (accum * d.world_size)
            self.engine.step()
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
        self.guard.commit(verdict)  # raises when the run must stop
        return verdict

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
        try:
            while st.tokens < cfg.train_tokens:
                self.step()
                window.append(self.history[-1])
                last = st.tokens >= cfg.train_tokens
                if st.step % cfg.metrics.log_interval == 0 or last:
                    applied = [h for h in window if h["applied"]] or window
                    self.metrics.log_step(
                        step=st.step, tokens=st.tokens, loss=sum(h["loss"] for h in applied) / len(applied),
                        grad_norm=sum(h["grad_norm"] for h in applied) / len(applied), lr=window[-1]["lr"],
                        batch=window[-1]["batch"])
                    window = []
                if self.val_sources and cfg.metrics.eval_batches and (
                        last or (cfg.metrics.eval_interval and st.step % cfg.metrics.eval_interval == 0)):
                    val = self.evaluate()
                    self.metrics.log_eval(step=st.step, losses=val)
        except GuardStop as e:
            self.metrics.log_event({"event": "guard_stop", "step": st.step, "message": str(e)})
            raise
        finally:
            self.metrics.close()
        summary = {"steps": st.step, "tokens": st.tokens, "sample_index": st.sample_index, "val_loss": val,
                   "skipped": self.guard.skipped, "losses": [h["loss"] for h in self.history]}
        if self.dist.rank == 0:
            Path(cfg.output_dir, "summary.json").write_text(json.dumps(summary, indent=1))
        return summary

    def state_dict(self) -> dict:
        """The loop's whole replayable state apart from model and optimizer (a checkpoint adds those)."""
        return {"train": asdict(self.state), "guard": self.guard.state_dict(),
                "rng": {"torch": torch.get_rng_state(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                "config": self.cfg.to_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.state = TrainState(**state["train"])
        self.guard.load_state_dict(state["guard"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])


def train(cfg: RunConfig, *, train_source: BatchSource | None = None,
          val_sources: dict[str, BatchSource] | None = None,
          model_hook: Callable[[Trainer], None] | None = None) -> dict:
    """Run `cfg` to its token budget; returns a summary (also written to output_dir/summary.json)."""
    trainer = Trainer(cfg, train_source=train_source, val_sources=val_sources)
    if model_hook is not None:
        model_hook(trainer)
    return trainer.fit()
