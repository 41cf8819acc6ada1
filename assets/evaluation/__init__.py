"""The evaluation group: `evaluation/<stage>` (stage.py) measures each training stage's final checkpoint."""

from assets.evaluation.stage import evaluation_assets

__all__ = ["evaluation_assets"]
