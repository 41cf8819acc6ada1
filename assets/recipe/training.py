"""The recipe's `training` section: the main run and the stages after it, and how any proxy run is built from main.

A stage's settings are the trainer's own run-config fields (trainer.config.RunConfig: model, optim,
schedule, batch, deepspeed, guard, metrics, checkpoint, train_tokens, seed). The main stage gives
them whole; every later stage gives only what it changes, merged over the stage it starts from, so a
stage reads like what it is. The later stages are one list, in order; each starts from an earlier one:
`continue_from: <stage>` continues that run (weights, optimizer state, step and token count; the LR
schedule goes on, trainer.optim.lr_at), `init_from: <stage>` takes its weights only (a fresh optimizer and
schedule). Neither: init_from the stage before. A WSD run (docs/stages.md):

    training:
      main: {train_tokens: 2000000, schedule: {kind: wsd, warmup_tokens: 20000, decay_fraction: 0.0}, ...}
      stages:
        - {name: mid_quality, continue_from: main, train_tokens: 400000, weights: {books: 0.5, web: 0.5}}
        - {name: long_512, continue_from: mid_quality, train_tokens: 200000, batch: {seq_len: 512},
           model: {rope_base: 100000}, optim: {lr: 3.0e-4}, schedule: {kind: constant, warmup_tokens: 8192},
           min_doc_tokens: 256}
        - {name: anneal, continue_from: mid_quality, train_tokens: 200000, weights: {books: 0.6, ...},
           schedule: {warmup_tokens: 0, decay_fraction: 1.0, min_lr_ratio: 0.0}}
    mixing: {prior: {web: 0.5, ...}, candidates: 8, proxy: {train_tokens: 200000, model: {n_layers: 1}}}

The older shape still loads: `long_context: [<stage>, ...]` then `anneal: <stage>` (named anneal) are that
list; a recipe gives one shape or the other. Each stage is validated at recipe load exactly as the trainer
will validate it (from_dict on the merged config), so an error names the stage and the field:
`training.long_context[0] (long_512).batch.seq_len: ...`. Stages are configs, never `if stage == ...`
branches (DESIGN.md).

A stage may also say how its trainer is started, over the launcher resource's defaults (which come from
the environment: PRETRAIN_LAUNCHER, PRETRAIN_NPROC_PER_NODE), and later stages inherit it like any field:

    main: {..., launch: {launcher: torchrun, nproc_per_node: 8, nnodes: 4, max_restarts: 3}}
    mixing: {proxy: {train_tokens: 200000, launch: {launcher: python, nproc_per_node: 1}}}

`launch` is not a trainer field: it is split off (split_launch) before the trainer sees the settings, and
it is not part of a stage's code version (the token stream does not depend on the world size, DESIGN.md),
so moving a stage to more processes resumes its run instead of starting a new one.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from resources.launcher import LauncherResource
from resources.slurm import SlurmConfig
from trainer.config import RunConfig, from_dict

# Fields of RunConfig a recipe stage may set; data, output_dir, stage, lineage and the tokenizer hash
# are filled in by the training assets.
STAGE_FIELDS = ("train_tokens", "seed", "model", "optim", "schedule", "batch", "deepspeed", "parallel", "guard",
                "metrics", "checkpoint")


def merge(base: dict, override: dict) -> dict:
    """Deep merge: dicts merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


LAUNCH_FIELD = "launch"


class LaunchSettings(BaseModel):
    """How one stage's trainer is started; what is not given stays the launcher resource's default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The launcher kinds are the resource's own (python, torchrun, deepspeed, slurm, ...).
    launcher: LauncherResource.model_fields["launcher"].annotation | None = None
    nproc_per_node: int | None = Field(None, ge=1)
    nnodes: int | None = Field(None, ge=1)
    threads: int | None = Field(None, ge=1)  # CPU threads per trainer process (a proxy's default: PROXY_THREADS)
    max_restarts: int | None = Field(None, ge=0)
    restart_window_hours: float | None = Field(None, gt=0)  # max_restarts counts within this window (weeks-long runs)
    slurm: SlurmConfig | None = None  # launcher slurm: partition, time, GPUs, sbatch args (resources/slurm.py)

    @field_validator("slurm", mode="before")
    @classmethod
    def _known_slurm_fields(cls, value):
        # Dagster's Config lets unknown keys through: a misspelt one would be silently ignored.
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(SlurmConfig.model_fields))
            if unknown:
                raise ValueError(f"{unknown[0]}: not a slurm field (slurm sets {', '.join(SlurmConfig.model_fields)})")
        return value

    @model_validator(mode="after")
    def _one_process_for_python(self):
        if self.launcher == "python" and ((self.nproc_per_node or 1) > 1 or (self.nnodes or 1) > 1):
            field = "nproc_per_node" if (self.nproc_per_node or 1) > 1 else "nnodes"
            raise ValueError(f"{field}: launcher 'python' runs one process; use torchrun or deepspeed for more")
        return self

    def overrides(self) -> dict:
        """The launcher resource's fields this stage sets (LauncherResource.launch(settings=...))."""
        return self.model_dump(exclude_none=True)


def split_launch(where: str, settings: dict) -> tuple[dict, LaunchSettings]:
    """(the trainer's fields, the stage's launch settings); a bad launch entry names the stage and field."""
    run = {k: v for k, v in settings.items() if k != LAUNCH_FIELD}
    raw = settings.get(LAUNCH_FIELD) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}.{LAUNCH_FIELD}: must be a mapping like {{launcher: torchrun, nproc_per_node: 2}}, "
                         f"got {raw!r}")
    try:
        return run, LaunchSettings(**raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            message = f"not a launch field (launch sets {', '.join(LaunchSettings.model_fields)})"
        else:
            message = error["msg"].removeprefix("Value error, ") + (f" (got {error['input']!r})" if field else "")
        raise ValueError(f"{where}.{LAUNCH_FIELD}.{field}: {message}" if field else
                         f"{where}.{LAUNCH_FIELD}.{message}") from None


def check_stage(where: str, settings: dict) -> RunConfig:
    settings, _ = split_launch(where, settings)
    unknown = sorted(set(settings) - set(STAGE_FIELDS))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: not a stage field (stages set {', '.join(STAGE_FIELDS)}, "
                         f"and {LAUNCH_FIELD})")
    if "train_tokens" not in settings:
        raise ValueError(f"{where}.train_tokens: required")
    try:
        # Placeholder data and remote: the packed shards of the chosen mixture and the store come at run time.
        checkpoint = {"remote": "_", **settings.get("checkpoint", {})}
        return from_dict(RunConfig, {**settings, "data": {"shards": {"_": "_"}}, "output_dir": "_", "checkpoint": checkpoint})
    except ValueError as exc:
        raise ValueError(f"{where}.{exc}") from None


# A proxy's trainer threads unless its launch says otherwise: proxies are small and many (the sweep's candidates, an
# ablation's arms, the ladder's rungs), side by side they use the cores better than threads do (two 1-thread
# proxies at once: the sweep in 55 s, one 2-thread proxy at a time: 75 s, on 2 cores), and a fixed count keeps a
# proxy's loss, so the chosen mixture, the same whatever runs beside it (`--jobs 1` or `--jobs 2`).
PROXY_THREADS = 1
NO_CHECKPOINTS = {"interval_steps": 0, "save_final": False, "resume": False}


def proxy_run(main: dict, *layers: tuple[str, dict], **fields) -> tuple[dict, LaunchSettings]:
    """The one way to build a proxy run (the mix sweep, the filter ablations, the scaling ladder): training.main
    with each (where, settings) layer merged over it in order, then `fields` (train_tokens, seed), without
    checkpoints. Every proxy keeps main's stability settings (model, schedule, optimizer) and its spike guard: a
    rollback with no checkpoint to return to goes back to the run's initial state (trainer.train.Trainer.rollback).
    Returns (the trainer's fields, the launch settings: PROXY_THREADS threads unless a layer sets `threads`)."""
    merged = main
    for _, layer in layers:
        merged = merge(merged, layer)
    settings, launch = split_launch(layers[-1][0] if layers else "training.main", merged)
    settings = merge(settings, {**fields, "checkpoint": NO_CHECKPOINTS})
    if launch.threads is None:
        launch = launch.model_copy(update={"threads": PROXY_THREADS})
    return settings, launch


STAGE_NAME = r"[a-z][a-z0-9_]*"


class Stage(BaseModel):
    """A stage after main: where it starts, its data; any other key is a run-config field it changes."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    continue_from: str | None = Field(None, description="An earlier stage whose run this one continues")
    init_from: str | None = Field(None, description="An earlier stage whose weights (only) start this one")
    weights: dict[str, float] | None = Field(None, description="Its own mixture (None: the chosen one)")
    min_doc_tokens: int = Field(0, ge=0, description="Only documents at least this long (the per-source length filter)")

    @field_validator("name")
    @classmethod
    def _key_safe(cls, name: str) -> str:
        if not re.fullmatch(STAGE_NAME, name):
            raise ValueError(f"stage name {name!r} must match {STAGE_NAME} (it becomes an asset key)")
        return name

    @model_validator(mode="after")
    def _one_start(self):
        if self.continue_from and self.init_from:
            raise ValueError(f"stage {self.name}: give continue_from or init_from, not both")
        return self

    def settings(self) -> dict:
        return dict(self.model_extra or {})

    def start(self, before: str) -> tuple[str, str]:
        """(continue_from or init_from, the stage it starts from); `before` is the stage before it."""
        return ("continue_from", self.continue_from) if self.continue_from else ("init_from", self.init_from or before)


class AnnealStage(Stage):
    name: str = "anneal"


class TrainingSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    main: dict[str, Any]
    stages: list[Stage] = []
    long_context: list[Stage] = []  # the older shape: long_context then anneal are `stages`
    anneal: AnnealStage | None = None

    @model_validator(mode="after")
    def _validate_every_stage(self):
        if self.stages and (self.long_context or self.anneal is not None):
            raise ValueError("give the stages after main as one list (training.stages) or as training.long_context "
                             "and training.anneal, not both")
        if self.anneal is not None and self.anneal.name != "anneal":
            raise ValueError(f"training.anneal.name: the anneal stage is named anneal, got {self.anneal.name!r} "
                             "(name other stages in training.stages)")
        names = ["main"]
        for where, stage in self.later():
            if stage.name in names:
                raise ValueError(f"{where}.name: {stage.name!r} is taken (stage names are unique, main included)")
            field, parent = stage.start(names[-1])
            if parent not in names:
                raise ValueError(f"{where}.{field}: {parent!r} is not an earlier stage ({', '.join(names)})")
            names.append(stage.name)
        self.stage_settings()  # raises ValueError naming the stage and field
        return self

    def later(self) -> list[tuple[str, Stage]]:
        """[(where in the recipe, stage)] after main, in training order."""
        if self.stages:
            return [(f"training.stages[{i}] ({s.name})", s) for i, s in enumerate(self.stages)]
        return [*((f"training.long_context[{i}] ({s.name})", s) for i, s in enumerate(self.long_context)),
                *([("training.anneal", self.anneal)] if self.anneal is not None else [])]

    def starts(self) -> dict[str, tuple[str, str]]:
        """{stage: (continue_from or init_from, the stage it starts from)} for every stage after main."""
        names, out = ["main"], {}
        for _, stage in self.later():
            out[stage.name] = stage.start(names[-1])
            names.append(stage.name)
        return out

    def stage(self, name: str) -> Stage | None:
        """The later stage of that name (None: main)."""
        return next((s for _, s in self.later() if s.name == name), None)

    def stage_settings(self) -> list[tuple[str, dict]]:
        """[(stage name, merged RunConfig fields)] in training order: main, then each later stage merged over
        the stage it starts from."""
        merged = {"main": dict(self.main)}
        check_stage("training.main", merged["main"])
        starts = self.starts()
        for where, stage in self.later():
            merged[stage.name] = merge(merged[starts[stage.name][1]], stage.settings())
            check_stage(where, merged[stage.name])
        return list(merged.items())

    def run_configs(self) -> list[tuple[str, RunConfig]]:
        return [(name, check_stage(name, settings)) for name, settings in self.stage_settings()]
