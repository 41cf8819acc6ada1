"""The generated reference (assets/cli/reference.py): the recipe's JSON Schema, `pretrain schema`, and the recipe and
CLI pages, each equal to a fresh generation. The schema is held to its job: it accepts every shipped recipe and the
README's example, and refuses a misspelt field at every depth an editor would show it, as the loader does."""

import copy
import json
import re

import jsonschema
import pytest
import yaml
from jsonschema.exceptions import best_match

from tests.conftest import REPO, SHARED_DATA

README = REPO / "README.md"
DOCS = REPO / "docs"
SCHEMA_LINE = "# yaml-language-server: $schema=../docs/recipe.schema.json"
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


def test_the_committed_schema_and_reference_pages_are_what_the_code_generates():
    from assets.cli.command import build_parser
    from assets.cli.reference import generated

    stale = [str(path.relative_to(REPO)) for path, text in generated(build_parser()).items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"out of date: {stale}; run `make docs-reference`"


def test_pretrain_schema_prints_the_committed_schema(capsys):
    from assets.cli import main

    assert main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((DOCS / "recipe.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(printed)
    # Descriptions and defaults reach the editor: a field of the recipe's own, one of an engine's, one of a stage's.
    source = printed["$defs"]["SourceConfig"]["properties"]
    assert printed["properties"]["base_dir"] == {"type": "string", "default": ".", "description":
                                                 "Where relative inputs are found, relative to the recipe file"}
    assert source["inputs"]["description"] and source["filter"]["description"]
    model = printed["$defs"]["ModelConfig"]["properties"]
    assert model["rope_base"]["default"] == 10000.0
    assert model["rope_base"]["description"] == "long-context stages raise it"  # the comment beside the field
    assert set(printed["$defs"]["MainStage"]["properties"]) >= {"model", "optim", "batch", "launch"}


@pytest.fixture(scope="module")
def validator():
    return jsonschema.Draft202012Validator(json.loads((DOCS / "recipe.schema.json").read_text()))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_names_the_schema_and_is_valid_under_it(recipe, validator):
    text = recipe.read_text(encoding="utf-8")
    assert text.splitlines()[0] == SCHEMA_LINE, f"{recipe.name}: the first line is not the schema line"
    assert (recipe.parent / SCHEMA_LINE.split("=", 1)[1]).resolve() == (DOCS / "recipe.schema.json").resolve()
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(yaml.safe_load(text))]
    assert not errors, errors


@pytest.mark.parametrize("where, field", [
    ((), "trainig"),                                   # a top-level section
    (("sources", 0, "reader"), "min_text_char"),       # an engine's settings (pipelines.ingest.config)
    (("sources", 3, "filter"), "langauge"),            # a filter step's name (c4's: web's is shared by an anchor)
    (("training", "main", "optim"), "lrr"),            # the trainer's run config, inside the main stage
    (("training", "long_context", 0), "weightz"),      # a later stage
    (("mixing", "proxy", "model"), "d_modle"),         # a proxy, merged over main
    (("training", "main", "launch", "slurm"), "partitoin"),
])
def test_the_schema_refuses_a_misspelt_field_and_names_it(where, field, validator):
    recipe = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    node = recipe
    for part in where:
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    node[field] = {}
    error = best_match(validator.iter_errors(recipe))
    assert error is not None, f"{field} at {where} was accepted"
    assert tuple(error.absolute_path) == where and repr(field) in error.message


def test_the_readme_recipe_is_valid_and_loads(tmp_path, validator):
    """The README's example is a recipe `pretrain` runs: valid under the schema, and loaded (inputs found) when its
    base_dir points at the shared data."""
    from assets.recipe import load_recipe

    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    example = next(b for b in blocks if b.startswith(SCHEMA_LINE))
    data = yaml.safe_load(example)
    assert not list(validator.iter_errors(data))
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({**data, "base_dir": str(SHARED_DATA)}))
    recipe = load_recipe(mine)
    assert [s.name for s in recipe.sources] == ["web", "code"]
    assert [name for name, _ in recipe.training.run_configs()] == ["main", "anneal"]


def test_a_recipe_the_schema_refuses_pretrain_refuses_too(tmp_path, validator):
    """The schema is the models' own: a misspelt field it refuses is refused by the loader as well, named alike."""
    from assets.recipe import RecipeError, load_recipe

    recipe = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    broken = copy.deepcopy(recipe)
    broken["base_dir"] = str(SHARED_DATA)
    broken["sources"][3]["reader"] = {"min_text_char": 5}
    assert list(validator.iter_errors(broken))
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    with pytest.raises(RecipeError, match="min_text_char"):
        load_recipe(path)
