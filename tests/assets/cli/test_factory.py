"""What every command stands on (assets/cli/factory.py): the Factory's selection of assets by key, pattern and
upstream, on the demo recipe in a fresh home, and its error naming what exists."""

import pytest

from assets.cli.factory import Factory, UsageError


@pytest.fixture(scope="module")
def factory(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PRETRAIN_HOME", str(home))
        patch.setenv("DAGSTER_HOME", str(home / "dagster"))
        patch.delenv("PRETRAIN_RECIPE", raising=False)
        yield Factory(None)


def names(keys) -> list[str]:
    return [k.to_user_string() for k in keys]


def test_a_pattern_selects_by_key_and_a_plus_adds_the_upstream(factory):
    assert names(factory.select("curation/*/raw_crawl")) == sorted(
        f"curation/{s.name}/raw_crawl" for s in factory.recipe.sources)
    upstream = names(factory.select("+tokenization/math/packed"))
    assert {"curation/math/raw_crawl", "curation/deduplicated", "tokenization/tokenizer",
            "tokenization/math/packed"} <= set(upstream)
    assert not any(name.startswith(("training/", "mixing/")) for name in upstream)
    assert factory.select(None) == factory.keys


def test_a_selection_or_asset_that_matches_nothing_names_what_exists(factory):
    with pytest.raises(UsageError, match=r"--select 'curation/zzz/\*' matches no asset; assets are: .*training/main"):
        factory.select("curation/zzz/*")
    with pytest.raises(UsageError, match="recipe 'demo' has no source 'nope'; it has web, cc"):
        factory.resolve("raw_crawl", "nope")
