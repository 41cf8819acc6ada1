"""The layout's contracts: packages resolve here, engines never import Dagster, neither packages nor modules form
an import cycle, no folder holds more than 15 modules, modules stay small or say why, and no file sends a reader
outside the repository for its docs."""

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.source_imports import absolute_imports, runtime_imports

PACKAGES = ["assets", "pipelines", "resources", "storage", "trainer"]
# The engines and the store they share run in processes that never load Dagster (trainer ranks, executor
# workers), so importing any of their modules must not pull it in.
DAGSTER_FREE = ["pipelines", "storage", "trainer"]
MAX_LINES = 450
# A folder is a part; past this many modules it holds several, and its name no longer says which.
MAX_MODULES_PER_FOLDER = 15


def _modules(package: str) -> list[str]:
    names = []
    for path in sorted((REPO / package).rglob("*.py")):
        if path.name == "__main__.py":  # importing it would run the program
            continue
        parts = path.relative_to(REPO).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _source_files() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))]


@pytest.mark.parametrize("package", PACKAGES)
def test_package_resolves_in_this_repository(package):
    # Generic names could be shadowed by another installed distribution.
    module = importlib.import_module(package)
    assert module.__file__ is not None
    assert REPO in Path(module.__file__).resolve().parents


@pytest.mark.parametrize("package", DAGSTER_FREE)
def test_every_engine_module_imports_without_dagster(package):
    modules = _modules(package)
    assert len(modules) > 1
    # A fresh interpreter: this test process has Dagster loaded already.
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'dagster' or m.startswith('dagster.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True, text=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def _package_imports() -> dict[str, set[str]]:
    """{package: packages of this project it imports}, from every import statement (inside functions too)."""
    edges: dict[str, set[str]] = {package: set() for package in PACKAGES}
    for path in _source_files():
        package = path.relative_to(REPO).parts[0]
        for target in absolute_imports(path):
            top = target.split(".")[0]
            if top in PACKAGES and top != package:
                edges[package].add(top)
    return edges


def test_packages_import_one_another_without_a_cycle():
    edges = _package_imports()
    # Depth-first search for a back edge; report the cycle it closes.
    state: dict[str, str] = {}

    def visit(package, path):
        state[package] = "open"
        for nxt in sorted(edges[package]):
            if state.get(nxt) == "open":
                pytest.fail("package import cycle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[package] = "done"

    for package in PACKAGES:
        if package not in state:
            visit(package, [package])
    # The engines and the store sit below the asset layer, never above it.
    for lower in ["pipelines", "storage", "trainer"]:
        assert "assets" not in edges[lower], lower
    assert edges["storage"] == set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports() -> dict[str, set[str]]:
    """{module: the project's modules it imports at run time}, from every import statement, inside functions too
    (an import in a function is a circle closed late, not no circle); imports under TYPE_CHECKING are left out."""
    paths = {_module_name(path): path for path in _source_files()}
    return {module: {name for name in runtime_imports(path, module) if name in paths and name != module}
            for module, path in paths.items()}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return found


def test_modules_import_one_another_without_a_circle():
    edges = _module_imports()
    assert "storage.factory" in edges["assets.cli.checkpoints"] or any("storage.factory" in e for e in edges.values())
    assert not _cycles(edges), "module import circles: " + "; ".join(" <-> ".join(c) for c in _cycles(edges))


def test_the_cycle_finder_finds_a_circle_closed_inside_a_function(tmp_path):
    # The finder itself, on a tree of its own: a -> b at the top, b -> a inside a function, c -> a under
    # TYPE_CHECKING only.
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from a import x\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nimport b\n")
    edges = {name: {m for m in runtime_imports(tmp_path / f"{name}.py", name) if m in ("a", "b", "c") and m != name}
             for name in ("a", "b", "c")}
    assert edges == {"a": {"b"}, "b": {"a"}, "c": {"b"}}
    assert _cycles(edges) == [["a", "b"]]


def test_no_folder_holds_more_than_15_modules():
    crowded = []
    for top in [*PACKAGES, "tests", "bench"]:
        for folder in sorted({p.parent for p in (REPO / top).rglob("*.py")}):
            count = len(list(folder.glob("*.py")))
            if count > MAX_MODULES_PER_FOLDER:
                crowded.append(f"{folder.relative_to(REPO)} ({count} modules)")
    assert not crowded, f"more than {MAX_MODULES_PER_FOLDER} modules in a folder: {crowded}"


def test_long_modules_say_why_in_their_docstring():
    long_without_reason = []
    tests_and_benches = sorted((REPO / "tests").rglob("test_*.py")) + sorted((REPO / "bench").glob("*.py"))
    for path in _source_files() + tests_and_benches:
        lines = path.read_text().count("\n")
        if lines > MAX_LINES:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            if "long because" not in doc.lower():
                long_without_reason.append(f"{path.relative_to(REPO)} ({lines} lines)")
    assert not long_without_reason, f"over {MAX_LINES} lines without 'Long because ...' in the docstring"


def test_no_file_points_outside_the_repository_for_docs():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    pointing = []
    for name in tracked:
        path = REPO / name
        if name == "tests/test_layout.py" or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if "shared/docs" in text:
            pointing.append(name)
    assert not pointing


def test_every_module_has_its_mirrored_test_file():
    # tests/ mirrors the packages: trainer/health/watchdog.py is unit-tested in tests/trainer/health/test_watchdog.py.
    missing = []
    for path in _source_files():
        if path.name in ("__init__.py", "__main__.py"):
            continue
        rel = path.relative_to(REPO)
        mirrored = REPO / "tests" / rel.parent / f"test_{rel.name}"
        if not mirrored.is_file():
            missing.append(str(mirrored.relative_to(REPO)))
    assert not missing
