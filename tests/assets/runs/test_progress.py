"""What `pretrain materialize` shows (assets/runs/progress.py): on a terminal (a pty), a line per asset, a live line with
the counts, an ETA and a training stage's step, loss and tok/s, and the rest in the log file; through a pipe, the same
lines and no redraws; a failure names the asset, its error and the log file. Real commands, in processes of their own.
"""

import io
import os
import re
import select
import subprocess
import sys

import pytest
import yaml
from dagster import DagsterInstance, RunsFilter

from assets.runs.parallel import SESSION_TAG
from assets.runs.progress import Progress, clock
from tests.assets.training.test_training import write_recipe
from tests.conftest import REPO

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
DONE = re.compile(r"^pretrain: \[(\d+)/(\d+)\] done     (\S+) in [\d.]+ s \(run [0-9a-f]{8}\)")
TRAINING = re.compile(r"training/main step \d+ \(\d+%\) loss \d+\.\d{3} [\d,]+ tok/s")


def pretrain(args, *, tty: bool, timeout: float = 600) -> tuple[int, str]:
    """`pretrain ARGS` in a process of its own, its stdout and stderr on a pseudo-terminal (`tty`, 160 columns, as a
    user's) or on a pipe: (exit status, everything it wrote)."""
    command = [sys.executable, "-m", "assets.cli", *args]
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160"}
    if not tty:
        done = subprocess.run(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
        return done.returncode, done.stdout + done.stderr
    import fcntl
    import pty
    import struct
    import termios

    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([controller], [], [], timeout)
            assert ready, f"no output for {timeout} s:\n{b''.join(chunks).decode(errors='replace')[-3000:]}"
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)


def screen(raw: str) -> list[str]:
    """The lines a terminal holds once `raw` is written to it: a carriage return goes back to the line's start, an erase
    (ESC[2K) clears it, a cursor-up (ESC[nA) goes back over lines, colours are dropped. What a redraw leaves is what
    the user sees."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+", raw):
        if token == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        elif token == "\r":
            col = 0
        elif token.startswith("\x1b"):
            if token.endswith("K"):
                lines[row] = ""
            elif token.endswith("A"):
                row = max(0, row - int(token[2:-1] or 1))
        else:
            lines[row] = lines[row][:col].ljust(col) + token + lines[row][col + len(token):]
            col += len(token)
    return [line.rstrip() for line in lines if line.strip()]


def session_runs(instance, log_line: str) -> tuple[str, list]:
    """(the log file's path, the runs of the command) from its closing line and the instance."""
    path = log_line.rsplit("the full log: ", 1)[1]
    session = os.path.basename(path).removesuffix(".log")
    return path, instance.get_runs(filters=RunsFilter(tags={SESSION_TAG: session}))


@pytest.mark.slow  # ~20 s (and the curated home, once a session): two packed outputs reused, a tiny training stage
def test_on_a_terminal_a_line_per_asset_a_live_line_and_the_rest_in_the_log_file(tmp_path, monkeypatch, curated_home):
    recipe = tmp_path / "recipe.yaml"
    # 40 steps: with 6 (the training tests' size) the steps took under one redraw (POLL_S) on a busy machine, after the
    # trainer's start-up, and the live line never showed one (one full-suite run in three).
    write_recipe(recipe, main_steps=40)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    status, raw = pretrain(["materialize", "--select", "tokenization/*/packed,training/main"], tty=True)
    lines = screen(raw)
    assert status == 0, raw[-3000:]

    # What stays on the terminal: the first line, one done line per asset, the closing line naming the log file.
    first, *done_lines, last = lines
    assert re.fullmatch(r"pretrain: materializing (\d+) asset\(s\) of recipe '[^']+'; the full log: \S+\.log", first)
    count = int(re.search(r"materializing (\d+)", first).group(1))
    done = [DONE.match(line) for line in done_lines]
    assert all(done), [line for line, match in zip(done_lines, done) if not match]
    assert sorted(int(m.group(1)) for m in done) == [1, 2, 3] and count == 3
    assert {m.group(3) for m in done} == {"training/main", "tokenization/c4/packed", "tokenization/math/packed"}
    assert re.fullmatch(r"pretrain: done in \d+:\d\d; the full log: \S+\.log", last)
    assert first.rsplit(" ", 1)[1] == last.rsplit(" ", 1)[1]
    # The training stage's done line has its figures.
    [main_line] = [line for line in done_lines if " training/main " in line]
    assert re.search(r": [\d,]+ tokens, loss \d+\.\d{3}", main_line), main_line

    # The live line was drawn (and redrawn in place): counts, elapsed time, ETA, and the trainer's step, loss, tok/s.
    plain = ANSI.sub("", raw)
    assert "\r" in raw and "\x1b[2K" in raw
    assert re.search(rf"\d+/{count} assets \| \d+:\d\d \| ETA (\d+:\d\d|-)", plain)
    assert TRAINING.search(plain), plain[-3000:]
    # Nothing of Dagster's, datatrove's, DeepSpeed's or the trainer's own output.
    for noise in ("DEBUG", "STEP_START", "RESOURCE_INIT", "LOGS_CAPTURED", "[pipes]", "DeepSpeed", "| tokens "):
        assert noise not in plain, noise

    # The log file holds Dagster's full event log: every event of every run of this command, in order.
    instance = DagsterInstance.get()
    path, runs = session_runs(instance, last)
    assert os.path.dirname(path) == str(curated_home / "logs") and len(runs) == count
    log = open(path).read()
    for run in runs:
        # Not anchored at a line's start: a line of another process may have been half written (tqdm's, which ends
        # its updates with a carriage return), and an event line then follows it on the same line.
        written = re.findall(rf"\d\d:\d\d:\d\d [+-]\d{{4}} - dagster - (\w+) - __ASSET_JOB - {run.run_id} - (.*)$", log,
                             re.M)
        events = instance.all_logs(run.run_id)
        assert len(written) == len(events), run.run_id
        for (level, line), event in zip(written, events):
            assert line.endswith(event.message.splitlines()[0]) if event.message else True, (line, event.message)
        assert {"DEBUG", "INFO"} <= {level for level, _ in written}
        assert any(" - STEP_SUCCESS - " in line for _, line in written)
    # And what the trainer printed (its step lines), and the messages the assets logged.
    assert re.search(r"step +\d+ \| tokens +[\d,]+", log)
    assert "launching the trainer" in log


@pytest.mark.slow  # ~15 s: two raw crawls, one of them failing, in a process of its own with its output on a pipe
def test_without_a_terminal_the_same_lines_no_redraws_and_a_failure_names_asset_error_and_log(tmp_path, monkeypatch,
                                                                                             shared_data):
    from tests.assets.test_cli import damaged_jsonl

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "one-damaged", "sources": [
        {"name": "good", "format": "jsonl", "inputs": [str(shared_data / "jsonl" / "olmo_c4-sample.02.json.gz")]},
        {"name": "shaky", "format": "jsonl", "inputs": [str(damaged_jsonl(tmp_path, shared_data))],
         "reader": {"max_bad_fraction": 0.2}}]}))
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))

    status, out = pretrain(["materialize", "--select", "curation/*/raw_crawl"], tty=False)
    assert status == 1, out[-3000:]
    assert "\r" not in out and "\x1b" not in out  # no redraw, no colour: a file holds lines
    lines = out.splitlines()
    assert re.fullmatch(r"pretrain: materializing 2 asset\(s\) of recipe 'one-damaged'; the full log: \S+\.log", lines[0])
    assert [m.group(3) for m in map(DONE.match, lines) if m] == ["curation/good/raw_crawl"]
    [failed] = [line for line in lines if " FAILED   " in line]
    assert re.match(r"pretrain: \[\d/2\] FAILED   curation/shaky/raw_crawl after [\d.]+ s \(run [0-9a-f]{8}\)", failed)
    # The failed asset with its run and its error, then the log file.
    [error] = [line for line in lines if line.startswith("pretrain: curation/shaky/raw_crawl failed (Dagster run ")]
    assert "bad_json" in error and "shaky" in error
    assert re.fullmatch(r"pretrain: FAILED in \d+:\d\d; the full log: \S+\.log", lines[-1])
    assert "DEBUG" not in out and "STEP_START" not in out

    path, runs = session_runs(DagsterInstance.get(), lines[-1])
    log = open(path).read()
    assert len(runs) == 2 and " - STEP_FAILURE - " in log and "bad_json" in log
    for run in runs:
        assert any(run.run_id in line and " - RUN_START - " in line for line in log.splitlines()), run.run_id


@pytest.mark.slow  # ~10 s: one raw crawl in a process of its own
def test_verbose_streams_everything_as_it_comes_and_writes_no_log_file(tmp_path, monkeypatch, pretrain_home):
    from tests.assets.test_cli import write_demo_copy

    recipe = tmp_path / "recipe.yaml"
    write_demo_copy(recipe)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))

    status, out = pretrain(["materialize", "--select", "curation/math/raw_crawl", "--verbose"], tty=False)
    assert status == 0, out[-3000:]
    # Dagster's event log, DEBUG events included, and the run's start line, on the stream as before.
    assert re.search(r" - DEBUG - .* - STEP_START - ", out) and " - ASSET_MATERIALIZATION - " in out
    assert "pretrain: [1/1] started  curation/math/raw_crawl" in out
    assert re.search(r"pretrain: \[1/1\] done     curation/math/raw_crawl in", out)
    assert "the full log" not in out and not (pretrain_home / "logs").exists()


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Training:
    """A watch whose one run trains: the records a RunWatch reads from a trainer's metrics.jsonl (test_watch.py)."""

    def __init__(self, record, train_tokens):
        self.record, self.train_tokens = record, train_tokens

    def training(self):
        return [("training/main", self.record, self.train_tokens)]

    def poll(self):
        return []

    def remove(self, run_id):
        return []


def test_the_live_line_counts_assets_estimates_the_rest_and_shows_the_training_step():
    now, terminal = Clock(), io.StringIO()
    progress = Progress(terminal, session="abc", log="/home/logs/abc.log", now=now)
    try:
        progress.counts(0, 4)
        progress.run_started("r1", "curation/web/raw_crawl", "pretrain: [1/4] started  curation/web/raw_crawl")
        assert progress.line() == "0/4 assets | 0:00 | ETA - | running curation/web/raw_crawl"
        now.now += 30
        progress.run_ended("r1", "pretrain: [1/4] done     curation/web/raw_crawl in 30.0 s")
        progress.counts(1, 4)
        # Three assets left at 30 s each so far.
        assert progress.line() == "1/4 assets | 0:30 | ETA 1:30"
        progress.run_started("r2", "training/main", "started")
        progress._watch = Training({"step": 40, "tokens": 20480, "loss": 6.8123, "tokens_per_s": 2950.4}, 65536)
        # The stage's own rest (45,056 tokens at 2,950 tok/s: 15 s) is less than the assets' rate says: 1:30 stays.
        assert progress.line() == "1/4 assets | 0:30 | ETA 1:30 | training/main step 40 (31%) loss 6.812 2,950 tok/s"
        progress._watch = Training({"step": 1, "tokens": 512, "loss": "nan", "tokens_per_s": 1.0}, 65536)
        assert progress.line().endswith("ETA 18:03:44 | training/main step 1 (1%) loss nan 1 tok/s")
        progress._watch = None
        progress.finish(False)
    finally:
        progress.close()
    # Not a terminal: the lines only, as they were said, and no live line.
    assert terminal.getvalue().splitlines() == ["pretrain: [1/4] done     curation/web/raw_crawl in 30.0 s",
                                                "pretrain: FAILED in 0:30; the full log: /home/logs/abc.log"]


def test_clock_reads_minutes_then_hours():
    assert [clock(s) for s in (0, 42.9, 725, 3723, -5)] == ["0:00", "0:42", "12:05", "1:02:03", "0:00"]
