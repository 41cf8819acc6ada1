"""assets/recipe/sources.py: a source's name, its dumps, and the parts of it that version its assets."""

import pytest
from pydantic import ValidationError

from assets.recipe import DEMO_RECIPE, load_recipe
from assets.recipe.sources import SourceConfig


def test_reader_settings_that_do_not_change_output_do_not_change_the_version():
    recipe = load_recipe(DEMO_RECIPE)
    web = recipe.source("web")
    tolerant = web.model_copy(update={"reader": type(web.reader)(**{**web.reader.__dict__, "max_bad_fraction": 0.5})})
    stricter = web.model_copy(update={"reader": type(web.reader)(**{**web.reader.__dict__, "min_text_chars": 500})})
    assert tolerant.raw_section() == web.raw_section()
    assert stricter.raw_section() != web.raw_section()


def test_a_filter_change_versions_filtered_and_not_raw_crawl():
    web = load_recipe(DEMO_RECIPE).source("web")
    strict = web.model_copy(update={"filter": type(web.filter)(**{**web.filter.__dict__, "c4": None})})
    assert strict.raw_section() == web.raw_section() and strict.filtered_section() != web.filtered_section()


@pytest.mark.parametrize("fields, message", [
    ({"name": "Web"}, "source name 'Web' must match"),
    ({"inputs": ["crawl/{dump}/a.warc.gz", "b.warc.gz"]}, "either every input has {dump}"),
    ({"inputs": ["crawl/x{dump}/a.warc.gz"]}, "must be one whole folder of the path"),
    ({"dumps": ["d1"]}, "the inputs have no {dump}"),
    ({"inputs": ["crawl/{dump}/*.warc.gz"], "dumps": ["dump2", "dump10"]}, "'dump10' is listed after 'dump2'"),
    ({"inputs": ["crawl/{dump}/*.warc.gz"], "dumps": ["d1", "d1"]}, "a dump is named twice"),
])
def test_a_bad_source_is_refused_naming_what_is_wrong(fields, message):
    with pytest.raises(ValidationError, match=message.replace("{", r"\{").replace("(", r"\(")):
        SourceConfig(**{"name": "web", "format": "warc", "inputs": ["a.warc.gz"], **fields})


def test_a_crawl_of_dumps_lists_each_dump_apart():
    crawl = SourceConfig(name="cc", format="warc", inputs=["crawl/{dump}/*.warc.gz"], dumps=["d1", "d2"])
    assert crawl.has_dumps and crawl.dump_inputs("d2") == ["crawl/d2/*.warc.gz"]
