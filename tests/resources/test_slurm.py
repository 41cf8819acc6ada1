"""The launcher on Slurm: one srun step, a torchrun per node, and the trainer's reports still reach Dagster.

The other tests run on a real Slurm (munged, slurmctld and two slurmd on this host, started by the `slurm`
fixture, tests/slurm_cluster.py): a tiny training asset on 1 node x 2 processes and on 2 nodes x 1 must give
the very run torchrun --standalone gives with 2 processes; and inside an sbatch allocation the same srun
is a step of that job.
"""

import json
import shlex
import uuid

import pytest
from dagster import AssetExecutionContext, DagsterInstance, MaterializeResult, asset, materialize

from resources.launcher import LauncherResource
from resources.slurm import SlurmConfig, node_script
from tests.conftest import REPO
from tests.ports import free_port
from tests.trainer.conftest import run_dict
from tests.trainer.faults import fault_env


def test_the_srun_command_and_each_nodes_torchrun(tmp_path):
    run = tmp_path / "run.json"
    slurm = SlurmConfig(partition="gpu", time="12:00:00", gpus_per_node=8, cpus_per_task=64, rdzv_port=29555,
                        srun_args=["--account=ml", "--exclusive"])
    cmd = LauncherResource(launcher="slurm", nnodes=4, nproc_per_node=8, slurm=slurm).command(run)
    srun, script = cmd[:-3], cmd[-1]
    assert srun[0] == "srun" and cmd[-3:-1] == ["bash", "-c"]
    for flag, value in [("--nodes", "4"), ("--ntasks-per-node", "1"), ("--partition", "gpu"),
                        ("--time", "12:00:00"), ("--gpus-per-node", "8"), ("--cpus-per-task", "64")]:
        assert srun[srun.index(flag) + 1] == value, flag
    # The Pipes variables must reach every task; one failed node stops the step; a Dagster stop ends it.
    assert {"--export=ALL", "--kill-on-bad-exit=1", "--quit-on-interrupt", "--account=ml", "--exclusive"} <= set(srun)
    assert 'scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n 1' in script
    torchrun = script.splitlines()[-1]
    assert torchrun.startswith("exec ") and "/torchrun --nproc_per_node 8 " in torchrun
    assert ('--nnodes "$SLURM_STEP_NUM_NODES" --node_rank "$SLURM_NODEID" --rdzv_backend c10d'
            ' --rdzv_endpoint "${addr:-$head}:29555"') in torchrun
    assert 'scontrol show node --oneliner "$head"' in script  # its NodeAddr: a node name need not resolve
    assert torchrun.endswith(f"-m trainer --config {run}")
    # Without a partition or a time limit the cluster's defaults apply: no empty flags.
    bare = LauncherResource(launcher="slurm").command(run)
    assert "--partition" not in bare and "--time" not in bare and "--gpus-per-node" not in bare
    with pytest.raises(ValueError, match="nnodes"):
        LauncherResource(launcher="slurm", nnodes=0).command(run)
    # A path with a space stays one argument of the trainer.
    assert node_script(SlurmConfig(), 1, "/opt/my venv/bin/torchrun", ["--config", "/a b/run.json"]).endswith(
        "--config '/a b/run.json'")


# One thread a process on the 2 shared cores; DeepSpeed's C++ op built once (~40 s) into the shared cache.
ENV = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
       "TORCH_EXTENSIONS_DIR": str(REPO / ".pretrain" / "torch_extensions")}


def _train(launcher: LauncherResource, root):
    """Materialize a tiny training asset with this launcher: (outcome, instance, the LaunchResult)."""
    config = run_dict(root / "out", metrics={"log_interval": 2, "eval_batches": 1, "tensorboard": False})
    seen = {}

    @asset
    def tiny_run(context: AssetExecutionContext, launcher: LauncherResource) -> MaterializeResult:
        seen["result"] = result = launcher.launch(context, config, root / "work")
        return MaterializeResult(metadata={"reported_steps": [r["step"] for r in result.events("train")]})

    instance = DagsterInstance.ephemeral()
    outcome = materialize([tiny_run], instance=instance, resources={"launcher": launcher})
    return outcome, instance, seen["result"]


def _numbers(records):
    """What must not depend on the launcher (time, throughput and MFU do)."""
    return [{k: r[k] for k in ("event", "step", "tokens", "loss", "grad_norm", "lr", "batch", "val_loss") if k in r}
            for r in records if r.get("event") in ("train", "eval")]


def _world_size(output_dir) -> int:
    manifests = list(output_dir.rglob("manifest.json"))
    assert manifests, f"no checkpoint manifest under {output_dir}"
    return json.loads(manifests[0].read_text())["world_size"]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """The reference: the same tiny run as 2 processes under torchrun --standalone on this machine."""
    root = tmp_path_factory.mktemp("standalone")
    outcome, _, result = _train(LauncherResource(launcher="torchrun", nproc_per_node=2, env=ENV), root)
    assert outcome.success and "--standalone" in result.command
    return result


@pytest.mark.parametrize("nnodes, nproc_per_node", [(1, 2), (2, 1)], ids=["1 node x 2", "2 nodes x 1"])
def test_a_training_asset_on_slurm_reports_to_dagster_and_matches_torchrun(slurm, standalone, tmp_path,
                                                                          nnodes, nproc_per_node):
    job_name = f"pretrain-test-{uuid.uuid4().hex[:8]}"
    launcher = LauncherResource(launcher="slurm", nnodes=nnodes, nproc_per_node=nproc_per_node, env=ENV,
                                slurm=SlurmConfig(partition=slurm.partition, time="00:10:00", cpus_per_task=1,
                                                  job_name=job_name, rdzv_port=free_port()))
    outcome, instance, result = _train(launcher, tmp_path)
    assert outcome.success
    assert result.command[0] == "srun"

    # Slurm ran it: one job of that name, on nnodes of the cluster's nodes, finished with exit code 0.
    jobs = [j for j in slurm.jobs() if j.get("JobName") == job_name]
    assert len(jobs) == 1, slurm.jobs()
    assert jobs[0]["JobState"] == "COMPLETED" and jobs[0]["ExitCode"] == "0:0"
    assert jobs[0]["NumNodes"] == str(nnodes)
    assert set(slurm.run("scontrol", "show", "hostnames", jobs[0]["NodeList"]).split()) <= set(slurm.nodes)
    assert _world_size(tmp_path / "out") == 2  # the nodes' torchruns met in one rendezvous

    # The records came back through Pipes (files in the work dir), once each: only rank 0 reports.
    assert result.summary["steps"] == 8
    metadata = outcome.asset_materializations_for_node("tiny_run")[0].metadata
    assert metadata["reported_steps"].value == [2, 4, 6, 8]
    assert len(result.events("eval")) >= 1
    on_disk = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
    assert _numbers(result.records) == _numbers(on_disk)
    logs = [e.user_message for e in instance.all_logs(outcome.run_id)]
    assert any(m.startswith("step 8 | loss") for m in logs), logs[-20:]
    assert not (tmp_path / "work" / "pipes_messages.jsonl").exists()  # Pipes removes its files at the end

    # The very run torchrun --standalone gives with 2 processes on this machine.
    assert result.summary == standalone.summary
    assert _numbers(result.records) == _numbers(standalone.records)


def test_inside_an_allocation_the_same_srun_is_a_step_of_it(slurm, tmp_path):
    """A Dagster run that sbatch started runs the launcher's srun as a step of its own job, not a new job."""
    name = f"outer-{uuid.uuid4().hex[:8]}"
    launcher = LauncherResource(launcher="slurm", nnodes=2, slurm=SlurmConfig(
        partition=slurm.partition, time="00:05:00", cpus_per_task=1, job_name="inner", rdzv_port=29555))
    command = launcher.command(tmp_path / "run.json")
    # /bin/echo in torchrun's place prints the arguments each node's torchrun would get.
    command[-1] = command[-1].replace(command[-1].split("exec ", 1)[1].split(" ", 1)[0], "/bin/echo")
    (tmp_path / "batch.sh").write_text("#!/bin/bash\n" + shlex.join(command) + "\n")
    slurm.run("sbatch", "--wait", "--nodes", "2", "--job-name", name, "--chdir", str(tmp_path),
              "--output", str(tmp_path / "batch.out"), str(tmp_path / "batch.sh"))
    (job,) = [j for j in slurm.jobs() if j.get("JobName") == name]
    assert job["JobState"] == "COMPLETED" and not [j for j in slurm.jobs() if j.get("JobName") == "inner"]
    lines = sorted((tmp_path / "batch.out").read_text().splitlines())
    assert lines == [f"--nproc_per_node 1 --nnodes 2 --node_rank {rank} --rdzv_backend c10d --rdzv_endpoint "
                     f"127.0.0.1:29555 --rdzv_id {job['JobId']}.0 -m trainer --config {tmp_path / 'run.json'}"
                     for rank in (0, 1)]


def test_a_straggling_node_is_drained_and_the_job_goes_on_without_it(slurm, tmp_path):
    """straggler.drain on 2 nodes: the slow rank's node is left out of the restart (srun --exclude), and the
    run resumes on the other node alone at the same global batch (its checkpoint resharded)."""
    job_name = f"pretrain-drain-{uuid.uuid4().hex[:8]}"
    launcher = LauncherResource(launcher="slurm", nnodes=2, nproc_per_node=1,
                                env={**ENV, **fault_env("slow:rank=1,seconds=0.4")},
                                slurm=SlurmConfig(partition=slurm.partition, time="00:10:00", cpus_per_task=1,
                                                  job_name=job_name, rdzv_port=free_port()))
    config = run_dict(tmp_path / "out", train_tokens=10 * 8 * 64, deepspeed={"zero_stage": 1},
                      metrics={"log_interval": 1, "eval_batches": 0, "tensorboard": False},
                      straggler={"drain": True, "window": 4, "steps": 3, "min_excess_s": 0.05})
    seen = {}

    @asset
    def drained_run(context: AssetExecutionContext, launcher: LauncherResource) -> MaterializeResult:
        seen["result"] = launcher.launch(context, config, tmp_path / "work")
        return MaterializeResult()

    assert materialize([drained_run], instance=DagsterInstance.ephemeral(), resources={"launcher": launcher}).success
    result = seen["result"]
    [straggler] = result.events("straggler")
    assert straggler["rank"] == 1 and straggler["host"] in slurm.nodes  # Slurm's node name, what --exclude takes
    [drain] = result.events("drain")
    [restart] = result.restarts
    assert restart["exit_status"] == 6 and restart["drained"] == straggler["host"] == drain["host"]
    assert restart["resumed_step"] == drain["step"] == straggler["step"] + 1  # checkpointed where it stopped
    [resumed] = result.events("resumed")
    assert resumed["world_size"] == 2 and resumed["universal"]  # 2 ranks' checkpoint into 1 rank
    assert result.summary["steps"] == 10
    # Slurm's side: the first job on both nodes, the second on the other node only.
    jobs = [j for j in slurm.jobs() if j.get("JobName") == job_name]
    assert [j["NumNodes"] for j in jobs] == ["2", "1"], jobs
    assert jobs[1]["NodeList"] != straggler["host"] and jobs[1]["JobState"] == "COMPLETED"
    srun = restart["command"]
    assert f"--exclude={straggler['host']}" in srun and srun[srun.index("--nodes") + 1] == "1"
