"""The mixing group: the proxy-model sweep over candidate mixtures, and the chosen weights (RegMix).

    mixing/mix_candidates    mix_candidates.py    mixtures drawn around the prior, one sweep partition each
    mixing/mix_sweep         mix_sweep.py         one proxy run per candidate (partitioned)
    mixing/mixture_weights   mixture_weights.py   the fitted, chosen mixture
    (shared)                 section.py           keys, versioned sections, proxy settings, result files

Each output is committed to the store like every other (manifest last), so a training stage reads the
chosen weights, with their data version, from the store.
"""

from dagster import AssetSelection, DefaultScheduleStatus, ScheduleDefinition, define_asset_job

from assets.mixing.mix_candidates import mix_candidates_asset
from assets.mixing.mix_sweep import mix_sweep_asset
from assets.mixing.mixture_weights import mixture_weights_asset
from assets.mixing.section import candidates_key
from assets.recipe import Recipe


def mixing_assets(recipe: Recipe) -> list:
    if recipe.mixing is None or recipe.training is None:
        return []
    return [mix_candidates_asset(recipe), mix_sweep_asset(recipe), mixture_weights_asset(recipe)]


def mixing_schedules(recipe: Recipe) -> list:
    """The recipe's cron re-draws the candidates; the automation sensor then runs every new or changed
    sweep partition (eager) and refits the weights (eager). Unchanged partitions reuse their results."""
    if recipe.mixing is None or recipe.training is None or not recipe.mixing.schedule:
        return []
    job = define_asset_job("mix_sweep_schedule_job", selection=AssetSelection.assets(candidates_key()),
                           description="Re-draw the sweep's candidates; the automation sensor runs the rest.")
    status = DefaultScheduleStatus.RUNNING if recipe.mixing.status == "running" else DefaultScheduleStatus.STOPPED
    return [ScheduleDefinition(name="mix_sweep_schedule", job=job, cron_schedule=recipe.mixing.schedule,
                               default_status=status)]
