"""The trainer's configuration: one kw-only dataclass per component, composed by RunConfig.

    cfg = load_run_config("run.json")   # ValueError naming the bad field: "run.json: model.n_heads: ..."

`run.json` mirrors these dataclasses field by field; unknown keys are refused so a typo never
silently falls back to a default. Sizes of the training run are in tokens (`train_tokens`,
`warmup_tokens`, `ramp_tokens`) so a batch-size ramp never changes the token schedule.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Llama-style decoder shape (RMSNorm pre-norm, SwiGLU, RoPE, GQA, no biases, untied head)."""

    vocab_size: int = 50257
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None = n_heads (plain multi-head attention)
    d_ff: int | None = None  # None = 8/3 · d_model rounded up to a multiple of 64 (Llama's rule)
    rope_base: float = 10000.0  # long-context stages raise it
    qk_norm: bool = False
    z_loss: float = 0.0  # coefficient of log²Z, the squared log of the softmax normalizer
    norm_eps: float = 1e-5
    init_std: float = 0.02
    attention: Literal["auto", "flex", "sdpa"] = "auto"  # auto: FlexAttention on CUDA, SDPA elsewhere
    doc_positions: bool = True  # RoPE positions restart at each document of a packed sequence

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"model: head dim d_model/n_heads = {self.d_model // self.n_heads} must be even for RoPE")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"model.n_heads ({self.n_heads}) must be divisible by model.n_kv_heads ({self.kv_heads})")
        if self.z_loss < 0:
            raise ValueError(f"model.z_loss must be >= 0, got {self.z_loss}")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ff_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else -(-(8 * self.d_model // 3) // 64) * 64


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW; weight decay on matrices only (norm gains never, embeddings only if asked)."""

    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_embeddings: bool = False
    grad_clip: float = 1.0  # global grad-norm clip, applied by DeepSpeed

    def __post_init__(self):
        object.__setattr__(self, "betas", tuple(self.betas))
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {self.betas}")
        if self.grad_clip < 0:
            raise ValueError(f"optim.grad_clip must be >= 0 (0 = off), got {self.grad_clip}")


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """LR over tokens: linear warmup, then cosine to a floor, or warmup-stable-decay (WSD)."""

    kind: Literal["cosine", "wsd", "constant"] = "cosine"
    warmup_tokens: int = 0
    min_lr_ratio: float = 0.1  # the floor, as a fraction of the peak LR
    decay_fraction: float = 0.2  # wsd: the LR decays linearly over this last fraction of train_tokens

    def __post_init__(self):
        if self.warmup_tokens < 0:
            raise ValueError(f"schedule.warmup_tokens must be >= 0, got {self.warmup_tokens}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"schedule.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not 0 < self.decay_fraction <= 1:
            raise ValueError(f"schedule.decay_fraction must be in (0, 1], got {self.decay_fraction}")


@dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """Batch in sequences of seq_len tokens; the ramp grows it in steps of ramp_start sequences."""

    global_batch: int = 32  # sequences per optimizer step (all ranks, all micro-batches)
    micro_batch: int = 8  # sequences per rank per forward/backward
    seq_len: int = 256
    # Ramp: start at ramp_start sequences and grow linearly (in multiples of ramp_start) to global_batch
    # over the first ramp_tokens tokens. Multiples keep every step's batch independent of the world size.
    ramp_start: int | None = None
    ramp_tokens: int = 0

    def __post_init__(self):
        for name in ("global_batch", "micro_batch", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"batch.{name} must be >= 1, got {getattr(self, name)}")
        if self.ramp_start is not None:
            if self.ramp_start < 1 or self.global_batch % self.ramp_start:
                raise ValueError(
                    f"batch.ramp_start ({self.ramp_start}) must be >= 1 and divide "
                    f"batch.global_batch ({self.global_batch})"
                )
            if self.ramp_tokens < 0:
                raise ValueError(f"batch.ramp_tokens must be >= 0, got {self.ramp_tokens}")

    def check_world(self, world_size: int) -> None:
        """Every batch the run will use must split into whole micro-batches on every rank."""
        unit = self.micro_batch * world_size
        smallest = self.ramp_start if self.ramp_start is not None else self.global_batch
        if smallest % unit:
            name = "batch.ramp_start" if self.ramp_start is not None else "batch.global_batch"
            raise ValueError(
                f"{name} ({smallest}) must be a multiple of batch.micro_batch × world size "
                f"({self.micro_batch} × {world_size} = {unit})"
            )


@dataclass(frozen=True, kw_only=True)
class DeepSpeedConfig:
    zero_stage: Literal[0, 1, 2, 3] = 0
    # bf16 weights and activations with fp32 master weights in the optimizer, or fp32 throughout. "auto":
    # bf16 where the device computes it natively (trainer.precision), fp32 elsewhere; true / false force it.
    bf16: bool | Literal["auto"] = "auto"

    def __post_init__(self):
        if self.bf16 not in (True, False, "auto"):
            raise ValueError(f'deepspeed.bf16: expected true, false or "auto", got {self.bf16!r}')


@dataclass(frozen=True, kw_only=True)
class GuardConfig:
    """Spike guard: skip outlier steps, stop for a rollback after repeated strikes."""

    enabled: bool = True
    warmup_steps: int = 10  # applied steps before outliers are judged (running averages settle)
    ema_beta: float = 0.9  # running averages of loss and grad norm over applied steps
    loss_ratio: float = 1.5  # outlier: loss > loss_ratio × running loss
    grad_norm_ratio: float = 5.0  # outlier: pre-clip grad norm > ratio × running grad norm
    max_strikes: int = 3  # this many skipped steps within strike_window steps -> rollback request
    strike_window: int = 50
    max_skipped: int = 20  # more skipped steps than this in a run -> stop loudly

    def __post_init__(self):
        if not 0 <= self.ema_beta < 1:
            raise ValueError(f"guard.ema_beta must be in [0, 1), got {self.ema_beta}")
        for name in ("loss_ratio", "grad_norm_ratio"):
            if getattr(self, name) <= 1:
                raise ValueError(f"guard.{name} must be > 1, got {getattr(self, name)}")
        for name in ("max_strikes", "strike_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"guard.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    log_interval: int = 10  # steps between progress lines / metric records
    eval_interval: int = 0  # steps between per-domain validation losses (0 = only at the end)
    eval_batches: int = 2  # global batches of held-out data per domain per evaluation
    tensorboard: bool = True
    peak_flops: float | None = None  # overrides the device table for MFU

    def __post_init__(self):
        if self.log_interval < 1:
            raise ValueError(f"metrics.log_interval must be >= 1, got {self.log_interval}")
        if self.eval_interval < 0 or self.eval_batches < 0:
            raise ValueError("metrics.eval_interval and metrics.eval_batches must be >= 0")


@dataclass(frozen=True, kw_only=True)
class WatchdogConfig:
    """Hangs: a step that does not finish in time ends the job naming the rank and step (trainer.watchdog)."""

    enabled: bool = True
    step_factor: float = 20.0  # timeout = step_factor × the median of the recent step times ...
    min_timeout_s: float = 180.0  # ... but never less than this (noise, a slow checkpoint's aftermath)
    first_steps_timeout_s: float = 1800.0  # the first steps (compilation, warm caches, a resume's load)
    first_steps: int = 3
    collective_timeout_s: float = 1800.0  # the NCCL / gloo timeout of every collective: the backstop

    def __post_init__(self):
        if self.step_factor <= 1:
            raise ValueError(f"watchdog.step_factor must be > 1, got {self.step_factor}")
        for name in ("min_timeout_s", "first_steps_timeout_s", "collective_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"watchdog.{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class SDCConfig:
    """Silent data corruption (trainer.rank_checks): every step each rank's own loss and gradient norm
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

    def __post_init__(self):
        for name in ("grad_norm_ratio", "loss_ratio"):
            if getattr(self, name) <= 1:
                raise ValueError(f"sdc.{name} must be > 1, got {getattr(self, name)}")
        for name in ("history", "max_offences", "canary_history"):
            if getattr(self, name) < 1:
                raise ValueError(f"sdc.{name} must be >= 1, got {getattr(self, name)}")
        if self.canary_interval < 0 or self.canary_tolerance <= 0:
            raise ValueError("sdc.canary_interval must be >= 0 and sdc.canary_tolerance > 0")


@dataclass(frozen=True, kw_only=True)
class StragglerConfig:
    """Per-rank step time (its own work, outside the collectives the loop can see) against the other ranks."""

    enabled: bool = True
    factor: float = 1.5  # slow: its time > factor × the median of the other ranks' ...
    min_excess_s: float = 0.02  # ... and more than this many seconds above it (tiny steps are all noise)
    window: int = 10  # reported when slow in `steps` of the last `window` steps
    steps: int = 5
    # Also drain it: checkpoint, stop (exit 6) and let the launcher restart without its node, when the
    # launcher can (Slurm with more than one node: it sets PRETRAIN_LAUNCHER_CAN_DRAIN); else only report.
    drain: bool = False

    def __post_init__(self):
        if self.factor <= 1:
            raise ValueError(f"straggler.factor must be > 1, got {self.factor}")
        if not 1 <= self.steps <= self.window:
            raise ValueError(f"straggler.steps must be in [1, straggler.window], got {self.steps}")


@dataclass(frozen=True, kw_only=True)
class HealthConfig:
    """Per-layer weight and activation RMS and gradient norms every `interval` steps (trainer.health)."""

    interval: int = 100  # 0 = off
    growth: float = 3.0  # flagged: a figure above growth × the median of its recent values
    history: int = 5

    def __post_init__(self):
        if self.interval < 0:
            raise ValueError(f"health.interval must be >= 0, got {self.interval}")
        if self.growth <= 1:
            raise ValueError(f"health.growth must be > 1, got {self.growth}")
        if self.history < 1:
            raise ValueError(f"health.history must be >= 1, got {self.history}")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """When and where checkpoints go: local disk first (committed atomically), then the object store
    in a background thread. Layout: <local_dir>/step-<N>/ and <remote>/checkpoints/<stage>/<run_name>/step-<N>/."""

    interval_steps: int = 0  # save every N optimizer steps; 0 = no fixed interval
    mtbf_hours: float | None = None  # automatic interval by Young's rule sqrt(2 · save time · MTBF)
    local_dir: str | None = None  # None = <output_dir>/checkpoints
    remote: str | None = None  # object-store URL (path, file://, s3://bucket/prefix); None = local only
    run_name: str = "run"
    keep_last: int = 3  # the newest k committed checkpoints are kept, locally and remotely
    keep_every: int = 0  # and every step that is a multiple of this, permanently (0 = none)
    save_final: bool = True  # a checkpoint at the end of the run
    resume: bool = True  # start from the newest committed checkpoint (local, else remote) when there is one
    allow_batch_change: bool = False  # resuming with a different global batch is refused unless this is set
    upload_retry_max_s: float = 30.0  # the background upload retries with backoff up to this pause, forever

    def __post_init__(self):
        for name in ("interval_steps", "keep_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"checkpoint.{name} must be >= 0, got {getattr(self, name)}")
        if self.keep_last < 1:
            raise ValueError(f"checkpoint.keep_last must be >= 1, got {self.keep_last}")
        if self.mtbf_hours is not None and self.mtbf_hours <= 0:
            raise ValueError(f"checkpoint.mtbf_hours must be > 0, got {self.mtbf_hours}")
        if not self.run_name or "/" in self.run_name:
            raise ValueError(f"checkpoint.run_name must be a non-empty name without '/', got {self.run_name!r}")


@dataclass(frozen=True, kw_only=True)
class DataSection:
    """Where the tokens come from: packed shards (trainer.data) or, for demos and tests, one text file."""

    shards: dict[str, str] = field(default_factory=dict)  # source name -> packed-shard folder
    weights: dict[str, float] = field(default_factory=dict)  # source name -> mixture weight
    min_doc_tokens: int = 0  # packed shards: only documents this long (long-context stages); 0 = all
    text: str | None = None  # a plain text file, documents separated by blank lines
    tokenizer: str | None = None  # tokenizer.json for `text`
    val_fraction: float = 0.1  # `text`: the last documents held out for validation
    top_tokens: int | None = None  # `text`: keep this many token ids (trainer.text_source); None = all

    def __post_init__(self):
        if self.text is None and not self.shards:
            raise ValueError("data: give either data.shards (packed shards) or data.text (+ data.tokenizer)")
        if self.text is not None and self.shards:
            raise ValueError("data: give data.shards or data.text, not both")
        if self.text is not None and self.tokenizer is None:
            raise ValueError("data.tokenizer: a tokenizer.json is needed with data.text")
        unknown = set(self.weights) - set(self.shards)
        if unknown:
            raise ValueError(f"data.weights: sources {sorted(unknown)} are not in data.shards")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run (a stage: main, long-context, anneal) = these configs, nothing else."""

    data: DataSection
    train_tokens: int
    output_dir: str
    stage: str = "main"
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    sdc: SDCConfig = field(default_factory=SDCConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    # A committed checkpoint step (path, file:// or s3://…/step-<N>) whose weights start this run: how a
    # long-context stage continues from the stage before. Optimizer and schedule start fresh; a resume wins.
    init_from: str | None = None
    tokenizer_sha256: str | None = None  # recorded in every checkpoint manifest
    # Data and code versions of everything upstream, passed in by the Dagster layer; recorded in every
    # checkpoint manifest: [{asset, data_version, code_version, run_id}, ...] from this stage back to raw.
    lineage: list[dict] = field(default_factory=list)

    def __post_init__(self):
        if self.train_tokens < 1:
            raise ValueError(f"train_tokens must be >= 1, got {self.train_tokens}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def from_dict(cls, data, where: str = ""):
    """Build dataclass `cls` from plain JSON data; errors name the field path (`model.n_heads`)."""
    return _convert(cls, data, where)


def load_run_config(path: str | Path) -> RunConfig:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the run config: {e}") from e
    try:
        return from_dict(RunConfig, data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def _convert(tp, value, where: str):
    origin = typing.get_origin(tp)
    label = where or "the config"
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"{label}: expected an object, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp) if f.init}
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ValueError(f"{_join(where, unknown[0])}: unknown field (known: {', '.join(sorted(fields))})")
        missing = [
            n for n, f in fields.items()
            if n not in value and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ValueError(f"{_join(where, missing[0])}: required field missing")
        kwargs = {k: _convert(hints[k], v, _join(where, k)) for k, v in value.items()}
        try:
            return tp(**kwargs)
        except ValueError as e:
            # __post_init__ messages already name their field ("model.n_heads ...").
            raise ValueError(str(e) if not where or str(e).startswith(where) else f"{where}: {e}") from e
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if len(errors) == 1 else f"{label}: {value!r} matches none of {tp}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices or isinstance(value, bool) != isinstance(choices[0], bool):
            raise ValueError(f"{label}: must be one of {list(choices)}, got {value!r}")
        return value
    if origin is dict:
        kt, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ValueError(f"{label}: expected an object, got {type(value).__name__}")
        return {_convert(kt, k, f"{label}[{k!r}]"): _convert(vt, v, f"{where}.{k}") for k, v in value.items()}
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ValueError(f"{label}: expected a list, got {type(value).__name__}")
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is dict:  # free-form JSON object (a lineage record)
        if not isinstance(value, dict):
            raise ValueError(f"{label}: expected an object, got {type(value).__name__}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ValueError(f"{label}: expected a list of {len(args)} items, got {value!r}")
        return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{label}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)  # 1e6 in JSON is a float
            raise ValueError(f"{label}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{label}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{label}: expected a string, got {value!r}")
        return value
    raise AssertionError(f"unsupported config type {tp} at {label}")


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
