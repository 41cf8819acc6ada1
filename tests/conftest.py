"""Shared test set-up: real data from ../shared/data, and a private PRETRAIN_HOME for every test."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()


@pytest.fixture(autouse=True)
def pretrain_home(tmp_path, monkeypatch) -> Path:
    """Nothing a test does lands in the user's .pretrain/ or Dagster instance."""
    home = tmp_path / "pretrain-home"
    monkeypatch.setenv("PRETRAIN_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    monkeypatch.delenv("PRETRAIN_STORE", raising=False)
    monkeypatch.delenv("PRETRAIN_RECIPE", raising=False)
    return home


@pytest.fixture
def shared_data() -> Path:
    assert SHARED_DATA.is_dir(), f"the shared data is expected at {SHARED_DATA}"
    return SHARED_DATA


# A real S3-compatible server on loopback for every test folder that needs one.
from tests.s3_server import moto_server, s3, s3_proxy, store  # noqa: E402,F401  (pytest fixtures)
from tests.slurm_cluster import slurm, slurm_cluster  # noqa: E402,F401  (a real Slurm on this host)


# Session fixtures a worker builds once: a test that uses one runs on the worker that built it (make test runs two
# workers with pytest-xdist's --dist loadgroup), so each is built once, as in a run without workers. {fixture: group}
SESSION_GROUPS = {"moto_server": "session-servers", "slurm_cluster": "session-servers",
                  "curated_template": "curated-c4-math"}  # tests/assets/conftest.py


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Tests of one session fixture (the servers, the curated home) share one worker; tests marked `gpu` run only
    where CUDA is present (the device machine); CI has none."""
    import torch

    for item in items:
        groups = {SESSION_GROUPS[name] for name in getattr(item, "fixturenames", ()) if name in SESSION_GROUPS}
        if groups:
            # A test of both would be a group of its own, building both again on its worker: none uses both.
            item.add_marker(pytest.mark.xdist_group("+".join(sorted(groups))))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker gpu); none is present here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
