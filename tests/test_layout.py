"""The four packages resolve inside this repository, and the engines never import Dagster."""

import importlib
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("package", ["pipelines", "trainer", "assets", "resources"])
def test_package_resolves_in_this_repository(package):
    # Generic names could be shadowed by another installed distribution.
    module = importlib.import_module(package)
    assert module.__file__ is not None
    assert REPO in __import__("pathlib").Path(module.__file__).resolve().parents


def test_engines_and_store_import_no_dagster():
    code = (
        "import sys, pipelines.ingest, resources.store, trainer, resources\n"
        "bad = sorted(m for m in sys.modules if m == 'dagster' or m.startswith('dagster.'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
