"""Health and failure handling: the loss-spike guard (skip or roll back), the per-layer figures and gradient
probe, the per-rank checks (silent data corruption, the canary, stragglers) and the step watchdog.

Each part decides from figures it is given and ends a run through trainer.exits; it may import trainer.config
and trainer.exits only. The callbacks at the top wire them into the loop.
"""
