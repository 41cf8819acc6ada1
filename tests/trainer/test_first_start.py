"""A trainer's first start on a fresh account costs no more than a warm one: with TORCH_EXTENSIONS_DIR empty and a new
HOME, `python -m trainer` loads DeepSpeed's CPU comm op from the venv, where `make install` built it, instead of
building it (~35 s) into ~/.cache (trainer/__init__.py)."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.trainer.conftest import read_metrics, write_run

WARM_WITHIN_S = 1.0


def startup_total(run_json, home) -> float:
    env = {**os.environ, "HOME": str(home), "TORCH_EXTENSIONS_DIR": ""}
    done = subprocess.run([sys.executable, "-m", "trainer", "--config", str(run_json)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [startup] = [record for record in read_metrics(json.loads(run_json.read_text())["output_dir"])
                 if record.get("event") == "startup"]
    return startup["total_s"]


@pytest.mark.slow  # ~10-20 s: two one-step trainer runs
def test_the_first_start_with_a_new_home_and_no_extensions_dir_is_as_quick_as_a_warm_one(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    first = startup_total(write_run(tmp_path / "first" / "run.json", train_tokens=8 * 64), home)
    warm = startup_total(write_run(tmp_path / "warm" / "run.json", train_tokens=8 * 64), home)
    assert first - warm < WARM_WITHIN_S, (first, warm)
    assert not (home / ".cache" / "torch_extensions").exists()  # nothing was built into the new HOME
    assert list((REPO / ".venv" / "torch_extensions").glob("deepspeed_shm_comm*"))  # the op built at install
