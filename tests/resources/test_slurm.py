"""The launcher on Slurm: a batch job (sbatch) with one srun step, a torchrun per node; the trainer's reports still
reach Dagster, and the job outlives the Dagster run that submitted it.

The other tests run on a real Slurm (munged, slurmctld and two slurmd on this host, started by the `slurm`
fixture, tests/slurm_cluster.py): a tiny training asset on 1 node x 2 processes and on 2 nodes x 1 must give
the very run torchrun --standalone gives with 2 processes; a run worker killed mid-training leaves the Slurm job
training and the next materialization follows it; a straggler's node, and a node whose rank corrupts its
gradients, are left out of the restart.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
from dagster import AssetExecutionContext, DagsterInstance, MaterializeResult, asset, materialize

from resources.launcher import LauncherResource
from resources.slurm import SlurmConfig, node_script, sbatch_options
from tests.conftest import REPO
from tests.ports import free_port
from tests.slurm_cluster import wait_until
from tests.trainer.conftest import run_dict
from tests.trainer.faults import fault_env
from trainer.checkpoint.store import LocalCheckpoints, step_name
from trainer.job.detach import read_job


def test_the_sbatch_options_the_srun_step_and_each_nodes_torchrun(tmp_path):
    run = tmp_path / "run.json"
    slurm = SlurmConfig(partition="gpu", time="7-00:00:00", gpus_per_node=8, cpus_per_task=64, rdzv_port=29555,
                        exclude=["node-7"], sbatch_args=["--account=ml", "--exclusive"])
    sbatch = sbatch_options(slurm, 4)
    for flag, value in [("--nodes", "4"), ("--ntasks-per-node", "1"), ("--partition", "gpu"),
                        ("--time", "7-00:00:00"), ("--gpus-per-node", "8"), ("--cpus-per-task", "64")]:
        assert sbatch[sbatch.index(flag) + 1] == value, flag
    # The Pipes variables must reach the job; a node taken out stays out; the user's own options pass through.
    assert sbatch[0] == "sbatch" and {"--export=ALL", "--exclude=node-7", "--account=ml", "--exclusive"} <= set(sbatch)
    cmd = LauncherResource(launcher="slurm", nnodes=4, nproc_per_node=8, slurm=slurm).command(run)
    srun, script = cmd[:-3], cmd[-1]
    assert srun[0] == "srun" and cmd[-3:-1] == ["bash", "-c"]
    # A step inherits neither the CPUs per task nor the GPUs per node from its job: given again.
    for flag, value in [("--nodes", "4"), ("--ntasks-per-node", "1"), ("--gpus-per-node", "8"), ("--cpus-per-task", "64")]:
        assert srun[srun.index(flag) + 1] == value, flag
    assert {"--export=ALL", "--kill-on-bad-exit=1"} <= set(srun)  # one failed node stops the step
    assert 'scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n 1' in script
    torchrun = script.splitlines()[-1]
    assert torchrun.startswith("exec ") and "/torchrun --nproc_per_node 8 " in torchrun
    assert ('--nnodes "$SLURM_STEP_NUM_NODES" --node_rank "$SLURM_NODEID" --rdzv_backend c10d'
            ' --rdzv_endpoint "${addr:-$head}:29555"') in torchrun
    assert 'scontrol show node --oneliner "$head"' in script  # its NodeAddr: a node name need not resolve
    assert torchrun.endswith(f"-m trainer --config {run}")
    # Without a partition or a time limit the cluster's defaults apply: no empty flags.
    bare = sbatch_options(SlurmConfig(), 1)
    assert "--partition" not in bare and "--time" not in bare and "--gpus-per-node" not in bare
    assert not [a for a in bare if a.startswith("--exclude")]
    with pytest.raises(ValueError, match="nnodes"):
        LauncherResource(launcher="slurm", nnodes=0).command(run)
    with pytest.raises(ValueError, match="nnodes"):
        sbatch_options(SlurmConfig(), 0)
    # A path with a space stays one argument of the trainer.
    assert node_script(SlurmConfig(), 1, "/opt/my venv/bin/torchrun", ["--config", "/a b/run.json"]).endswith(
        "--config '/a b/run.json'")


# One thread a process on the 2 shared cores; DeepSpeed's C++ op built once (~40 s) into the shared cache.
ENV = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
       "TORCH_EXTENSIONS_DIR": str(REPO / ".venv" / "torch_extensions")}


def _train(launcher: LauncherResource, root, config: dict | None = None):
    """Materialize a tiny training asset with this launcher: (outcome, instance, the LaunchResult)."""
    config = config or run_dict(root / "out", metrics={"log_interval": 2, "eval_batches": 1, "tensorboard": False})
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


def ended_jobs(slurm, job_name: str) -> list[dict]:
    """The jobs of that name once Slurm has them all ended. The launcher returns when srun does, and slurmctld marks
    the job COMPLETED a moment later (the suite once read RUNNING in between, under AVX2-only kernels)."""
    wait_until(lambda: not [j for j in slurm.jobs() if j.get("JobName") == job_name
                       and j.get("JobState") in ("PENDING", "RUNNING", "COMPLETING")],
          30, f"the jobs named {job_name} to end", slurm)
    return [j for j in slurm.jobs() if j.get("JobName") == job_name]

@pytest.mark.slow  # ~15-25 s each: a Slurm job of two trainer ranks and the same run under torchrun
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
    jobs = ended_jobs(slurm, job_name)
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


@pytest.mark.slow  # ~30 s: two Slurm jobs, the second on one node
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
    assert restart["exit_status"] == 6 and restart["excluded"] == straggler["host"] == drain["host"]
    assert restart["why"] == "straggler"
    assert restart["resumed_step"] == drain["step"] == straggler["step"] + 1  # checkpointed where it stopped
    [resumed] = result.events("resumed")
    assert resumed["world_size"] == 2 and resumed["universal"]  # 2 ranks' checkpoint into 1 rank
    assert result.summary["steps"] == 10
    # Slurm's side: the first job on both nodes, the second on the other node only.
    jobs = ended_jobs(slurm, job_name)
    assert [j["NumNodes"] for j in jobs] == ["2", "1"], jobs
    assert jobs[1]["NodeList"] != straggler["host"] and jobs[1]["JobState"] == "COMPLETED"
    sbatch, srun = restart["sbatch"], restart["command"]
    assert f"--exclude={straggler['host']}" in sbatch and sbatch[sbatch.index("--nodes") + 1] == "1"
    assert srun[srun.index("--nodes") + 1] == "1"


# The Dagster run in a process of its own, to be killed: the same tiny asset, the launcher from JSON.
RUN_WORKER = """
import json, sys
from dagster import AssetExecutionContext, DagsterInstance, MaterializeResult, asset, materialize
from resources.launcher import LauncherResource
config, work, launcher = json.loads(sys.argv[1]), sys.argv[2], LauncherResource(**json.loads(sys.argv[3]))

@asset
def tiny_run(context: AssetExecutionContext, launcher: LauncherResource) -> MaterializeResult:
    launcher.launch(context, config, work)
    return MaterializeResult()

materialize([tiny_run], instance=DagsterInstance.ephemeral(), resources={"launcher": launcher})
"""


def _slowed_launcher(slurm, kind: str, job_name: str) -> LauncherResource:
    """2 ranks, each step slowed by 0.25 s (so a run is caught mid-training): on the 2 Slurm nodes, or under a local
    torchrun."""
    return LauncherResource(launcher=kind, nnodes=2 if kind == "slurm" else 1, nproc_per_node=1 if kind == "slurm" else 2,
                            env={**ENV, **fault_env("slow:seconds=0.25")},
                            slurm=SlurmConfig(partition=slurm.partition, time="00:10:00", cpus_per_task=1,
                                              job_name=job_name, rdzv_port=free_port()))


def _start_run_worker(launcher: LauncherResource, config: dict, work, slurm) -> subprocess.Popen:
    """The Dagster run in a process (and process group) of its own, returned once its trainer reports step 3."""
    worker = subprocess.Popen([sys.executable, "-c", RUN_WORKER, json.dumps(config), str(work),
                               launcher.model_dump_json()], cwd=REPO, env={**os.environ, **slurm.env},
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    try:
        while not [r for r in _train_steps(Path(config["output_dir"])) if r["step"] >= 3]:
            assert worker.poll() is None, "the run worker ended before step 3"
            assert time.monotonic() < deadline, "no step 3 within 240 s"
            time.sleep(0.05)
    except BaseException:
        os.killpg(worker.pid, signal.SIGKILL)
        raise
    return worker


def _train_steps(output_dir) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if r.get("event") == "train"]


def _final_weights(output_dir):
    from trainer.checkpoint.weights import checkpoint_weights

    final = LocalCheckpoints(output_dir / "checkpoints").committed()[-1]
    return final, checkpoint_weights(output_dir / "checkpoints" / step_name(final))[0]


@pytest.mark.slow  # ~1 min: the Slurm job, killed worker and all, then the same run under torchrun
def test_a_killed_run_worker_leaves_the_slurm_job_training_and_the_next_run_follows_it(slurm, tmp_path):
    """SIGKILL to the process running the Dagster run mid-training: the batch job goes on (Slurm says RUNNING);
    the next materialization follows that job by its Slurm job id instead of submitting a second one, every step
    is trained once, and the final checkpoint is bit for bit the one an uninterrupted run writes."""
    job_name = f"pretrain-follow-{uuid.uuid4().hex[:8]}"
    launcher = _slowed_launcher(slurm, "slurm", job_name)
    config = run_dict(tmp_path / "out", train_tokens=24 * 8 * 64, checkpoint={"interval_steps": 8},
                      metrics={"log_interval": 1, "eval_batches": 0, "tensorboard": False})
    work = tmp_path / "work"
    worker = _start_run_worker(launcher, config, work, slurm)
    os.killpg(worker.pid, signal.SIGKILL)  # the worker and its process group: the job is Slurm's, not theirs
    worker.wait()
    job = read_job(work)
    running = set(_trainer_processes(work / "run.json"))
    assert len(running) == 4, running  # one job trains on: each node's torchrun and its rank
    [submitted] = [j for j in slurm.jobs() if j.get("JobName") == job_name]
    assert job.slurm_job_id == submitted["JobId"] and submitted["JobState"] == "RUNNING", submitted
    assert job.alive() and job.host == socket.gethostname()  # the wrapper runs as the batch script, on this host
    step_when_killed = _train_steps(tmp_path / "out")[-1]["step"]
    assert step_when_killed < 24

    seen, following = set(), threading.Event()

    def watch():  # the process table while the next run follows: any trainer process not already running is a second
        while not following.is_set():
            seen.update(_trainer_processes(work / "run.json"))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        outcome, instance, result = _train(launcher, tmp_path, config)  # the same work dir: it follows the job
    finally:
        following.set()
        watcher.join()
    assert seen and seen <= running, (seen, running)  # the same processes trained on: no second trainer started
    assert outcome.success
    logs = [e.user_message for e in instance.all_logs(outcome.run_id)]
    assert any("still running" in m and f"Slurm job {job.slurm_job_id}" in m for m in logs), logs
    assert instance.get_run_by_id(outcome.run_id).tags["pretrain/job"] == f"slurm:{job.slurm_job_id}"
    assert [j["JobId"] for j in slurm.jobs() if j.get("JobName") == job_name] == [job.slurm_job_id]  # no second job
    assert read_job(work).exit_status == 0 and not result.restarts
    steps = [r["step"] for r in _train_steps(tmp_path / "out")]
    assert steps == list(range(1, 25)), steps  # every step once: nothing trained twice, nothing resumed
    assert not result.events("resumed") and [r["step"] for r in result.events("train")] == steps

    # The same run uninterrupted (torchrun --standalone, 2 processes): the same losses and final weights, bit for bit.
    reference = tmp_path / "reference"
    ref_outcome, _, ref = _train(LauncherResource(launcher="torchrun", nproc_per_node=2, env=ENV), reference,
                                 {**config, "output_dir": str(reference / "out")})
    assert ref_outcome.success
    assert [(r["step"], r["loss"]) for r in result.events("train")] == [(r["step"], r["loss"]) for r in ref.events("train")]
    (step, mine), (their_step, theirs) = _final_weights(tmp_path / "out"), _final_weights(reference / "out")
    assert step == their_step == 24 and mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.slow  # ~1 min: 2 Slurm jobs and a reference run
def test_a_node_whose_rank_corrupts_its_gradients_is_left_out_and_the_job_goes_on_without_it(slurm, tmp_path):
    """Silent data corruption on 2 nodes: rank 1's gradients corrupt at step 5 (sdc.max_offences 1) stop the job
    naming its node; the launcher restarts it without that node (sbatch --exclude), on 1 node at the same global
    batch from the step-4 checkpoint, and from there its losses are those of a 1-node run from the same checkpoint."""
    job_name = f"pretrain-sdc-{uuid.uuid4().hex[:8]}"
    launcher = LauncherResource(launcher="slurm", nnodes=2, nproc_per_node=1, env={**ENV, **fault_env("corrupt:rank=1,step=5")},
                                slurm=SlurmConfig(partition=slurm.partition, time="00:10:00", cpus_per_task=1,
                                                  job_name=job_name, rdzv_port=free_port()))
    config = run_dict(tmp_path / "out", train_tokens=10 * 8 * 64, deepspeed={"zero_stage": 1},
                      checkpoint={"interval_steps": 2, "keep_last": 10}, sdc={"max_offences": 1},
                      metrics={"log_interval": 1, "eval_batches": 0, "tensorboard": False})
    outcome, instance, result = _train(launcher, tmp_path, config)
    assert outcome.success
    [sdc] = result.events("sdc")
    assert sdc["rank"] == 1 and sdc["step"] == 5 and sdc["host"] in slurm.nodes
    [restart] = result.restarts
    assert restart["exit_status"] == 5 and restart["excluded"] == sdc["host"]
    assert restart["why"] == "silent data corruption" and restart["failure"]["host"] == sdc["host"]
    assert f"--exclude={sdc['host']}" in restart["sbatch"] and restart["resumed_step"] == 4
    [resumed] = result.events("resumed")
    assert resumed["world_size"] == 2 and resumed["universal"]  # 2 ranks' checkpoint into 1 rank
    jobs = [j for j in slurm.jobs() if j.get("JobName") == job_name]
    assert [j["NumNodes"] for j in jobs] == ["2", "1"] and jobs[1]["NodeList"] != sdc["host"], jobs
    assert read_job(tmp_path / "work").extra["excluded_nodes"] == [sdc["host"]]  # what `pretrain jobs` shows
    logs = [e.user_message for e in instance.all_logs(outcome.run_id)]
    assert any(m.startswith(f"EXCLUDED {sdc['host']} (silent data corruption)") for m in logs), logs
    assert result.summary["steps"] == 10

    # A run on 1 node (one process) from the same step-4 checkpoint: the same losses from the restart on.
    one_node = tmp_path / "one-node"
    (one_node / "out" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "out" / "checkpoints" / step_name(4), one_node / "out" / "checkpoints" / step_name(4))
    (one_node / "out" / "checkpoints" / "latest").write_text("4")
    ref_outcome, _, ref = _train(LauncherResource(env=ENV), one_node, {**config, "output_dir": str(one_node / "out")})
    assert ref_outcome.success and [r["step"] for r in ref.events("resumed")] == [4]
    def after_resume(records):
        resumed = next(i for i, r in enumerate(records) if r.get("event") == "resumed")
        return [(r["step"], r["loss"]) for r in records[resumed:] if r.get("event") == "train"]

    assert after_resume(result.records) == after_resume(ref.records)
    assert [step for step, _ in after_resume(ref.records)] == list(range(5, 11))


def _trainer_processes(run_json) -> list[int]:
    """Pids of every process still running the trainer on `run_json` (torchrun agents and ranks), from /proc."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            argv = open(f"/proc/{entry.name}/cmdline", "rb").read().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if b"trainer" in argv and str(run_json).encode() in argv:
            found.append(int(entry.name))
    return found


@pytest.mark.slow  # ~30 s each
@pytest.mark.parametrize("kind", ["slurm", "torchrun"])
def test_stopping_the_dagster_run_checkpoints_and_stops_the_job_leaving_nothing_running(slurm, tmp_path, kind):
    """SIGINT to the process running the Dagster run (how Dagster stops a run): the launcher asks the job to stop
    (scancel --signal=INT to the Slurm step; SIGINT to the local job's wrapper); the ranks checkpoint after the step
    they agree on and exit; no trainer process and no Slurm job is left."""
    job_name = f"pretrain-stop-{uuid.uuid4().hex[:8]}"
    launcher = _slowed_launcher(slurm, kind, job_name)
    config = run_dict(tmp_path / "out", train_tokens=40 * 8 * 64, deepspeed={"zero_stage": 1},
                      metrics={"log_interval": 1, "eval_batches": 0, "tensorboard": False})
    work = tmp_path / "work"
    worker = _start_run_worker(launcher, config, work, slurm)
    try:
        worker.send_signal(signal.SIGINT)  # the run worker alone: the job is not in its process group
        worker.wait(timeout=120)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
    job = read_job(work)
    deadline = time.monotonic() + 60
    while (job.alive() or _trainer_processes(work / "run.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not job.alive() and not _trainer_processes(work / "run.json"), job.describe()  # no orphan
    if kind == "slurm":
        [ended] = [j for j in slurm.jobs() if j.get("JobName") == job_name]
        assert ended["JobState"] != "RUNNING", ended
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    [stopped] = [r for r in records if r.get("event") == "stopped"]
    assert stopped["step"] < 40 and LocalCheckpoints(tmp_path / "out" / "checkpoints").committed()[-1] == stopped["step"]
    assert json.loads((tmp_path / "out" / "failure.json").read_text())["kind"] == "stopped"
