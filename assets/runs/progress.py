"""What `pretrain materialize` shows on its terminal: a line per asset when its run ends, the warnings and errors of
the runs, a closing line naming the log file, and below them one live line for the whole command:

    pretrain: materializing 12 asset(s) of recipe 'demo'; the full log: /…/.pretrain/logs/1a2b3c4d5e6f.log
    pretrain: [1/12] done     curation/web/raw_crawl in 6.1 s (run 1a2b3c4d): 1,171 documents of 1,171
    pretrain: training/main: warning: RESTART 1/3: the trainer failed on attempt 1 (…) [...]
    7/12 assets | 1:02 | ETA 0:40 | training/main step 40 (31%) loss 6.812 2,950 tok/s      <- redrawn in place

Everything else (Dagster's event log, datatrove's and DeepSpeed's output, the trainer's own lines) goes to the log
file (assets/runs/output.py); the live line reads the runs' progress where they write it (assets/runs/watch.py). The
live line is drawn with rich, only on a terminal that can redraw a line: through a pipe, under nohup or in CI the
same lines come, and no redraws.

Two reports with one interface, which the scheduler (assets/runs/parallel.py) and the CLI call:
- Progress: the above;
- StreamReport: every line on stderr as it comes, Dagster's among them (`--verbose`, and a caller of
  materialize_parallel that gives no report), as before the log file existed.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

POLL_S = 1.0  # how often the live line is redrawn and the runs are read


def new_session() -> str:
    """The id of one `pretrain materialize`: every run of it is tagged with it, and its log file is named after it."""
    return uuid.uuid4().hex[:12]


def clock(seconds: float) -> str:
    """'0:42', '12:05', '1:02:03'."""
    seconds = int(max(0.0, seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class StreamReport:
    """Every line on stderr as it comes, the runs' start lines too; Dagster's own output goes there as well."""

    log: Path | None = None
    console_events = True  # the runs' Dagster console loggers print every event (assets/runs/runners.py)

    def __init__(self, session: str | None = None):
        self.session = session or new_session()

    def say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def run_started(self, run_id: str, name: str, line: str) -> None:
        self.say(line)

    def run_ended(self, run_id: str, line: str) -> None:
        self.say(line)

    def counts(self, done: int, total: int | None) -> None:
        pass

    def watch(self, instance) -> None:
        pass

    def finish(self, ok: bool) -> None:
        pass

    def close(self) -> None:
        pass


class Progress:
    """The terminal of a `pretrain materialize` whose other output goes to `log`: lines, and the live line. The runs'
    event log goes to `log` too, written from here as it is read from the instance (assets/runs/watch.py)."""

    console_events = False

    def __init__(self, terminal, *, session: str, log: Path, now=time.monotonic):
        from rich.console import Console

        self.session, self.log, self._now = session, log, now
        self.console = Console(file=terminal, highlight=False, markup=False, emoji=False, soft_wrap=True)
        self._live = None
        if self.console.is_terminal and not self.console.is_dumb_terminal:
            from rich.live import Live

            # Our own thread redraws (below), after reading the runs; Live only draws, and leaves no line behind.
            self._live = Live(console=self.console, transient=True, auto_refresh=False, redirect_stdout=False,
                              redirect_stderr=False)
            self._live.start()
        self._lock = threading.RLock()
        self._watch = self._event_log = None
        self._running: dict[str, str] = {}  # run id -> its task's name
        self._done, self._total = 0, None
        self._began = self._batch_began = now()
        self._watch_failed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pretrain-progress", daemon=True)
        self._thread.start()

    # The report's interface (StreamReport's).

    def say(self, text: str) -> None:
        from rich.text import Text

        with self._lock:
            self.console.print(Text(text), soft_wrap=True)

    def run_started(self, run_id: str, name: str, line: str) -> None:
        """The live line names the run; `line` (its start) is only in the log file's stream."""
        with self._lock:
            self._running[run_id] = name
            if self._watch is not None:
                self._watch.add(run_id, name)
            self._redraw()

    def run_ended(self, run_id: str, line: str) -> None:
        """The run's warnings not shown yet, then its done (or FAILED) line."""
        with self._lock:
            self._running.pop(run_id, None)
            for warning in self._read(lambda: self._watch.remove(run_id)):
                self.say(warning)
            self.say(line)
            self._redraw()

    def counts(self, done: int, total: int | None) -> None:
        with self._lock:
            if done == 0:  # a new round of runs (`--stale` runs several): its own rate
                self._batch_began = self._now()
            self._done, self._total = done, total
            self._redraw()

    def watch(self, instance) -> None:
        """Follow the runs in `instance` from now on: their warnings, and the training stages' steps."""
        from assets.runs.watch import RunWatch

        with self._lock:
            self._event_log = open(self.log, "a", buffering=1, encoding="utf-8", errors="replace")
            self._watch = RunWatch(instance, self._event_log)
            for run_id, name in self._running.items():
                self._watch.add(run_id, name)

    def finish(self, ok: bool) -> None:
        """The closing line: how it ended, how long it took, where the full log is."""
        self.say(f"pretrain: {'done' if ok else 'FAILED'} in {clock(self._now() - self._began)}; "
                 f"the full log: {self.log}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            for warning in self._read(lambda: self._watch.poll()):  # the last events of runs never reported ended
                self.say(warning)
            if self._live is not None:
                self._live.stop()
                self._live = None
            if self._event_log is not None:
                self._event_log.close()
                self._watch = self._event_log = None

    # The live line.

    def line(self) -> str:
        """'7/12 assets | 1:02 | ETA 0:40 | training/main step 40 (31%) loss 6.812 2,950 tok/s | running …'."""
        now = self._now()
        training = self._watch.training() if self._watch is not None else []
        eta = self._eta(now, training)
        parts = [f"{self._done}/{self._total if self._total is not None else '?'} assets", clock(now - self._began),
                 f"ETA {clock(eta)}" if eta is not None else "ETA -"]
        for name, record, train_tokens in training:
            share = f" ({100 * record['tokens'] / train_tokens:.0f}%)" if train_tokens and record.get("tokens") else ""
            parts.append(f"{name} step {record.get('step')}{share} loss {_figure(record.get('loss'), '{:.3f}')} "
                         f"{_figure(record.get('tokens_per_s'), '{:,.0f}')} tok/s")
        trained = {name for name, _, _ in training}
        others = [name for name in self._running.values() if name not in trained]
        if others:
            parts.append("running " + ", ".join(others))
        return " | ".join(parts)

    def _eta(self, now: float, training: list) -> float | None:
        """The assets left at this round's rate so far; at least what a training stage has left at its tokens/s."""
        estimates = []
        if self._done and self._total is not None:
            estimates.append((now - self._batch_began) / self._done * (self._total - self._done))
        for _, record, train_tokens in training:
            rate = record.get("tokens_per_s")
            if train_tokens and isinstance(rate, (int, float)) and rate > 0:
                estimates.append((train_tokens - record.get("tokens", 0)) / rate)
        return max(estimates) if estimates else None

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            with self._lock:
                for warning in self._read(lambda: self._watch.poll()):
                    self.say(warning)
                self._redraw()

    def _read(self, read) -> list[str]:
        """What `read()` returns from the watch, [] without one; a watch that fails (the instance busy, a file
        half-written) costs the live line its figures, never the command: its error goes to the log, once."""
        if self._watch is None:
            return []
        try:
            return read()
        except Exception:
            if not self._watch_failed:
                self._watch_failed = True
                print(f"pretrain: reading the runs' progress failed (the live line goes on without it):\n"
                      f"{traceback.format_exc()}", file=sys.stderr, flush=True)  # the log file
            return []

    def _redraw(self) -> None:
        if self._live is None:
            return
        from rich.text import Text

        self._live.update(Text(self.line(), no_wrap=True, overflow="ellipsis"), refresh=True)


def _figure(value, form: str) -> str:
    return form.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
