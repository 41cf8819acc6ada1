"""Back-of-the-envelope sizing of a training run, before any GPU is rented.

    from trainer.planner.plan import ModelShape, Layout, plan
    p = plan(ModelShape.from_dict({...}), tokens=2e12, layout=Layout(dp=64, zero=3), device="h100", mfu=0.4)

Pure arithmetic (no torch): parameter count of the Llama layout (the trainer's, trainer.model.config.count_parameters),
training FLOPs with the attention term, GPU-hours at a given MFU, model-state memory per GPU for a (tp, pp, dp, ZeRO) layout, the
pipeline bubble and Young's checkpoint interval. `pretrain plan` prints these for each training stage,
and for a FLOP budget the compute-optimal N and D (by a scaling fit, scaling_law.py, or Chinchilla's rule).
Memory is decimal (1 GB = 1e9 bytes), as the device datasheets state it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.model.config import ParameterCount, count_parameters
from trainer.model.config import flops_per_token as _flops_per_token

if TYPE_CHECKING:  # the fit is read by the caller: plan's arithmetic loads no scipy
    from trainer.planner.scaling_law import ScalingFit

# Mixed-precision Adam keeps, per parameter: bf16 weights (2) + bf16 grads (2) + fp32 master weights,
# momentum and variance (4 + 4 + 4 = 12). ZeRO-1 shards the 12, ZeRO-2 also the grads, ZeRO-3 everything.
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12
STATE_BYTES_PER_PARAM = WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES


@dataclass(frozen=True, kw_only=True)
class Device:
    name: str
    peak_flops: float  # dense bf16 FLOP/s, no sparsity
    memory_bytes: float


DEVICES = {
    "h100": Device(name="H100", peak_flops=989e12, memory_bytes=80e9),
    "h200": Device(name="H200", peak_flops=989e12, memory_bytes=141e9),
    "a100": Device(name="A100 80GB", peak_flops=312e12, memory_bytes=80e9),
    "a100-40gb": Device(name="A100 40GB", peak_flops=312e12, memory_bytes=40e9),
}


def get_device(name: str | Device) -> Device:
    if isinstance(name, Device):
        return name
    try:
        return DEVICES[name.lower()]
    except KeyError:
        raise ValueError(f"device: unknown {name!r}; known devices are {', '.join(DEVICES)}") from None


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The numbers that decide a Llama-style model's size and cost (names as in the Llama papers)."""

    layers: int
    d_model: int
    d_ff: int  # SwiGLU hidden width
    heads: int
    kv_heads: int | None = None  # grouped-query attention; None means as many as `heads`
    vocab: int
    seq_len: int
    tied_embeddings: bool = False
    qk_norm: bool = False  # one RMSNorm gain of head_dim each on queries and keys, per layer

    def __post_init__(self):
        for field in ("layers", "d_model", "d_ff", "heads", "vocab", "seq_len"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"model.{field}: must be a positive integer, got {value!r}")
        if self.kv_heads is not None and (isinstance(self.kv_heads, bool) or not isinstance(self.kv_heads, int) or self.kv_heads <= 0):
            raise ValueError(f"model.kv_heads: must be a positive integer or null, got {self.kv_heads!r}")
        if self.d_model % self.heads:
            raise ValueError(f"model.heads: d_model {self.d_model} is not divisible by {self.heads} heads")
        if self.heads % self.n_kv_heads:
            raise ValueError(f"model.kv_heads: {self.heads} heads are not divisible into {self.n_kv_heads} kv groups")

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    # trainer.model.config.ModelConfig spellings of the same fields, so its dict form loads as is.
    ALIASES = {"n_layers": "layers", "n_heads": "heads", "n_kv_heads": "kv_heads", "vocab_size": "vocab"}
    # ModelConfig settings that change neither the parameter count nor the FLOPs.
    NOT_SIZING = frozenset({"rope_base", "z_loss", "norm_eps", "init_std", "attention", "doc_positions",
                            "activation_checkpointing", "checkpoint_every", "compile"})

    @classmethod
    def from_model_config(cls, model, *, seq_len: int) -> ModelShape:
        """From a trainer.model.config.ModelConfig, with its defaults resolved (d_ff None -> Llama's 8/3 rule)."""
        return cls(layers=model.n_layers, d_model=model.d_model, d_ff=model.ff_dim, heads=model.n_heads,
                   kv_heads=model.n_kv_heads, vocab=model.vocab_size, seq_len=seq_len, qk_norm=model.qk_norm)

    @classmethod
    def from_dict(cls, config: dict, *, seq_len: int | None = None) -> ModelShape:
        """Build from planner or trainer field names; `seq_len` fills in (or overrides) the sequence length."""
        if not isinstance(config, dict):
            raise ValueError(f"model: expected a mapping of model fields, got {type(config).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        values: dict = {}
        for key, value in config.items():
            name = cls.ALIASES.get(key, key)
            if name in fields:
                if name in values:
                    raise ValueError(f"model.{key}: given twice (also as {name!r} or one of its aliases)")
                values[name] = value
            elif key not in cls.NOT_SIZING:
                known = sorted(fields | set(cls.ALIASES) | cls.NOT_SIZING)
                raise ValueError(f"model.{key}: unknown field; known fields are {', '.join(known)}")
        if seq_len is not None:
            values["seq_len"] = seq_len
        missing = [f for f in ("layers", "d_model", "d_ff", "heads", "vocab", "seq_len") if f not in values]
        if missing:
            raise ValueError(f"model.{missing[0]}: missing (needed fields: {', '.join(missing)})")
        return cls(**values)

    def parameter_count(self) -> ParameterCount:
        """The weights by use (trainer.model.config.ParameterCount: total, non_embedding, matmul): the trainer's
        count."""
        return count_parameters(vocab=self.vocab, d_model=self.d_model, layers=self.layers, heads=self.heads,
                                kv_heads=self.n_kv_heads, d_ff=self.d_ff, qk_norm=self.qk_norm,
                                tied=self.tied_embeddings)


def flops_per_token(shape: ModelShape, *, attention: bool = True) -> float:
    """Training FLOPs per token, forward + backward: 6 per weight a token is multiplied through (not the input
    embedding, a lookup) plus 12·L·T·d for attention (trainer.model.config.flops_per_token, MFU's count too).
    attention=False leaves that term out: the 6·N·D of the scaling-law papers and cost tables."""
    return _flops_per_token(shape.parameter_count(), layers=shape.layers, d_model=shape.d_model,
                            seq_len=shape.seq_len, attention=attention)


def attention_flops_per_token(shape: ModelShape) -> float:
    return flops_per_token(shape) - flops_per_token(shape, attention=False)


TOKENS_PER_PARAMETER = 20  # compute-optimal (Chinchilla: Hoffmann et al. 2022)


def compute_optimal(flops: float, tokens_per_parameter: float = TOKENS_PER_PARAMETER) -> tuple[float, float]:
    """(parameters, tokens) that spend a FLOP budget C = 6·N·D with D = 20·N: N = sqrt(C / 120)."""
    if flops <= 0:
        raise ValueError(f"budget: FLOPs must be > 0, got {flops!r}")
    params = math.sqrt(flops / (6 * tokens_per_parameter))
    return params, tokens_per_parameter * params


# Chinchilla's exponents of the compute-optimal N and D in compute: N_opt ∝ C^0.5, D_opt ∝ C^0.5 (Hoffmann et al.'s
# approaches 1 and 2 found 0.50/0.50 and 0.49/0.51); a fixed tokens-per-parameter ratio is exactly this rule.
CHINCHILLA_EXPONENTS = (0.5, 0.5)


def budget_report(flops: float, fit: ScalingFit | None = None, *, fit_source: str = "", no_fit: str = "",
                  out) -> dict:
    """Print the compute-optimal N and D for a FLOP budget (C = 6·N·D) by the scaling fit when there is one, else by
    Chinchilla's 20 tokens per parameter; the fit's exponents beside Chinchilla's, and which rule was applied
    (`fit_source`: where the fit came from; `no_fit`: why there is none). Returns the figures printed."""
    chinchilla = compute_optimal(flops)
    if fit is None:
        params, tokens = chinchilla
        a, b = CHINCHILLA_EXPONENTS
        rule = f"Chinchilla's {TOKENS_PER_PARAMETER} tokens per parameter"
        print(f"compute-optimal for {flops:.3g} FLOPs ({TOKENS_PER_PARAMETER} tokens per parameter, C = 6·N·D): "
              f"{params:.3g} parameters on {tokens:.3g} tokens", file=out)
        print(f"exponents in compute  N_opt ∝ C^{a:.2f}, D_opt ∝ C^{b:.2f} (Chinchilla)", file=out)
        print(f"rule applied          {rule}" + (f" (no scaling fit: {no_fit})" if no_fit else ""), file=out)
        return {"rule": "chinchilla", "params": params, "tokens": tokens, "exponents": (a, b)}
    params, tokens = fit.optimal(flops)
    a, b = fit.exponents()
    loss = fit.predict(params, tokens)

    def interval(key: str) -> str:
        lo, hi = fit.intervals.get(key, (None, None))
        return "" if lo is None else f" (5–95%: {lo:.3f}–{hi:.3f})"

    rule = "the scaling fit"
    print(f"compute-optimal for {flops:.3g} FLOPs (the scaling fit, C = 6·N·D): {params:.3g} parameters on "
          f"{tokens:.3g} tokens ({tokens / params:.1f} tokens per parameter), predicted loss {loss:.4f}", file=out)
    print(f"exponents in compute  N_opt ∝ C^{a:.3f}{interval('a')}, D_opt ∝ C^{b:.3f}{interval('b')}; "
          f"Chinchilla's: {CHINCHILLA_EXPONENTS[0]:.2f} and {CHINCHILLA_EXPONENTS[1]:.2f}", file=out)
    print(f"Chinchilla's rule     {chinchilla[0]:.3g} parameters on {chinchilla[1]:.3g} tokens "
          f"({TOKENS_PER_PARAMETER} tokens per parameter), predicted loss {fit.predict(*chinchilla):.4f}", file=out)
    print(f"rule applied          {rule}: L = {fit.E:.4g} + {fit.A:.4g}/N^{fit.alpha:.4f} + {fit.B:.4g}/D^{fit.beta:.4f}"
          f" over {fit.points} points, from {fit_source}" + (f" ({fit.rule})" if fit.rule else ""), file=out)
    print("                      N counts parameters as the fit's points do (scaling/fit: every parameter)", file=out)
    return {"rule": "fit", "params": params, "tokens": tokens, "exponents": (a, b), "loss": loss}


def cost_row(params: float, tokens: float, *, flops_per_s: float, price_per_gpu_hour: float | None = None) -> dict:
    """One line of a cost table by N and D alone (no attention term): FLOPs 6·N·D, GPU-hours at an achieved
    throughput per GPU (e.g. 400e12), and dollars at a price per GPU-hour."""
    if params <= 0 or tokens <= 0 or flops_per_s <= 0:
        raise ValueError(f"cost: params, tokens and FLOP/s must be > 0, got {params}, {tokens}, {flops_per_s}")
    flops = 6 * params * tokens
    hours = flops / flops_per_s / 3600
    return {"params": params, "tokens": tokens, "flops": flops, "gpu_hours": hours,
            "usd": None if price_per_gpu_hour is None else hours * price_per_gpu_hour}


def total_flops(shape: ModelShape, tokens: float) -> float:
    return flops_per_token(shape) * tokens


def gpu_hours(flops: float, *, device: str | Device, mfu: float) -> float:
    """Device-hours to execute `flops` at model FLOPs utilization `mfu` of the device's bf16 peak."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu: must be in (0, 1], got {mfu!r}")
    return flops / (mfu * get_device(device).peak_flops) / 3600


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How the model is spread: tensor parallel × pipeline parallel × data parallel GPUs."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 0  # ZeRO stage across the data-parallel group
    micro_batches: int = 1  # per pipeline flush (only matters with pp > 1)

    def __post_init__(self):
        for field in ("tp", "pp", "dp", "micro_batches"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"layout.{field}: must be an integer ≥ 1, got {value!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"layout.zero: ZeRO stage must be 0, 1, 2 or 3, got {self.zero!r}")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp


def model_state_bytes_per_gpu(params: float, layout: Layout) -> float:
    """Weights, grads and Adam state held by one GPU (activations and buffers not counted).

    tp and pp split the parameters; ZeRO then shards some of the 16 bytes/param across dp."""
    local = params / (layout.tp * layout.pp)
    sharded = {0: 0, 1: OPTIMIZER_BYTES, 2: OPTIMIZER_BYTES + GRAD_BYTES, 3: STATE_BYTES_PER_PARAM}[layout.zero]
    return local * ((STATE_BYTES_PER_PARAM - sharded) + sharded / layout.dp)


def pipeline_bubble(stages: int, micro_batches: int) -> float:
    """Idle fraction of a GPipe/1F1B schedule: (P−1)/(m+P−1)."""
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"pipeline: stages and micro_batches must be ≥ 1, got {stages} and {micro_batches}")
    return (stages - 1) / (micro_batches + stages - 1)


def young_checkpoint_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Seconds between checkpoints that minimise lost work (Young 1974): √(2·δ·M), δ = time to write
    one checkpoint, M = mean time between failures of the whole job."""
    if checkpoint_seconds <= 0 or mtbf_seconds <= 0:
        raise ValueError(f"checkpoint interval: write time and MTBF must be > 0, got {checkpoint_seconds} and {mtbf_seconds}")
    return math.sqrt(2 * checkpoint_seconds * mtbf_seconds)


@dataclass(frozen=True, kw_only=True)
class Plan:
    shape: ModelShape
    layout: Layout
    device: Device
    mfu: float
    tokens: float
    params: int
    flops_per_token: float
    total_flops: float
    gpu_hours: float
    wall_hours: float  # gpu_hours spread over the layout's GPUs
    state_bytes_per_gpu: float
    activation_bytes_per_gpu: float  # with the stage's recomputation
    activation_bytes_no_recompute: float
    recompute: str
    micro_batch: int
    sequence_parallel: int
    attention_share: float  # the attention term's FLOPs over 6N
    usd: float | None  # gpu_hours at the price per GPU-hour, when given
    bubble: float
    checkpoint_interval_s: float | None
    fits: bool
    warning: str | None

    def lines(self) -> list[str]:
        lines = [
            f"parameters          {self.params:,} ({self.params / 1e9:.2f} B)",
            f"FLOPs/token         {self.flops_per_token:.3e} "
            + (f"(6N + 12·L·T·d, T = {self.shape.seq_len}; N the weights but the input embedding)"
               if self.flops_per_token > 6 * self.shape.parameter_count().matmul else
               "(6N, N the weights but the input embedding: the attention term left out)"),
            f"tokens              {self.tokens:.3e}",
            f"total FLOPs         {self.total_flops:.3e}",
            f"GPU-hours           {self.gpu_hours:,.0f} {self.device.name} at {self.mfu:.0%} MFU"
            f" ({self.wall_hours:,.1f} h wall on {self.layout.gpus} GPUs)",
            f"attention term      +{self.attention_share:.1%} FLOPs over 6N",
            f"state/GPU           {self.state_bytes_per_gpu / 1e9:.2f} GB of {self.device.memory_bytes / 1e9:.0f} GB"
            f" (tp {self.layout.tp} × pp {self.layout.pp} × dp {self.layout.dp}, ZeRO-{self.layout.zero};"
            " weights+grads+Adam)",
            f"activations/GPU     {self.activation_bytes_per_gpu / 1e9:.2f} GB (recompute {self.recompute}, micro-batch "
            f"{self.micro_batch}, sequence parallel {self.sequence_parallel}; "
            f"{self.activation_bytes_no_recompute / 1e9:.2f} GB without recomputation)",
            f"pipeline bubble     {self.bubble:.1%} (P = {self.layout.pp}, m = {self.layout.micro_batches})",
        ]
        if self.usd is not None:
            lines.append(f"cost                ${self.usd:,.0f}")
        if self.checkpoint_interval_s is not None:
            lines.append(f"checkpoint every    {self.checkpoint_interval_s / 60:.1f} min (Young)")
        return lines


def plan(
    shape: ModelShape,
    tokens: float,
    layout: Layout,
    device: str | Device,
    mfu: float,
    *,
    checkpoint_seconds: float | None = None,
    mtbf_seconds: float | None = None,
    micro_batch: int = 1,
    recompute: str = "none",
    sequence_parallel: int = 1,
    price_per_gpu_hour: float | None = None,
    attention: bool = True,
) -> Plan:
    """All the figures for one training stage, with a warning when the model state and the activations of a
    micro-batch overflow a GPU."""
    from trainer.planner.activations import activation_bytes_per_gpu

    if tokens <= 0:
        raise ValueError(f"tokens: must be > 0, got {tokens!r}")
    dev = get_device(device)
    counts = shape.parameter_count()
    params = counts.total  # memory: every weight
    per_token = flops_per_token(shape, attention=attention)
    hours = gpu_hours(per_token * tokens, device=dev, mfu=mfu)
    state = model_state_bytes_per_gpu(params, layout)
    sizing = {"micro_batch": micro_batch, "layout": layout, "sequence_parallel": sequence_parallel}
    activations = activation_bytes_per_gpu(shape, recompute=recompute, **sizing)
    without = activation_bytes_per_gpu(shape, recompute="none", **sizing)
    fits = state + activations <= dev.memory_bytes
    warning = None
    if not fits:
        warning = (
            f"model state {state / 1e9:.1f} GB + activations {activations / 1e9:.1f} GB per GPU do not fit one "
            f"{dev.name}'s {dev.memory_bytes / 1e9:.0f} GB (tp {layout.tp} × pp {layout.pp} × dp {layout.dp}, "
            f"ZeRO-{layout.zero}, recompute {recompute}): shard it further (a higher ZeRO stage over more dp ranks, "
            "more tp/pp), recompute activations, split the sequence, or take a smaller micro-batch"
        )
    interval = None
    if checkpoint_seconds is not None and mtbf_seconds is not None:
        interval = young_checkpoint_interval(checkpoint_seconds, mtbf_seconds)
    return Plan(
        shape=shape, layout=layout, device=dev, mfu=mfu, tokens=tokens, params=params, flops_per_token=per_token,
        total_flops=per_token * tokens, gpu_hours=hours, wall_hours=hours / layout.gpus, state_bytes_per_gpu=state,
        activation_bytes_per_gpu=activations, activation_bytes_no_recompute=without, recompute=recompute,
        micro_batch=micro_batch, sequence_parallel=sequence_parallel,
        attention_share=attention_flops_per_token(shape) / (6 * counts.matmul),
        usd=None if price_per_gpu_hour is None else hours * price_per_gpu_hour, bubble=pipeline_bubble(layout.pp, layout.micro_batches), checkpoint_interval_s=interval, fits=fits, warning=warning,
    )


def report(stages: list[tuple[str, ModelShape, float]], *, layout: Layout, device: str | Device, mfu: float,
           checkpoint_seconds: float | None = None, mtbf_seconds: float | None = None, out, err,
           stage_options: dict[str, dict] | None = None, **options) -> list[Plan]:
    """Print one block per training stage to `out`; a layout that does not fit also warns on `err`. `options` are
    plan()'s sizing keywords for every stage (micro_batch, recompute, ...), over each stage's own
    `stage_options[name]` (from its run config)."""
    plans = []
    for i, (name, shape, tokens) in enumerate(stages):
        p = plan(shape, tokens, layout, device, mfu, checkpoint_seconds=checkpoint_seconds, mtbf_seconds=mtbf_seconds,
                 **{**(stage_options or {}).get(name, {}), **options})
        if i:
            print(file=out)
        print(f"stage {name}", file=out)
        for line in p.lines():
            print(f"  {line}", file=out)
        if p.warning:
            print(f"  WARNING: {p.warning}", file=out)
            print(f"WARNING: stage {name}: {p.warning}", file=err)
        plans.append(p)
    return plans


def cost_table(rows: list[tuple[float, float]], *, flops_per_s: float, price_per_gpu_hour: float | None, out) -> list[dict]:
    """Print a cost table by parameters and tokens alone (6·N·D, no attention term), as scaling-law papers give it."""
    print(f"{'params':>10} {'tokens':>10} {'FLOPs':>10} {'GPU-hours':>12} {'cost':>12}   "
          f"(6·N·D at {flops_per_s / 1e12:.0f} TFLOP/s achieved per GPU)", file=out)
    found = []
    for params, tokens in rows:
        row = cost_row(params, tokens, flops_per_s=flops_per_s, price_per_gpu_hour=price_per_gpu_hour)
        usd = "" if row["usd"] is None else f"${row['usd']:,.0f}"
        print(f"{params:>10.3g} {tokens:>10.3g} {row['flops']:>10.2e} {row['gpu_hours']:>12,.0f} {usd:>12}", file=out)
        found.append(row)
    return found


def load_stage(spec: str, *, seq_len: int | None = None) -> tuple[str, ModelShape, float | None]:
    """(stage name, shape, tokens or None) from inline JSON or a JSON file holding either the model
    fields alone, or a whole trainer run config (has a "model" section): that one is validated as the
    trainer would (trainer.config.RunConfig), and gives the stage, batch.seq_len and train_tokens."""
    if spec.lstrip().startswith("{"):
        source, text = "inline model JSON", spec
    else:
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"model: no such file {spec!r} (give inline JSON or a path to a JSON file)")
        source, text = str(path), path.read_text(encoding="utf-8")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{source}: expected a JSON object, got {type(config).__name__}")
    try:
        if "model" in config:
            from trainer.config import RunConfig, from_dict  # imported here: only a run config needs pydantic

            run = from_dict(RunConfig, config)
            shape = ModelShape.from_model_config(run.model, seq_len=seq_len or run.batch.seq_len)
            return run.stage, shape, float(run.train_tokens)
        return "model", ModelShape.from_dict(config, seq_len=seq_len), None
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


_TOKEN_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_tokens(text: str) -> float:
    """A token budget as `2e12`, `2000000000000` or `2T` (K, M, B/G, T suffixes)."""
    value = text.strip().replace("_", "").replace(",", "")
    scale = _TOKEN_SUFFIXES.get(value[-1:].upper(), 1.0) if value else 1.0
    if scale != 1.0:
        value = value[:-1]
    try:
        tokens = float(value) * scale
    except ValueError:
        raise ValueError(f"tokens: {text!r} is not a number (e.g. 2e12 or 2T)") from None
    if not math.isfinite(tokens) or tokens <= 0:
        raise ValueError(f"tokens: must be a positive number, got {text!r}")
    return tokens
