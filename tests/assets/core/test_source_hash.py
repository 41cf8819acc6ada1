"""assets/core/source_hash.py on a small tree of its own: which source text a code reference takes in, and that its
digest moves with exactly that text."""

import hashlib

import pytest

from assets.core.source_hash import CodeRefError, code_digest, code_parts


def write_tree(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


TREE = {
    "assets/__init__.py": "",
    "assets/thing.py": "from pipelines.steps import run\nfrom assets.keys import KEY\n\ndef build():\n    return run()\n",
    "assets/keys.py": "KEY = 'k'\n",
    "pipelines/__init__.py": "",
    "pipelines/steps.py": (
        "import json\n\n"
        "WORDS = ('a', 'b')\n\n\n"
        "def run():\n    from pipelines.helpers import helper  # lazy: still followed\n    return helper()\n\n\n"
        "def other():\n    return 2\n\n\n"
        "@staticmethod\ndef decorated():\n    return 3\n"),
    "pipelines/helpers.py": "def helper():\n    return 1\n",
    "trainer/__init__.py": "",
    "trainer/a.py": "A = 1\n",
    "trainer/sub/__init__.py": "",
    "trainer/sub/b.py": "B = 2\n",
}


def test_a_module_takes_in_the_engine_modules_it_imports_but_not_other_asset_modules(tmp_path):
    write_tree(tmp_path, TREE)
    parts = code_parts(["assets.thing"], tmp_path)
    assert sorted(parts) == ["assets.thing", "pipelines.helpers", "pipelines.steps"]  # not assets.keys, nor json
    assert parts["pipelines.helpers"] == TREE["pipelines/helpers.py"]
    expected = hashlib.sha256()
    for label in sorted(parts):
        expected.update(f"{label}\0{parts[label]}\0".encode())
    assert code_digest(["assets.thing"], tmp_path) == expected.hexdigest()


def test_named_definitions_take_in_only_their_own_text(tmp_path):
    write_tree(tmp_path, TREE)
    parts = code_parts(["assets.thing", "pipelines.steps:WORDS,decorated"], tmp_path)
    # A module named by definitions is left out of the closure: its other functions (and their imports) are not in.
    assert sorted(parts) == ["assets.thing", "pipelines.steps:WORDS", "pipelines.steps:decorated"]
    assert parts["pipelines.steps:WORDS"] == "WORDS = ('a', 'b')"
    assert parts["pipelines.steps:decorated"] == "staticmethod\ndef decorated():\n    return 3"
    # Digests are cached per (references, root) for the process: the edited copy is a tree of its own.
    edited = tmp_path / "edited"
    write_tree(edited, {**TREE, "pipelines/steps.py": TREE["pipelines/steps.py"].replace("return 2", "return 20")})
    assert code_digest(["pipelines.steps:WORDS"], edited) == code_digest(["pipelines.steps:WORDS"], tmp_path)
    assert code_digest(["pipelines.steps:other"], edited) != code_digest(["pipelines.steps:other"], tmp_path)


def test_a_package_is_every_module_in_it(tmp_path):
    write_tree(tmp_path, TREE)
    assert sorted(code_parts(["trainer"], tmp_path)) == ["trainer", "trainer.a", "trainer.sub", "trainer.sub.b"]


def test_the_digest_is_the_text_alone_not_where_it_lives_nor_its_line_endings(tmp_path):
    write_tree(tmp_path / "one", TREE)
    write_tree(tmp_path / "two", {name: text.replace("\n", "\r\n") for name, text in TREE.items()})
    assert code_digest(["assets.thing"], tmp_path / "one") == code_digest(["assets.thing"], tmp_path / "two")
    write_tree(tmp_path / "three", {**TREE, "pipelines/helpers.py": "def helper():\n    return 2\n"})
    assert code_digest(["assets.thing"], tmp_path / "one") != code_digest(["assets.thing"], tmp_path / "three")


def test_a_reference_to_nothing_names_what_is_missing(tmp_path):
    write_tree(tmp_path, TREE)
    with pytest.raises(CodeRefError, match="no module pipelines.nothing"):
        code_parts(["pipelines.nothing"], tmp_path)
    with pytest.raises(CodeRefError, match="pipelines.steps has no top-level 'gone'"):
        code_parts(["pipelines.steps:gone"], tmp_path)
