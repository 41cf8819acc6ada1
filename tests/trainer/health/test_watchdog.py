"""trainer.health.watchdog: the timeout rule, and a firing on one rank (no process group): failure.json and the exit."""

import json
import threading
import time

from trainer.health.config import WatchdogConfig
from trainer.exits import HANG_EXIT
from trainer.health.watchdog import StepWatchdog, where_is


def test_the_timeout_follows_the_recent_step_times():
    dog = StepWatchdog(WatchdogConfig(enabled=False, first_steps=2, first_steps_timeout_s=99, min_timeout_s=1,
                                      step_factor=10), rank=0, world_size=1, output_dir="unused")
    assert dog.timeout() == 99
    for _ in range(2):
        dog.arm(0)
        dog.disarm()
    assert dog.timeout() == 1  # 10 × a near-zero median, but never under min_timeout_s
    dog.arm(5)
    dog.pause()  # not counted as a step
    assert len(dog._durations) == 2


def test_a_step_past_its_timeout_writes_failure_json_and_exits_4(tmp_path):
    exited, fired = [], []
    dog = StepWatchdog(WatchdogConfig(first_steps=5, first_steps_timeout_s=0.3), rank=0, world_size=1,
                       output_dir=tmp_path, on_fire=fired.append, exit=exited.append)
    dog._main = threading.current_thread().ident
    dog.arm(7)
    deadline = time.monotonic() + 10
    while not exited and time.monotonic() < deadline:
        time.sleep(0.05)  # "stuck" here, outside any collective
    dog.close()
    assert exited == [HANG_EXIT]
    failure = json.loads((tmp_path / "failure.json").read_text())
    assert failure["kind"] == "hang" and failure["exit_status"] == HANG_EXIT and failure["step"] == 7
    assert failure["rank"] == 0 and "stuck outside any collective at" in failure["message"]
    assert "test_watchdog.py" in failure["message"] and fired[0]["event"] == "hang"


def test_where_is_names_where_another_thread_is():
    stop = threading.Event()

    def waiting_here():
        stop.wait(10)

    thread = threading.Thread(target=waiting_here)
    thread.start()
    try:
        time.sleep(0.1)
        report = where_is(thread.ident)
    finally:
        stop.set()
        thread.join()
    assert not report["in_collective"] and report["stack"]
    assert any("waiting_here" in frame for frame in report["stack"])
