"""output_to (assets/runs/output.py): what a process and the processes it starts write goes to the log file, the
terminal's stream still reaches the terminal, and everything is as it was after the block. The whole command on a
terminal and on a pipe: tests/assets/runs/test_progress.py."""

import subprocess
import sys

from assets.runs.output import log_path, output_to
from tests.conftest import REPO

SCRIPT = """
import os, subprocess, sys, warnings
from pathlib import Path
from assets.runs.output import output_to

with output_to(Path(sys.argv[1])) as terminal:
    print("a print to stdout")
    print("a print to stderr", file=sys.stderr)
    warnings.warn("a library's warning")
    subprocess.run([sys.executable, "-c", "import os; print('a child on stdout', flush=True); os.write(2, b'a child on stderr')"])
    terminal.write("pretrain: a line for the user\\n")
print("after the block, on stdout again")
"""


def test_this_process_and_those_it_starts_write_to_the_log_and_the_terminal_keeps_its_lines(tmp_path):
    log = tmp_path / "logs" / "1a2b3c.log"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(log)], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    # stderr was the terminal: it got the user's line alone; stdout is back once the block ended.
    assert done.stderr == "pretrain: a line for the user\n"
    assert done.stdout == "after the block, on stdout again\n"
    text = log.read_text()
    for line in ("a print to stdout", "a print to stderr", "a library's warning", "a child on stdout",
                 "a child on stderr"):
        assert line in text, line
    assert "for the user" not in text and "after the block" not in text


def test_in_a_process_whose_stderr_is_captured_the_terminal_is_that_capture(tmp_path, capsys):
    """As under pytest (or any caller that replaced sys.stderr): the terminal's lines go to sys.stderr as it was."""
    log = tmp_path / "x.log"
    with output_to(log) as terminal:
        print("to the log")
        terminal.write("to the terminal\n")
    print("to stdout again")
    captured = capsys.readouterr()
    assert captured.err == "to the terminal\n" and captured.out == "to stdout again\n"
    assert log.read_text() == "to the log\n"


def test_the_log_is_named_after_the_command_under_pretrain_home(pretrain_home):
    assert log_path("1a2b3c4d5e6f") == pretrain_home / "logs" / "1a2b3c4d5e6f.log"
