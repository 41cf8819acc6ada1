"""The model weights of a committed checkpoint step, whole and in fp32, for evaluation and export; another
run's step that a new stage starts from (init_from: its weights; continue_from: its whole state).

    state, manifest = checkpoint_weights(step_folder)      # CausalLM parameter names -> fp32 tensors
    model_cfg = model_config(manifest)                     # the ModelConfig the run trained

Under ZeRO 1-3 the fp32 master weights are gathered from every rank's optimizer shard (DeepSpeed's
zero_to_fp32); under ZeRO-0 the module's own weights are read (fp32 runs: exact; bf16 runs: the bf16
weights the model computed with); a tensor-parallel run's shards are concatenated from its module files (likewise).
The step's files are verified against its manifest first, so a
corrupt checkpoint is never evaluated or exported.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trainer.checkpoint.store import LocalCheckpoints, ResumePoint, local_step
from trainer.config import from_dict
from trainer.model.config import ModelConfig

DS_TAG = "ds"  # trainer/checkpoint/checkpointer.py writes DeepSpeed's files under <step>/ds/


def model_config(manifest: dict) -> ModelConfig:
    # The model section alone: a checkpoint stays loadable when another section's vocabulary changes after it was
    # written (metrics.downstream_tasks took lm-eval's task names: "lambada" became "lambada_openai").
    return from_dict(ModelConfig, manifest["config"]["model"], "model")


def checkpoint_weights(step_folder: str | Path, *, verify: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
    folder = Path(step_folder)
    if verify:
        step = int(folder.name.removeprefix("step-"))
        manifest = LocalCheckpoints(folder.parent).verify(step)
    else:
        manifest = json.loads((folder / "manifest.json").read_text())
    ds = folder / DS_TAG
    if not ds.is_dir():
        raise ValueError(f"{folder}: no DeepSpeed files ({DS_TAG}/): not a trainer checkpoint step")
    if any(ds.glob("layer_*-model_states.pt")):  # a pipeline's (parallel.pipeline > 1): one file per layer
        from trainer.parallel.pipeline import causal_lm_weights

        state = causal_lm_weights(ds)
    elif manifest.get("config", {}).get("parallel", {}).get("tensor", 1) > 1:  # a file per tensor-parallel shard
        from trainer.parallel.tensor import merged_weights

        state = merged_weights(ds)
    elif any(ds.glob("*optim_states.pt")):
        from trainer.parallel.engine import zero_fp32_weights  # zero_to_fp32, or the shards of bf16 ZeRO-1's optimizer

        state = zero_fp32_weights(ds)
    else:
        [model_file] = sorted(ds.glob("*model_states.pt"))
        state = torch.load(model_file, map_location="cpu", weights_only=False)["module"]
    return {name: t.detach().to(torch.float32) for name, t in state.items()}, manifest


def load_initial_weights(model: torch.nn.Module, uri: str, cache_dir: str | Path) -> dict:
    """Initialise `model` (a CausalLM) from another run's checkpoint: weights only (a new stage starts
    its own optimizer and schedule). Returns that checkpoint's manifest."""
    state, manifest = checkpoint_weights(local_step(uri, cache_dir))
    changed = parametrization_change(manifest, model.transformer.cfg)
    if changed:
        raise ValueError(f"init_from {uri}: {changed}: the same weights compute another function under another "
                         "parametrization; give this stage the checkpoint's model.parametrization and model.mup_*")
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in sorted(set(own) & set(state))
              if state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        raise ValueError(f"init_from {uri}: the checkpoint's model does not match model config "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]}, shapes {shapes[:3]})")
    model.load_state_dict(state)
    return manifest


# What fixes the shapes of the weights and Adam moments: a continued run may change anything else (rope_base).
SHAPE_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "kv_heads", "ff_dim", "qk_norm")
# What, beyond the shapes, fixes the function the weights compute (μP's multipliers, trainer.model.transformer) and
# the optimizer's parameter groups: a checkpoint resumes, continues or initialises only a run that agrees on them.
PARAMETRIZATION_FIELDS = ("parametrization", "mup_base_width", "mup_base_head_dim")


def parametrization_change(manifest: dict, model: ModelConfig) -> str | None:
    """The model.* fields of PARAMETRIZATION_FIELDS on which the checkpoint's run and `model` differ, with both values
    ("model.parametrization "mup" vs "standard""); None when they agree. A checkpoint from before these fields
    existed was standard (the defaults fill in), and so was one whose manifest records no model."""
    theirs = from_dict(ModelConfig, manifest.get("config", {}).get("model", {}), "model")
    differ = [f"model.{k} {getattr(theirs, k)!r} in the checkpoint, {getattr(model, k)!r} in this run"
              for k in PARAMETRIZATION_FIELDS if getattr(theirs, k) != getattr(model, k)]
    return "; ".join(differ) or None


def continued_step(uri: str, cache_dir: str | Path, model: ModelConfig, dist) -> ResumePoint:
    """The verified local copy of the step at `uri` that a run continues (continue_from): rank 0 downloads it
    once and checks it, every rank gets its answer. A model of another shape is refused, naming what differs."""
    found = [None]
    if dist.rank == 0:
        folder = local_step(uri, cache_dir)
        step = int(folder.name.removeprefix("step-"))
        manifest = LocalCheckpoints(folder.parent).verify(step)
        if not (folder / DS_TAG).is_dir():
            raise ValueError(f"continue_from {uri}: no DeepSpeed files ({DS_TAG}/): not a trainer checkpoint step")
        theirs = model_config(manifest)
        differ = [f"{k} {getattr(theirs, k)} vs {getattr(model, k)}" for k in SHAPE_FIELDS
                  if getattr(theirs, k) != getattr(model, k)]
        if differ:
            raise ValueError(f"continue_from {uri}: the checkpoint's model does not match model config "
                             f"({', '.join(differ)})")
        found = [ResumePoint(step, folder, manifest, "continue_from")]
    if dist.world_size > 1:
        torch.distributed.broadcast_object_list(found, src=0)
    return found[0]


def continue_run(trainer, source: ResumePoint, *, universal: bool) -> None:
    """Continue in `trainer` (its engine freshly built) the run that wrote `source`: its weights and optimizer
    state (Adam's moments and step count), its step and token count; this stage's own optimizer settings
    (betas, eps, weight decay) and LR schedule apply from there. The data position goes on when the data
    stream is the same; a new mixture, sequence length or length filter starts its own stream at sample 0.
    The spike guard, SDC and canary checks start afresh: their running figures belong to the other stream."""
    cfg, st = trainer.cfg, trainer.state
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in trainer.optimizer.param_groups]
    trainer.checkpointer.load_module(source, trainer.module, universal=universal)
    for group, own in zip(trainer.optimizer.param_groups, hyper):
        group.update(own)  # DeepSpeed's load brought the other run's hyperparameters
    saved = json.loads((source.path / "trainer.json").read_text())["train"]
    theirs = source.manifest["config"]
    same_stream = (theirs["data"] == cfg.data.model_dump() and theirs["seed"] == cfg.seed
                   and theirs["batch"]["seq_len"] == cfg.batch.seq_len)
    st.step, st.tokens, st.start_tokens = saved["step"], saved["tokens"], saved["tokens"]
    if same_stream:
        st.sample_index, st.skip_windows = saved["sample_index"], [list(w) for w in saved.get("skip_windows", [])]
    trainer.metrics.log_event({"event": "continued", "from": cfg.continue_from, "step": source.step,
                               "tokens": st.tokens, "same_data": same_stream, "universal": universal})
