"""assets/core/source_hash.py on a small tree of its own: which source text a code reference takes in, and that its
digest moves with exactly that text, never with where it lives (module names, the module paths of the project's
import lines): a pure move of a module leaves the digest as it was."""

import ast
import pytest

from assets.core import source_hash
from assets.core.source_hash import CACHE_ENV, CodeRefError, code_digest, code_parts


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
    # What is hashed has no plain import of the project's own code (it binds a name to the definition the closure
    # hashes), at the top or in a function; json's import is as written.
    assert parts["assets.thing"].startswith("\ndef build()")
    assert "import json\n" in parts["pipelines.steps"]
    assert "def run():\n    return helper()\n" in parts["pipelines.steps"]
    # The digest is the texts' alone: the same texts under other module names give the same digest.
    renamed = {"assets/__init__.py": "", "assets/other.py": TREE["assets/thing.py"], "pipelines/__init__.py": "",
               "pipelines/run_steps.py": TREE["pipelines/steps.py"],
               "pipelines/utils.py": TREE["pipelines/helpers.py"]}
    # assets.other imports nothing under those names: its closure is named by hand.
    write_tree(tmp_path / "renamed", renamed)
    assert code_digest(["assets.other", "pipelines.run_steps", "pipelines.utils"], tmp_path / "renamed") == \
        code_digest(["assets.thing"], tmp_path)


def test_moving_a_module_and_rewriting_its_import_lines_keeps_the_digest(tmp_path):
    """A pure move (the file renamed, the import lines naming it rewritten) is no change of code: no asset's code
    version may move for it."""
    write_tree(tmp_path / "before", TREE)
    moved = {name: text for name, text in TREE.items() if name != "pipelines/helpers.py"}
    moved["pipelines/sub/__init__.py"] = ""
    moved["pipelines/sub/helpers.py"] = TREE["pipelines/helpers.py"]
    absolute = {**moved, "pipelines/steps.py": TREE["pipelines/steps.py"].replace(
        "from pipelines.helpers import helper", "from pipelines.sub.helpers import helper")}
    write_tree(tmp_path / "absolute", absolute)
    # Still followed under its new name.
    assert "pipelines.sub.helpers" in code_parts(["assets.thing"], tmp_path / "absolute")
    assert code_digest(["assets.thing"], tmp_path / "absolute") == code_digest(["assets.thing"], tmp_path / "before")
    # The relative form of the same import, and a parenthesized one over two lines, are the same import.
    relative = {**moved, "pipelines/steps.py": TREE["pipelines/steps.py"].replace(
        "from pipelines.helpers import helper", "from .sub.helpers import (\n        helper,\n    )")}
    write_tree(tmp_path / "relative", relative)
    assert "pipelines.sub.helpers" in code_parts(["assets.thing"], tmp_path / "relative")
    assert code_digest(["assets.thing"], tmp_path / "relative") == code_digest(["assets.thing"], tmp_path / "before")
    # A package named whole: its modules' names and a new empty __init__.py are no part of its digest.
    assert code_digest(["pipelines"], tmp_path / "absolute") == code_digest(["pipelines"], tmp_path / "before")


def test_what_an_import_binds_and_any_other_line_are_part_of_the_digest(tmp_path):
    write_tree(tmp_path / "before", TREE)
    before = code_digest(["assets.thing"], tmp_path / "before")
    other_names = {**TREE, "pipelines/steps.py": TREE["pipelines/steps.py"].replace(
        "import helper  #", "import other as helper  #")}
    write_tree(tmp_path / "names", other_names)
    assert code_digest(["assets.thing"], tmp_path / "names") != before
    alias = {**TREE, "assets/thing.py": TREE["assets/thing.py"].replace("import KEY", "import KEY as K")}
    write_tree(tmp_path / "alias", alias)
    assert code_digest(["assets.thing"], tmp_path / "alias") != before
    body = {**TREE, "pipelines/steps.py": TREE["pipelines/steps.py"].replace("return helper()", "return helper() + 1")}
    write_tree(tmp_path / "body", body)
    assert code_digest(["assets.thing"], tmp_path / "body") != before
    # A third-party import is hashed as written: where it comes from is what it is.
    third_party = {**TREE, "pipelines/steps.py": TREE["pipelines/steps.py"].replace("import json", "import orjson as json")}
    write_tree(tmp_path / "third_party", third_party)
    assert code_digest(["assets.thing"], tmp_path / "third_party") != before


def test_a_module_split_in_two_keeps_the_digest_and_so_do_its_docstring_comments_and_order(tmp_path):
    """Definitions moved to a module of their own (the split's imports copied, the importers' import lines
    rewritten), a module docstring, a comment between statements, the order of the statements: none of them is
    code an output depends on."""
    write_tree(tmp_path / "before", TREE)
    before = code_digest(["assets.thing"], tmp_path / "before")
    split = {**TREE,
             "pipelines/steps.py": '"""Running."""\nimport json\nfrom pipelines.rest import other, decorated\n\n'
                                   "# the words\nWORDS = ('a', 'b')\n\n\n"
                                   "def run():\n    from pipelines.helpers import helper  # lazy: still followed\n"
                                   "    return helper()\n",
             "pipelines/rest.py": '"""The rest."""\nimport json\n\n\n@staticmethod\ndef decorated():\n    return 3\n\n\n'
                                  "def other():\n    return 2\n"}
    write_tree(tmp_path / "split", split)
    assert "pipelines.rest" in code_parts(["assets.thing"], tmp_path / "split")
    assert code_digest(["assets.thing"], tmp_path / "split") == before
    # A lazy import split in two, one per module the names now come from, is the one import it was.
    lazy = {**split, "pipelines/steps.py": split["pipelines/steps.py"].replace(
        "    from pipelines.helpers import helper  # lazy: still followed\n",
        "    from pipelines.helpers import helper\n    from pipelines.rest import other  # lazy\n")}
    write_tree(tmp_path / "lazy", lazy)
    assert code_digest(["assets.thing"], tmp_path / "lazy") == before
    # What it cannot hide: a third-party import that was not there, and a statement's own text.
    other_import = {**split, "pipelines/rest.py": split["pipelines/rest.py"].replace("import json", "import re")}
    write_tree(tmp_path / "other_import", other_import)
    assert code_digest(["assets.thing"], tmp_path / "other_import") != before
    decorator = {**split, "pipelines/rest.py": split["pipelines/rest.py"].replace("@staticmethod", "@classmethod")}
    write_tree(tmp_path / "decorator", decorator)
    assert code_digest(["assets.thing"], tmp_path / "decorator") != before


def test_the_texts_are_a_multiset(tmp_path):
    """Two modules with the same text are two modules' code: a second copy counts, it is not folded into the first."""
    write_tree(tmp_path, {**TREE, "trainer/sub/c.py": TREE["trainer/sub/b.py"]})
    one, two = code_digest(["trainer.sub.b"], tmp_path), code_digest(["trainer.sub.b", "trainer.sub.c"], tmp_path)
    assert one != two
    assert code_digest(["trainer.sub.c", "trainer.sub.b"], tmp_path) == two  # in any order


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


def test_star_takes_in_every_top_level_definition_and_nothing_else(tmp_path):
    """`mod:*` is `mod:Name` for every name the module defines: the same texts, its imports and docstring left
    out and not followed; a definition added to the module is in it with no list to keep."""
    write_tree(tmp_path, TREE)
    every = "pipelines.steps:WORDS,run,other,decorated"
    assert code_parts(["pipelines.steps:*"], tmp_path) == code_parts([every], tmp_path)
    assert sorted(code_parts(["assets.thing", "pipelines.steps:*"], tmp_path)) == [  # pipelines.helpers not followed
        "assets.thing", "pipelines.steps:WORDS", "pipelines.steps:decorated", "pipelines.steps:other",
        "pipelines.steps:run"]
    assert code_parts(["pipelines.steps:*,other"], tmp_path) == code_parts([every], tmp_path)
    added = tmp_path / "added"
    write_tree(added, {**TREE, "pipelines/steps.py": TREE["pipelines/steps.py"] + "\n\ndef new():\n    return 4\n"})
    assert "pipelines.steps:new" in code_parts(["pipelines.steps:*"], added)
    assert code_digest(["pipelines.steps:*"], added) != code_digest(["pipelines.steps:*"], tmp_path)
    # Only definitions: an import line or the docstring edited leaves it as it was.
    imports = tmp_path / "imports"
    write_tree(imports, {**TREE, "pipelines/steps.py": '"""Doc."""\n' + TREE["pipelines/steps.py"].replace(
        "import json", "import orjson as json")})
    assert code_digest(["pipelines.steps:*"], imports) == code_digest(["pipelines.steps:*"], tmp_path)


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


def _new_process():
    """What a new process starts with: none of the parses this one holds."""
    for cached in (source_hash._parsed_module, source_hash._parsed_definitions, source_hash._digest):
        cached.cache_clear()


def test_a_parse_is_kept_on_disk_for_the_next_process_and_an_edit_is_parsed_again(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    write_tree(tmp_path / "src", TREE)
    refs = ["assets.thing", "trainer.a:A"]
    _new_process()
    first = code_parts(refs, tmp_path / "src")
    # A file per module parsed (assets.thing, pipelines.steps, pipelines.helpers) and per module of definitions.
    assert len(list((tmp_path / "cache").glob("*.json"))) == 4
    assert not list((tmp_path / "cache").glob("*.tmp"))

    def no_parse(*args, **kwargs):
        raise AssertionError("parsed again")

    _new_process()
    with monkeypatch.context() as patched:
        patched.setattr(ast, "parse", no_parse)
        assert code_parts(refs, tmp_path / "src") == first
    # The imports followed are asked of the tree each time: the same texts where pipelines.helpers is no module
    # take in less.
    write_tree(tmp_path / "bare", {k: v for k, v in TREE.items() if k != "pipelines/helpers.py"})
    _new_process()
    assert "pipelines.helpers" not in code_parts(refs, tmp_path / "bare")
    # An edit is a new text: parsed, and its digest moves.
    (tmp_path / "src" / "pipelines" / "helpers.py").write_text("def helper():\n    return 2\n")
    _new_process()
    assert code_parts(refs, tmp_path / "src")["pipelines.helpers"] == "def helper():\n    return 2\n"


def test_a_kept_parse_that_cannot_be_read_or_kept_costs_only_a_parse(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    write_tree(tmp_path / "src", TREE)
    _new_process()
    digest = code_digest(["assets.thing"], tmp_path / "src")
    for kept in (tmp_path / "cache").glob("*.json"):
        kept.write_text('{"text": "cut sho')  # a file cut short
    _new_process()
    assert code_digest(["assets.thing"], tmp_path / "src") == digest
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "a-file" / "cache"))  # a folder that cannot be made
    _new_process()
    assert code_digest(["assets.thing"], tmp_path / "src") == digest
