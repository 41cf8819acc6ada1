"""The one `Definitions` object the code location serves (workspace.yaml loads `assets.definitions:defs`).

The recipe in force is read once, here, at load: PRETRAIN_RECIPE or recipes/demo.yaml. Resources are
chosen in this one place from the environment (PRETRAIN_HOME, PRETRAIN_STORE, AWS_ENDPOINT_URL,
AWS_DEFAULT_REGION), never in asset code.
"""

from __future__ import annotations

import os

from dagster import Definitions

from assets.curation import raw_crawl_asset
from assets.decontaminated import decontaminated_asset, decontaminated_key
from assets.deduplicated import deduplicated_asset
from assets.filtered import curation_filter_assets, filtered_key
from assets.home import pretrain_home, store_url
from assets.recipe import Recipe, load_recipe
from assets.tokenization import tokenization_assets
from resources.executor import ExecutorResource
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
        # datatrove pipelines: local by default; PRETRAIN_EXECUTOR_WORKERS > 1 runs tasks in a process pool.
        "executor": ExecutorResource(kind="local", workers=int(os.environ.get("PRETRAIN_EXECUTOR_WORKERS", "1"))),
    }


def build_defs(recipe: Recipe) -> Definitions:
    assets = [raw_crawl_asset(recipe, source) for source in recipe.sources]
    # The curation chain: raw_crawl -> filtered -> deduplicated (across sources) -> decontaminated -> packed.
    assets += curation_filter_assets(recipe)
    assets.append(deduplicated_asset(recipe, upstream_key=filtered_key))
    assets += [decontaminated_asset(recipe, source) for source in recipe.sources]
    assets += tokenization_assets(recipe, upstream_key=decontaminated_key)
    return Definitions(assets=assets, resources=build_resources())


defs = build_defs(load_recipe())
