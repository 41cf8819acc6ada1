"""The step watchdog: a step that does not finish in time ends the job, naming the rank and the step.

    dog = StepWatchdog(cfg.watchdog, rank=r, world_size=w, output_dir=out, on_fire=metrics.log_event)
    dog.arm(step); ... the step ...; dog.disarm()
    dog.close()

A thread on every rank watches the armed step. The timeout follows the run: step_factor × the median
of the recent step times, at least min_timeout_s; the first steps get first_steps_timeout_s. When it
fires, each rank looks at where its main thread is: inside a collective (torch.distributed, DeepSpeed's
comm) it is waiting for someone; anywhere else it is the one holding the job up. The ranks swap these
reports through the process group's store (which works while the group itself is stuck), rank 0
writes <output_dir>/failure.json and every rank prints the verdict and exits with HANG_EXIT, so the
launcher (resources/launcher.py) restarts the job from its last committed checkpoint.

The NCCL / gloo timeout (watchdog.collective_timeout_s, set on the process group) is the backstop
for a hang this thread cannot see, e.g. one inside a checkpoint save or an evaluation.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Callable

from trainer.health.config import WatchdogConfig
from trainer.exits import HANG_EXIT, node_name, write_failure

EXCHANGE_S = 10.0  # how long a firing rank waits for the others' reports
COLLECTIVE_MARKERS = ("torch/distributed/", "deepspeed/comm/", "deepspeed/runtime/comm/")


def where_is(thread_id: int) -> dict:
    """Where a thread is now: in a collective or not, and its innermost frames."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return {"in_collective": False, "where": "unknown (thread gone)", "stack": []}
    stack = traceback.extract_stack(frame)
    collective = [f for f in stack if any(m in f.filename.replace(os.sep, "/") for m in COLLECTIVE_MARKERS)]
    inner = stack[-1]
    ours = next((f for f in reversed(stack) if "site-packages" not in f.filename), inner)
    return {"in_collective": bool(collective),
            "collective": collective[-1].name if collective else None,
            "where": f"{_short(ours.filename)}:{ours.lineno} in {ours.name}",
            "stack": [f"{_short(f.filename)}:{f.lineno} {f.name}" for f in stack[-8:]]}


def _short(path: str) -> str:
    for root in ("site-packages/", os.getcwd() + "/"):
        if root in path:
            return path.split(root, 1)[1]
    return path


def _default_store():
    try:
        import torch.distributed as torch_dist
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store() if torch_dist.is_initialized() else None
    except Exception:  # no group, or a torch without the helper: each rank reports alone
        return None


class StepWatchdog:
    def __init__(self, cfg: WatchdogConfig, *, rank: int, world_size: int, output_dir: str | Path,
                 on_fire: Callable[[dict], None] | None = None, exit: Callable[[int], None] = os._exit):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.output_dir = Path(output_dir)
        self.on_fire = on_fire
        self._exit = exit
        self.host = node_name()  # what a launcher can leave out after two hangs
        self._durations: deque[float] = deque(maxlen=50)
        self._armed: tuple[int, float, float] | None = None  # (step, started, timeout)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._main = threading.current_thread().ident  # the thread that runs the steps
        self._thread = None
        if cfg.enabled:
            self._thread = threading.Thread(target=self._watch, name="step-watchdog", daemon=True)
            self._thread.start()

    def timeout(self) -> float:
        if len(self._durations) < self.cfg.first_steps:
            return self.cfg.first_steps_timeout_s
        return max(self.cfg.min_timeout_s, self.cfg.step_factor * statistics.median(self._durations))

    def arm(self, step: int) -> None:
        with self._lock:
            self._armed = (step, time.monotonic(), self.timeout())

    def disarm(self) -> None:
        with self._lock:
            if self._armed is not None:
                self._durations.append(time.monotonic() - self._armed[1])
            self._armed = None

    def pause(self) -> None:
        """Stop watching without counting the time as a step (a rollback, a long load)."""
        with self._lock:
            self._armed = None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                armed = self._armed
            if armed is not None and time.monotonic() - armed[1] > armed[2]:
                step, started, timeout = armed
                self.fire(step, time.monotonic() - started, timeout)
                return

    # -- firing ----------------------------------------------------------------------------------

    def _timeout_reason(self, timeout: float) -> str:
        if len(self._durations) < self.cfg.first_steps:
            return f"watchdog.first_steps_timeout_s = {timeout:g} s"
        median = statistics.median(self._durations)
        return (f"{timeout:.1f} s = max(watchdog.min_timeout_s {self.cfg.min_timeout_s:g} s, "
                f"watchdog.step_factor {self.cfg.step_factor:g} × median step {median:.3f} s)")

    def fire(self, step: int, elapsed: float, timeout: float) -> None:
        mine = {"rank": self.rank, "host": self.host, "pid": os.getpid(), **where_is(self._main)}
        reports = self._exchange(step, mine)
        stuck = [r for r in reports if r is not None and not r["in_collective"]]
        silent = [rank for rank, r in enumerate(reports) if r is None]
        waiting = [r for r in reports if r is not None and r["in_collective"]]
        head = (f"watchdog: step {step} did not finish within {elapsed:.1f} s (timeout {self._timeout_reason(timeout)})")
        if stuck or silent:
            blamed = [r["rank"] for r in stuck] + silent
            parts = [f"rank {r['rank']} (host {r['host']}, pid {r['pid']}) is stuck outside any collective at "
                     f"{r['where']}" for r in stuck]
            parts += [f"rank {rank} did not answer (dead or frozen)" for rank in silent]
            if waiting:
                parts.append(f"rank(s) {[r['rank'] for r in waiting]} wait for it in a collective "
                             f"({waiting[0]['collective']})")
        else:
            blamed = []
            parts = [f"every rank waits in a collective ({mine['collective']}): a communication hang "
                     f"(network, or a peer process that died)"]
        message = head + ": " + "; ".join(parts)
        first = (stuck[0]["rank"] if stuck else silent[0]) if blamed else None
        record = {"event": "hang", "kind": "hang", "step": step, "rank": first, "ranks": blamed,
                  "host": reports[first]["host"] if first is not None and reports[first] else None,
                  "elapsed_s": round(elapsed, 3), "timeout_s": round(timeout, 3), "message": message,
                  "reports": [r for r in reports if r is not None]}
        print(f"[rank {self.rank}] {message}", file=sys.stderr, flush=True)
        if self.rank == 0:
            try:
                if self.on_fire is not None:
                    self.on_fire({k: v for k, v in record.items() if k != "reports"})
            except Exception:  # the main thread may hold the metrics writer; the file below is what counts
                pass
            write_failure(self.output_dir, {**record, "exit_status": HANG_EXIT})
        self._done_and_exit()

    def _exchange(self, step: int, mine: dict) -> list[dict | None]:
        reports: list[dict | None] = [None] * self.world_size
        reports[self.rank] = mine
        store = _default_store() if self.world_size > 1 else None
        if store is None:
            return reports
        try:
            store.set(f"watchdog/report/{self.rank}", json.dumps(mine))
            deadline = time.monotonic() + EXCHANGE_S
            while time.monotonic() < deadline and any(r is None for r in reports):
                for rank in range(self.world_size):
                    if reports[rank] is None and store.check([f"watchdog/report/{rank}"]):
                        reports[rank] = json.loads(store.get(f"watchdog/report/{rank}"))
                time.sleep(0.1)
        except Exception as e:  # the store went with a dead rank 0: report what this rank knows
            print(f"[rank {self.rank}] watchdog: cannot reach the other ranks ({e})", file=sys.stderr, flush=True)
        return reports

    def _done_and_exit(self) -> None:
        # Rank 0 writes failure.json; the others wait for it a moment so the launcher's teardown of the
        # job (its first exit) does not cut rank 0 off before the file is there.
        store = _default_store() if self.world_size > 1 else None
        try:
            if store is not None:
                if self.rank == 0:
                    store.set("watchdog/done", "1")
                else:
                    deadline = time.monotonic() + EXCHANGE_S
                    while time.monotonic() < deadline and not store.check(["watchdog/done"]):
                        time.sleep(0.1)
        except Exception:
            pass
        sys.stderr.flush()
        sys.stdout.flush()
        self._exit(HANG_EXIT)
