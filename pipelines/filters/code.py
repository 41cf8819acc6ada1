"""Code-data quality: the prose rules' counterpart for source files, every drop counted by its reason.

    step = CodeQualityFilter(CodeConfig(allowed_licenses=("MIT", "Apache-2.0", "none")))
    step.filter(Document(text=source, id="code/repo.tar.gz::pkg/mod.py"))   # True or (False, reason)

Reasons (stats `dropped_<reason>`, pipelines/filters/pipeline.py's filter_counts):
- `code_long_line`, `code_alnum_fraction`: data blobs and binary-ish text;
- `minified`: a `.min.` file name or a mean line length over max_mean_line_length;
- `generated`: a generator header in the first lines (markers in CodeConfig) or a generated name (`_pb2.py`);
- `syntax_error`: a Python file (by its name, or metadata `language: python`) that does not parse;
- `license`: its licence (SPDX header, licence text, else metadata `license`) is not in allowed_licenses;
- `stars`: metadata `stars` (or The Stack's `max_stars_count`) under min_stars;
- `no_tests_in_repo`: require_tests_in_repo and no test file shares its repository.

A Python file that 3.11's `ast` rejects only for newer syntax (PEP 695 type parameters `class C[T]`,
`def f[T]()`, `type X = ...`; 3.12's nested f-string quotes; 3.14's unparenthesized `except A, B:`) is not
broken: each failing line in one of those forms is rewritten to its older equivalent until the file parses, and
the file is kept (keep_newer_syntax) and counted under `flagged_python_newer_syntax` (or dropped as
`python_newer_syntax`). Kept files get metadata `code_license` (an SPDX id or None) and `code_copyright` (the
first copyright line, or None).
"""

from __future__ import annotations

import ast
import re
import warnings

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter

from pipelines.filters.config import CodeConfig

_MINIFIED_NAME = re.compile(r"\.min\.\w+$", re.IGNORECASE)
_GENERATED_NAME = re.compile(r"(_pb2(_grpc)?\.pyi?|\.pb\.(go|cc|h)|\.designer\.cs)$", re.IGNORECASE)
_PYTHON_NAME = re.compile(r"\.pyi?$", re.IGNORECASE)
_TEST_NAME = re.compile(r"(^|/)(tests?/|test_[^/]*\.py$|[^/]*_test\.py$|conftest\.py$)")

# Licence texts -> SPDX ids, tried in order (the first match wins; LGPL and AGPL before GPL).
_SPDX = re.compile(r"SPDX-License-Identifier:\s*([\w.+-]+(?:\s+(?:OR|AND|WITH)\s+[\w.+-]+)*)", re.IGNORECASE)
_LICENSE_TEXTS: tuple[tuple[str, re.Pattern], ...] = tuple((spdx, re.compile(pattern, re.IGNORECASE | re.DOTALL)) for spdx, pattern in (
    ("MIT", r"permission is hereby granted, free of charge|\bMIT License\b|licensed under the MIT"),
    ("Apache-2.0", r"Apache License,?\s+Version 2\.0"),
    ("BSD-3-Clause", r"Redistribution and use in source and binary forms.*Neither the name"),
    ("BSD-2-Clause", r"Redistribution and use in source and binary forms"),
    ("AGPL-3.0", r"GNU Affero General Public License"),
    ("LGPL-3.0", r"GNU Lesser General Public License.{0,200}version 3"),
    ("LGPL-2.1", r"GNU Lesser General Public License|GNU Library General Public License"),
    ("GPL-3.0", r"GNU General Public License.{0,200}version 3"),
    ("GPL-2.0", r"GNU General Public License"),
    ("MPL-2.0", r"Mozilla Public License,? v(ersion|\.) ?2\.0"),
    ("Unlicense", r"free and unencumbered software released into the public domain"),
))
_COMMENT_BREAK = re.compile(r"\s*\n\s*(?:#+|//+|/?\*+|;+|--)?\s*")  # a licence text wraps over comment lines
_COPYRIGHT = re.compile(r"^\W*(copyright\b|\(c\)\s*\d{4}|©)", re.IGNORECASE | re.MULTILINE)

# Newer syntax on a failing line -> its 3.11 equivalent (same line count, so later errors keep their numbers).
_TYPE_PARAMS = re.compile(r"^(\s*(?:async\s+)?(?:def|class)\s+\w+)\s*\[")
_TYPE_ALIAS = re.compile(r"^(\s*)type\s+(\w+)\s*(\[.*\])?\s*=")
_BARE_EXCEPT_TUPLE = re.compile(r"^(\s*except\*?\s+)([^():#]+,[^():#]+):")
_FSTRING = re.compile(r"""\b(?:[fF][rR]?|[rR][fF])(["']).*\1""")
_MAX_REWRITES = 200


def _closing_bracket(line: str, start: int) -> int | None:
    """Index of the `]` closing the `[` at start, or None."""
    depth = 0
    for i in range(start, len(line)):
        depth += {"[": 1, "]": -1}.get(line[i], 0)
        if depth == 0:
            return i
    return None


def _older_line(line: str, message: str) -> str | None:
    """The line with one newer construct rewritten for 3.11's parser, or None when it has none."""
    if m := _TYPE_PARAMS.match(line):
        end = _closing_bracket(line, m.end() - 1)
        return None if end is None else m.group(1) + line[end + 1:]
    if m := _TYPE_ALIAS.match(line):
        return f"{m.group(1)}{m.group(2)} =" + line[m.end():]
    if m := _BARE_EXCEPT_TUPLE.match(line):
        return f"{m.group(1)}({m.group(2).strip()}):" + line[m.end():]
    if message.startswith("f-string") and _FSTRING.search(line):
        return _FSTRING.sub("0", line)
    return None


def python_syntax(text: str) -> str:
    """"ok", "newer" (parses once the newer constructs above are rewritten) or "error"."""
    lines, newer = text.splitlines(), False
    for _ in range(_MAX_REWRITES):
        try:
            with warnings.catch_warnings():  # invalid escape sequences warn; they are not errors
                warnings.simplefilter("ignore")
                ast.parse("\n".join(lines) if newer else text)
            return "newer" if newer else "ok"
        except (SyntaxError, ValueError) as error:  # ValueError: null bytes
            lineno = getattr(error, "lineno", None)
            if not lineno or lineno > len(lines):
                return "error"
            older = _older_line(lines[lineno - 1], getattr(error, "msg", ""))
            if older is None or older == lines[lineno - 1]:
                return "error"
            lines[lineno - 1], newer = older, True
    return "error"


def detect_license(text: str, head_lines: int) -> tuple[str | None, str | None]:
    """(SPDX id or None, the first copyright line or None) from the file's first head_lines lines."""
    head = "\n".join(text.splitlines()[:head_lines])
    license_id = None
    if m := _SPDX.search(head):
        license_id = m.group(1)
    else:
        flat = _COMMENT_BREAK.sub(" ", head)
        license_id = next((spdx for spdx, pattern in _LICENSE_TEXTS if pattern.search(flat)), None)
    copyright_line = None
    if m := _COPYRIGHT.search(head):
        copyright_line = head[m.start():].split("\n", 1)[0].strip()[:200]
    return license_id, copyright_line


def _name(doc: Document) -> str:
    meta = doc.metadata
    return str(meta.get("path") or meta.get("origin") or doc.id or "")


def _repository(doc: Document) -> str | None:
    """The repository name metadata carries (ours, or The Stack's), else None."""
    meta = doc.metadata
    return meta.get("repository") or meta.get("repo_name") or meta.get("max_stars_repo_name")


class CodeQualityFilter(BaseFilter):
    """Syntax, minified and generated files, licences and repository signals (module docstring)."""

    name = "🧑‍💻 Code quality"

    def __init__(self, config: CodeConfig, exclusion_writer=None):
        super().__init__(exclusion_writer)
        self.config = config
        self.markers = tuple(m.lower() for m in config.autogenerated_markers)
        self.allowed = None if config.allowed_licenses is None else {x.lower() for x in config.allowed_licenses}
        self.repos_with_tests: set[str] | None = None

    def run(self, data, rank: int = 0, world_size: int = 1):
        """With require_tests_in_repo, this task's documents are read first to find the repositories that have
        tests (a repository split over several tasks' inputs is judged on each part alone)."""
        if self.config.require_tests_in_repo:
            data = list(data)
            self.repos_with_tests = {repo for doc in data if (repo := _repository(doc)) and _TEST_NAME.search(_name(doc))}
        yield from super().run(data, rank, world_size)

    def filter(self, doc: Document):
        text, config, name = doc.text, self.config, _name(doc)
        lines = text.splitlines() or [""]
        if _MINIFIED_NAME.search(name) or len(text) / len(lines) > config.max_mean_line_length:
            return False, "minified"
        if max(map(len, lines)) > config.max_line_length:
            return False, "code_long_line"
        if sum(ch.isalnum() for ch in text) / max(1, len(text)) < config.min_alnum_fraction:
            return False, "code_alnum_fraction"
        head = "\n".join(lines[: config.marker_lines]).lower()
        if _GENERATED_NAME.search(name) or any(marker in head for marker in self.markers):
            return False, "generated"
        if config.python_syntax and (_PYTHON_NAME.search(name) or str(doc.metadata.get("language", "")).lower() == "python"):
            syntax = python_syntax(text)
            if syntax == "error":
                return False, "syntax_error"
            if syntax == "newer":
                if not config.keep_newer_syntax:
                    return False, "python_newer_syntax"
                self.stat_update("flagged_python_newer_syntax")
        license_id, copyright_line = detect_license(text, config.license_lines)
        license_id = license_id or doc.metadata.get("license") or None
        doc.metadata["code_license"], doc.metadata["code_copyright"] = license_id, copyright_line
        if self.allowed is not None and str(license_id).lower() not in self.allowed:
            return False, "license"
        stars = doc.metadata.get("stars", doc.metadata.get("max_stars_count"))
        if config.min_stars is not None and stars is not None and stars < config.min_stars:
            return False, "stars"
        repo = _repository(doc)
        if self.repos_with_tests is not None and repo and repo not in self.repos_with_tests:
            return False, "no_tests_in_repo"
        return True
