"""The model weights of a committed checkpoint step, whole and in fp32, for evaluation and export.

    state, manifest = checkpoint_weights(step_folder)      # CausalLM parameter names -> fp32 tensors
    model_cfg = model_config(manifest)                     # the ModelConfig the run trained

Under ZeRO 1-3 the fp32 master weights are gathered from every rank's optimizer shard (DeepSpeed's
zero_to_fp32); under ZeRO-0 the module's own weights are read (fp32 runs: exact; bf16 runs: the bf16
weights the model computed with). The step's files are verified against its manifest first, so a
corrupt checkpoint is never evaluated or exported.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import torch

from trainer.checkpoint_store import LocalCheckpoints, local_step
from trainer.config import ModelConfig, RunConfig, from_dict

DS_TAG = "ds"  # trainer/checkpoint.py writes DeepSpeed's files under <step>/ds/


def model_config(manifest: dict) -> ModelConfig:
    return from_dict(RunConfig, manifest["config"]).model


def checkpoint_weights(step_folder: str | Path, *, verify: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
    folder = Path(step_folder)
    if verify:
        step = int(folder.name.removeprefix("step-"))
        manifest = LocalCheckpoints(folder.parent).verify(step)
    else:
        import json

        manifest = json.loads((folder / "manifest.json").read_text())
    ds = folder / DS_TAG
    if not ds.is_dir():
        raise ValueError(f"{folder}: no DeepSpeed files ({DS_TAG}/): not a trainer checkpoint step")
    if any(ds.glob("*optim_states.pt")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with contextlib.redirect_stdout(io.StringIO()):  # it prints a progress line per shard
            state = get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=DS_TAG)
    else:
        [model_file] = sorted(ds.glob("*model_states.pt"))
        state = torch.load(model_file, map_location="cpu", weights_only=False)["module"]
    return {name: t.detach().to(torch.float32) for name, t in state.items()}, manifest


def load_initial_weights(model: torch.nn.Module, uri: str, cache_dir: str | Path) -> dict:
    """Initialise `model` (a CausalLM) from another run's checkpoint: weights only (a new stage starts
    its own optimizer and schedule). Returns that checkpoint's manifest."""
    state, manifest = checkpoint_weights(local_step(uri, cache_dir))
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in sorted(set(own) & set(state))
              if state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        raise ValueError(f"init_from {uri}: the checkpoint's model does not match model config "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]}, shapes {shapes[:3]})")
    model.load_state_dict(state)
    return manifest
