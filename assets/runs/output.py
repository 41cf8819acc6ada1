"""Where the output of one `pretrain materialize` goes: its own lines to the terminal, the rest to a log file.

    with materialize_output(verbose=False) as report:   # assets/runs/progress.py: Progress, or StreamReport
        report.say("pretrain: materializing …")          # the terminal
        …                                                 # everything else: $PRETRAIN_HOME/logs/<session>.log

The rest is Dagster's event log (every event, DEBUG included, from its console logger), datatrove's banners and
stats tables, DeepSpeed's and the trainer's output, warnings of the libraries: written by this process, by the
worker processes it starts and by theirs (executor helpers, trainers, evaluations). So the redirection is of the
file descriptors 1 and 2, which every process started from here inherits, and of sys.stdout and sys.stderr, which
Python code writes to and which need not be those descriptors (pytest's capture). The terminal keeps a descriptor of
its own. `--verbose` changes nothing: everything streams to stderr as it comes, and no log file is written.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

from assets.home import pretrain_home
from assets.runs.progress import Progress, StreamReport, new_session


def log_path(session: str) -> Path:
    return pretrain_home() / "logs" / f"{session}.log"


@contextlib.contextmanager
def materialize_output(verbose: bool = False):
    """The report of one `pretrain materialize` (a new session id); unless `verbose`, with this process's output, and
    that of every process it starts, in the session's log file until the block ends."""
    session = new_session()
    if verbose:
        yield StreamReport(session)
        return
    path = log_path(session)
    with output_to(path) as terminal:
        report = Progress(terminal, session=session, log=path)
        try:
            yield report
        finally:
            report.close()


@contextlib.contextmanager
def output_to(path: Path):
    """Everything written to stdout and stderr, by this process and those it starts, appended to `path` until the
    block ends; yields the stream that still reaches the terminal (or whatever stderr was: a test's capture)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):
            stream.flush()
    terminal, own_terminal = _terminal()
    log = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
    saved_fds = {fd: os.dup(fd) for fd in (1, 2)}
    saved_streams = sys.stdout, sys.stderr
    try:
        for fd in saved_fds:
            os.dup2(log.fileno(), fd)
        sys.stdout = sys.stderr = log
        yield terminal
    finally:
        with contextlib.suppress(ValueError, OSError):
            log.flush()
        sys.stdout, sys.stderr = saved_streams
        for fd, saved in saved_fds.items():
            os.dup2(saved, fd)
            os.close(saved)
        log.close()
        if own_terminal:
            terminal.close()


def _terminal():
    """(the stream for the terminal's lines, whether it is ours to close): a descriptor of its own when stderr is
    descriptor 2 (about to point at the log); else stderr's Python stream itself, which no redirection touches."""
    try:
        is_fd_2 = sys.stderr.fileno() == 2
    except (AttributeError, ValueError, io.UnsupportedOperation):
        is_fd_2 = False
    if not is_fd_2:
        return sys.stderr, False
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    return os.fdopen(os.dup(2), "w", buffering=1, encoding=encoding, errors="replace"), True
