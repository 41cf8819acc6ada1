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


# The session's servers: a test that uses one runs on the worker that started it (make test runs two workers with
# pytest-xdist's --dist loadgroup), so each starts once, as in a run without workers.
SESSION_SERVERS = {"moto_server", "slurm_cluster"}


def pytest_collection_modifyitems(config, items):
    """Tests of the session's servers share one worker; tests marked `gpu` run only where CUDA is present (the
    device machine); CI has none."""
    import torch

    for item in items:
        if SESSION_SERVERS & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("session-servers"))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker gpu); none is present here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
