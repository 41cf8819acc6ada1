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
