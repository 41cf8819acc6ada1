"""ScratchResource (resources/scratch.py): a fresh folder per use under one root, named after its asset."""

from __future__ import annotations

from resources.scratch import ScratchResource


def test_each_new_dir_is_fresh_and_named_after_the_label(tmp_path):
    scratch = ScratchResource(root=str(tmp_path / "work"))
    first = scratch.new_dir("curation/web/filtered")
    second = scratch.new_dir("curation/web/filtered")
    assert first != second and first.is_dir() and second.is_dir()
    assert first.parent == tmp_path / "work"
    # A key's slashes would make nested folders; the label stays one folder name.
    assert first.name.startswith("curation-web-filtered-") and "/" not in first.name


def test_version_dir_is_the_same_folder_for_the_same_version(tmp_path):
    # A resumable build killed half-way finds its finished tasks there when materialized again.
    scratch = ScratchResource(root=str(tmp_path / "work"))
    first = scratch.version_dir("curation/deduplicated", "abc123")
    assert first == scratch.version_dir("curation/deduplicated", "abc123") == tmp_path / "work/resume/curation/deduplicated/abc123"
    assert scratch.version_dir("curation/deduplicated", "def456") != first
