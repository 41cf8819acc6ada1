"""A run whose process is gone is marked failed by the next `pretrain` command (assets/runs/dead.py): a real
`pretrain materialize` killed with SIGKILL mid-ingest, then `pretrain status`; and the runs that must be left
alone (a live process, a reused pid, another host, a run without the tags)."""

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
import yaml
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

from assets.cli import main
from assets.runs.dead import HOST_TAG, PID_TAG, PROCESS_STARTED_TAG, fail_dead_runs, owner_tags, process_alive
from assets.home import ensure_dagster_home
from assets.recipe import DEMO_RECIPE

REPO = DEMO_RECIPE.parents[1]


def web_only_recipe(path):
    """The demo's `web` source alone (its 1,171-page crawl takes seconds to ingest), without the two model steps of
    its filter, which need sections of their own."""
    demo = yaml.safe_load(DEMO_RECIPE.read_text())
    web = next(source for source in demo["sources"] if source["name"] == "web")
    web["filter"] = {k: v for k, v in web["filter"].items() if k not in ("quality_model", "perplexity")}
    raw = {"name": "dead-runs", "base_dir": str((DEMO_RECIPE.parent / demo["base_dir"]).resolve()), "sources": [web]}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def open_runs(instance) -> list:
    return [run for run in instance.get_runs() if run.status == DagsterRunStatus.STARTED]


@pytest.mark.slow  # ~5-15 s: a CLI start, a killed ingest, a status
def test_a_materialize_killed_mid_run_leaves_its_run_failed_once_status_has_looked(tmp_path, monkeypatch, capsys):
    recipe = web_only_recipe(tmp_path / "recipe.yaml")
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    ensure_dagster_home()
    # The SQLite databases exist before the command starts: this process polls them while it would create (stamp)
    # them, and one of the two fails with "UNIQUE constraint failed: alembic_version".
    instance = DagsterInstance.get()
    instance.get_runs(limit=1)
    env = {**os.environ, "PRETRAIN_JOBS": "1"}
    command = [sys.executable, "-c", "import sys; from assets.cli import main; sys.exit(main())", "materialize",
               "--select", "curation/web/raw_crawl"]
    log = open(tmp_path / "materialize.log", "w")
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not open_runs(instance):
            assert proc.poll() is None, f"materialize ended before it was killed:\n{(tmp_path / 'materialize.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no run started within 120 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the command and anything it started, as `kill -9` on the job would
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    [run] = open_runs(instance)
    assert run.tags[PID_TAG] == str(proc.pid) and run.tags[HOST_TAG] == socket.gethostname()

    capsys.readouterr()
    assert main(["status"]) == 0
    err = capsys.readouterr().err
    assert f"pretrain: run {run.run_id} (curation/web/raw_crawl) marked failed" in err
    assert f"pid {proc.pid}" in err
    after = instance.get_run_by_id(run.run_id)
    assert after.status == DagsterRunStatus.FAILURE
    [failure] = [record.event_log_entry.dagster_event for record in
                 instance.get_records_for_run(run.run_id).records
                 if record.event_log_entry.dagster_event and record.event_log_entry.dagster_event.event_type_value == "PIPELINE_FAILURE"]
    assert "is gone" in failure.message and "Marked failed by pretrain" in failure.message
    # Looked at once: the next command finds nothing more to mark.
    assert main(["status"]) == 0
    assert "marked failed" not in capsys.readouterr().err


def add_started_run(instance, tags: dict) -> str:
    run_id = str(uuid.uuid4())
    instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id=run_id, status=DagsterRunStatus.STARTED, tags=tags))
    return run_id


def test_only_runs_of_this_host_whose_process_is_gone_are_marked(tmp_path):
    ensure_dagster_home()
    instance = DagsterInstance.get()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ended_pid = int(ended.stdout)
    me = owner_tags()
    host = socket.gethostname()
    runs = {
        "alive": add_started_run(instance, me),
        "ended": add_started_run(instance, {**me, PID_TAG: str(ended_pid)}),
        # This process's pid, but a process that started a minute earlier: the pid was reused.
        "reused": add_started_run(instance, {**me, PROCESS_STARTED_TAG: f"{float(me[PROCESS_STARTED_TAG]) - 60:.3f}"}),
        "other host": add_started_run(instance, {**me, HOST_TAG: host + "-elsewhere", PID_TAG: str(ended_pid)}),
        "untagged": add_started_run(instance, {}),
        "bad tag": add_started_run(instance, {HOST_TAG: host, PID_TAG: "not-a-pid", PROCESS_STARTED_TAG: "0"}),
    }
    lines = fail_dead_runs(instance)
    states = {name: instance.get_run_by_id(run_id).status for name, run_id in runs.items()}
    assert states == {"alive": DagsterRunStatus.STARTED, "ended": DagsterRunStatus.FAILURE,
                      "reused": DagsterRunStatus.FAILURE, "other host": DagsterRunStatus.STARTED,
                      "untagged": DagsterRunStatus.STARTED, "bad tag": DagsterRunStatus.STARTED}
    assert sorted(line.split()[1] for line in lines) == sorted([runs["ended"], runs["reused"]])
    assert fail_dead_runs(instance) == []


def test_a_process_is_alive_only_as_the_one_that_started_then(tmp_path):
    me = owner_tags()
    started = float(me[PROCESS_STARTED_TAG])
    assert process_alive(os.getpid(), started)
    assert not process_alive(os.getpid(), started - 5)
    import psutil

    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    zombie_started = psutil.Process(zombie.pid).create_time()
    deadline = time.monotonic() + 60
    while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:  # ended, not yet reaped
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not process_alive(zombie.pid, zombie_started)
    zombie.wait()
    assert not process_alive(zombie.pid, zombie_started)
