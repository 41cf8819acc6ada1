"""The training group: `training/<stage>` (stage.py), one asset per stage of the recipe's `training` section
(main, each long-context stage, anneal), each a trainer run through the launcher resource; inputs.py gathers
what a trainer reads (the packed outputs, the tokenizer, their lineage) for training, the mix sweep and
evaluation alike; follow.py's sensor materializes a stage again when its run's worker died while its job trains
on, so that the job is followed again."""

from assets.training.follow import follow_sensors
from assets.training.stage import training_assets

__all__ = ["follow_sensors", "training_assets"]
