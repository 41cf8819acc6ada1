"""The package declares what its code imports: pyproject's dependencies and extras, read back from the installed
package's metadata, against the third-party modules the source imports (scanned, not listed by hand)."""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.source_imports import absolute_imports

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "assets", "trainer", "resources", "storage")
OWN = set(PACKAGES) | {"tests", "bench", "conftest"}
TEST_STACK = {"pytest", "pytest-timeout", "moto", "playwright", "datasketch", "jsonschema"}
# The documentation site (`make docs`; the suite builds it through `python -m mkdocs`): never a dependency of the tool.
DOCS_STACK = {"mkdocs", "mkdocs-material"}
# lm-evaluation-harness's Hugging Face model needs transformers at run time: the [eval] extra declares it (the export
# test uses it too, so [test] may as well); never a core dependency.
EVAL_STACK = {"lm-eval", "transformers"}


def imported_modules(folders) -> dict[str, set[str]]:
    """{top-level module: files importing it} for every absolute import in the folders' .py files."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in (REPO / folder).rglob("*.py"):
            for name in absolute_imports(path):
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OWN:
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def declared() -> dict[str, set[str]]:
    """{distribution: the extras that declare it ("" for the core dependencies)} of the installed package."""
    out: dict[str, set[str]] = {}
    for line in metadata.requires("pretrain-factory") or []:
        req = Requirement(line)
        extras = [e for e in ("test", "eval", "ray", "postgres", "docs") if req.marker and req.marker.evaluate({"extra": e})]
        for extra in extras or ([""] if not req.marker else []):
            out.setdefault(canonicalize_name(req.name), set()).add(extra)
    return out


def distributions(module: str) -> set[str]:
    return {canonicalize_name(d) for d in metadata.packages_distributions().get(module, [])}


def test_every_module_the_code_imports_is_declared_and_the_test_and_eval_stacks_only_as_extras():
    deps = declared()
    assert deps, "the installed package declares no dependencies (pip install -e . again?)"
    for module, files in imported_modules(PACKAGES).items():
        dists = distributions(module)
        assert dists, f"{module} (imported by {sorted(files)[0]}) is not installed"
        assert dists & set(deps), f"{module} ({sorted(dists)}, imported by {sorted(files)[0]}) is not declared"
    for module, files in imported_modules(["tests", "bench"]).items():
        dists = distributions(module)
        assert dists & set(deps), f"{module} ({sorted(dists)}, imported by {sorted(files)[0]}) is not declared"
    for name in TEST_STACK:
        assert deps.get(canonicalize_name(name)) == {"test"}, f"{name}: only in the [test] extra, got {deps.get(name)}"
    for name in EVAL_STACK:
        extras = deps.get(canonicalize_name(name), set())
        assert "eval" in extras and "" not in extras, f"{name}: in the [eval] extra, not a core dependency, got {extras}"
    for name in DOCS_STACK:
        assert deps.get(canonicalize_name(name)) == {"docs"}, f"{name}: only in the [docs] extra, got {deps.get(name)}"


def test_every_declared_distribution_is_installed_at_a_version_constraints_txt_pins():
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = req.specifier
    for name in declared():
        version = metadata.version(name)
        assert name in pins, f"{name} is declared but constraints.txt does not pin it"
        assert pins[name].contains(version, prereleases=True), f"{name} {version} is not what constraints.txt pins"
