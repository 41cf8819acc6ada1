"""The one `Definitions` object the code location serves (workspace.yaml loads `assets.definitions:defs`).

The recipe in force is read once, here, when `defs` is first asked for: PRETRAIN_RECIPE or recipes/demo.yaml.
Resources are chosen in this one place from the environment (PRETRAIN_HOME, PRETRAIN_STORE, AWS_ENDPOINT_URL,
AWS_DEFAULT_REGION, PRETRAIN_EXECUTOR and its settings), never in asset code. `pretrain` builds its own recipe's
with `build_defs`, once per command.
"""

from __future__ import annotations

import functools
import os

from assets.core.startup import built_to_keep

# The modules live as long as the process that loads the code location: imported with the collector paused
# (assets/core/startup.py), 0.2 s of its load at 100 sources.
with built_to_keep():
    from dagster import AssetSelection, DefaultScheduleStatus, Definitions, ScheduleDefinition, define_asset_job

    from assets.curation import curation_assets
    from assets.curation.decontaminated import decontaminated_key
    from assets.dumps import dump_sensors
    from assets.curation.raw_crawl import inputs_key
    from assets.evaluation import evaluation_assets
    from assets.home import pretrain_home, store_url
    from assets.mixing import mixing_assets, mixing_schedules, mixing_sensors
    from assets.recipe import Recipe, load_recipe
    from assets.scaling.fit import fit_asset
    from assets.scaling.ladder import ladder_asset
    from assets.tokenization import tokenization_assets
    from assets.training import follow_sensors, training_assets
    from resources.executor import ExecutorResource
    from resources.launcher import LauncherResource
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
        # The trainer's processes: `python -m trainer` by default; PRETRAIN_LAUNCHER=torchrun|deepspeed and
        # PRETRAIN_NPROC_PER_NODE for more, PRETRAIN_MAX_RESTARTS relaunches of a failed trainer
        # (resources/launcher.py). These are defaults: a recipe stage's `launch:` overrides them (assets/recipe/training.py).
        "launcher": LauncherResource(launcher=os.environ.get("PRETRAIN_LAUNCHER", "python"),
                                     nproc_per_node=int(os.environ.get("PRETRAIN_NPROC_PER_NODE", "1")),
                                     max_restarts=int(os.environ.get("PRETRAIN_MAX_RESTARTS", "2"))),
        # datatrove pipelines: local by default, a task per CPU of the run at once (PRETRAIN_EXECUTOR_WORKERS to set
        # it); PRETRAIN_EXECUTOR=ray or slurm with PRETRAIN_RAY_ADDRESS / PRETRAIN_SLURM_PARTITION, ...
        # (ExecutorResource.from_env lists them).
        "executor": ExecutorResource.from_env(os.environ),
    }


def build_defs(recipe: Recipe) -> Definitions:
    # The curation chain: raw_crawl -> filtered -> deduplicated (across sources) -> decontaminated -> packed.
    assets = curation_assets(recipe)
    assets += tokenization_assets(recipe, upstream_key=decontaminated_key)
    # Mixing and training: the sweep picks the mixture, the stages train on it, each stage is evaluated.
    assets += mixing_assets(recipe)
    assets += training_assets(recipe)
    # The scaling ladder and its fit (a recipe with a `scaling` section): the loss training/main will reach.
    if recipe.scaling is not None:
        assets += [ladder_asset(recipe), fit_asset(recipe)]
    assets += evaluation_assets(recipe)
    observed = [observe_inputs_schedule(recipe)] if any(not s.has_dumps for s in recipe.sources) else []
    return Definitions(assets=assets, schedules=[*mixing_schedules(recipe), *observed],
                       sensors=[*mixing_sensors(recipe), *follow_sensors(), *dump_sensors(recipe)],
                       resources=build_resources())


OBSERVE_INPUTS = "observe_inputs"
OBSERVE_CRON = "*/15 * * * *"


def observe_inputs_schedule(recipe: Recipe) -> ScheduleDefinition:
    """Every source's input files observed every 15 minutes (running by default, under `dagster dev` or the
    daemon), so a new or replaced input file turns its raw_crawl stale in the UI without anyone asking."""
    keys = [inputs_key(source.name) for source in recipe.sources if not source.has_dumps]
    job = define_asset_job(OBSERVE_INPUTS, selection=AssetSelection.assets(*keys),
                           description="Observe every source's input files (curation/<source>/inputs).")
    return ScheduleDefinition(name=OBSERVE_INPUTS, job=job, cron_schedule=OBSERVE_CRON,
                              default_status=DefaultScheduleStatus.RUNNING)


@functools.cache
def _recipe_defs() -> Definitions:
    # Kept for the life of the process that loads the code location (assets/core/startup.py).
    with built_to_keep():
        defs = build_defs(load_recipe())
        defs.resolve_asset_graph()
    return defs


def __getattr__(name: str):
    # `defs` is built when first asked for (workspace.yaml's loader, a run's worker process), not at import: the
    # `pretrain` commands import build_defs from here and build their own recipe's, and a module-level build of
    # PRETRAIN_RECIPE's (or the demo's) made every command build the definitions twice (4 s of 9 at 100 sources).
    # Cached on the function, so a reload of this module (a test's new PRETRAIN_HOME) builds again.
    if name == "defs":
        return _recipe_defs()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
