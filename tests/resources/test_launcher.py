"""The launcher resource: the trainer as an external process under Dagster Pipes, its progress in Dagster."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from dagster import AssetExecutionContext, DagsterInstance, MaterializeResult, MetadataValue, asset, materialize

from resources.launcher import LauncherResource, plain_process
from tests.conftest import REPO
from tests.trainer.conftest import run_dict
from tests.trainer.faults import fault_env
from trainer.checkpoint.store import LocalCheckpoints
from trainer.job.detach import read_job


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


def test_a_plain_process_runs_alone_whatever_ranks_its_parent_was_told():
    """An evaluation is one process. A parent that ran a one-rank group keeps LOCAL_RANK (trainer.parallel.engine
    sets it); started with that, lm-eval's Accelerate took the evaluation for one of several CPU ranks and failed at
    its env:// rendezvous (seen in the demo staleness test under the AVX2 pair, after such a test on its worker)."""
    probe = [sys.executable, "-c", "from accelerate import PartialState; print(PartialState(cpu=True).distributed_type)"]
    told = {**os.environ, "LOCAL_RANK": "0"}  # passed on whole, as Pipes does
    leaked = subprocess.run(probe, env=told, capture_output=True, text=True, timeout=300)
    assert leaked.returncode != 0 and "env:// rendezvous" in leaked.stderr, leaked.stderr[-2000:]
    alone = subprocess.run(plain_process(probe), env=told, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0 and alone.stdout.strip() == "DistributedType.NO", alone.stderr[-2000:]
    printed = subprocess.run(plain_process(["env"]), env={**told, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "KEPT": "yes"},
                             capture_output=True, text=True, check=True).stdout.splitlines()
    assert "KEPT=yes" in printed and not [line for line in printed if line.split("=")[0] in (
        "LOCAL_RANK", "MASTER_ADDR", "RANK", "WORLD_SIZE")]


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
    # The run's tags name the job it followed (host:pid:start ticks), as job.json does.
    job = read_job(tmp_path / "work")
    tags = instance.get_run_by_id(outcome.run_id).tags
    assert tags["pretrain/job"] == f"{job.host}:{job.pid}:{job.started_ticks}" == job.name
    assert tags["pretrain/job_work"] == str(tmp_path / "work") and tags["pretrain/job_assets"] == "tiny_run"


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


# --- Restarts: a trainer that dies is launched again and resumes; what a restart cannot help fails at once. ---

TORCHRUN = str(Path(sys.executable).parent / "torchrun")

# Stands in for the trainer's ways of ending (the real trainer is used below where it can fail on cue): attempt k
# reports itself through Pipes and in out/metrics.jsonl, as the trainer does (and, from the second on, a "resumed"
# record), then ends as run.json's
# plan[k-1] says: 0 (summary.json written), a status, "kill" (SIGKILL to itself), "hang" (failure.json and 4), or a
# failure record (written as failure.json, then its exit_status).
FAKE_TRAINER = '''
import json, os, signal, sys
from pathlib import Path
from dagster_pipes import open_dagster_pipes

run = json.loads(Path(sys.argv[1]).read_text())
out = Path(run["output_dir"]); out.mkdir(parents=True, exist_ok=True)
count = out / "attempts"
# Rank 0 counts the attempt, then marks it counted for its torchrun agent (the ranks' shared parent); another rank
# reads the count only after that mark. Reading it at its own start, a rank that started after rank 0 had counted
# took itself for the next attempt (a loaded machine), and one that started before saw no count at all.
counted = out / f"counted-{os.getppid()}"
rank0 = os.environ.get("RANK", "0") == "0"
if not rank0:
    import time; deadline = time.monotonic() + 120
    while not counted.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
attempt = (len(count.read_text()) if count.exists() else 0) + rank0
end = run["plan"][min(attempt, len(run["plan"])) - 1]
if rank0:  # one writer, as the trainer's rank 0
    count.write_text("x" * attempt)
    counted.touch()
    records = [{"event": "attempt", "n": attempt}] + ([{"event": "resumed", "step": 3 * (attempt - 1)}] if attempt > 1 else [])
    with open_dagster_pipes() as pipes, open(out / "metrics.jsonl", "a") as metrics:
        for record in records:
            pipes.report_custom_message(record)
            metrics.write(json.dumps(record) + "\\n")
if end == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if end == "hang":
    (out / "failure.json").write_text(json.dumps(run["failure"]))
    sys.exit(4)
if isinstance(end, dict):  # a failure record: written as the trainer writes it, then its exit status
    (out / "failure.json").write_text(json.dumps(end))
    sys.exit(end["exit_status"])
if end == "rank1":  # under torchrun: rank 1 stops with `status`, writing nothing; rank 0 waits to be stopped
    if os.environ["RANK"] == "1":  # rank 0 has counted this attempt by now (above)
        sys.exit(run["status"])
    import time; time.sleep(600)  # torchrun stops it; ending on its own, it would be a second failure
if end == 0:
    (out / "summary.json").write_text(json.dumps({"steps": attempt}))
sys.exit(end)
'''


class ScriptLauncher(LauncherResource):
    """The launcher with FAKE_TRAINER in the trainer's place (alone, or under a real torchrun)."""

    script: str
    under_torchrun: bool = False

    def command(self, run_json):
        if self.hostfile:  # what DeepSpeed's launcher would be given (the stand-in ignores it)
            return [sys.executable, self.script, str(run_json), "--hostfile", self.hostfile]
        if self.under_torchrun:
            return [TORCHRUN, "--standalone", "--nproc_per_node", "2", self.script, str(run_json)]
        return [sys.executable, self.script, str(run_json)]


@pytest.fixture
def trainer_env(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two cores shared by everything
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))


def _launching_asset(config: dict, work, settings=None, name="run"):
    """An asset that launches `config`, its metadata the LaunchResult (restarts as the training assets put them)."""

    @asset(name=name)
    def launched(context: AssetExecutionContext, launcher: LauncherResource) -> MaterializeResult:
        result = launcher.launch(context, config, work, settings=settings)
        return MaterializeResult(metadata={
            "restarts": len(result.restarts), "restart_log": MetadataValue.json(result.restarts),
            "records": MetadataValue.json(result.records), "command": MetadataValue.json(result.command)})

    return launched


def _materialize(asset_def, launcher):
    instance = DagsterInstance.ephemeral()
    outcome = materialize([asset_def], instance=instance, resources={"launcher": launcher}, raise_on_error=False)
    logs = [e.user_message for e in instance.all_logs(outcome.run_id)]
    if outcome.success:
        metadata = {k: v.value for k, v in outcome.asset_materializations_for_node(asset_def.op.name)[0].metadata.items()}
        return metadata, logs, None
    return None, logs, outcome.get_step_failure_events()[0].step_failure_data.error.to_string()


def _fake(tmp_path, plan, **run) -> tuple[dict, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "fake_trainer.py"
    script.write_text(FAKE_TRAINER)
    return {"output_dir": str(tmp_path / "out"), "plan": plan, **run}, script


def test_a_hang_the_trainer_reports_is_restarted_and_its_failure_file_moved_aside(tmp_path):
    hang = {"kind": "hang", "exit_status": 4, "rank": 1, "step": 7, "host": "node-3",
            "message": "step 7 made no progress for 30 s (rank 1 in all_reduce)"}
    config, script = _fake(tmp_path, ["hang", 0], failure=hang)
    metadata, logs, error = _materialize(_launching_asset(config, tmp_path / "work"), ScriptLauncher(script=str(script)))
    assert error is None, error
    assert metadata["restarts"] == 1
    [restart] = metadata["restart_log"]
    assert restart["attempt"] == 1 and restart["exit_status"] == 4 and restart["failure"] == hang
    assert "hang" in restart["reason"] and "rank 1" in restart["reason"] and "no progress" in restart["reason"]
    assert restart["resumed_step"] == 3  # from the second attempt's "resumed" record
    # The file is kept for the post-mortem, out of the next attempt's way.
    out = tmp_path / "out"
    assert json.loads((out / "failure-1.json").read_text()) == hang and not (out / "failure.json").exists()
    # Every attempt's records, in order.
    assert [(r["event"], r.get("n", r.get("step"))) for r in metadata["records"]] == [
        ("attempt", 1), ("attempt", 2), ("resumed", 3)]
    assert any(m.startswith("RESTART 1/2") and "hang" in m for m in logs), logs
    assert any(m == "restart 1: the trainer resumed at step 3" for m in logs)


def test_when_the_restarts_run_out_the_launch_fails_naming_every_attempt(tmp_path):
    config, script = _fake(tmp_path, ["kill", 7, 0])
    _, logs, error = _materialize(_launching_asset(config, tmp_path / "work"),
                                  ScriptLauncher(script=str(script), max_restarts=1))
    assert ("the trainer failed on all 2 attempts (max_restarts 1): attempt 1: exit status -9: a trainer process was "
            "killed by SIGKILL; attempt 2: exit status 7. Last reason: exit status 7") in error
    assert (tmp_path / "out" / "attempts").read_text() == "xx"  # no third attempt
    assert sum(m.startswith("RESTART") for m in logs) == 1


def test_restarts_count_within_a_window_so_failures_spread_out_do_not_end_a_long_run(tmp_path):
    """Three failures (max_restarts 2) inside the window stop the job, every reason listed; the same three spread
    over longer than the window do not (here the window is shorter than one attempt: none counts against the next)."""
    config, script = _fake(tmp_path / "inside", ["kill", 7, "kill", 0])
    _, logs, error = _materialize(_launching_asset(config, tmp_path / "inside" / "work"),
                                  ScriptLauncher(script=str(script), max_restarts=2, restart_window_hours=6))
    assert ("the trainer failed on 3 attempts within 6 h (max_restarts 2): attempt 1: exit status -9: a trainer "
            "process was killed by SIGKILL; attempt 2: exit status 7; attempt 3: exit status -9") in error
    assert (tmp_path / "inside" / "out" / "attempts").read_text() == "xxx"
    assert [m.split(":")[0] for m in logs if m.startswith("RESTART")] == ["RESTART 1/2 in 6 h", "RESTART 2/2 in 6 h"]

    config, script = _fake(tmp_path / "spread", ["kill", 7, "kill", 0])
    metadata, logs, error = _materialize(_launching_asset(config, tmp_path / "spread" / "work"),
                                         ScriptLauncher(script=str(script), max_restarts=2, restart_window_hours=1e-7))
    assert error is None, error
    assert metadata["restarts"] == 3 and (tmp_path / "spread" / "out" / "attempts").read_text() == "xxxx"
    assert [r["exit_status"] for r in metadata["restart_log"]] == [-9, 7, -9]


def _failure(kind: str, status: int, host: str) -> dict:
    return {"kind": kind, "exit_status": status, "rank": 1, "step": 7, "host": host, "message": f"{kind} on {host}"}


def test_a_node_named_by_two_hangs_or_by_sdc_is_left_out_through_a_hostfile_without_it(tmp_path):
    """DeepSpeed's launcher over a hostfile of 3 nodes: one hang on node-1 restarts on every node; a second one
    there leaves node-1 out (a hostfile without it); silent data corruption on node-2, which no restart on the same
    node can help, leaves node-2 out at once instead of failing the launch."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-0 slots=8\nnode-1 slots=8\nnode-2 slots=8\n")
    plan = [_failure("hang", 4, "node-1"), _failure("hang", 4, "node-1"), _failure("sdc", 5, "node-2"), 0]
    config, script = _fake(tmp_path, plan)
    launcher = ScriptLauncher(script=str(script), launcher="deepspeed", nnodes=3, hostfile=str(hostfile), max_restarts=3)
    metadata, logs, error = _materialize(_launching_asset(config, tmp_path / "work"), launcher)
    assert error is None, error
    first, second, third = metadata["restart_log"]
    assert "excluded" not in first and "command" not in first  # one hang may be the network's: every node again
    assert (second["excluded"], second["why"], third["excluded"], third["why"]) == (
        "node-1", "2 hangs", "node-2", "silent data corruption")
    without_1, without_both = Path(second["command"][-1]), Path(third["command"][-1])
    assert [line.split()[0] for line in without_1.read_text().splitlines() if not line.startswith("#")] == ["node-0", "node-2"]
    assert [line.split()[0] for line in without_both.read_text().splitlines() if not line.startswith("#")] == ["node-0"]
    assert hostfile.read_text().count("slots") == 3  # the user's own file is left as it was
    assert [m.split(":")[0] for m in logs if m.startswith("EXCLUDED")] == [
        "EXCLUDED node-1 (2 hangs)", "EXCLUDED node-2 (silent data corruption)"]
    assert (tmp_path / "out" / "attempts").read_text() == "xxxx"
    assert read_job(tmp_path / "work").extra["excluded_nodes"] == ["node-1", "node-2"]  # for `pretrain jobs`


def test_sdc_fails_at_once_where_no_node_can_be_left_out(tmp_path):
    config, script = _fake(tmp_path, [_failure("sdc", 5, "node-0"), 0])
    _, _, error = _materialize(_launching_asset(config, tmp_path / "work"), ScriptLauncher(script=str(script)))
    assert "failed with code 5" in error and "a restart cannot help" in error
    assert (tmp_path / "out" / "attempts").read_text() == "x"


def test_what_a_restart_cannot_help_fails_at_once_even_under_torchrun(tmp_path, trainer_env):
    # The real trainer on a bad config, 2 ranks: each exits 2 and says so in failure.json; torchrun exits 1.
    config = run_dict(tmp_path / "out", model={"n_heads": 3})  # d_model 64 is not divisible by 3
    _, logs, error = _materialize(_launching_asset(config, tmp_path / "work"),
                                  LauncherResource(launcher="torchrun", nproc_per_node=2, max_restarts=2))
    assert "the trainer failed with code 2" in error and "not restarted" in error and "n_heads" in error
    assert not any(m.startswith("RESTART") for m in logs)
    out = tmp_path / "out"
    assert json.loads((out / "failure-1.json").read_text())["kind"] == "config" and not (out / "failure-2.json").exists()
    # A rank that stops with 3 (the spike guard) and writes nothing: torchrun's own report is what tells.
    config, script = _fake(tmp_path / "guard", ["rank1"], status=3)
    _, logs, error = _materialize(_launching_asset(config, tmp_path / "guard" / "work"),
                                  ScriptLauncher(script=str(script), launcher="torchrun", under_torchrun=True))
    assert "the trainer failed with code 3 (exit status 3: the spike guard stopped the run)" in error
    assert (tmp_path / "guard" / "out" / "attempts").read_text() == "x"  # one attempt
    assert not any(m.startswith("RESTART") for m in logs)


def _rank_pid(run_json: Path, rank: int) -> int | None:
    """The trainer process of `rank` running run_json (torchrun gives each worker its RANK), from /proc."""
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or str(run_json).encode() not in (entry / "cmdline").read_bytes().split(b"\0"):
                continue
            if f"RANK={rank}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:  # gone meanwhile
            pass
    return None


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class KillRankOnce(threading.Thread):
    """SIGKILL trainer rank 0 once, as soon as a step is committed and a later one trained, then note what was
    committed. Rank 0 is the one that commits, so once it is dead nothing more can be committed before the
    restart: what is committed then is what the restart must resume from."""

    def __init__(self, out: Path, run_json: Path):
        super().__init__(daemon=True)
        self.out, self.run_json, self.kills, self.committed, self.done = out, run_json, 0, [], threading.Event()

    def trained(self) -> list[int]:
        path = self.out / "metrics.jsonl"
        steps = []
        for line in (path.read_text().splitlines() if path.exists() else []):
            try:
                record = json.loads(line)
            except ValueError:  # a line being written
                continue
            if record.get("event") == "train":
                steps.append(record["step"])
        return steps

    def run(self):
        local = LocalCheckpoints(self.out / "checkpoints")
        while not self.done.is_set():
            committed = local.committed()
            if committed and max(self.trained(), default=0) > committed[-1] and (pid := _rank_pid(self.run_json, 0)):
                os.kill(pid, signal.SIGKILL)
                self.kills += 1
                while _alive(pid):
                    time.sleep(0.005)
                self.committed = local.committed()
                return
            time.sleep(0.005)


@pytest.mark.slow  # ~1 min: two 2-rank runs of 12 tiny steps, one of them killed and restarted
def test_a_killed_rank_is_restarted_and_the_run_ends_as_if_never_interrupted(tmp_path, trainer_env):
    steps = 12

    def config(out):
        return run_dict(out, train_tokens=steps * 8 * 64, deepspeed={"zero_stage": 1},
                        metrics={"log_interval": 1, "eval_batches": 0, "tensorboard": False},
                        checkpoint={"interval_steps": 3, "keep_last": 4})

    # The resource is the single-process default; the launch's own settings (a recipe stage's `launch:`) make it
    # torchrun with 2 ranks.
    two_ranks = {"launcher": "torchrun", "nproc_per_node": 2}
    reference, _, error = _materialize(_launching_asset(config(tmp_path / "ref"), tmp_path / "ref-work", two_ranks),
                                       LauncherResource())
    assert error is None, error
    expected = {r["step"]: r["loss"] for r in reference["records"] if r["event"] == "train"}
    assert sorted(expected) == list(range(1, steps + 1)) and reference["restarts"] == 0

    killer = KillRankOnce(tmp_path / "out", tmp_path / "work" / "run.json")
    killer.start()
    try:
        metadata, logs, error = _materialize(
            _launching_asset(config(tmp_path / "out"), tmp_path / "work", two_ranks), LauncherResource())
    finally:
        killer.done.set()
        killer.join()
    assert killer.kills == 1, "the run ended before rank 0 could be killed"
    assert error is None, error
    command = metadata["command"]
    assert command[0].endswith("torchrun") and command[command.index("--nproc_per_node") + 1] == "2"

    # One restart, resumed at the last step committed before the kill.
    last = killer.committed[-1]
    assert metadata["restarts"] == 1
    [restart] = metadata["restart_log"]
    assert restart["attempt"] == 1 and restart["resumed_step"] == last, (restart, killer.committed)
    assert restart["exit_status"] == -9 and "SIGKILL" in restart["reason"], restart
    assert any(m.startswith("RESTART 1/2") for m in logs)
    assert f"restart 1: the trainer resumed at step {last}" in logs

    # Both attempts' records, in order: steps up to the checkpoint trained once; after it, again from last + 1.
    records = metadata["records"]
    cut = next(i for i, r in enumerate(records) if r["event"] == "resumed")
    first = [r["step"] for r in records[:cut] if r["event"] == "train"]
    second = [r["step"] for r in records[cut:] if r["event"] == "train"]
    assert first == list(range(1, len(first) + 1)) and len(first) > last  # the kill came after step last + 1
    assert second == list(range(last + 1, steps + 1))
    trained = Counter(first + second)
    assert all(trained[step] == 1 for step in range(1, last + 1))
    # And the losses are those of the run that was never interrupted, bit for bit.
    losses = {r["step"]: r["loss"] for r in records if r["event"] == "train"}  # the last attempt's where retrained
    assert losses == expected
    assert [r["loss"] for r in records[:cut] if r["event"] == "train"] == [expected[s] for s in first]


@pytest.mark.slow  # ~1 min: a 2-rank run whose rank 1 hangs once, ended by the trainer's watchdog (>= 15 s)
def test_a_hang_ended_by_the_watchdog_is_restarted_from_the_last_checkpoint(tmp_path, trainer_env):
    def run(out):
        return run_dict(out, train_tokens=10 * 8 * 64, deepspeed={"zero_stage": 1},
                        metrics={"log_interval": 1, "eval_batches": 0, "tensorboard": False},
                        checkpoint={"interval_steps": 3},
                        watchdog={"min_timeout_s": 15, "first_steps": 2, "step_factor": 5})

    reference, _, error = _materialize(_launching_asset(run(tmp_path / "ref"), tmp_path / "ref-work"),
                                       LauncherResource(launcher="torchrun", nproc_per_node=2))
    assert error is None, error
    config = run(tmp_path / "out")
    # tests/trainer/faults.py: rank 1 sleeps inside step 7, in the first attempt only.
    fault = f"hang:rank=1,step=7,seconds=600,once={tmp_path / 'hang-once'}"
    launcher = LauncherResource(launcher="torchrun", nproc_per_node=2, env=fault_env(fault))
    metadata, logs, error = _materialize(_launching_asset(config, tmp_path / "work"), launcher)
    assert error is None, error
    [restart] = metadata["restart_log"]
    assert restart["exit_status"] == 4 and restart["failure"]["kind"] == "hang"  # from failure.json: torchrun said 1
    assert (restart["failure"]["rank"], restart["failure"]["step"]) == (1, 7)
    assert "hang (rank 1, step 7" in restart["reason"] and restart["resumed_step"] == 6
    out = tmp_path / "out"
    assert json.loads((out / "failure-1.json").read_text()) == restart["failure"] and not (out / "failure.json").exists()
    losses = {r["step"]: r["loss"] for r in metadata["records"] if r["event"] == "train"}
    assert sorted(losses) == list(range(1, 11))
    # The final losses are those of a run that never hung, bit for bit (the resumed attempt's where retrained).
    assert losses == {r["step"]: r["loss"] for r in reference["records"] if r["event"] == "train"}
