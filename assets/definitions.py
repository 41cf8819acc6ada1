"""The one `Definitions` object the code location serves (workspace.yaml loads `assets.definitions:defs`).

The recipe in force is read once, here, at load: PRETRAIN_RECIPE or recipes/demo.yaml. Resources are
chosen in this one place from the environment (PRETRAIN_HOME, PRETRAIN_STORE, AWS_ENDPOINT_URL,
AWS_DEFAULT_REGION), never in asset code.
"""

from __future__ import annotations

import os

from dagster import Definitions

from assets.curation import raw_crawl_asset
from assets.home import pretrain_home, store_url
from assets.recipe import Recipe, load_recipe
from resources.scratch import ScratchResource
from resources.store_resource import StoreResource


def build_resources() -> dict:
    return {
        "store": StoreResource(
            url=store_url(),
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL"),
            region=os.environ.get("AWS_DEFAULT_REGION"),
        ),
        "scratch": ScratchResource(root=str(pretrain_home() / "work")),
    }


def build_defs(recipe: Recipe) -> Definitions:
    assets = [raw_crawl_asset(recipe, source) for source in recipe.sources]
    return Definitions(assets=assets, resources=build_resources())


defs = build_defs(load_recipe())
