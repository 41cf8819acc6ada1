"""The launcher resource: the trainer as an external process under Dagster Pipes, its progress in Dagster."""

import sys

import pytest
from dagster import AssetExecutionContext, DagsterInstance, MaterializeResult, asset, materialize

from resources.launcher import LauncherResource
from tests.trainer.conftest import run_dict


def test_commands_for_each_launcher(tmp_path):
    run = tmp_path / "run.json"
    assert LauncherResource().command(run) == [sys.executable, "-m", "trainer", "--config", str(run)]
    torchrun = LauncherResource(launcher="torchrun", nproc_per_node=2).command(run)
    assert torchrun[1:] == ["--nproc_per_node", "2", "--standalone", "-m", "trainer", "--config", str(run)]
    nodes = LauncherResource(launcher="torchrun", nproc_per_node=8, nnodes=4, node_rank=1,
                             rdzv_endpoint="10.0.0.1:29400").command(run)
    assert nodes[nodes.index("--rdzv_endpoint") + 1] == "10.0.0.1:29400" and "--standalone" not in nodes
    assert nodes[nodes.index("--nnodes") + 1] == "4" and nodes[nodes.index("--node_rank") + 1] == "1"
    ds = LauncherResource(launcher="deepspeed", nproc_per_node=2, hostfile="/etc/hosts.ds", master_port=29500)
    assert ds.command(run)[1:] == ["--hostfile", "/etc/hosts.ds", "--num_gpus", "2", "--master_port", "29500",
                                   "--module", "trainer", "--config", str(run)]
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        LauncherResource(launcher="torchrun", nnodes=2).command(run)
    with pytest.raises(ValueError, match="one process"):
        LauncherResource(nproc_per_node=2).command(run)


def test_a_training_asset_streams_the_trainers_progress_into_dagster(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    config = run_dict(tmp_path / "out", metrics={"log_interval": 2, "eval_batches": 1, "tensorboard": False})

    @asset
    def tiny_run(context: AssetExecutionContext, launcher: LauncherResource) -> MaterializeResult:
        result = launcher.launch(context, config, tmp_path / "work")
        train = result.events("train")
        return MaterializeResult(metadata={"steps": result.summary["steps"], "final_loss": train[-1]["loss"],
                                           "reported_steps": [r["step"] for r in train]})

    instance = DagsterInstance.ephemeral()
    outcome = materialize([tiny_run], instance=instance, resources={"launcher": LauncherResource()})
    assert outcome.success
    metadata = outcome.asset_materializations_for_node("tiny_run")[0].metadata
    assert metadata["steps"].value == 8 and metadata["reported_steps"].value == [2, 4, 6, 8]
    losses = [r["loss"] for r in map(__import__("json").loads, open(tmp_path / "out" / "metrics.jsonl"))
              if r["event"] == "train"]
    assert metadata["final_loss"].value == losses[-1]  # the record that came through Pipes is the file's
    # The trainer's progress lines are in the Dagster run's log, as they happened.
    logs = [e.user_message for e in instance.all_logs(outcome.run_id)]
    assert any(m.startswith("step 8 | loss") for m in logs), logs[-20:]
    assert any("validation" in m for m in logs)


def test_a_failing_trainer_fails_the_asset_with_its_error(tmp_path):
    config = run_dict(tmp_path / "out", model={"n_heads": 3})  # d_model 64 is not divisible by 3

    @asset
    def broken_run(context: AssetExecutionContext, launcher: LauncherResource) -> MaterializeResult:
        launcher.launch(context, config, tmp_path / "work")
        return MaterializeResult()

    outcome = materialize([broken_run], instance=DagsterInstance.ephemeral(),
                          resources={"launcher": LauncherResource()}, raise_on_error=False)
    assert not outcome.success
    failure = outcome.get_step_failure_events()[0].step_failure_data.error
    assert "failed with code 2" in failure.to_string()  # the trainer's exit status for a bad config
