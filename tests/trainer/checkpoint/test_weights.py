"""trainer.checkpoint.weights: a committed ZeRO-0 step's weights in fp32, verified first, its model config, init_from checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import run_dict
from trainer.checkpoint.store import CorruptCheckpoint, LocalCheckpoints
from trainer.model.config import ModelConfig
from trainer.model.transformer import CausalLM
from trainer.checkpoint.weights import DS_TAG, checkpoint_weights, load_initial_weights, model_config

TINY = {"vocab_size": 64, "d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1}


def commit_step(root: Path, step: int, state: dict, model: dict = TINY, extra: dict | None = None) -> Path:
    """A committed step laid out as trainer/checkpoint/checkpointer.py writes a ZeRO-0 one: <step>/ds/mp_rank_00_model_states.pt."""
    store = LocalCheckpoints(root, fsync=False)
    staging = store.staging_dir(step)
    (staging / DS_TAG).mkdir()
    torch.save({"module": state, "buffer_names": []}, staging / DS_TAG / "mp_rank_00_model_states.pt")
    for rel, data in (extra or {}).items():
        (staging / rel).write_bytes(data)
    config = run_dict(root.parent / "out", model=model)
    store.commit(step, {"config": config, "stage": "main"})
    return store.path(step)


@pytest.fixture
def bf16_model() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(ModelConfig(**TINY)).to(torch.bfloat16)


def test_a_zero_0_step_gives_every_weight_upcast_to_fp32(tmp_path, bf16_model):
    state = bf16_model.state_dict()
    step = commit_step(tmp_path / "ckpt", 5, state)
    weights, manifest = checkpoint_weights(step)
    assert set(weights) == set(state) and manifest["step"] == 5 and manifest["stage"] == "main"
    for name, value in state.items():
        assert weights[name].dtype == torch.float32 and weights[name].shape == value.shape
        assert torch.equal(weights[name], value.float()), name  # bf16 -> fp32 is exact
    assert not any(t.requires_grad for t in weights.values())


def test_the_weights_load_into_a_model_of_the_manifests_config(tmp_path, bf16_model):
    step = commit_step(tmp_path / "ckpt", 1, bf16_model.state_dict())
    weights, manifest = checkpoint_weights(step)
    cfg = model_config(manifest)
    assert isinstance(cfg, ModelConfig)
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads) == (64, 32, 1, 2, 1)
    fresh = CausalLM(cfg)
    fresh.load_state_dict(weights)  # strict: every parameter by name and shape
    tokens = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(fresh.transformer(tokens), bf16_model.float().transformer(tokens))


def test_a_corrupt_weights_file_is_refused_by_name_before_it_is_read(tmp_path, bf16_model):
    step = commit_step(tmp_path / "ckpt", 2, bf16_model.state_dict())
    model_file = step / DS_TAG / "mp_rank_00_model_states.pt"
    data = bytearray(model_file.read_bytes())
    data[-100] ^= 0xFF  # same size, different bytes
    model_file.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match=r"ds/mp_rank_00_model_states\.pt.*sha256 mismatch"):
        checkpoint_weights(step)
    model_file.write_bytes(bytes(data[:-10]))
    with pytest.raises(CorruptCheckpoint, match=r"ds/mp_rank_00_model_states\.pt.*size"):
        checkpoint_weights(step)


def test_verify_false_reads_the_manifest_without_hashing(tmp_path, bf16_model):
    step = commit_step(tmp_path / "ckpt", 3, bf16_model.state_dict(), extra={"notes.txt": b"kept"})
    (step / "notes.txt").write_bytes(b"changed after the commit")  # verify would refuse this step
    with pytest.raises(CorruptCheckpoint, match="notes.txt"):
        checkpoint_weights(step)
    weights, manifest = checkpoint_weights(step, verify=False)
    assert manifest == json.loads((step / "manifest.json").read_text()) and len(weights) == len(bf16_model.state_dict())


def test_a_step_without_deepspeed_files_is_not_a_trainer_checkpoint(tmp_path):
    store = LocalCheckpoints(tmp_path / "ckpt", fsync=False)
    (store.staging_dir(4) / "weights.bin").write_bytes(b"\0" * 8)
    store.commit(4, {"config": run_dict(tmp_path / "out")})
    with pytest.raises(ValueError, match=r"step-00000004: no DeepSpeed files \(ds/\): not a trainer checkpoint step"):
        checkpoint_weights(store.path(4))


def test_an_uncommitted_step_has_no_manifest(tmp_path):
    folder = tmp_path / "ckpt" / "step-00000007"
    (folder / DS_TAG).mkdir(parents=True)
    with pytest.raises(CorruptCheckpoint, match="manifest.json"):
        checkpoint_weights(folder)


def test_init_from_copies_the_weights_into_a_matching_model(tmp_path, bf16_model):
    step = commit_step(tmp_path / "ckpt", 6, bf16_model.state_dict())
    torch.manual_seed(1)
    model = CausalLM(ModelConfig(**TINY))
    manifest = load_initial_weights(model, str(step), tmp_path / "cache")
    assert manifest["step"] == 6
    for name, value in bf16_model.state_dict().items():
        assert torch.equal(model.state_dict()[name], value.float()), name
    assert not (tmp_path / "cache").exists()  # a local step is read in place, not copied


def test_init_from_a_model_of_another_shape_names_what_differs(tmp_path, bf16_model):
    step = commit_step(tmp_path / "ckpt", 6, bf16_model.state_dict())
    wider = CausalLM(ModelConfig(**{**TINY, "d_model": 64, "n_heads": 4, "n_kv_heads": 2}))
    before = {k: v.clone() for k, v in wider.state_dict().items()}
    # head dim 32 / 2 = 16 with 1 kv head: wk is (16, 32); the wider model's (2 * 16, 64). Only shapes differ.
    with pytest.raises(ValueError, match=r"does not match model config \(missing \[\], unexpected \[\], shapes "
                                         r"\['transformer\.blocks\.0\.attn\.wk\.weight \(16, 32\) vs \(32, 64\)'"):
        load_initial_weights(wider, str(step), tmp_path / "cache")
    assert all(torch.equal(before[k], v) for k, v in wider.state_dict().items())  # left as it was
    deeper = CausalLM(ModelConfig(**{**TINY, "n_layers": 2}))
    with pytest.raises(ValueError, match=r"init_from .*step-00000006.*missing \['transformer\.blocks\.1\."):
        load_initial_weights(deeper, str(step), tmp_path / "cache")


def test_init_from_needs_a_step_folder(tmp_path):
    with pytest.raises(ValueError, match="give a checkpoint step folder"):
        load_initial_weights(CausalLM(ModelConfig(**TINY)), str(tmp_path / "ckpt"), tmp_path / "cache")
