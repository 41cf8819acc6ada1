"""The executor's environment variables, read without Dagster (what `pretrain materialize` does first thing)."""

import subprocess
import sys

import pytest

from resources.executor_env import CPUS_ENV, ExecutorEnvironment, available_cpus, given_cpus
from tests.conftest import REPO


def test_the_variables_become_the_resource_fields_and_a_bad_one_is_named():
    # No PRETRAIN_EXECUTOR_WORKERS: local leaves workers unset (the run's CPUs, when it runs); a cluster, no limit.
    assert ExecutorEnvironment.read({}).resource_fields() == {"kind": "local"}
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


def test_the_cpus_a_run_was_given_are_its_share_or_all_it_may_use(monkeypatch):
    """PRETRAIN_CPUS (set by `pretrain materialize` for a run beside others) else the process's affinity."""
    import os

    assert available_cpus() == len(os.sched_getaffinity(0))
    assert given_cpus({}) == available_cpus()
    assert given_cpus({CPUS_ENV: "3"}) == 3 and given_cpus({CPUS_ENV: ""}) == available_cpus()
    monkeypatch.setenv(CPUS_ENV, "5")
    assert given_cpus() == 5  # the environment as it is now
    for bad in ("0", "two"):
        with pytest.raises(ValueError, match=rf"^PRETRAIN_CPUS: expected a whole number of CPUs, 1 or more; got '{bad}'$"):
            given_cpus({CPUS_ENV: bad})
