"""`make ui`: the Dagster UI (`dagster dev`: the webserver, the daemon, the code server) on the persistent instance,
stopped as a whole when asked.

    python -m assets.ui [--host 127.0.0.1] [--port 3000]

Why a wrapper: `dagster dev` left alone ignored SIGTERM, which is how a service manager or a container stops a
program. Measured: 5 processes still running 40 s after it, until each was killed. Here SIGTERM and SIGINT are
passed on to `dagster dev` as the SIGINT it does shut down on (Ctrl-C). After GRACE_S, whatever is left of its
process group is killed, so the command ends within 10 s. Training jobs that a UI run started are detached on
purpose (trainer/job/) and keep training; they are followed again by the next run.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from assets.home import ensure_dagster_home

REPO = Path(__file__).resolve().parents[1]
GRACE_S = 6.0  # for dagster dev to stop its webserver, daemon and code server before they are killed
POLL_S = 0.1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assets.ui", description="the Dagster UI on this instance")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3000)
    args = parser.parse_args(argv)
    ensure_dagster_home()
    dagster = Path(sys.executable).parent / "dagster"
    # A group of its own: what dagster dev starts (and its runs' workers) is stopped as one, whoever signals us.
    server = subprocess.Popen([str(dagster), "dev", "-w", str(REPO / "workspace.yaml"), "-h", args.host,
                               "-p", str(args.port)], start_new_session=True)
    asked: list[int] = []

    def ask_to_stop(signum, frame):
        asked.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, ask_to_stop)
    while server.poll() is None and not asked:
        time.sleep(POLL_S)
    if not asked:  # dagster dev ended by itself (a port in use, a bad workspace): its status is ours
        stop_group(server.pid)
        return server.returncode
    print(f"ui: {signal.Signals(asked[0]).name}: stopping dagster dev", file=sys.stderr, flush=True)
    stop_group(server.pid)
    server.wait()
    return 128 + asked[0]


def stop_group(group: int) -> None:
    """SIGINT to every process of the group, then SIGKILL to what is left after GRACE_S."""
    try:
        os.killpg(group, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and group_alive(group):
        time.sleep(POLL_S)
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def group_alive(group: int) -> bool:
    """Whether a process of the group is still running (not a zombie that only waits to be reaped)."""
    import psutil

    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == group and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


if __name__ == "__main__":
    sys.exit(main())
