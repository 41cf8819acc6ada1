"""The executor's environment variables, read without Dagster (what `pretrain materialize` does first thing)."""

import subprocess
import sys

import pytest

from resources.executor_env import ExecutorEnvironment
from tests.conftest import REPO


def test_the_variables_become_the_resource_fields_and_a_bad_one_is_named():
    assert ExecutorEnvironment.read({}).resource_fields() == {"kind": "local", "workers": 1}
    assert ExecutorEnvironment.read({"PRETRAIN_EXECUTOR": "ray"}).resource_fields() == {"kind": "ray", "workers": -1}
    env = ExecutorEnvironment.read({"PRETRAIN_EXECUTOR_WORKERS": "2", "PRETRAIN_EXECUTOR_TASKS": "8", "PATH": "/bin",
                                    "PRETRAIN_SLURM_ACCOUNT": "ml", "PRETRAIN_EXECUTOR": ""})
    assert (env.kind, env.workers, env.tasks) == ("local", 2, 8)  # empty is unset; other variables are ignored
    assert env.resource_fields()["slurm_sbatch_args"] == {"account": "ml"}
    with pytest.raises(ValueError, match=r"^PRETRAIN_EXECUTOR_WORKERS: 'two' is not an integer$"):
        ExecutorEnvironment.read({"PRETRAIN_EXECUTOR_WORKERS": "two"})


def test_reading_the_environment_imports_no_dagster():
    code = "import sys, resources.executor_env; print('dagster' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
