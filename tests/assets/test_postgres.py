"""The Dagster instance on PostgreSQL: a real server (Debian's postgresql-15) started for the test on loopback,
the curation assets run against it, four `pretrain materialize` processes at once, every run recorded there.

SQLite stays the default: without PRETRAIN_DAGSTER_PG_URL the instance's dagster.yaml names no storage.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from assets.home import PG_URL_ENV
from assets.recipe import DEMO_RECIPE
from tests.conftest import REPO
from tests.ports import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
# Sources of 10 real documents each: the first is ingested and filtered alone, then the other four are
# ingested by four runs at once (different sources, so no two runs write the same output).
SOURCES = {
    "c4a": "jsonl/olmo_c4-sample.01.json.gz",
    "c4b": "jsonl/olmo_c4-sample.02.json.gz",
    "c4c": "jsonl/olmo_c4-sample.03.json.gz",
    "guardian": "jsonl/olmo_c4_100_domains_theguardian.jsonl.gz",
    "dolma": "jsonl/dolma_cc_en_head-0091.jsonl.gz",
}
FIRST, CONCURRENT = "c4a", ("c4b", "c4c", "guardian", "dolma")


@pytest.fixture
def postgres_url():
    """A PostgreSQL 15 server of its own on 127.0.0.1 (trust auth, data in a temporary folder); stopped after."""
    if not (PG_BIN / "initdb").is_file():
        pytest.fail(f"PostgreSQL 15 is not installed ({PG_BIN}/initdb missing): `make system-deps` installs it")
    # initdb refuses to run as root: as root, the server runs as the `postgres` user, in a folder it owns
    # (pytest's tmp_path is private to root, so the folder is made directly under /tmp).
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    root = Path(tempfile.mkdtemp(prefix="pretrain-pg-"))
    if as_pg:
        shutil.chown(root, "postgres", "postgres")
    data, port = root / "data", free_port()

    def pg(*args, **kwargs):
        return subprocess.run([*as_pg, *map(str, args)], check=True, capture_output=True, text=True, timeout=120, **kwargs)

    started = False
    try:
        pg(PG_BIN / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        # Durability is not this test's subject: fsync off keeps the 2 shared cores on the work.
        pg(PG_BIN / "pg_ctl", "-D", data, "-l", root / "server.log", "-w", "-t", "60", "start", "-o",
           f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off")
        started = True
        pg(PG_BIN / "psql", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-c", "CREATE DATABASE dagster")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/dagster"
    finally:
        if started:
            pg(PG_BIN / "pg_ctl", "-D", data, "-m", "fast", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


def psql(url: str, query: str) -> str:
    url = url.replace("+psycopg2", "")  # libpq's own URL form
    return subprocess.run(["psql", url, "-At", "-c", query], check=True, capture_output=True, text=True).stdout.strip()


def write_recipe(path: Path) -> None:
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    path.write_text(yaml.safe_dump({
        "name": "postgres",
        "base_dir": str((DEMO_RECIPE.parent / raw["base_dir"]).resolve()),
        "sources": [{"name": name, "format": "jsonl", "inputs": [inputs],
                     "filter": {"gopher_repetition": {}, "gopher_quality": {}, "pii": {}}}
                    for name, inputs in SOURCES.items()],
    }, sort_keys=False))


@pytest.mark.slow  # 40-80 s on 2 busy cores: a server start, two runs, then four runs at once
def test_curation_runs_on_postgres_with_four_concurrent_runs(tmp_path, monkeypatch, postgres_url):
    from dagster import AssetKey, DagsterInstance, DagsterRunStatus
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage

    from assets.cli import main

    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    monkeypatch.setenv(PG_URL_ENV, postgres_url)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    # The first run creates Dagster's tables (as `dagster instance migrate` would on a production database);
    # `pretrain materialize` makes one run per asset: two here.
    assert main(["materialize", "--select", f"curation/{FIRST}/raw_crawl,curation/{FIRST}/filtered"]) == 0

    # Four processes at once against the same instance: each writes its run, events and materialization.
    procs = [
        subprocess.Popen([sys.executable, "-m", "assets.cli", "materialize", "--select", f"curation/{name}/raw_crawl"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in CONCURRENT
    ]
    results = [(*p.communicate(timeout=400), p.returncode) for p in procs]  # drains the pipes while waiting
    for name, (out, err, code) in zip(CONCURRENT, results):
        assert code == 0, f"{name}: exit {code}\n{err[-4000:]}"
        for sign in ("database is locked", "deadlock detected", "LockNotAvailable", "OperationalError", "could not serialize"):
            assert sign not in err, f"{name}: {sign!r} in\n{err[-4000:]}"

    instance = DagsterInstance.get()
    assert isinstance(instance.run_storage, PostgresRunStorage)
    assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
    assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
    runs = instance.get_runs()
    assert len(runs) == 6 and {run.status for run in runs} == {DagsterRunStatus.SUCCESS}
    done = [("curation", FIRST, "filtered")] + [("curation", name, "raw_crawl") for name in SOURCES]
    for key in done:
        assert instance.get_latest_materialization_event(AssetKey(list(key))) is not None, key
    # Read straight from the server, not through Dagster: the runs are rows in PostgreSQL.
    assert psql(postgres_url, "SELECT count(*) FROM runs WHERE status = 'SUCCESS'") == "6"
    materialized = psql(postgres_url, "SELECT count(DISTINCT asset_key) FROM event_logs "
                                      "WHERE dagster_event_type = 'ASSET_MATERIALIZATION'")
    assert materialized == str(len(done))
    # Nothing went to SQLite files in DAGSTER_HOME.
    assert not list(Path(os.environ["DAGSTER_HOME"]).rglob("*.db"))
