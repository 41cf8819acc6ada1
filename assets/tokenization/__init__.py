"""The tokenization group: the tokenizer, and one packed output per source.

    tokenization/tokenizer         tokenizer.py   trained on every source's documents, or adopted
    tokenization/<source>/packed   packed.py      train / val token streams the trainer reads
"""

from typing import Callable

from dagster import AssetKey

from assets.recipe import Recipe
from assets.tokenization.packed import packed_asset
from assets.tokenization.tokenizer import tokenizer_asset


def tokenization_assets(recipe: Recipe, upstream_key: Callable[[str], AssetKey]) -> list:
    """The tokenizer asset and one packed asset per source; `upstream_key(source)` names its documents' asset, so
    the stage reads whichever curation output is last in the chain."""
    return [tokenizer_asset(recipe, upstream_key)] + [
        packed_asset(recipe, source.name, upstream_key) for source in recipe.sources
    ]
