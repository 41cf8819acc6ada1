"""A training run's configuration: RunConfig composes one pydantic model per part, each defined beside its part
(trainer/model/config.py, parallel/config.py, health/config.py, reporting/config.py, checkpoint/config.py); the
loop's own sections (optim, schedule, batch, data) are here, with how a run.json is read.

    cfg = load_run_config("run.json")   # ValueError naming the bad field: "run.json: model.n_heads: ..."

`run.json` mirrors these models field by field, validated by pydantic as the recipe is (assets/recipe/): unknown
keys are refused so a typo never silently falls back to a default, and nothing is coerced ("2" is not 2, 1 is not
true); every section builds on trainer/base_config.py's RunConfigSection for that. Sizes of the training run are in
tokens (`train_tokens`, `warmup_tokens`, `ramp_tokens`) so a batch-size ramp never changes the token schedule.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from trainer.base_config import RunConfigSection
from trainer.checkpoint.config import CheckpointConfig
from trainer.health.config import GuardConfig, HealthConfig, SDCConfig, StragglerConfig, WatchdogConfig
from trainer.model.config import ModelConfig
from trainer.parallel.config import DeepSpeedConfig, ParallelConfig
from trainer.reporting.config import MetricsConfig


class OptimConfig(RunConfigSection):
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


class ScheduleConfig(RunConfigSection):
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


class BatchConfig(RunConfigSection):
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



class DataSection(RunConfigSection):
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


class RunConfig(RunConfigSection):
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
