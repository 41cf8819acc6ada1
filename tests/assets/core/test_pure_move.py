"""A pure move of a module on the real repository keeps every asset fresh: a copy of the repository in which one
engine module is moved to another file (and the import lines that name it rewritten, nothing else) builds the
demo's asset definitions with the same code version for every asset as the unmoved copy, so Dagster sees no
code-version change and no materialization turns stale for the move (assets/core/source_hash.py)."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("assets", "pipelines", "resources", "storage", "trainer", "recipes")
FILES = ("pyproject.toml", "workspace.yaml")

# Run in the copy (cwd and PYTHONPATH): {asset key: code version}, and the assets whose hashed code takes in the
# module named by argv[1] (its label in code_parts), and where the code was imported from.
BUILD = """
import importlib.util, json, sys
import assets
from assets.core.factory import CODE_METADATA
from assets.core.source_hash import code_parts
from assets.definitions import defs  # the demo recipe's (PRETRAIN_RECIPE is unset)

module = sys.argv[1]
graph = defs.resolve_asset_graph()
versions, users = {}, []
for key in graph.get_all_asset_keys():
    node = graph.get(key)
    versions[key.to_user_string()] = node.code_version
    refs = node.metadata[CODE_METADATA].value if CODE_METADATA in node.metadata else []
    if refs and module in code_parts(refs):
        users.append(key.to_user_string())
print(json.dumps({"versions": versions, "users": sorted(users), "assets": assets.__file__,
                  "found": importlib.util.find_spec(module) is not None}))
"""


def module_name(path, root) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def imported_module(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module a `from ... import` statement of module `importer` imports from."""
    if not node.level:
        return node.module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def sources(root):
    """{path: text} of every .py file of the copy."""
    return {path: path.read_text(encoding="utf-8") for package in PACKAGES for path in (root / package).rglob("*.py")}


def import_spans(tree) -> list[tuple[int, int]]:
    return [(n.lineno, n.end_lineno) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def without_imports(text: str) -> str:
    """`text` with the lines of its import statements emptied."""
    lines = text.split("\n")
    for first, last in import_spans(ast.parse(text)):
        lines[first - 1: last] = [""] * (last - first + 1)
    return "\n".join(lines)


def movable(module: str, root, texts) -> bool:
    """`module` is imported by other modules, only as `from <module> import names` (absolute or relative), and its
    dotted name is in no other text of the repository (a code reference, a `python -m`): moving it then changes
    import lines alone."""
    stem, package = module.rsplit(".", 1)[1], module.rsplit(".", 1)[0]
    named = re.compile(rf"(?<![\w.]){re.escape(module)}(?![\w])")
    importers = 0
    for path, text in texts.items():
        tree = ast.parse(text)
        this, is_package = module_name(path, root), path.name == "__init__.py"
        if named.search(without_imports(text)):
            return False  # named outside an import statement
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name == module or a.name.startswith(module + ".")
                                                    for a in node.names):
                return False  # `import a.b.c`: its uses name the path too
            if isinstance(node, ast.ImportFrom):
                base = imported_module(node, this, is_package)
                if base == package and any(a.name == stem for a in node.names):
                    return False  # `from package import module`: the bound name is the module's
                importers += base == module
    others = [*(root / "recipes").rglob("*"), *(root / name for name in FILES)]
    return importers > 0 and not any(p.is_file() and named.search(p.read_text(errors="replace")) for p in others)


def pick_module(root, package: str = "pipelines") -> str:
    """A module of `package` that can be moved by its import lines alone, found by scanning so that the test follows
    wherever modules live now: for pipelines the WARC reader (the module defining WarcEntry or read_warc) when it
    can, else the first other; for trainer (hashed whole as a package by every training stage) the first."""
    texts = sources(root)

    def not_the_warc_reader(path) -> bool:
        tops = {n.name for n in ast.parse(texts[path]).body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        return not {"WarcEntry", "read_warc"} & tops

    candidates = [path for path in sorted(texts)
                  if path.name != "__init__.py" and path.relative_to(root).parts[0] == package]
    for path in sorted(candidates, key=not_the_warc_reader):  # the WARC reader first (a stable sort)
        if movable(module_name(path, root), root, texts):
            return module_name(path, root)
    raise AssertionError(f"no {package} module is imported by import lines alone")


def move(root, module: str) -> str:
    """`module` moved to <name>_moved.py in its folder, and every import statement naming it rewritten (its line
    spans from ast: nothing else changes). Returns the new dotted name."""
    old = root.joinpath(*module.split(".")).with_suffix(".py")
    new = old.with_name(old.stem + "_moved.py")
    old.rename(new)
    moved = module + "_moved"
    for path, text in sources(root).items():
        this, is_package = module_name(path, root), path.name == "__init__.py"
        lines = text.split("\n")
        nodes = [n for n in ast.walk(ast.parse(text))
                 if isinstance(n, ast.ImportFrom) and n.module and imported_module(n, this, is_package) == module]
        for node in sorted(nodes, key=lambda n: n.lineno, reverse=True):
            statement = "\n".join(lines[node.lineno - 1: node.end_lineno])
            # `from <dots><node.module> import`: the module's last part gets the new file's name.
            rewritten, count = re.subn(rf"(from\s+\.*){re.escape(node.module)}(\s)",
                                       lambda m: m.group(1) + node.module + "_moved" + m.group(2), statement, count=1)
            assert count == 1, statement
            lines[node.lineno - 1: node.end_lineno] = rewritten.split("\n")
        if nodes:
            path.write_text("\n".join(lines), encoding="utf-8")
    return moved


def copy_repo(target):
    """The repository's source under `target`, with the demo's data beside it where the recipe looks (base_dir
    ../../shared/data: a link to the real one)."""
    target.parent.mkdir(parents=True)
    (target.parent / "shared").symlink_to(REPO.parent / "shared", target_is_directory=True)
    for package in PACKAGES:
        shutil.copytree(REPO / package, target / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in FILES:
        shutil.copy2(REPO / name, target / name)
    return target


def start_build(root, module: str, home) -> subprocess.Popen:
    env = {name: value for name, value in os.environ.items() if name not in ("PRETRAIN_RECIPE", "PRETRAIN_STORE")}
    env.update(PYTHONPATH=str(root), PRETRAIN_HOME=str(home), DAGSTER_HOME=str(home / "dagster"),
               HF_HUB_OFFLINE="1")
    return subprocess.Popen([sys.executable, "-c", BUILD, module], cwd=root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def result(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("package", ["pipelines", "trainer"])  # a data stage's module; the trainer's, named whole
def test_moving_an_engine_module_keeps_every_code_version(tmp_path, package):
    # Two copies of the same snapshot, so that an edit under way in the repository cannot part them.
    before = copy_repo(tmp_path / "before" / "repo")
    after = tmp_path / "after" / "repo"
    shutil.copytree(before, after)
    (after.parent / "shared").symlink_to(REPO.parent / "shared", target_is_directory=True)
    module = pick_module(after, package)
    moved = move(after, module)
    # A pure move: the module's text as it was under its new name, and in the other files import lines alone
    # rewritten (at least one).
    old_path = module.replace(".", "/") + ".py"
    new_path = moved.replace(".", "/") + ".py"
    assert (after / new_path).read_text() == (before / old_path).read_text() and not (after / old_path).exists()
    rewritten = []
    for path, text in sources(after).items():
        original = (before / (old_path if path == after / new_path else path.relative_to(after))).read_text()
        if text != original:
            assert without_imports(text) == without_imports(original), path
            rewritten.append(path)
    assert rewritten, "the move rewrote no import line"
    # Both builds at once (each is mostly imports).
    runs = [start_build(before, module, tmp_path / "home-before"), start_build(after, moved, tmp_path / "home-after")]
    unmoved, moved_run = (result(run) for run in runs)
    assert unmoved["assets"].startswith(str(before)) and moved_run["assets"].startswith(str(after))
    assert unmoved["found"] and moved_run["found"], "the moved module does not import under its new name"
    assert unmoved["versions"] and any(unmoved["versions"].values())
    # Every asset keeps its code version: nothing is stale for the move.
    assert moved_run["versions"] == unmoved["versions"]
    # And the move was one that matters: some asset's code version hashes the moved module's text.
    assert moved_run["users"], f"no asset's code takes in {moved}"
    assert moved_run["users"] == unmoved["users"]


def pick_definition(root) -> tuple[str, str]:
    """(module, name): a top-level function or class of a pipelines module that other modules import by name, that
    its own module does not use, that uses no other top-level name of its module, in a module no code reference
    names by definition (`mod:Name`, `mod:*`): it can move to a module of its own by import lines alone."""
    texts = sources(root)
    imported: dict[tuple[str, str], int] = {}
    for path, text in texts.items():
        this, is_package = module_name(path, root), path.name == "__init__.py"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or node.level):
                for alias in node.names:
                    key = (imported_module(node, this, is_package), alias.name)
                    imported[key] = imported.get(key, 0) + 1
    everything = "\n".join(texts.values())
    for path in sorted(texts):
        module = module_name(path, root)
        if path.name == "__init__.py" or not module.startswith("pipelines.") or f"{module}:" in everything:
            continue
        tree = ast.parse(texts[path])
        tops = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        tops |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or not imported.get((module, node.name)):
                continue
            others = [n for n in tree.body if n is not node]
            used_here = any(isinstance(x, ast.Name) and x.id == node.name for n in others for x in ast.walk(n))
            uses = {x.id for x in ast.walk(node) if isinstance(x, ast.Name)}
            if not used_here and not uses & (tops - {node.name}):
                return module, node.name
    raise AssertionError("no pipelines definition can move by its import lines alone")


def move_definition(root, module: str, name: str) -> str:
    """Definition `name` of `module` moved to <module>_part.py beside it, with a copy of the module's top-level
    imports, and every import statement that names it split in two: the moved name from the new module, the rest
    from the old. Returns the new module's dotted name."""
    old = root.joinpath(*module.split(".")).with_suffix(".py")
    text = old.read_text(encoding="utf-8")
    tree, lines = ast.parse(text), text.split("\n")
    node = next(n for n in tree.body if getattr(n, "name", None) == name)
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    definition = "\n".join(lines[first - 1: node.end_lineno])
    imports = [ast.get_source_segment(text, n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    imports.sort(key=lambda line: not line.startswith("from __future__"))
    old.with_name(old.stem + "_part.py").write_text(
        '"""Split from its module."""\n\n' + "\n".join(imports) + "\n\n\n" + definition + "\n", encoding="utf-8")
    old.write_text("\n".join(lines[: first - 1] + lines[node.end_lineno:]), encoding="utf-8")
    part = module + "_part"
    for path, source in sources(root).items():
        this, is_package = module_name(path, root), path.name == "__init__.py"
        lines = source.split("\n")
        nodes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom) and
                 imported_module(n, this, is_package) == module and any(a.name == name for a in n.names)]
        for node in sorted(nodes, key=lambda n: n.lineno, reverse=True):
            indent = lines[node.lineno - 1][: node.col_offset]
            rest = [f"{a.name} as {a.asname}" if a.asname else a.name for a in node.names if a.name != name]
            alias = next(a for a in node.names if a.name == name)
            split = [f"{indent}from {part} import {name}" + (f" as {alias.asname}" if alias.asname else "")]
            if rest:
                split.append(f"{indent}from {module} import {', '.join(rest)}")
            lines[node.lineno - 1: node.end_lineno] = split
        if nodes:
            path.write_text("\n".join(lines), encoding="utf-8")
    return part


@pytest.mark.slow
def test_moving_a_definition_to_a_module_of_its_own_keeps_every_code_version(tmp_path):
    """A module split in parts, as trainer/config.py was: the definition's text goes to a new module with the
    imports it had, its importers' import lines are split in two; no asset's code version moves."""
    before = copy_repo(tmp_path / "before" / "repo")
    after = tmp_path / "after" / "repo"
    shutil.copytree(before, after)
    (after.parent / "shared").symlink_to(REPO.parent / "shared", target_is_directory=True)
    module, name = pick_definition(after)
    part = move_definition(after, module, name)
    old_path = module.replace(".", "/") + ".py"
    assert name not in {getattr(n, "name", None) for n in ast.parse((after / old_path).read_text()).body}
    changed = {Path(old_path), Path(part.replace(".", "/") + ".py")}
    for path, text in sources(after).items():
        if path.relative_to(after) not in changed:  # elsewhere, import lines alone
            assert without_imports(text) == without_imports((before / path.relative_to(after)).read_text()), path
    runs = [start_build(before, module, tmp_path / "home-before"), start_build(after, part, tmp_path / "home-after")]
    unsplit, split = (result(run) for run in runs)
    assert split["found"] and split["assets"].startswith(str(after))
    assert split["versions"] == unsplit["versions"]
    # The move was one that matters: some asset's code takes in the new module, and the old one still.
    assert split["users"], f"no asset's code takes in {part} ({module}:{name} moved)"
