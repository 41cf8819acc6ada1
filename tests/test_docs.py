"""The manual: a README of at most 12 KB that links every page of docs/, and a site that builds with every warning an
error (the generated reference pages and the schema: tests/assets/cli/test_reference.py)."""

import os
import re
import subprocess
import sys

from tests.conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"


def linked_targets(path) -> set:
    """The files a Markdown file links to, resolved (anchors and external links left out)."""
    text = path.read_text(encoding="utf-8")
    targets = set()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        target = target.split("#", 1)[0]
        if target and "://" not in target:
            targets.add((path.parent / target).resolve())
    return targets


def test_the_readme_is_short_and_links_every_page_of_the_manual():
    assert README.stat().st_size <= 12 * 1024, f"README.md is {README.stat().st_size} bytes; the manual is docs/"
    linked = linked_targets(README)
    pages = {p.resolve() for p in DOCS.rglob("*.md")}
    assert pages, "no docs pages"
    assert not pages - linked, f"pages the README does not link: {sorted(str(p.relative_to(DOCS)) for p in pages - linked)}"
    missing = [t for t in linked if not t.exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_site_builds_with_every_warning_an_error(tmp_path):
    # The strict build: a broken link or anchor, a page left out of the nav, a missing snippet fails it (mkdocs.yml).
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "What the demo does" in home and "curation/quality_classifier" in home  # the README's sections, included
    assert (tmp_path / "site" / "reference" / "recipe" / "index.html").exists()
