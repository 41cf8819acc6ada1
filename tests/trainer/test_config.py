"""The trainer's run config (trainer/config.py): pydantic validates run.json, and errors name the field by its
dotted path; what a run writes into its checkpoint manifests reads back to the same config and the same JSON."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import REPO
from trainer.config import BatchConfig, OptimConfig, RunConfig, from_dict, load_run_config
from trainer.model.config import ModelConfig
from trainer.parallel.config import DeepSpeedConfig

DEMO_RECIPE = REPO / "recipes" / "demo.yaml"  # assets.recipe names it too, but importing that loads Dagster
BASE = {"data": {"text": "t.txt", "tokenizer": "tok.json"}, "train_tokens": 1000, "output_dir": "out"}


def error_of(data: dict, where: str = "") -> str:
    with pytest.raises(ValueError) as e:
        from_dict(RunConfig, data, where=where)
    return str(e.value)


def test_an_unknown_field_is_refused_naming_its_path_and_the_known_ones():
    assert error_of({**BASE, "colour": "blue"}).startswith("colour: unknown field (known: batch, checkpoint, continue_from, data,")
    message = error_of({**BASE, "model": {"n_layer": 2}})
    assert message.startswith("model.n_layer: unknown field (known: activation_checkpointing, attention, checkpoint_every, compile, d_ff, d_model,")
    assert "n_layers" in message
    # The outermost typo first, as a reader fixes them.
    assert error_of({**BASE, "model": {"n_layer": 2}, "foo": 1}).startswith("foo: unknown field")
    assert error_of({**BASE, "data": {"shards": {"web": "w"}, "weight": {}}}).startswith("data.weight: unknown field")
    assert error_of({k: v for k, v in BASE.items() if k != "output_dir"}) == "output_dir: required field missing"


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"model": {"d_model": "256"}}, "model.d_model: expected an integer, got '256'"),  # no coercion from text
        ({"model": {"d_model": 2.5}}, "model.d_model: expected an integer, got 2.5"),
        ({"model": {"d_model": True}}, "model.d_model: expected an integer, got True"),
        ({"model": {"qk_norm": 1}}, "model.qk_norm: expected true or false, got 1"),
        ({"model": {"rope_base": "1e4"}}, "model.rope_base: expected a number, got '1e4'"),
        ({"model": {"attention": "fast"}}, "model.attention: must be one of ['auto', 'flex', 'sdpa'], got 'fast'"),
        ({"model": [1]}, "model: expected an object, got list"),
        ({"stage": 3}, "stage: expected a string, got 3"),
        ({"deepspeed": {"zero_stage": True}}, "deepspeed.zero_stage: must be one of [0, 1, 2, 3], got True"),
        ({"deepspeed": {"bf16": "yes"}}, 'deepspeed.bf16: expected true, false or "auto", got \'yes\''),
        ({"optim": {"betas": [0.9]}}, "optim.betas: expected a list of 2 items, got [0.9]"),
        ({"data": {"shards": {"web": 1}}}, "data.shards.web: expected a string, got 1"),
        ({"lineage": [1]}, "lineage[0]: expected an object, got int"),
        # A section's own checks name their field the same way.
        ({"model": {"d_model": 100, "n_heads": 3}}, "model.d_model (100) must be divisible by model.n_heads (3)"),
        ({"data": {"text": "t.txt"}}, "data.tokenizer: a tokenizer.json is needed with data.text"),
        ({"train_tokens": 0}, "train_tokens must be >= 1, got 0"),
    ],
)
def test_a_wrong_value_is_refused_naming_its_path(patch, message):
    assert error_of({**BASE, **patch}) == message


def test_errors_under_a_prefix_and_from_a_file_name_where_they_are(tmp_path):
    message = error_of({**BASE, "model": {"d_model": "x"}}, where="stage")
    assert message == "stage.model.d_model: expected an integer, got 'x'"
    assert error_of([1]) == "the config: expected an object, got list"
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**BASE, "batch": {"seq_len": 0}}))
    with pytest.raises(ValueError, match=r"run\.json: batch\.seq_len must be >= 1, got 0"):
        load_run_config(path)
    # Built directly, a config is checked as well (pydantic's ValidationError is a ValueError).
    with pytest.raises(ValueError, match="model.n_heads"):
        ModelConfig(d_model=64, n_heads=3)


def test_defaults_and_json_numbers():
    cfg = from_dict(RunConfig, BASE)
    assert cfg.model == ModelConfig() and cfg.optim == OptimConfig() and cfg.batch == BatchConfig()
    assert (cfg.stage, cfg.seed, cfg.init_from, cfg.lineage) == ("main", 0, None, [])
    assert cfg.model.ff_dim == 704 and cfg.model.kv_heads == 4 and cfg.model.head_dim == 64
    assert cfg.optim.betas == (0.9, 0.95) and DeepSpeedConfig().bf16 == "auto"
    # JSON has one number type: json.dumps(2e6) gives 2000000.0, which an int field takes; a float field
    # takes an int and keeps a float, so the config's JSON does not depend on how the number was written.
    cfg = from_dict(RunConfig, {**BASE, "train_tokens": 2e6, "model": {"rope_base": 500000},
                                "optim": {"betas": [0, 0.99]}})
    assert cfg.train_tokens == 2_000_000 and type(cfg.train_tokens) is int
    assert type(cfg.model.rope_base) is float and cfg.optim.betas == (0.0, 0.99) and type(cfg.optim.betas[0]) is float
    with pytest.raises(ValueError):  # frozen, as the dataclasses were
        cfg.model.d_model = 8


def test_a_run_config_round_trips_through_json():
    cfg = from_dict(RunConfig, {
        **BASE, "data": {"shards": {"web": "/s/web", "code": "/s/code"}, "weights": {"web": 1, "code": 0.5}},
        "lineage": [{"asset": "raw", "data_version": "1", "run_id": None}], "tokenizer_sha256": "ab" * 32,
        "model": {"n_kv_heads": 2, "qk_norm": True}, "deepspeed": {"bf16": False, "zero_stage": 2},
    })
    text = json.dumps(cfg.to_dict())
    again = from_dict(RunConfig, json.loads(text))
    assert again == cfg and json.dumps(again.to_dict()) == text
    assert list(cfg.to_dict()) == list(RunConfig.model_fields)  # the manifest's key order is the field order
    assert cfg.to_dict()["optim"]["betas"] == (0.9, 0.95)
    assert cfg.to_dict()["data"]["weights"] == {"web": 1.0, "code": 0.5}


def test_the_demo_recipes_main_stage_is_a_valid_run_config():
    main = yaml.safe_load(DEMO_RECIPE.read_text())["training"]["main"]
    settings = {k: v for k, v in main.items() if k != "launch"}  # how the trainer starts, not a trainer field
    cfg = from_dict(RunConfig, {**settings, "data": {"shards": {"web": "w"}}, "output_dir": "out"})
    assert cfg.train_tokens == main["train_tokens"] and cfg.model.n_kv_heads == 2 and cfg.schedule.kind == "wsd"
    assert from_dict(RunConfig, json.loads(json.dumps(cfg.to_dict()))) == cfg
