"""The trainer's configuration: one pydantic model per component, composed by RunConfig.

    cfg = load_run_config("run.json")   # ValueError naming the bad field: "run.json: model.n_heads: ..."

`run.json` mirrors these models field by field, validated by pydantic as the recipe is (assets/recipe.py):
unknown keys are refused so a typo never silently falls back to a default, and nothing is coerced ("2" is
not 2, 1 is not true). Sizes of the training run are in tokens (`train_tokens`, `warmup_tokens`,
`ramp_tokens`) so a batch-size ramp never changes the token schedule.

Long because every section a run.json can hold is here with its checks, in one place to read, as the recipe's
stages (assets/stages.py) validate against them; splitting it would scatter one schema over several files.
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class _Config(BaseModel):
    """What every section shares: frozen, unknown keys refused, values taken as JSON gives them."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _whole_numbers(cls, value, info):
        # JSON has one number type: json.dumps(2e6) reads back as 2000000.0, which an int field takes.
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, float) and value.is_integer() and int in (typing.get_args(annotation) or (annotation,)):
            return int(value)
        return value

    @model_validator(mode="after")
    def _checked(self):
        self._check()
        return self

    def _check(self) -> None:
        """A section's own rules, beyond the types; a ValueError names the field by its path in run.json."""


@dataclass(frozen=True)
class ParameterCount:
    """A Llama-style model's weights, counted once (count_parameters, through ModelConfig.parameter_count and the
    planner's ModelShape.parameter_count) for the planner, MFU and the scaling ladder, each reading its own figure:

    - `total`: every weight, each once (a tied head shares the embedding's): memory, optimizer state, checkpoints,
      and the N of the scaling ladder's law (Hoffmann et al. 2022's count; assets/scaling/section.py says why not
      Kaplan's non-embedding one at a ladder's sizes).
    - `non_embedding`: all but the input embedding and the output head (Kaplan et al. 2020's N), for comparison with
      laws fitted on that count.
    - `matmul`: the weights a token is multiplied through, all but the input embedding (a lookup, no FLOPs) with
      the head's matrix counted even where it is the embedding's: 6·matmul is the training FLOPs per token before
      attention's 12·L·T·d (flops_per_token: MFU and the planner's GPU-hours).
    """

    embedding: int  # the input embedding, vocab × d_model
    head: int  # the output head's own matrix: vocab × d_model, 0 when tied to the embedding
    body: int  # the blocks (attention, MLP, their norms) and the final norm
    tied: bool = False

    @property
    def total(self) -> int:
        return self.embedding + self.head + self.body

    @property
    def non_embedding(self) -> int:
        return self.body

    @property
    def matmul(self) -> int:
        return self.body + (self.embedding if self.tied else self.head)


def count_parameters(*, vocab: int, d_model: int, layers: int, heads: int, kv_heads: int, d_ff: int,
                     qk_norm: bool = False, tied: bool = False) -> ParameterCount:
    """The weights of trainer.model.transformer's layout (no biases, RMSNorm one gain vector; per layer q, k, v, o,
    the SwiGLU's gate, up and down, two norms and, with QK-norm, a gain of head_dim each on queries and keys)."""
    head_dim = d_model // heads
    attention = 2 * d_model * d_model + 2 * d_model * kv_heads * head_dim  # q and o; k and v (grouped)
    mlp = 3 * d_model * d_ff
    norms = 2 * d_model + (2 * head_dim if qk_norm else 0)
    matrix = vocab * d_model
    return ParameterCount(embedding=matrix, head=0 if tied else matrix,
                          body=layers * (attention + mlp + norms) + d_model, tied=tied)  # + d_model: the final norm


def flops_per_token(params: ParameterCount, *, layers: int, d_model: int, seq_len: int,
                    attention: bool = True) -> float:
    """Training FLOPs per token, forward and backward: 6 per weight multiplied through (params.matmul) plus
    12·L·T·d for the attention scores and their weighted sum (PaLM appendix B; not halved for causality).
    attention=False leaves that term out: the 6·N·D of cost tables."""
    return 6 * params.matmul + (12 * layers * seq_len * d_model if attention else 0)


class ModelConfig(_Config):
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
    # Recompute activations in the backward pass instead of keeping them (memory for ~1/3 more compute):
    # none; full: whole blocks, every `checkpoint_every`-th one (1: all); selective: the attention half of every
    # block (its norm, projections and attention), the MLP's activations kept.
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    checkpoint_every: int = 1
    # torch.compile of every block (names and checkpoints unchanged); None: on CUDA only, where it pays for its
    # compile time (on a CPU it costs more than a short run gains).
    compile: bool | None = None
    # standard: today's model (init_std everywhere, 1/sqrt(head dim) attention, one LR). mup: Tensor Programs V's
    # μP for Adam (trainer.model.transformer.Transformer.width_mult): the model at d_model = mup_base_width (same
    # n_heads, n_layers) is the standard one, and an LR tuned there holds at other widths. Changes the model's
    # function, so a checkpoint resumes, continues or initialises only a run of the same mup settings.
    parametrization: Literal["standard", "mup"] = "standard"
    mup_base_width: int | None = None  # the width the LR was tuned at (mup only, where it is required)
    # The base model's head dim, which the attention scale √(base d_head)/d_head keeps at the base width's. None:
    # mup_base_width / n_heads (the heads keep their number and grow). Give it where the heads keep their size and
    # grow in number (a ladder of d_model 64 with 4 heads, 128 with 8): their head dim, so the scale stays 1/√d_head.
    mup_base_head_dim: int | None = None

    def _check(self) -> None:
        if self.parametrization == "mup":
            if self.mup_base_width is None:
                raise ValueError("model.mup_base_width: required with model.parametrization = \"mup\" (the width "
                                 "whose tuned learning rate the run takes over)")
            if self.mup_base_width < 1:
                raise ValueError(f"model.mup_base_width must be >= 1, got {self.mup_base_width}")
            if self.mup_base_head_dim is None and self.mup_base_width % self.n_heads:
                raise ValueError(f"model.mup_base_width ({self.mup_base_width}) must be a multiple of model.n_heads "
                                 f"({self.n_heads}) unless model.mup_base_head_dim is given: the base model's head dim "
                                 "is mup_base_width / n_heads")
            if self.mup_base_head_dim is not None and self.mup_base_head_dim < 1:
                raise ValueError(f"model.mup_base_head_dim must be >= 1, got {self.mup_base_head_dim}")
        else:
            for name in ("mup_base_width", "mup_base_head_dim"):
                if getattr(self, name) is not None:
                    raise ValueError(f"model.{name} is read only with model.parametrization = \"mup\" (this run is "
                                     "\"standard\")")
        if self.checkpoint_every < 1:
            raise ValueError(f"model.checkpoint_every must be >= 1, got {self.checkpoint_every}")
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

    def parameter_count(self) -> ParameterCount:
        """The model's weights by use (ParameterCount): the head is never tied here."""
        return count_parameters(vocab=self.vocab_size, d_model=self.d_model, layers=self.n_layers, heads=self.n_heads,
                                kv_heads=self.kv_heads, d_ff=self.ff_dim, qk_norm=self.qk_norm)


class OptimConfig(_Config):
    """AdamW; weight decay on matrices only (norm gains never, embeddings only if asked)."""

    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_embeddings: bool = False
    grad_clip: float = 1.0  # global grad-norm clip, applied by DeepSpeed

    @field_validator("betas", mode="before")
    @classmethod
    def _pair(cls, value):
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ValueError(f"optim.betas: expected a list of 2 items, got {value!r}")
        return tuple(value)  # JSON has no tuples

    def _check(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {self.betas}")
        if self.grad_clip < 0:
            raise ValueError(f"optim.grad_clip must be >= 0 (0 = off), got {self.grad_clip}")


class ScheduleConfig(_Config):
    """LR over tokens: linear warmup, then cosine to a floor, or warmup-stable-decay (WSD)."""

    kind: Literal["cosine", "wsd", "constant"] = "cosine"
    warmup_tokens: int = 0  # counted from the stage's start: a continued stage's own warmup (0: none)
    min_lr_ratio: float = 0.1  # the floor, as a fraction of the peak LR
    # wsd: the LR decays linearly over this last fraction of the stage's tokens; 0 = a stable phase that an
    # anneal stage continues (continue_from, decay_fraction 1): together one WSD schedule (trainer.optim.lr_at).
    decay_fraction: float = 0.2

    def _check(self) -> None:
        if self.warmup_tokens < 0:
            raise ValueError(f"schedule.warmup_tokens must be >= 0, got {self.warmup_tokens}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"schedule.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not 0 <= self.decay_fraction <= 1:
            raise ValueError(f"schedule.decay_fraction must be in [0, 1], got {self.decay_fraction}")


class BatchConfig(_Config):
    """Batch in sequences of seq_len tokens; the ramp grows it in steps of ramp_start sequences."""

    global_batch: int = 32  # sequences per optimizer step (all ranks, all micro-batches)
    micro_batch: int = 8  # sequences per rank per forward/backward
    seq_len: int = 256
    # Ramp: start at ramp_start sequences and grow linearly (in multiples of ramp_start) to global_batch
    # over the first ramp_tokens tokens. Multiples keep every step's batch independent of the world size.
    ramp_start: int | None = None
    ramp_tokens: int = 0
    # Sequence parallelism (DeepSpeed Ulysses, trainer/parallel/sequence.py): every `sequence_parallel`
    # consecutive ranks split each sequence of their micro-batch, for contexts one device cannot hold.
    sequence_parallel: int = 1

    def _check(self) -> None:
        if self.sequence_parallel < 1 or self.seq_len % self.sequence_parallel:
            raise ValueError(f"batch.sequence_parallel ({self.sequence_parallel}) must be >= 1 and divide "
                             f"batch.seq_len ({self.seq_len})")
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

    def check_world(self, world_size: int, pipeline: int = 1, tensor: int = 1) -> None:
        """Every batch the run will use must split into whole micro-batches on every data-parallel rank (the ranks
        of a sequence-parallel group share theirs, and so do the stages of a pipeline and the ranks of a
        tensor-parallel group: data-parallel size = world / (pipeline × tensor × sequence_parallel))."""
        for name, size in (("parallel.pipeline", pipeline), ("parallel.tensor", tensor),
                           ("batch.sequence_parallel", self.sequence_parallel)):
            if world_size % size:
                raise ValueError(f"{name} ({size}) must divide the world size ({world_size})")
        world_size //= self.sequence_parallel * pipeline * tensor
        unit = self.micro_batch * world_size
        smallest = self.ramp_start if self.ramp_start is not None else self.global_batch
        if smallest % unit:
            name = "batch.ramp_start" if self.ramp_start is not None else "batch.global_batch"
            raise ValueError(
                f"{name} ({smallest}) must be a multiple of batch.micro_batch × world size "
                f"({self.micro_batch} × {world_size} = {unit})"
            )


# Measured with DeepSpeed 0.19.8: 2 tensor-parallel ranks at bf16 ZeRO-0 report a pre-clip norm of 2.11 where the
# whole model's is 2.49 (first step of tests/trainer/parallel/test_tensor.py's run), and clip by it; ZeRO-1 and 2
# give the whole model's.
TENSOR_BF16_ZERO0 = "DeepSpeed's bf16 ZeRO-0 optimizer does not count the tensor-parallel shards into its gradient norm"


class ParallelConfig(_Config):
    """How the model is split over ranks beyond data parallelism (sequence parallelism is batch.sequence_parallel)."""

    # Pipeline stages (trainer.parallel.pipeline, DeepSpeed's PipelineEngine, 1F1B): every `pipeline` ranks hold one copy of
    # the model, the transformer blocks split evenly between them; the micro-batches of a step (global batch /
    # (micro_batch × data-parallel size)) flow through them. 1: no pipeline.
    pipeline: int = 1
    # Tensor parallelism (trainer.parallel.tensor, DeepSpeed AutoTP): every `tensor` consecutive ranks (one node's
    # GPUs: it all-reduces twice per block in forward and backward) split each block's projections, attention by
    # heads and the MLP by its hidden units; they read the same samples. 1: none.
    tensor: int = 1

    def _check(self) -> None:
        for name in ("pipeline", "tensor"):
            if getattr(self, name) < 1:
                raise ValueError(f"parallel.{name} must be >= 1, got {getattr(self, name)}")


class DeepSpeedConfig(_Config):
    zero_stage: Literal[0, 1, 2, 3] = 0
    # bf16 weights and activations with fp32 master weights in the optimizer, or fp32 throughout. "auto":
    # bf16 where the device computes it natively (trainer.parallel.precision), fp32 elsewhere; true / false force it.
    bf16: bool | Literal["auto"] = "auto"

    @field_validator("zero_stage", "bf16", mode="before")
    @classmethod
    def _choices(cls, value, info):
        # Before the types, in run.json's words: a Literal compares by == (true would pass as stage 1), and a
        # union's own error would name its members rather than the field.
        if info.field_name == "zero_stage" and isinstance(value, bool):
            raise ValueError(f"deepspeed.zero_stage: must be one of [0, 1, 2, 3], got {value!r}")
        if info.field_name == "bf16" and value is not True and value is not False and value != "auto":
            raise ValueError(f'deepspeed.bf16: expected true, false or "auto", got {value!r}')
        return value


class GuardConfig(_Config):
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


# The zero-shot tasks, by lm-evaluation-harness's names: the in-training evaluator (trainer/evaluation/evaluate.py) and the
# evaluation assets' lm-eval runs (trainer/evaluation/harness.py) both know each of them.
ZeroShotTask = Literal["lambada_openai", "hellaswag", "arc_easy", "arc_challenge", "piqa", "winogrande", "boolq", "mmlu"]


class MetricsConfig(_Config):
    log_interval: int = 10  # steps between progress lines / metric records
    eval_interval: int = 0  # steps between per-domain validation losses (0 = only at the end)
    eval_batches: int = 2  # global batches of held-out data per domain per evaluation
    tensorboard: bool = True
    peak_flops: float | None = None  # overrides the device table for MFU
    # Zero-shot tasks (trainer.evaluation.evaluate) every downstream_interval steps and at the end (0 = off), downstream_limit
    # items each, from the benchmark folder downstream_benchmarks with data.tokenizer (a training asset gives both).
    downstream_interval: int = Field(0, ge=0)
    downstream_tasks: list[ZeroShotTask] = ["lambada_openai", "hellaswag", "arc_easy", "piqa"]
    downstream_limit: int = Field(50, ge=1)
    downstream_benchmarks: str | None = None

    def _check(self) -> None:
        if self.log_interval < 1:
            raise ValueError(f"metrics.log_interval must be >= 1, got {self.log_interval}")
        if self.eval_interval < 0 or self.eval_batches < 0:
            raise ValueError("metrics.eval_interval and metrics.eval_batches must be >= 0")


class WatchdogConfig(_Config):
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


class SDCConfig(_Config):
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


class StragglerConfig(_Config):
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


class HealthConfig(_Config):
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


class CheckpointConfig(_Config):
    """When and where checkpoints go: local disk first (committed atomically), then the object store
    in a background thread. Layout: <local_dir>/step-<N>/ and <remote>/checkpoints/<stage>/<run_name>/step-<N>/."""

    interval_steps: int = 0  # save every N optimizer steps; 0 = no fixed interval
    mtbf_hours: float | None = None  # automatic interval by Young's rule sqrt(2 · save time · MTBF)
    local_dir: str | None = None  # None = <output_dir>/checkpoints; $VARS are expanded on each rank ($TMPDIR)
    # false: no folder is shared by the nodes (node-local disks): each rank writes its own files under
    # <local_dir>/rank-<r>/ and uploads them itself, rank 0 commits the step in `remote` (trainer.checkpoint.rank_upload)
    shared_local_dir: bool = True
    remote: str | None = None  # object-store URL (path, file://, s3://bucket/prefix); None = local only
    run_name: str = "run"
    keep_last: int = 3  # the newest k committed checkpoints are kept, locally and remotely
    keep_every: int = 0  # and every step that is a multiple of this, permanently (0 = none)
    save_final: bool = True  # a checkpoint at the end of the run
    resume: bool = True  # start from the newest committed checkpoint (local, else remote) when there is one
    allow_batch_change: bool = False  # resuming with a different global batch is refused unless this is set
    upload_retry_max_s: float = 30.0  # the background upload retries with backoff up to this pause, forever

    def _check(self) -> None:
        for name in ("interval_steps", "keep_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"checkpoint.{name} must be >= 0, got {getattr(self, name)}")
        if self.keep_last < 1:
            raise ValueError(f"checkpoint.keep_last must be >= 1, got {self.keep_last}")
        if self.mtbf_hours is not None and self.mtbf_hours <= 0:
            raise ValueError(f"checkpoint.mtbf_hours must be > 0, got {self.mtbf_hours}")
        if not self.run_name or "/" in self.run_name:
            raise ValueError(f"checkpoint.run_name must be a non-empty name without '/', got {self.run_name!r}")
        if not self.shared_local_dir and not self.remote:
            raise ValueError("checkpoint.shared_local_dir = false needs checkpoint.remote: without a shared folder "
                             "the object store is where every rank's files meet and where a step is committed")


class DataSection(_Config):
    """Where the tokens come from: packed shards (trainer.data.mixture) or, for demos and tests, one text file."""

    shards: dict[str, str] = Field(default_factory=dict)  # source name -> packed-shard folder
    weights: dict[str, float] = Field(default_factory=dict)  # source name -> mixture weight
    min_doc_tokens: int = 0  # packed shards: only documents this long (long-context stages); 0 = all
    text: str | None = None  # a plain text file, documents separated by blank lines
    tokenizer: str | None = None  # tokenizer.json for `text`; with shards, the zero-shot evaluations' (metrics)
    val_fraction: float = 0.1  # `text`: the last documents held out for validation
    top_tokens: int | None = None  # `text`: keep this many token ids (trainer.data.text_source); None = all

    def _check(self) -> None:
        if self.text is None and not self.shards:
            raise ValueError("data: give either data.shards (packed shards) or data.text (+ data.tokenizer)")
        if self.text is not None and self.shards:
            raise ValueError("data: give data.shards or data.text, not both")
        if self.text is not None and self.tokenizer is None:
            raise ValueError("data.tokenizer: a tokenizer.json is needed with data.text")
        unknown = set(self.weights) - set(self.shards)
        if unknown:
            raise ValueError(f"data.weights: sources {sorted(unknown)} are not in data.shards")


class RunConfig(_Config):
    """One training run (a stage: main, long-context, anneal) = these configs, nothing else."""

    data: DataSection
    train_tokens: int
    output_dir: str
    stage: str = "main"
    seed: int = 0
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    guard: GuardConfig = Field(default_factory=GuardConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    watchdog: WatchdogConfig = Field(default_factory=WatchdogConfig)
    sdc: SDCConfig = Field(default_factory=SDCConfig)
    straggler: StragglerConfig = Field(default_factory=StragglerConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    # A committed checkpoint step (path, file:// or s3://…/step-<N>) whose weights start this run. Optimizer
    # and schedule start fresh; a resume of this run's own checkpoints wins.
    init_from: str | None = None
    # Or one that this run continues: weights, optimizer state, step and token count (the schedule goes on
    # from there: train_tokens are this stage's own tokens on top). Checkpoints go under this run's own
    # name; a resume of those wins. How an anneal branches off the stable phase of a WSD run.
    continue_from: str | None = None
    tokenizer_sha256: str | None = None  # recorded in every checkpoint manifest
    # Data and code versions of everything upstream, passed in by the Dagster layer; recorded in every
    # checkpoint manifest: [{asset, data_version, code_version, run_id}, ...] from this stage back to raw.
    lineage: list[dict] = Field(default_factory=list)

    def _check(self) -> None:
        if self.train_tokens < 1:
            raise ValueError(f"train_tokens must be >= 1, got {self.train_tokens}")
        if self.init_from and self.continue_from:
            raise ValueError("init_from and continue_from: give one (weights only, or the whole run's state)")
        if self.parallel.pipeline > 1:
            self._check_pipeline()
        if self.parallel.tensor > 1:
            self._check_tensor()

    def _check_pipeline(self) -> None:
        """What the pipeline path (trainer.parallel.pipeline) does not do, refused by name rather than run wrongly."""
        P = self.parallel.pipeline
        refused = [
            (self.model.n_layers < P, f"model.n_layers ({self.model.n_layers}) must be >= parallel.pipeline ({P}): "
                                      "every stage holds at least one block"),
            (self.batch.sequence_parallel > 1, "batch.sequence_parallel > 1 cannot be combined with "
                                               "parallel.pipeline > 1 (Ulysses inside pipeline stages is not built)"),
            (self.model.activation_checkpointing != "none",
             "model.activation_checkpointing must be \"none\" with parallel.pipeline > 1 (recomputation inside "
             "pipeline stages is not built)"),
            (self.deepspeed.zero_stage > 1, "deepspeed.zero_stage must be 0 or 1 with parallel.pipeline > 1 "
                                            "(DeepSpeed refuses ZeRO-2/3 with a pipeline)"),
            (self.batch.ramp_start is not None, "batch.ramp_start: a batch-size ramp cannot be combined with "
                                                "parallel.pipeline > 1 (DeepSpeed's pipeline fixes its micro-batch "
                                                "count when built)"),
            (self.model.parametrization == "mup", "model.parametrization \"mup\" cannot be combined with "
                                                  "parallel.pipeline > 1 (the pipeline's last stage computes the "
                                                  "logits without μP's output multiplier)"),
        ]
        for bad, message in refused + self._split_refusals("parallel.pipeline", "a pipeline's stages"):
            if bad:
                raise ValueError(message)

    def _check_tensor(self) -> None:
        """What the tensor-parallel path (trainer.parallel.tensor) does not do, refused by name."""
        T, m = self.parallel.tensor, self.model
        refused = [
            (m.n_heads % T, f"model.n_heads ({m.n_heads}) must be divisible by parallel.tensor ({T}): each rank "
                            "computes whole attention heads"),
            (m.kv_heads % T, f"model.n_kv_heads ({m.kv_heads}) must be divisible by parallel.tensor ({T}): each "
                             "rank holds whole key/value heads"),
            (m.ff_dim % T, f"model.d_ff ({m.ff_dim}) must be divisible by parallel.tensor ({T})"),
            (self.parallel.pipeline > 1, "parallel.tensor > 1 cannot be combined with parallel.pipeline > 1 "
                                         "(AutoTP inside pipeline stages is not built)"),
            (self.batch.sequence_parallel > 1, "batch.sequence_parallel > 1 cannot be combined with parallel.tensor "
                                               "> 1 (Ulysses over tensor-parallel heads is not built)"),
            (self.deepspeed.zero_stage == 3, "deepspeed.zero_stage must be 0, 1 or 2 with parallel.tensor > 1 "
                                             "(AutoTP under ZeRO-3 is not tested here)"),
            (m.parametrization == "mup", "model.parametrization \"mup\" cannot be combined with parallel.tensor > 1 "
                                         "(μP's per-group learning rates under AutoTP's shards are not tested here)"),
            (self.deepspeed.bf16 is True and self.deepspeed.zero_stage == 0,
             "deepspeed.bf16 true with parallel.tensor > 1 needs deepspeed.zero_stage 1 or 2 (" + TENSOR_BF16_ZERO0
             + ")"),
        ]
        for bad, message in refused + self._split_refusals("parallel.tensor", "a tensor-parallel group's ranks"):
            if bad:
                raise ValueError(message)

    def _split_refusals(self, field: str, parts: str) -> list[tuple[bool, str]]:
        """The per-rank checks that assume every rank holds the whole model, where `field` splits it over `parts`.
        On by default, they are turned off there (checks_off, logged at start); asked for in the config, refused."""
        return [
            ("enabled" in self.sdc.model_fields_set and self.sdc.enabled,
             f"sdc.enabled must be false with {field} > 1 (the per-rank loss and gradient-norm comparison "
             "assumes every rank holds the whole model)"),
            ("enabled" in self.straggler.model_fields_set and self.straggler.enabled,
             f"straggler.enabled must be false with {field} > 1 ({parts} wait on each other inside every step, so "
             "their step times do not single a slow rank out)"),
            ("interval" in self.health.model_fields_set and self.health.interval != 0,
             f"health.interval must be 0 with {field} > 1 (per-layer health figures are not gathered over "
             "the parts of the model)"),
            (self.metrics.downstream_interval != 0, f"metrics.downstream_interval must be 0 with {field} > 1 "
                                                    "(zero-shot scoring needs the whole model)"),
        ]

    @property
    def fp32_only(self) -> str | None:
        """Why this layout trains in fp32 whatever the hardware does (deepspeed.bf16 "auto" resolves to false), or
        None. bf16 true is refused for it (_check_tensor)."""
        if self.parallel.tensor > 1 and self.deepspeed.zero_stage == 0:
            return f"parallel.tensor > 1 under ZeRO-0 trains in fp32 ({TENSOR_BF16_ZERO0})"
        return None

    @property
    def model_split(self) -> str | None:
        """The field that splits the model over ranks (each holds a part of it), or None."""
        return next((f"parallel.{name}" for name in ("pipeline", "tensor") if getattr(self.parallel, name) > 1), None)

    def checks_off(self) -> tuple["RunConfig", list[str]]:
        """This config with the per-rank checks a split model cannot run turned off (RunConfig._split_refusals),
        and the fields turned off; unchanged where every rank holds the whole model."""
        if self.model_split is None:
            return self, []
        off = {"sdc": {"enabled": False}, "straggler": {"enabled": False}, "health": {"interval": 0}}
        changed = [f"{section}.{field}" for section, fields in off.items() for field, value in fields.items()
                   if getattr(getattr(self, section), field) != value]
        return self.model_copy(update={section: getattr(self, section).model_copy(update=fields)
                                       for section, fields in off.items()}), changed

    def to_dict(self) -> dict:
        """What checkpoint manifests store; from_dict reads it back (resume, init_from, export)."""
        return self.model_dump()


def from_dict(cls, data, where: str = ""):
    """Build config model `cls` from plain JSON data; errors name the field path (`model.n_heads`)."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ValueError(_describe(cls, e, where)) from None


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


# Pydantic's error types in the words run.json errors have always used ({0} is the value that was given).
_WORDS = {"missing": "required field missing", "int_type": "expected an integer, got {0!r}",
          "float_type": "expected a number, got {0!r}", "bool_type": "expected true or false, got {0!r}",
          "string_type": "expected a string, got {0!r}", "list_type": "expected a list, got {0.__class__.__name__}",
          "dict_type": "expected an object, got {0.__class__.__name__}",
          "model_type": "expected an object, got {0.__class__.__name__}"}


def _describe(cls, error: ValidationError, where: str) -> str:
    """One line for one error: an unknown field first, then a missing one, the outermost first (as before)."""
    rank = {"extra_forbidden": 0, "missing": 1}
    first = min(error.errors(), key=lambda e: (rank.get(e["type"], 2), len(e["loc"]) if e["type"] in rank else 0))
    loc, kind, value = first["loc"], first["type"], first["input"]
    path = ".".join([where] * bool(where) + [f"[{p}]" if isinstance(p, int) else p for p in loc]).replace(".[", "[")
    if kind == "value_error":
        # The checks name their own field ("model.d_model (100) must be divisible by model.n_heads (3)").
        message = first["msg"].removeprefix("Value error, ")
        return message if not path or message.startswith(path) else f"{path}: {message}"
    if kind == "extra_forbidden":
        message = f"unknown field (known: {', '.join(sorted(_section(cls, loc[:-1]).model_fields))})"
    elif kind == "literal_error" and isinstance(loc[-1], int):  # an item of a list (metrics.downstream_tasks[0])
        message = f"must be one of {first['ctx']['expected']}, got {value!r}"
    elif kind == "literal_error":
        choices = typing.get_args(_section(cls, loc[:-1]).model_fields[loc[-1]].annotation)
        message = f"must be one of {list(choices)}, got {value!r}"
    else:
        message = _WORDS.get(kind, f"{first['msg']}, got {{0!r}}").format(value)
    return f"{path or 'the config'}: {message}"


def _section(cls, loc: tuple) -> type[BaseModel]:
    """The config model that the field path `loc` (from `cls`) ends in."""
    for part in loc:
        annotation = cls.model_fields[part].annotation if part in cls.model_fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            break
        cls = annotation
    return cls
