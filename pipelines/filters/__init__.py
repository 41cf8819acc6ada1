"""Filtering: the filter steps (URL lists, language ID, Gopher, C4, FineWeb, PII, code rules, the quality model),
their config as the recipe writes it, and the linear quality model. Every drop is counted by its reason.

It may import the shared pipelines.shards and pipelines.runner.
"""
