"""assets/recipe/curation.py: the recipe's `checks` section, validated at load and part of no code version."""

import pytest

from assets.recipe import DEMO_RECIPE, RecipeError, load_recipe
from assets.recipe.curation import ChecksConfig
from tests.assets.test_recipe import write_recipe


def test_checks_section_is_validated_and_versions_nothing(tmp_path):
    assert load_recipe(DEMO_RECIPE).checks == ChecksConfig(mode="chunks", chunk_documents=10_000)
    for name, value, expected in [("mode", "all", "checks.mode: Input should be 'chunks' or 'sample'"),
                                  ("chunk_documents", 0, "checks.chunk_documents: Input should be greater than")]:
        (tmp_path / name).mkdir()
        with pytest.raises(RecipeError, match=expected):
            load_recipe(write_recipe(tmp_path / name, lambda raw: raw.update(checks={name: value})))
    # How a check reads an output is not what any asset makes: no code version changes with it.
    from assets.definitions import build_defs

    def code_versions(path):
        graph = build_defs(load_recipe(path)).resolve_asset_graph()
        return {k.to_user_string(): graph.get(k).code_version for k in graph.get_all_asset_keys()}

    (tmp_path / "sampled").mkdir()
    sampled = write_recipe(tmp_path / "sampled", lambda raw: raw.update(
        checks={"mode": "sample", "sample_documents": 500, "chunk_documents": 100, "seed": 3}))
    assert load_recipe(sampled).checks.sample_documents == 500
    assert code_versions(sampled) == code_versions(DEMO_RECIPE)


def test_s3_inputs_are_listed_when_asked_for_not_at_load(tmp_path, s3):
    for name in ("b.warc.gz", "a.warc.gz"):
        s3.client().put_object(Bucket=s3.bucket, Key=f"crawl/{name}", Body=b"x")
    url = f"s3://{s3.bucket}/crawl/*.warc.gz"
    recipe = load_recipe(write_recipe(tmp_path, lambda raw: raw["sources"][1].update(inputs=[url])))
    assert recipe.input_files(recipe.source("cc")) == [f"s3://{s3.bucket}/crawl/a.warc.gz",
                                                       f"s3://{s3.bucket}/crawl/b.warc.gz"]
    # Loading lists nothing remote (Dagster loads the definitions in every run's process): a missing object, or
    # an endpoint nobody answers at, is found when the inputs are asked for (raw_crawl's prepare), named there.
    missing = f"s3://{s3.bucket}/crawl/gone.warc.gz"
    recipe = load_recipe(write_recipe(tmp_path, lambda raw: raw["sources"][1].update(inputs=[missing])))
    with pytest.raises(ValueError, match=f"input '{missing}' does not exist"):
        recipe.input_files(recipe.source("cc"))
    unreachable = write_recipe(tmp_path, lambda raw: raw["sources"][1].update(inputs=["s3://no-such-bucket/x/*.gz"]))
    load_recipe(unreachable)
