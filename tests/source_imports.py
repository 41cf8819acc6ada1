"""The modules a source file imports, read with ast (never by importing it): what the layout and packaging tests
check the code against."""

from __future__ import annotations

import ast
from pathlib import Path


def absolute_imports(path: Path) -> list[str]:
    """Every module an absolute import statement of the file names (`import a.b`, `from a.b import c`: "a.b"),
    inside functions too."""
    names: list[str] = []
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _type_checking_only(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): imports there exist for annotations, never at run time."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(path: Path, module: str) -> list[str]:
    """Every module name the file's import statements name at run time (inside functions too, relative imports
    resolved from `module`, not those under `if TYPE_CHECKING:`). `from a.b import c` names both "a.b" and
    "a.b.c": the caller keeps the ones that are modules."""
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: -node.level]
                base = ".".join(anchor + ([base] if base else []))
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(Path(path).read_text(encoding="utf-8"), str(path)))
    return names
