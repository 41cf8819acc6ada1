"""trainer.exits: every exit status and the failure.json schema, in one module the launcher imports without torch."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from trainer.exits import (CONFIG_EXIT, DRAIN_EXIT, FAILURE_FILE, GUARD_EXIT, HANG_EXIT, KINDS, NOT_RESTARTABLE,
                           SDC_EXIT, STOP_EXIT, TrainerExit, failure_record, node_name, write_failure)


def test_importing_exits_and_the_launcher_side_never_loads_torch():
    code = ("import sys, trainer, trainer.exits; assert 'torch' not in sys.modules, 'torch loaded'; "
            "print(trainer.exits.DRAIN_EXIT)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "6", result.stderr


def test_statuses_and_kinds():
    assert (CONFIG_EXIT, GUARD_EXIT, HANG_EXIT, SDC_EXIT, DRAIN_EXIT, STOP_EXIT) == (2, 3, 4, 5, 6, 7)
    assert KINDS == {"config": 2, "guard_stop": 3, "hang": 4, "sdc": 5, "straggler": 6, "stopped": 7}
    assert STOP_EXIT not in NOT_RESTARTABLE  # a job stopped by a time limit or preemption resumes when restarted
    assert failure_record("sdc", "rank 1 is corrupt", rank=1, host="n1") == {
        "kind": "sdc", "exit_status": 5, "message": "rank 1 is corrupt", "rank": 1, "host": "n1"}


def test_a_failure_names_slurms_node_where_there_is_one(monkeypatch):
    import socket

    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    assert node_name() == socket.gethostname()
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-017")  # two Slurm nodes may share a host; --exclude takes this name
    assert node_name() == "gpu-017"


def test_each_stop_the_trainer_raises_says_its_status():
    from trainer.checkpoint.checkpointer import ResumeRefused
    from trainer.health.guard import GuardStop, RollbackRequested, TooManySkips
    from trainer.health.rank_checks import DrainRequested, SDCStop

    assert GuardStop("x").exit_status == TooManySkips("x").exit_status == GUARD_EXIT
    assert RollbackRequested("x", skip_window=(1, 2)).exit_status == GUARD_EXIT
    sdc = SDCStop("x", rank=1, host="n1")
    assert (sdc.exit_status, sdc.kind, sdc.extra, sdc.rank) == (SDC_EXIT, "sdc", {"rank": 1, "host": "n1"}, 1)
    assert DrainRequested("x", rank=0, host="n0").exit_status == DRAIN_EXIT
    from trainer.train import StopRequested

    assert StopRequested("x").exit_status == STOP_EXIT
    refused = ResumeRefused("another global batch")
    assert isinstance(refused, ValueError) and refused.exit_status == CONFIG_EXIT
    assert all(isinstance(e, TrainerExit) for e in (sdc, refused, GuardStop("x")))


def test_write_failure_replaces_the_file_whole(tmp_path):
    write_failure(tmp_path / "out", failure_record("hang", "first"))
    write_failure(tmp_path / "out", failure_record("guard_stop", "second"))
    assert json.loads((tmp_path / "out" / FAILURE_FILE).read_text())["message"] == "second"
    assert [p.name for p in (tmp_path / "out").iterdir()] == [FAILURE_FILE]


def test_main_exits_2_on_a_bad_config_and_says_so_in_failure_json(tmp_path, capsys):
    from trainer.__main__ import main

    run = tmp_path / "run.json"
    run.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "train_tokens": 1, "model": {"nope": 1}}))
    assert main(["--config", str(run)]) == CONFIG_EXIT
    failure = json.loads((tmp_path / "out" / FAILURE_FILE).read_text())
    assert failure["kind"] == "config" and failure["exit_status"] == CONFIG_EXIT and failure["message"]
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_has_a_status_above_1(kind):
    assert KINDS[kind] > 1  # 1 is torchrun's own status: never the trainer's word
