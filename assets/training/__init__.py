"""The training group: `training/<stage>` (stage.py), one asset per stage of the recipe's `training` section
(main, each long-context stage, anneal), each a trainer run through the launcher resource; inputs.py gathers
what a trainer reads (the packed outputs, the tokenizer, their lineage) for training, the mix sweep and
evaluation alike."""

from assets.training.stage import training_assets

__all__ = ["training_assets"]
