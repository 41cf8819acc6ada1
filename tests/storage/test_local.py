"""The local backend (storage/local.py): a plain folder whose writes are atomic and whose paths are real."""

from __future__ import annotations

import os

import pytest

from storage.local import LocalStore
from storage.objects import ObjectNotFoundError, write_atomic


def test_objects_are_plain_files_under_the_root(tmp_path):
    store = LocalStore(tmp_path / "root")
    store.put_bytes("a/b.txt", b"hello")
    path = tmp_path / "root" / "a" / "b.txt"
    assert path.read_bytes() == b"hello"
    assert store.local_path("a/b.txt") == path.resolve()
    assert store.uri("a/b.txt") == path.resolve().as_uri()
    assert store.url == str((tmp_path / "root").resolve())


def test_a_write_that_breaks_midway_leaves_the_old_file_and_no_temp(tmp_path):
    dest = tmp_path / "f.bin"
    dest.write_bytes(b"old")

    def chunks():
        yield b"new-part-one"
        raise OSError("disk went away")

    with pytest.raises(OSError, match="disk went away"):
        write_atomic(dest, chunks())
    assert dest.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f.bin"]


def test_a_delete_of_a_missing_key_is_quiet_and_a_folder_is_not_an_object(tmp_path):
    store = LocalStore(tmp_path)
    store.delete("never/written")
    (tmp_path / "folder").mkdir()
    assert not store.exists("folder")
    with pytest.raises(ObjectNotFoundError, match="folder"):
        store.open_read("folder")
