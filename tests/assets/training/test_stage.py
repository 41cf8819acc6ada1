"""assets/training/stage.py: the demo recipe's three stages as specs (keys, deps, sections, Launchpad config), and
the run config each hands the launcher, found by running prepare and build directly with a launcher that records
the run instead of starting a trainer: main from scratch on the chosen mixture, long_512 from main's final
checkpoint, anneal from long_512's on the anneal weights, each carrying the lineage of the one before."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, Failure

import assets.training.stage as stage
from assets.core.factory import Inputs
from assets.core.versioning import code_version, manifest_header, version_key
from assets.recipe import DEMO_RECIPE, load_recipe
from resources.launcher import LaunchResult
from storage.local import LocalStore
from storage.manifest import commit_folder
from tests.assets.training.real_packed import real_packed
from tests.assets.training.test_inputs import committed, context_for

PRIOR = ["books", "c4", "code", "math", "web"]


def specs_of(monkeypatch, recipe):
    monkeypatch.setattr(stage, "output_asset", lambda spec: spec)
    return stage.training_assets(recipe)


def packed_deps(sources):
    return [AssetKey(["tokenization", s, "packed"]) for s in sources] + [AssetKey(["tokenization", "tokenizer"])]


def test_demo_specs(monkeypatch):
    recipe = load_recipe(DEMO_RECIPE)
    main, long, anneal = specs_of(monkeypatch, recipe)
    assert [s.key for s in (main, long, anneal)] == [AssetKey(["training", n]) for n in ("main", "long_512", "anneal")]
    assert {s.group for s in (main, long, anneal)} == {"training"}
    weights = AssetKey(["mixing", "mixture_weights"])
    assert list(main.deps) == packed_deps(PRIOR) + [weights]
    assert list(long.deps) == packed_deps(PRIOR) + [weights, AssetKey(["training", "main"])]
    # The anneal branches off main (continue_from: main), on its own mixture.
    assert list(anneal.deps) == packed_deps(["books", "code", "math"]) + [AssetKey(["training", "main"])]
    assert all(dict(s.reads) == {} for s in (main, long, anneal))
    assert main.section["weights"] is None and long.section["weights"] is None
    assert anneal.section["weights"] == {"books": 0.4, "math": 0.3, "code": 0.3}
    assert [s.section["min_doc_tokens"] for s in (main, long, anneal)] == [0, 256, 0]
    assert all("launch" not in s.section["settings"] for s in (main, long, anneal))  # how it starts is not versioned
    assert main.section["settings"]["batch"]["seq_len"] == 128 and long.section["settings"]["batch"]["seq_len"] == 512
    assert anneal.section["settings"]["batch"]["seq_len"] == 128  # merged over main, the stage it continues
    # Where a stage starts is part of what it is (its code version): continue_from main, for both.
    assert "continue_from" not in main.section
    assert long.section["continue_from"] == anneal.section["continue_from"] == "main"
    assert main.code_version == code_version("training-main", main.code_sha256, main.section)
    assert main.resources == frozenset({"launcher"}) and main.out_name == "result"
    schema = main.asset_args["config_schema"]
    assert {k: f.default_value for k, f in schema.items()} == {"train_tokens": 262144, "seq_len": 128, "global_batch": 16}
    assert main.asset_args["metadata"]["launch"].value == {"max_restarts": 2}
    assert main.asset_args["retry_policy"].max_retries == 2


def test_launchpad_overrides_change_the_settings_and_a_bad_one_fails_naming_the_field():
    settings = {"train_tokens": 100, "batch": {"seq_len": 128, "global_batch": 16, "micro_batch": 8}}
    same, none = stage._with_overrides("main", settings, {"train_tokens": 100, "seq_len": 128})
    assert (same, none) == (settings, {})
    merged, overrides = stage._with_overrides("main", settings, {"train_tokens": 200, "global_batch": 32, "other": 1})
    assert overrides == {"train_tokens": 200, "global_batch": 32}
    assert merged == {"train_tokens": 200, "batch": {"seq_len": 128, "global_batch": 32, "micro_batch": 8}}
    with pytest.raises(Failure) as err:
        stage._with_overrides("main", settings, {"seq_len": 0})
    assert err.value.description == "launchpad config of training/main.batch.seq_len must be >= 1, got 0"


class RecordingLauncher:
    """Records the run config; writes what a trainer that saved one final checkpoint at step 4 would."""

    def __init__(self):
        self.runs = []

    def launch(self, context, run, work, settings):
        self.runs.append((run, settings))
        out = Path(run["output_dir"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps({"tokens": run["train_tokens"], "steps": 4}))
        (out / "metrics.jsonl").write_text("")
        return LaunchResult(summary={"tokens": run["train_tokens"]}, records=[{"event": "checkpoint_saved", "step": 4}])


def run_stage(spec, context, store):
    """The factory's sequence (core/factory.py) without Dagster: prepare, version key, build, commit, record."""
    inputs = spec.prepare(Inputs(context=context, store=store, outputs={}))
    vkey = version_key(spec.code_version, upstream=inputs.key_versions(), inputs=inputs.fingerprints)
    inputs = inputs.but(version_key=vkey)
    work = spec.work_dir(inputs)
    (work / spec.out_name).mkdir(parents=True)
    fields = spec.build(inputs.but(work=work), work / spec.out_name)
    prefix = "/".join([*spec.key.path, vkey])
    manifest = commit_folder(store, prefix, work / spec.out_name, {
        **manifest_header(spec.key.path, vkey, spec.code_version, spec.section, "run-" + spec.key.path[-1]),
        "upstream": inputs.upstream_versions(), **inputs.manifest, **fields})
    context.instance.report_runless_asset_event(AssetMaterialization(
        asset_key=spec.key, metadata={"prefix": prefix}, tags={"dagster/data_version": manifest["data_version"]}))
    return inputs, manifest


def test_the_run_configs_continue_main_in_long_512_and_anneal(monkeypatch, tmp_path):
    recipe = load_recipe(DEMO_RECIPE)
    instance = DagsterInstance.ephemeral()
    store = LocalStore(tmp_path / "store")
    outs, tok = real_packed(instance, store, tmp_path, {s: 140_000 for s in PRIOR})  # counted before launch
    chosen = {"web": 0.4, "c4": 0.1, "books": 0.2, "code": 0.2, "math": 0.1}
    weights = committed(instance, store, tmp_path, AssetKey(["mixing", "mixture_weights"]),
                        {"result.json": json.dumps({"weights": chosen})})
    launcher = RecordingLauncher()
    context = context_for(instance, tmp_path, launcher=launcher, store=SimpleNamespace(url=str(tmp_path / "store")))
    main, long, anneal = specs_of(monkeypatch, recipe)

    main_inputs, main_manifest = run_stage(main, context, store)
    (run, settings), = launcher.runs
    assert settings == {"max_restarts": 2} and "launch" not in run
    assert run["stage"] == "main" and run["init_from"] is None and run["train_tokens"] == 262144
    vkey = main_manifest["version_key"]
    # Zero-shot tasks during training (metrics.downstream_interval): the recipe's benchmarks and the tokenizer.
    tokenizer = tmp_path / "work" / "training" / "main" / vkey / "tokenizer" / "tokenizer.json"
    assert run["data"] == {"shards": {s: str(tmp_path / "store" / outs[s].prefix) for s in PRIOR},
                           "weights": chosen, "min_doc_tokens": 0, "tokenizer": str(tokenizer)}
    assert tokenizer.read_text() == "{}"  # the tokenizer output's file
    assert run["metrics"]["downstream_interval"] == 32
    assert run["metrics"]["downstream_benchmarks"] == str(recipe.input_root / "benchmarks")
    assert run["checkpoint"] == {"interval_steps": 32, "keep_last": 2, "remote": str(tmp_path / "store"),
                                 "run_name": vkey, "local_dir": str(tmp_path / "work" / "training" / "main" / vkey / "checkpoints")}
    assert run["output_dir"] == str(tmp_path / "work" / "training" / "main" / vkey / "out")
    # Where its TensorBoard events go while it trains: in the run's log at the start, in the manifest at the end.
    assert main_manifest["tensorboard"] == run["output_dir"] + "/tensorboard"
    assert run["tokenizer_sha256"] == "t" * 64
    assert [r["asset"] for r in run["lineage"]] == ["mixing/mixture_weights", *[f"tokenization/{s}/packed" for s in PRIOR],
                                                    "tokenization/tokenizer"]
    assert main_inputs.upstream == {**{f"tokenization/{s}/packed": outs[s].data_version for s in PRIOR},
                                    "tokenization/tokenizer": tok.data_version,
                                    "mixing/mixture_weights": weights.data_version}
    assert main_manifest["checkpoint"] == {"prefix": f"checkpoints/main/{vkey}/step-00000004", "step": 4,
                                           "uri": store.uri(f"checkpoints/main/{vkey}/step-00000004")}
    assert main_manifest["weights"] == chosen and main_manifest["lineage"] == run["lineage"]

    long_inputs, long_manifest = run_stage(long, context, store)
    run = launcher.runs[-1][0]
    # It continues main's run (weights, optimizer state, step, tokens) at its own low LR.
    assert run["stage"] == "long_512" and run["continue_from"] == main_manifest["checkpoint"]["uri"]
    assert run["init_from"] is None and run["optim"]["lr"] == 2.0e-4 and run["schedule"]["warmup_tokens"] == 8192
    assert run["batch"]["seq_len"] == 512 and run["model"]["rope_base"] == 100000.0
    assert run["data"]["min_doc_tokens"] == 256 and run["data"]["weights"] == chosen
    assert long_inputs.upstream["training/main"] == main_manifest["data_version"]
    assert run["lineage"][0] == {"asset": "training/main", "data_version": main_manifest["data_version"],
                                 "code_version": main.code_version, "run_id": "run-main",
                                 "recipe_section_sha256": main_manifest["recipe_section_sha256"],
                                 "prefix": f"training/main/{vkey}"}
    assert run["lineage"][1:] == main_manifest["lineage"]  # main's inputs, each once

    _, anneal_manifest = run_stage(anneal, context, store)
    run = launcher.runs[-1][0]
    # WSD's decay: it branches off main's final (stable-phase) checkpoint, not off the long-context stage.
    assert run["stage"] == "anneal" and run["continue_from"] == main_manifest["checkpoint"]["uri"]
    assert run["init_from"] is None and run["batch"]["seq_len"] == 128
    assert run["data"]["weights"] == {"books": 0.4, "math": 0.3, "code": 0.3}
    assert set(run["data"]["shards"]) == {"books", "code", "math"}
    assert run["schedule"]["decay_fraction"] == 1.0 and run["data"]["min_doc_tokens"] == 0
    assert [r["asset"] for r in run["lineage"][:2]] == ["training/main", "mixing/mixture_weights"]
    assert "training/long_512" not in [r["asset"] for r in run["lineage"]]
    assert "mixing/mixture_weights" in [r["asset"] for r in run["lineage"]]  # through main, though anneal reads none
    assert len({(r["asset"], r["data_version"]) for r in run["lineage"]}) == len(run["lineage"])
    assert anneal_manifest["checkpoint"]["prefix"].startswith("checkpoints/anneal/")
    instance.dispose()


def test_a_stage_can_keep_its_checkpoints_on_node_local_disks(tmp_path):
    """checkpoint.shared_local_dir false in a recipe stage: it validates (the store is its remote at run time), and
    the run.json puts the checkpoints under the recipe's local_dir (node-local, $VARS expanded on each node) per stage
    and version; without a local_dir they stay in the stage's work folder."""
    from assets.recipe.training import check_stage
    from tests.assets.test_recipe import write_recipe

    def node_local(raw):
        raw["training"]["main"]["checkpoint"] = {**raw["training"]["main"].get("checkpoint", {}),
                                                 "shared_local_dir": False, "local_dir": "/scratch/$SLURM_JOB_ID/ckpt"}

    load_recipe(write_recipe(tmp_path, node_local))  # raises naming the field if a stage cannot ask for it
    assert check_stage("training.main", {"train_tokens": 1000, "checkpoint": {"shared_local_dir": False}})
    section = stage.checkpoint_section({"shared_local_dir": False, "local_dir": "/scratch/$SLURM_JOB_ID/ckpt/",
                                        "keep_last": 2}, remote="s3://bucket/store", run_name="v1", stage="main",
                                       default_dir=Path("/work/main/v1/checkpoints"))
    assert section == {"shared_local_dir": False, "keep_last": 2, "remote": "s3://bucket/store", "run_name": "v1",
                       "local_dir": "/scratch/$SLURM_JOB_ID/ckpt/main/v1"}
    assert stage.checkpoint_section({}, remote="s3://b", run_name="v1", stage="main",
                                    default_dir=Path("/w/v1/checkpoints"))["local_dir"] == "/w/v1/checkpoints"
