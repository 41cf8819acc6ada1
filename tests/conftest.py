"""Shared test set-up: real data from ../shared/data, and a private PRETRAIN_HOME for every test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()


def share_the_cores_between_workers() -> None:
    """Under pytest-xdist, each worker's processes (the worker itself, the trainers, Dagster runs and evaluations its
    tests start) use cores // workers OpenMP threads, unless OMP_NUM_THREADS is already set. Each worker otherwise runs
    torch with every core while the other worker keeps them busy, and OpenMP threads that wait on a taken core made
    the demo's main training 6x slower (111 s, 600 tokens/s, against 18 s alone). This is what assets/runs/parallel.py
    does for two runs at once; a test that needs its own count still sets it. Before anything imports torch: its
    thread pool is sized when it loads.

    For the same reason `pretrain materialize` runs cores // workers Dagster runs at once (PRETRAIN_JOBS, unless set):
    on 2 cores, one, in the worker's own process. Its default, a pool of one process per core, started a fresh
    interpreter per process and per command that imported the code location, great-expectations and the filters'
    models again (~3 s, ~4 s and more of CPU each, 10-20 s a command); in the worker they load once a session. The
    lineage test took 124 s of CPU that way and 54 s in process. tests/assets/runs/test_parallel.py passes --jobs 2
    for the pool. Likewise a data stage runs cores // workers tasks at once (PRETRAIN_CPUS), not one per core."""
    from assets.runs.parallel import JOBS_ENV, THREADS_ENV
    from resources.executor_env import CPUS_ENV, available_cpus

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 1:
        share = str(max(1, available_cpus() // workers))
        os.environ.setdefault(THREADS_ENV, share)
        os.environ.setdefault(JOBS_ENV, share)
        os.environ.setdefault(CPUS_ENV, share)  # the local executor's tasks at once, by default (its share of CPUs)


share_the_cores_between_workers()


@pytest.fixture(autouse=True)
def pretrain_home(tmp_path, monkeypatch) -> Path:
    """Nothing a test does lands in the user's .pretrain/ or Dagster instance."""
    home = tmp_path / "pretrain-home"
    monkeypatch.setenv("PRETRAIN_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    monkeypatch.delenv("PRETRAIN_STORE", raising=False)
    monkeypatch.delenv("PRETRAIN_RECIPE", raising=False)
    return home


@pytest.fixture(autouse=True)
def sigterm_heard():
    """Dagster run in this process (`pretrain materialize --jobs 1`, `materialize()`, a shared fixture's build) sets
    SIGTERM to SIGINT's handler and leaves it so. Where SIGINT is ignored, as in a shell's background job, SIGTERM
    was then ignored for the rest of that worker's tests, and every process a later test started inherited it:
    `make ui` outlived its SIGTERM, and a multiprocessing pool's terminate() (datatrove's in bench/ingest.py,
    lm-eval's bootstrap) joined workers that never heard theirs, forever (all seen in suites run in the
    background). Each test starts with SIGTERM at its default if it was ignored, and leaves it so."""
    import signal

    def heard():
        if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    heard()
    yield
    heard()


@pytest.fixture
def shared_data() -> Path:
    assert SHARED_DATA.is_dir(), f"the shared data is expected at {SHARED_DATA}"
    return SHARED_DATA


# A real S3-compatible server on loopback for every test folder that needs one.
from tests.s3_server import moto_server, s3, s3_proxy, store  # noqa: E402,F401  (pytest fixtures)
from tests.slurm_cluster import slurm, slurm_cluster  # noqa: E402,F401  (a real Slurm on this host)


# Fixtures broader than a test (session or module scope) are built once per worker that runs a test using them: make
# test runs two pytest-xdist workers with --dist loadgroup, so every test of such a fixture is put in one group, on one
# worker, and the fixture is built once, as in a run without workers. Fixtures that one test uses together join one
# group (else that test's worker would build them again). Groups named here read better in test ids than
# "<module>.<fixture>": the servers (tests/s3_server.py, tests/slurm_cluster.py) share a worker, and the curated home
# (tests/assets/curated.py).
GROUP_NAMES = {"moto_server": "session-servers", "slurm_cluster": "session-servers",
               "curated_template": "curated-c4-math"}


def shared_fixture_groups(items) -> dict:
    """{test item: its group}, for the tests that use a session or module fixture of this suite (not pytest's own,
    such as tmp_path_factory): fixtures joined when one test uses both, or when GROUP_NAMES gives them one name."""
    parent: dict[str, str] = {}

    def root(label: str) -> str:
        while parent.setdefault(label, label) != label:
            label = parent[label]
        return label

    def join(a: str, b: str) -> None:
        a, b = root(a), root(b)
        if a != b:
            parent[max(a, b)] = min(a, b)

    used = {}
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        labels = []
        for name in getattr(item, "fixturenames", ()):
            defs = info.name2fixturedefs.get(name) if info else None
            fixture = defs[-1] if defs else None
            if fixture is None or fixture.scope == "function" or not fixture.func.__module__.startswith("tests."):
                continue
            labels.append(GROUP_NAMES.get(name, f"{fixture.func.__module__.rsplit('.', 1)[-1]}.{name}"))
        for label in labels:
            join(labels[0], label)
        if labels:
            used[item] = labels[0]
    return {item: root(label) for item, label in used.items()}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Tests of one shared fixture share one worker (shared_fixture_groups); tests marked `slow` come first; tests
    marked `gpu` run only where CUDA is present (the device machine); CI has none.

    Slow first: pytest-xdist hands out the groups largest first, then single tests in this order, each to the
    worker that runs out of work. Collected by path, a minute-long test near the end (the UI's, a multi-rank kill)
    kept one worker busy while the other, done, sat idle (~55 s of the suite's wall time); started early, the long
    tests run beside others and the short ones fill in at the end. A stable sort: each module's order is kept."""
    import torch

    for item, group in shared_fixture_groups(items).items():
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: "slow" not in item.keywords)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marker gpu); none is present here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
