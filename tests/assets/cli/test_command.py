"""The parser and the entry point (assets/cli/command.py): every command is reachable as `pretrain` installs it and
as `python -m assets.cli`, and the usage text names each one."""

import importlib.metadata
import json
import subprocess
import sys

from assets.cli import main
from assets.cli.command import build_parser
from tests.conftest import REPO


def commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "==SUPPRESS==" or getattr(a, "choices", None))
    return list(sub.choices)


def test_the_installed_entry_point_is_main():
    (entry,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "pretrain"]
    assert entry.load() is main


def test_the_usage_text_names_every_command():
    usage = build_parser().description
    names = commands()
    assert set(names) == {"materialize", "status", "where", "docs", "jobs", "lineage", "export", "eval", "plan", "schema"}
    for name in names:
        assert f"pretrain {name}" in usage, f"the usage text (assets/cli/command.py) does not show `pretrain {name}`"


def test_python_dash_m_runs_the_command_line():
    done = subprocess.run([sys.executable, "-m", "assets.cli", "schema"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["title"] == "pretrain-factory recipe"
    done = subprocess.run([sys.executable, "-m", "assets.cli", "nonsense"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and "invalid choice: 'nonsense'" in done.stderr
