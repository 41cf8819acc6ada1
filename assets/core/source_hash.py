"""The code part of a code version: a sha256 of the source text of the code an asset's output depends on.

    refs = ("assets.curation.raw_crawl",)               # a module: its text, and the engine modules it imports
    refs = ("pipelines.filters:PiiScrubber,scrub_pii",)  # top-level definitions of a module, nothing else
    refs = ("trainer",)                                  # a package: every module in it
    code_digest(refs)                                    # sha256 hex of those texts, in a fixed order

A module reference brings in, transitively, the engine modules (ENGINE_PACKAGES) it imports anywhere in its
text (a lazy import in a function counts), found by reading the source with `ast`, not by importing it; other
asset modules it imports (keys, plots, the recipe) are not followed: an asset that builds with another asset
module's code names it. A module also named with definitions (`mod:Name`) is left out of that closure: only
the named definitions count, which is how a filtered asset depends on the filter steps its recipe uses and not
on the others. An engine run in a subprocess (`python -m trainer`) is named as a package.

Source text, never bytecode: the same files give the same digest on every machine and Python version. Line
endings are normalized; the path a module was read from is no part of it.
"""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: assets/, pipelines/, trainer/, ...
ENGINE_PACKAGES = ("pipelines", "trainer")  # what computes outputs; storage/ and resources/ only move them


class CodeRefError(ValueError):
    """A code reference that names no module, or a definition the module does not have."""


def code_digest(refs, root: Path = ROOT) -> str:
    """sha256 hex of the code `refs` name (see the module docstring), read under `root`."""
    return _digest(tuple(refs), Path(root))


@lru_cache(maxsize=None)
def _digest(refs: tuple[str, ...], root: Path) -> str:
    parts = code_parts(refs, root)
    digest = hashlib.sha256()
    for label in sorted(parts):
        digest.update(f"{label}\0{parts[label]}\0".encode())
    return digest.hexdigest()


def code_parts(refs, root: Path = ROOT) -> dict[str, str]:
    """{label: source text} for `refs`: "pipelines.ingest" for a whole module, "pipelines.filters:Name" for one
    definition. What `code_digest` hashes; a test can list it."""
    named: dict[str, set[str]] = {}
    modules: list[str] = []
    for ref in refs:
        module, _, names = ref.partition(":")
        if names:
            named.setdefault(module, set()).update(n.strip() for n in names.split(",") if n.strip())
        else:
            modules.extend(_package_modules(module, root) or [module])
    parts: dict[str, str] = {}
    pending = list(modules)
    while pending:
        module = pending.pop()
        if module in parts or module in named:
            continue
        text = _read(module, root)
        parts[module] = text
        pending.extend(_followed_imports(module, text, root))
    for module, names in named.items():
        segments = _definitions(module, _read(module, root))
        for name in sorted(names):
            if name not in segments:
                raise CodeRefError(f"code reference {module}:{name}: {module} has no top-level {name!r}")
            parts[f"{module}:{name}"] = segments[name]
    return parts


def _path(module: str, root: Path) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_modules(module: str, root: Path) -> list[str]:
    """Every module of a package (sorted), or [] when `module` is not a package folder."""
    folder = root.joinpath(*module.split("."))
    if not (folder / "__init__.py").is_file():
        return []
    return sorted(".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
                  for p in folder.rglob("*.py"))


def _read(module: str, root: Path) -> str:
    path = _path(module, root)
    if path is None:
        raise CodeRefError(f"code reference {module}: no module {module} under {root}")
    return path.read_text(encoding="utf-8").replace("\r\n", "\n")


def _followed_imports(module: str, text: str, root: Path) -> list[str]:
    """The engine modules `module` imports (as module names that exist under root)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                anchor = module.split(".")[: -node.level]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports a module; `from mod import name` a definition of mod.
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in ENGINE_PACKAGES and _path(name, root) is not None:
                found.append(name)
    return found


def _definitions(module: str, text: str) -> dict[str, str]:
    """{name: source segment} of the module's top-level functions, classes and assignments."""
    segments = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        else:
            continue
        segment = ast.get_source_segment(text, node, padded=True) or ""
        # Decorators belong to the definition.
        decorators = getattr(node, "decorator_list", [])
        if decorators:
            segment = "\n".join(ast.get_source_segment(text, d) or "" for d in decorators) + "\n" + segment
        for name in names:
            segments[name] = segment
    return segments
