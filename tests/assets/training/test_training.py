"""Training stages as assets on a small recipe: main -> long-context -> anneal -> evaluation, each continuing the
run before (continue_from), through the launcher resource, checkpointing to the store; a killed main run
resumes from its last checkpoint; a training job outlives the Dagster run that started it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from assets.cli import main
from assets.definitions import build_resources
from tests.assets.curated import copy_curated, two_small_sources
from tests.conftest import REPO
from trainer.checkpoint.store import LocalCheckpoints, step_name
from trainer.job.detach import read_job

MODEL = {"vocab_size": 1024, "d_model": 32, "n_layers": 1, "n_heads": 2}
BATCH = {"global_batch": 8, "micro_batch": 8, "seq_len": 64, "ramp_start": None, "ramp_tokens": 0}


def write_recipe(path, main_steps=6):
    """The curated home's two sources (tests/assets/curated.py), with three tiny training stages."""
    raw = two_small_sources()
    raw.pop("mixing", None)
    raw["training"] = {
        "main": {"train_tokens": main_steps * 8 * 64, "model": MODEL, "batch": BATCH, "optim": {"lr": 3e-3},
                 "deepspeed": {"zero_stage": 1, "bf16": "auto"},
                 "metrics": {"log_interval": 1, "eval_batches": 1, "tensorboard": False, "downstream_interval": 3,
                             "downstream_tasks": ["arc_easy"], "downstream_limit": 4},
                 "checkpoint": {"interval_steps": 2, "keep_last": 2}},
        "long_context": [{"name": "long_128", "continue_from": "main", "train_tokens": 2 * 4 * 128,
                          "model": {"rope_base": 50000.0}, "optim": {"lr": 3e-4},
                          "batch": {"seq_len": 128, "global_batch": 4, "micro_batch": 4}, "min_doc_tokens": 200}],
        "anneal": {"continue_from": "long_128", "train_tokens": 2 * 4 * 128, "weights": {"math": 1.0},
                   "schedule": {"kind": "wsd", "decay_fraction": 1.0, "min_lr_ratio": 0.0}},
    }
    raw["evaluation"] = {"tasks": ["arc_easy", "lambada_openai"], "limit": 4, "val_sequences": 4, "canary_sequences": 2}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def metadata(key: str) -> dict:
    event = DagsterInstance.get().get_latest_materialization_event(AssetKey.from_user_string(key))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


@pytest.mark.slow  # ~2 min: three tiny training stages and three evaluations on the session's curated home
def test_every_stage_trains_from_the_one_before_and_is_evaluated(tmp_path, monkeypatch, capsys, curated_home):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    assert main(["materialize", "--stale"]) == 0  # the training stages and their evaluations: curation is fresh

    store = build_resources()["store"].open()
    stages = {name: metadata(f"training/{name}") for name in ("main", "long_128", "anneal")}
    # Each continues the run before it: the step count goes on (6 of main, then 2 steps each).
    assert [stages[n]["steps"] for n in ("main", "long_128", "anneal")] == [6, 8, 10]
    for name, meta in stages.items():
        prefix = meta["checkpoint"].split("/store/", 1)[1]  # file://…/store/checkpoints/<stage>/<vkey>/step-N
        manifest = json.loads(store.get_bytes(f"{prefix}/manifest.json"))
        assert manifest["step"] == meta["checkpoint_step"] and manifest["config"]["stage"] == name
        # The precision the trainer chose for this machine, in the checkpoint and in the asset's metadata.
        assert manifest["precision"]["requested"] == "auto"
        assert manifest["precision"]["dtype"] == meta["precision"] in ("bf16", "fp32")
        assert meta["precision_reason"] == manifest["precision"]["reason"]
        assert "data:image/png;base64," in meta["loss_curve"]
        # Zero-shot arc_easy during training (every 3 steps and at the end), plotted against tokens.
        assert "data:image/png;base64," in meta["zero_shot_curve"]
        assets = [r["asset"] for r in manifest["lineage"]]
        assert {"tokenization/math/packed", "tokenization/tokenizer", "curation/math/raw_crawl"} <= set(assets)
    # Each later stage continues the one before: its checkpoint names the previous stage's final step, and its
    # tokens count on from there.
    long_run = json.loads(store.get_bytes(
        stages["long_128"]["checkpoint"].split("/store/", 1)[1] + "/manifest.json"))
    assert long_run["config"]["continue_from"] == stages["main"]["checkpoint"]
    assert long_run["config"]["init_from"] is None
    assert long_run["tokens"] == 6 * 8 * 64 + 2 * 4 * 128
    assert long_run["config"]["batch"]["seq_len"] == 128 and long_run["config"]["model"]["rope_base"] == 50000.0
    assert long_run["config"]["data"]["min_doc_tokens"] == 200  # only long documents
    assert [r["asset"] for r in long_run["lineage"]][0] == "training/main"
    assert metadata("training/anneal")["weights"] == {"math": 1.0}

    for name in ("main", "long_128", "anneal"):
        ev = metadata(f"evaluation/{name}")
        assert set(ev["val_loss"]) == {"c4", "math"} and ev["canary_loss"] > 0
        assert ev["step"] == stages[name]["checkpoint_step"]
        assert 0 <= ev["arc_easy_acc_norm"] <= 1 and 0 <= ev["lambada_openai_acc"] <= 1
        # lm-eval's results: every metric with its stderr, its table, and the stages this one descends from.
        assert {"acc_norm,none", "acc_norm_stderr,none"} <= set(ev["lm_eval"]["results"]["arc_easy"])
        assert "arc_easy" in ev["lm_eval_table"] and "data:image/png;base64," in ev["lm_eval_across_stages"]
        # The evaluation process reports through the asset's Pipes session: its summary line is in the run's log,
        # and Dagster's warning of a session that received no message is not.
        instance = DagsterInstance.get()
        run_id = instance.get_latest_materialization_event(AssetKey(["evaluation", name])).run_id
        messages = [entry.user_message for entry in instance.all_logs(run_id)]
        assert any(f"step {ev['step']}: val_loss c4 " in m and "canary_loss" in m for m in messages), messages[-20:]
        assert not any("did not receive any messages" in m for m in messages)

    # The checkpoint alone tells what made it.
    capsys.readouterr()
    assert main(["lineage", stages["anneal"]["checkpoint"]]) == 0
    out = capsys.readouterr().out
    assert "training/long_128" in out and "curation/c4/raw_crawl" in out
    # And exports as a Llama model, with the tokenizer its lineage names.
    assert main(["export", stages["anneal"]["checkpoint"], str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "tokenizer.json").exists() and (tmp_path / "hf" / "model.safetensors").exists()
    # `pretrain eval` runs lm-eval on it as the evaluation asset does (the recipe's benchmarks; the tasks given).
    # In a process of its own, as a user runs it: lm-eval forks, and a fork of this test session (threads of earlier
    # tests holding locks) can hang.
    done = subprocess.run([sys.executable, "-m", "assets.cli", "eval", stages["anneal"]["checkpoint"], "--tasks",
                           "arc_easy", "--limit", "4", "--out", str(tmp_path / "lm_eval.json")],
                          cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "acc_norm" in done.stdout
    cli_results = json.loads((tmp_path / "lm_eval.json").read_text())["results"]["arc_easy"]
    # The same checkpoint and items as the evaluation asset: the same score.
    assert cli_results["acc_norm,none"] == metadata("evaluation/anneal")["arc_easy_acc_norm"]

    # The Launchpad starts from the recipe's values; a bad override fails naming the field, before training.
    from assets.definitions import build_defs
    from assets.recipe import load_recipe

    defs = build_defs(load_recipe(recipe))
    job = defs.resolve_implicit_global_asset_job_def()
    op = job.graph.node_named("training__main").definition
    assert op.config_schema.config_type.fields["train_tokens"].default_value == 6 * 8 * 64
    result = job.execute_in_process(instance=DagsterInstance.get(), asset_selection=[AssetKey(["training", "main"])],
                                    run_config={"ops": {"training__main": {"config": {"seq_len": 0}}}},
                                    raise_on_error=False)
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error.to_string()
    assert "launchpad config of training/main.batch.seq_len must be >= 1" in error


@pytest.mark.slow  # ~1-2 min
def test_a_killed_main_run_resumes_from_its_last_checkpoint(tmp_path, monkeypatch, curated_home):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe, main_steps=24)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))

    command = [sys.executable, "-m", "assets.cli", "materialize", "--select", "training/main"]
    proc = subprocess.Popen(command, cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    metrics = None
    try:
        while time.monotonic() < deadline:
            found = list((tmp_path / "pretrain-home" / "work" / "training" / "main").glob("*/out/metrics.jsonl"))
            if found:
                metrics = found[0]
                saved = [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("event") == "committed"]
                if any(r["step"] >= 4 for r in saved):
                    break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.02)  # a step of this model takes ~20 ms where bf16 is native: look often
        else:
            pytest.fail("no checkpoint at step 4 within 300 s")
    finally:
        # kill -9 everything: the training job, which runs in a session of its own (it outlives the CLI otherwise:
        # test_a_killed_run_worker_leaves_the_job_training), first, as a step takes milliseconds; then the CLI.
        for job_file in (tmp_path / "pretrain-home" / "work" / "training" / "main").glob("*/job.json"):
            read_job(job_file.parent).kill()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    # What was committed when the kill came (the event may not have reached the metrics file yet).
    committed = LocalCheckpoints(metrics.parent.parent / "checkpoints").committed()[-1]
    trained_before = [r["step"] for r in records if r.get("event") == "train"]

    assert main(["materialize", "--select", "training/main"]) == 0
    after = [json.loads(line) for line in metrics.read_text().splitlines()][len(records):]
    resumed = [r for r in after if r.get("event") == "resumed"]
    assert resumed and resumed[0]["step"] == committed
    steps = [r["step"] for r in after if r.get("event") == "train"]
    assert steps == list(range(committed + 1, 25))  # nothing before the checkpoint is trained again
    assert max(trained_before) >= committed
    assert metadata("training/main")["steps"] == 24

    # Killed after the trainer's final checkpoint was committed but before the asset's output was: the next
    # materialization resumes at the end, trains nothing, and commits with that final checkpoint.
    (manifest,) = (tmp_path / "pretrain-home" / "store" / "training" / "main").glob("*/manifest.json")
    final = json.loads(manifest.read_text())["checkpoint"]
    manifest.unlink()
    before = len(metrics.read_text().splitlines())
    assert main(["materialize", "--select", "training/main"]) == 0
    again = [json.loads(line) for line in metrics.read_text().splitlines()][before:]
    assert [r["step"] for r in again if r.get("event") == "resumed"] == [24]
    assert not [r for r in again if r.get("event") == "train"]
    assert json.loads(manifest.read_text())["checkpoint"] == final


def trainer_processes(run_json) -> list[int]:
    """Pids of the processes running the trainer on `run_json` (`python -m trainer --config run_json`), from /proc."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = open(f"/proc/{entry.name}/cmdline", "rb").read().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if b"trainer" in argv and str(run_json).encode() in argv:
            found.append(int(entry.name))
    return found


@pytest.mark.slow  # ~1-2 min: the main run twice (killed once, then uninterrupted) on copies of the curated home
def test_a_killed_run_worker_leaves_the_job_training_and_the_next_run_follows_it(tmp_path, monkeypatch, capsys,
                                                                                 curated_template, curated_home):
    """SIGKILL to the process running the Dagster run (the CLI here) mid-training: the trainer goes on; the next
    materialization follows that job instead of starting a second trainer, no step is trained twice, and the final
    checkpoint is bit for bit the one an uninterrupted run writes."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe, main_steps=96)  # long enough (~2 s where bf16 is native) to find the job still running
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    work_root = tmp_path / "pretrain-home" / "work" / "training" / "main"

    proc = subprocess.Popen([sys.executable, "-m", "assets.cli", "materialize", "--select", "training/main"], cwd=REPO,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            found = list(work_root.glob("*/out/metrics.jsonl"))
            if found and any(r.get("event") == "train" and r["step"] >= 3 for r in map(json.loads, found[0].read_text().splitlines())):
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.02)
        else:
            pytest.fail("no step 3 within 300 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI and all in its process group: not the job, in its own session
        proc.wait()
    work = found[0].parent.parent
    job = read_job(work)
    try:
        assert job.alive() and job.attempt == 1, job.describe()
        [trainer] = trainer_processes(work / "run.json")  # the trainer goes on training
        capsys.readouterr()
        assert main(["jobs", "--json"]) == 0  # read from the job's files: no Dagster run follows it now
        [shown] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert (shown["stage"], shown["state"], shown["pid"], shown["attempt"]) == ("main", "running", job.pid, 1)
        assert shown["step"] >= 3 and shown["tokens"] == shown["step"] * 8 * 64 and shown["eta_s"] is not None
        step_when_killed = max(r["step"] for r in map(json.loads, found[0].read_text().splitlines()) if r.get("event") == "train")

        assert main(["materialize", "--select", "training/main"]) == 0  # follows the job to its end
        assert read_job(work).pid == job.pid and read_job(work).exit_status == 0  # the same job, not a second one
        records = [json.loads(line) for line in found[0].read_text().splitlines()]
        steps = [r["step"] for r in records if r.get("event") == "train"]
        assert steps == list(range(1, 97)), steps  # every step once: nothing trained twice, nothing resumed
        assert not [r for r in records if r.get("event") == "resumed"] and step_when_killed < 96
        assert metadata("training/main")["steps"] == 96
        final = LocalCheckpoints(work / "checkpoints").committed()[-1]
    finally:
        job.kill()

    # An uninterrupted run of the same stage in another home: the same losses and final weights, bit for bit.
    import torch

    from trainer.checkpoint.weights import checkpoint_weights

    other = tmp_path / "other-home"
    copy_curated(curated_template, other)
    monkeypatch.setenv("PRETRAIN_HOME", str(other))
    monkeypatch.setenv("DAGSTER_HOME", str(other / "dagster"))
    assert main(["materialize", "--stale", "--select", "+training/main"]) == 0
    [other_work] = (other / "work" / "training" / "main").glob("*")
    assert other_work.name == work.name and LocalCheckpoints(other_work / "checkpoints").committed()[-1] == final
    uninterrupted = [json.loads(line) for line in (other_work / "out" / "metrics.jsonl").read_text().splitlines()]
    losses = lambda rs: [(r["step"], r["loss"]) for r in rs if r.get("event") == "train"]  # noqa: E731
    assert losses(records) == losses(uninterrupted)
    step = step_name(final)
    mine, _ = checkpoint_weights(work / "checkpoints" / step)
    theirs, _ = checkpoint_weights(other_work / "checkpoints" / step)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
