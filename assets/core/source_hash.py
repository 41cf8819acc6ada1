"""The code part of a code version: a sha256 of the source text of the code an asset's output depends on.

    refs = ("assets.curation.raw_crawl",)               # a module: its text, and the engine modules it imports
    refs = ("pipelines.filters.pii:PiiScrubber,scrub_pii",)    # top-level definitions of a module, nothing else
    refs = ("pipelines.filters.pii:*",)                 # every top-level definition of the module, nothing else
    refs = ("trainer",)                                  # a package: every module in it
    code_digest(refs)                                    # sha256 hex of those texts, as a multiset
    code_parts(refs)                                     # {module or "module:Name": the text hashed}, to look at

A module reference brings in, transitively, the engine modules (ENGINE_PACKAGES) it imports anywhere in its
text (a lazy import in a function counts), found by reading the source with `ast`, not by importing it; other
asset modules it imports (keys, plots, the recipe) are not followed: an asset that builds with another asset
module's code names it. A module also named with definitions (`mod:Name`) is left out of that closure: only
the named definitions count, which is how a filtered asset depends on the filter steps its recipe uses and not
on the others. `mod:*` names every top-level definition of the module (each function, class and assignment: the
segments `mod:Name` hashes, for all its names): the module's code without its docstring and import lines, its
imports not followed. A filtered asset names each filter step's module so (pipelines/filters/config.py STEP_CODE):
a definition added there is in the step's version with no list of names to keep. An engine run in a subprocess
(`python -m trainer`) is named as a package.

What is hashed is the content, never where it lives, so that a pure move (a module's file renamed, or definitions
moved from one module to another, or a module split in parts, with only import lines rewritten) leaves every code
version as it was, and no materialization turns stale for it:
  - the digest is the sha256 of the sorted sha256s of the code's top-level statements, a multiset: a whole module
    counts each of its top-level statements (a function or class with its decorators, an assignment, an `if`
    block), never its name, its module docstring, the comments between statements, or the order of its
    statements; a definition (`mod:Name`) is its source segment. Two copies of a statement count twice; a module
    of nothing but imports and a docstring counts nothing, so a new package's __init__.py adds nothing;
  - top-level imports are what they bind, as a set over the whole closure: `from pydantic import BaseModel, Field`
    is `from pydantic import BaseModel` and `from pydantic import Field`, whichever modules import them and however
    often (a module split in two imports pydantic twice). Imports of anything else (torch, json) are hashed as
    written, alias for alias;
  - an import of the project's own packages (PROJECT_PACKAGES), at the top or inside a function, absolute or
    relative, binds a name to the project's definition of that name, whose text the closure hashes: it counts only
    for an alias (`from trainer.checkpoint.store import local_step as step` and `from .store import local_step as
    step` both hash as `from <project> import local_step as step`; `import trainer.model as tm` as `import
    <project> as tm`); a plain `from trainer.config import RunConfig` counts nothing, wherever RunConfig moves.
    What this cannot see: two definitions of one name in one closure, and an import switched from one to the other.
Which engine modules a module pulls in is still found from the real import names. A change of what is imported
from outside the project or under which alias, or of any line of a statement, changes the digest.

Source text, never bytecode: the same files give the same digest on every machine and Python version. Line
endings are normalized; the path a module was read from is no part of it.

What parsing finds (a module's normalized text and imports, a module's definitions) is kept on disk under
$PRETRAIN_CODE_CACHE (default $XDG_CACHE_HOME/pretrain/source-hash, else ~/.cache/pretrain/source-hash), a file
per content: the sha256 of this module's own text, the module's name and the file's text. An edited file, or an
edit of this module, is parsed again; nothing is ever stale. It saves every process that builds the definitions
(`pretrain status`, the UI's load of the code location) parsing about 80 modules: 0.4 s of 3.1 at 100 sources.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: assets/, pipelines/, trainer/, ...
ENGINE_PACKAGES = ("pipelines", "trainer")  # what computes outputs; storage/ and resources/ only move them
# The project's own packages: their import statements are hashed without the module path (see above).
PROJECT_PACKAGES = ("assets", "pipelines", "resources", "storage", "trainer")
PROJECT = "<project>"  # what a normalized import names instead of the module
CACHE_ENV = "PRETRAIN_CODE_CACHE"


class CodeRefError(ValueError):
    """A code reference that names no module, or a definition the module does not have."""


def code_digest(refs, root: Path = ROOT) -> str:
    """sha256 hex of the code `refs` name (see the module docstring), read under `root`."""
    return _digest(tuple(refs), Path(root))


@lru_cache(maxsize=None)
def _digest(refs: tuple[str, ...], root: Path) -> str:
    # The labels (module names) are left out: the statements' texts as a sorted multiset of their sha256s, then
    # the top-level imports' bindings as a set.
    parts = _parts(refs, root).values()
    hashes = sorted(hashlib.sha256(text.encode()).hexdigest()
                    for part in parts for text in part["statements"] if text.strip())
    bindings = sorted({binding for part in parts for binding in part["bindings"]})
    return hashlib.sha256("\n".join(hashes + [""] + bindings).encode()).hexdigest()


def code_parts(refs, root: Path = ROOT) -> dict[str, str]:
    """{label: normalized source text} for `refs`: "pipelines.ingest.step" for a whole module,
    "pipelines.filters.pii:Name" for one definition (every one for "pipelines.filters.pii:*"). `code_digest`
    hashes their statements and imports (not the labels); a test can list them."""
    return {label: part["text"] for label, part in _parts(refs, root).items()}


def _parts(refs, root: Path) -> dict[str, dict]:
    """{label: {"text", "statements", "bindings"}} for `refs` (see code_parts)."""
    named: dict[str, set[str]] = {}
    modules: list[str] = []
    for ref in refs:
        module, _, names = ref.partition(":")
        if names:
            named.setdefault(module, set()).update(n.strip() for n in names.split(",") if n.strip())
        else:
            modules.extend(_package_modules(module, root) or [module])
    parts: dict[str, dict] = {}
    pending = list(modules)
    while pending:
        module = pending.pop()
        if module in parts or module in named:
            continue
        parts[module], followed = _module_part(module, root)
        pending.extend(followed)
    for module, names in named.items():
        segments = _module_definitions(module, root)
        if "*" in names:  # every top-level definition
            names = (names - {"*"}) | set(segments)
        for name in sorted(names):
            if name not in segments:
                raise CodeRefError(f"code reference {module}:{name}: {module} has no top-level {name!r}")
            parts[f"{module}:{name}"] = {"text": segments[name], "statements": [segments[name]], "bindings": []}
    return parts


def _module_part(module: str, root: Path) -> tuple[dict, tuple[str, ...]]:
    """A whole module's part ({"text", "statements", "bindings"}) and the engine modules it imports (from the real
    import names)."""
    path = _path(module, root)
    if path is None:
        raise CodeRefError(f"code reference {module}: no module {module} under {root}")
    stat = path.stat()
    return _parsed_module(module, root, path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=None)
def _parsed_module(module: str, root: Path, path: Path, mtime_ns: int, size: int) -> tuple[dict, tuple[str, ...]]:
    # Once per file and content in a process: the definitions' 40 assets name overlapping closures (the whole
    # trainer package for each training stage), and parsing each module for every one took 3.2 s of every load of
    # the code location. Keyed by the file's mtime and size, so an edited file is read again.
    text = _text(path)
    parsed = _cached("module", module, text)
    if parsed is None:
        tree = ast.parse(text)  # a module that does not parse raises, naming its line
        statements, bindings = _top_level(text, tree)
        parsed = {"text": _normalized(text, tree), "statements": statements, "bindings": bindings,
                  "imports": _imported_names(module, tree)}
        _keep("module", module, text, parsed)
    # Which imported names are modules under root is asked each time: a module added beside it changes it.
    followed = tuple(name for name in parsed["imports"] if _path(name, root) is not None)
    part = {key: parsed[key] for key in ("text", "statements", "bindings")}
    return part, followed


def _top_level(text: str, tree: ast.Module) -> tuple[list[str], list[str]]:
    """(statements, bindings) of a module: the normalized text of each top-level statement but the docstring and
    the imports (a definition from its first decorator to its last line), and what the top-level imports bind."""
    lines = text.split("\n")
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the module docstring: a split module's parts each have their own
    statements, bindings = [], []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bindings.extend(_bindings(node))
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        statements.append(normalize_imports("\n".join(lines[first - 1: node.end_lineno])))
    return statements, bindings


def _bindings(node: ast.Import | ast.ImportFrom) -> list[str]:
    """A top-level import statement as one canonical import per name it binds; a project import only where it
    binds an alias (the module docstring)."""
    if isinstance(node, ast.ImportFrom):
        project = bool(node.level) or (node.module or "").split(".")[0] in PROJECT_PACKAGES
        source = PROJECT if project else node.module
        return [f"from {source} import {_bound(alias, alias.name)}" for alias in node.names
                if alias.asname or not project]
    return [f"import {_bound(alias, PROJECT if _is_project(alias.name) else alias.name)}" for alias in node.names
            if alias.asname or not _is_project(alias.name)]


def _is_project(name: str) -> bool:
    return name.split(".")[0] in PROJECT_PACKAGES


def _bound(alias: ast.alias, name: str) -> str:
    return f"{name} as {alias.asname}" if alias.asname else name


def normalize_imports(text: str) -> str:
    """`text` with every import statement of the project's packages in its canonical form (the module docstring):
    what it binds under an alias, not where from, the line's text before and after the statement (indentation, a
    comment) kept; a statement that binds no alias, alone on its lines, is taken out with them.
    Text that does not parse is returned as it is."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    return _normalized(text, tree)


def _normalized(text: str, tree: ast.AST) -> str:
    statements = [node for node in ast.walk(tree)
                  if isinstance(node, (ast.Import, ast.ImportFrom)) and _canonical(node) is not None]
    lines = text.split("\n")  # as ast numbers them (str.splitlines would also break at \f, \x1c, ...)
    # From the last statement back: a rewrite changes only its own span and what follows it.
    for node in sorted(statements, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        first, last = lines[node.lineno - 1].encode(), lines[node.end_lineno - 1].encode()
        # ast's column offsets count UTF-8 bytes.
        before, after = first[: node.col_offset].decode(), last[node.end_col_offset:].decode()
        canonical = _canonical(node)
        if not canonical and not before.strip() and (not after.strip() or after.strip().startswith("#")):
            # An import that binds nothing to hash, alone on its lines: the lines go, comment and all, so that one
            # import split in two (a module split in parts) reads the same.
            lines[node.lineno - 1: node.end_lineno] = []
        else:
            lines[node.lineno - 1: node.end_lineno] = [before + canonical + after]
    return "\n".join(lines)


def _canonical(node: ast.Import | ast.ImportFrom) -> str | None:
    """The canonical text of an import statement of the project's packages (what it binds under an alias; empty
    when it binds none); None for any other import."""
    if isinstance(node, ast.ImportFrom):
        if not node.level and not _is_project(node.module or ""):
            return None
        aliased = [_bound(alias, alias.name) for alias in node.names if alias.asname]
        return f"from {PROJECT} import " + ", ".join(aliased) if aliased else ""
    if not any(_is_project(alias.name) for alias in node.names):
        return None
    names = [_bound(alias, PROJECT if _is_project(alias.name) else alias.name) for alias in node.names
             if alias.asname or not _is_project(alias.name)]  # `import json` beside a project import: as written
    return "import " + ", ".join(names) if names else ""


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


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8").replace("\r\n", "\n")


def _imported_names(module: str, tree: ast.AST) -> list[str]:
    """The names of engine modules `module` may import (ENGINE_PACKAGES), from its parsed text: the caller keeps
    those that are modules under its root."""
    found = []
    for node in ast.walk(tree):
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
        found.extend(name for name in names if name.split(".")[0] in ENGINE_PACKAGES)
    return found


def _module_definitions(module: str, root: Path) -> dict[str, str]:
    path = _path(module, root)
    if path is None:
        raise CodeRefError(f"code reference {module}: no module {module} under {root}")
    stat = path.stat()
    return _parsed_definitions(module, path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=None)
def _parsed_definitions(module: str, path: Path, mtime_ns: int, size: int) -> dict[str, str]:
    # Once per file and content, as _parsed_module: each source's filtered asset names the filter steps its recipe
    # uses, and parsing the filter modules again for every other set of names took 1.5 s of every load.
    # Kept normalized: every asset that names a definition hashes that text.
    text = _text(path)
    segments = _cached("definitions", module, text)
    if segments is None:
        segments = {name: normalize_imports(segment) for name, segment in _definitions(module, text).items()}
        _keep("definitions", module, text, segments)
    return segments


def _cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(os.environ.get(CACHE_ENV) or Path(base) / "pretrain" / "source-hash")


@lru_cache(maxsize=None)
def _own_sha256() -> str:
    # In every key: an edit of how texts are normalized or imports followed makes every kept parse unused.
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _cache_file(kind: str, module: str, text: str) -> Path:
    key = hashlib.sha256("\0".join((_own_sha256(), kind, module, text)).encode()).hexdigest()
    return _cache_folder() / f"{key}.json"


def _cached(kind: str, module: str, text: str):
    """What parsing `module`'s `text` found, kept by an earlier process; None when it was not kept (or cannot be
    read: it is then parsed again)."""
    try:
        return json.loads(_cache_file(kind, module, text).read_text(encoding="utf-8"))
    except (OSError, ValueError, RuntimeError):  # RuntimeError: no home folder to put the cache in
        return None


def _keep(kind: str, module: str, text: str, parsed) -> None:
    """Keep `parsed` for the next process, written whole (a temporary file renamed) so that a concurrent reader
    sees all or nothing. A folder that cannot be written (a read-only home) only costs the next process a parse."""
    try:
        target = _cache_file(kind, module, text)
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    except (OSError, RuntimeError):
        return
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(parsed, out)
        os.replace(temporary, target)
    except OSError:
        Path(temporary).unlink(missing_ok=True)


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
