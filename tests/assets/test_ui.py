"""`make ui` comes up and, on SIGTERM to make (what a service manager or a container sends), leaves no process of
its own or of dagster dev's running after 10 s (assets/ui.py)."""

import os
import signal
import subprocess
import time

import psutil
import pytest
from dagster import DagsterInstance

from assets.home import ensure_dagster_home
from assets.ui import group_alive
from tests.ports import free_port
from tests.ui.test_browser import REPO, wait_for_server

STOPPED_WITHIN_S = 10


@pytest.mark.slow  # ~15-30 s: dagster dev's webserver, daemon and code server come up, then stop
def test_make_ui_comes_up_and_every_process_is_gone_10_s_after_sigterm(tmp_path):
    ensure_dagster_home()
    DagsterInstance.get().get_runs(limit=1)  # the SQLite databases exist before the webserver and daemon race to stamp them
    port = free_port()
    # Not the outer make's flags (`make test` runs this): `make ui` as a user types it.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    log = tmp_path / "make-ui.log"
    with open(log, "wb") as out:
        make = subprocess.Popen(["make", "--no-print-directory", "ui", f"UI_PORT={port}"], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    processes: list[psutil.Process] = []
    try:
        wait_for_server(make, f"http://127.0.0.1:{port}", log)
        processes += [psutil.Process(make.pid), *psutil.Process(make.pid).children(recursive=True)]
        commands = [" ".join(process.cmdline()) for process in processes]
        assert any("assets.ui" in c for c in commands) and any("dagster dev" in c or "dagster-webserver" in c
                                                               for c in commands), commands
        groups = {os.getpgid(process.pid) for process in processes}
        make.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOPPED_WITHIN_S
        while time.monotonic() < deadline:
            if not any(alive(p) for p in processes) and not any(group_alive(g) for g in groups):
                break
            time.sleep(0.1)
        left = [" ".join(p.cmdline()) for p in processes if alive(p)]
        assert not left, f"running {STOPPED_WITHIN_S} s after SIGTERM: {left}\n{log.read_text()[-2000:]}"
        assert not any(group_alive(g) for g in groups)
        assert make.wait(timeout=5) != 0  # stopped by a signal, not ended by itself
        assert "ui: SIGTERM: stopping dagster dev" in log.read_text()
    finally:  # a failed check leaves nothing running either
        for process in [*processes, *(psutil.Process(make.pid).children(recursive=True) if alive_pid(make.pid) else [])]:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        make.wait(timeout=30)


def alive_pid(pid: int) -> bool:
    try:
        return alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
