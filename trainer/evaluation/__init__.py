"""Evaluation and export: the zero-shot tasks over the local benchmark files, the log-likelihood evaluator the
loop and `python -m trainer.evaluation.evaluate` run, lm-evaluation-harness on a checkpoint exported to Hugging
Face format, and that export.

It may import trainer.config, trainer.model, trainer.data, trainer.checkpoint (the weights) and
trainer.reporting (the Pipes channel back to the evaluation asset); the loop uses it through a callback.
"""
