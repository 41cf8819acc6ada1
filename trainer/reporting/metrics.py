"""Training metrics: a progress line with ETA on stdout, a JSONL file and TensorBoard event files.

MFU = (6N + 12·L·T·d) · tokens/s ÷ (peak FLOP/s per device × devices), with N the parameters outside the
input embedding (a lookup, not a matmul: ParameterCount.matmul, the head included) and 12·L·T·d the attention
scores and values (PaLM appendix B): trainer.model.config.flops_per_token, the planner's count too.
The peak is that of the dtype the run computes in: from a device table on known GPUs; on a CPU the best
matmul rate measured once per machine, dtype and thread count and cached under PRETRAIN_HOME
(trainer.reporting.peak), labelled as measured.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from trainer.model.config import ModelConfig
from trainer.reporting.config import MetricsConfig
from trainer.model.config import flops_per_token as _flops_per_token
from trainer.reporting.peak import Peak
from trainer.reporting.pipes import PipesReporter


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """The model's training FLOPs per token, from its config (the same under ZeRO-3, TP or PP as on one device)."""
    return _flops_per_token(cfg.parameter_count(), layers=cfg.n_layers, d_model=cfg.d_model, seq_len=seq_len)


def _eta(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Metrics:
    """Writes on rank 0 only; every rank may call it."""

    def __init__(self, cfg: MetricsConfig, output_dir: str | Path, *, rank: int, flops_per_token: float,
                 train_tokens: int, world_size: int = 1, peak: Peak | None = None):
        self.cfg = cfg
        self.active = rank == 0
        self.flops_per_token = flops_per_token
        self.world_size = world_size  # tokens/s are the whole job's: MFU divides by every device's peak
        self.peak = peak  # set once the run's precision is known (set_peak)
        self.train_tokens = train_tokens
        self.jsonl = None
        self.tb = None
        if self.active:
            out = Path(output_dir)
            out.mkdir(parents=True, exist_ok=True)
            self.jsonl = (out / "metrics.jsonl").open("a")
            if cfg.tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out / "tensorboard"))
        self._window_start = time.perf_counter()
        self._window_tokens = 0
        self._run_start = self._window_start
        # Under Dagster Pipes (the launcher resource), records and progress lines also go to the asset.
        self.pipes = PipesReporter.open(rank)

    def set_peak(self, peak: Peak) -> None:
        self.peak = peak

    def count(self, tokens: int) -> None:
        self._window_tokens += tokens

    def log_step(self, *, step: int, tokens: int, loss: float, grad_norm: float, lr: float, batch: int,
                 rank_busy_s: list[float] | None = None) -> dict:
        """Summarise the window since the last call (throughput is over the whole window)."""
        now = time.perf_counter()
        elapsed = max(now - self._window_start, 1e-9)
        tps = self._window_tokens / elapsed
        per_device = self.flops_per_token * tps / self.world_size
        # A device cannot beat its own peak: a measured one that it beats was measured low (a loaded machine).
        self.peak.raise_to(per_device)
        mfu = per_device / self.peak.flops
        self._window_start, self._window_tokens = now, 0
        run_tps = tokens / max(now - self._run_start, 1e-9)
        eta = (self.train_tokens - tokens) / run_tps if run_tps > 0 else 0.0
        record = {"event": "train", "step": step, "tokens": tokens, "loss": loss, "grad_norm": grad_norm,
                  "lr": lr, "batch": batch, "tokens_per_s": tps, "mfu": mfu, "peak": self.peak.label,
                  "time": time.time()}
        if rank_busy_s:
            record["rank_busy_s"] = [round(t, 4) for t in rank_busy_s]  # the last step's, per rank (stragglers)
        if self.active:
            print(
                f"step {step:>6} | tokens {tokens:>12,} ({100 * tokens / self.train_tokens:5.1f}%) | loss {loss:.4f} | "
                f"gnorm {grad_norm:.3f} | lr {lr:.2e} | batch {batch} | {tps:,.0f} tok/s | "
                f"MFU {100 * mfu:.2f}% ({self.peak.label}) | ETA {_eta(eta)}",
                flush=True,
            )
            self._write(record)
            self._log(f"step {step} | loss {loss:.4f} | lr {lr:.2e} | {tps:,.0f} tok/s | MFU {100 * mfu:.2f}%")
            for key in ("loss", "grad_norm", "lr", "tokens_per_s", "mfu", "batch"):
                self._scalar(f"train/{key}", record[key], step)
            for rank, seconds in enumerate(rank_busy_s or []):
                self._scalar(f"ranks/busy_s/{rank}", seconds, step)
        return record

    def log_eval(self, *, step: int, losses: dict[str, float]) -> None:
        if not self.active:
            return
        print(f"step {step:>6} | validation " + " | ".join(f"{k} {v:.4f}" for k, v in losses.items()), flush=True)
        self._write({"event": "eval", "step": step, "val_loss": losses, "time": time.time()})
        self._log(f"step {step} | validation " + " | ".join(f"{k} {v:.4f}" for k, v in losses.items()))
        for name, value in losses.items():
            self._scalar(f"val/{name}", value, step)

    def log_downstream(self, *, step: int, tokens: int, tasks: dict[str, dict], seconds: float) -> None:
        """Zero-shot figures during training (trainer.evaluation.evaluate.Downstream), by task: its headline metric and n."""
        if not self.active:
            return
        line = f"step {step:>6} | zero-shot " + " | ".join(
            f"{name} {r['metric']} {r.get(r['metric'], math.nan):.3f}" for name, r in tasks.items())
        print(f"{line} ({seconds:.1f} s)", flush=True)
        self._write({"event": "downstream", "step": step, "tokens": tokens, "tasks": tasks,
                     "seconds": round(seconds, 3), "time": time.time()})
        self._log(line)
        for name, r in tasks.items():
            self._scalar(f"downstream/{name}_{r['metric']}", r.get(r["metric"], math.nan), step)

    def log_health(self, record: dict) -> None:
        """Per-layer health figures (trainer.health.layers): the metrics file and TensorBoard, no progress line."""
        if not self.active:
            return
        self._write({**record, "time": time.time()})
        for layer, figures in record["layers"].items():
            for metric, value in figures.items():
                self._scalar(f"health/{layer}/{metric}", value, record["step"])

    def log_event(self, record: dict) -> None:
        """Anything else worth keeping (a skipped step, the run's end)."""
        if self.active:
            line = " | ".join(f"{k} {v}" for k, v in record.items())
            print(line, flush=True)
            self._write(record)
            self._log(line)

    def _write(self, record: dict) -> None:
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.pipes is not None:
            self.pipes.record(record)

    def _log(self, line: str) -> None:
        if self.pipes is not None:
            self.pipes.log(line)

    def _scalar(self, tag: str, value: float, step: int) -> None:
        if self.tb is not None and math.isfinite(value):
            self.tb.add_scalar(tag, value, step)

    def close(self) -> None:
        if self.pipes is not None:
            self.pipes.close()
            self.pipes = None
        if self.jsonl is not None:
            self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
