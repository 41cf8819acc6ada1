"""Report back to Dagster when the trainer runs under Dagster Pipes (the launcher resource).

    reporter = PipesReporter.open()   # None when not launched through Pipes (standalone, tests)
    reporter.record({"event": "train", "step": 10, ...})   # a custom message the asset reads back
    reporter.log("step 10 | loss ...")                     # a line in the Dagster run's log
    reporter.close()

Only rank 0 opens the channel: every rank inherits the Pipes environment from the launcher, and one
writer is what the asset expects. dagster-pipes is the trainer's only Dagster dependency and is
imported here alone, lazily (DESIGN.md).
"""

from __future__ import annotations

import math
import os

PIPES_ENV = "DAGSTER_PIPES_CONTEXT"


def _plain(value):
    """JSON-safe: NaN/inf become strings (a skipped step's loss may be NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class PipesReporter:
    def __init__(self, context):
        self._context = context

    @classmethod
    def open(cls, rank: int = 0) -> PipesReporter | None:
        if rank != 0 or PIPES_ENV not in os.environ:
            return None
        from dagster_pipes import open_dagster_pipes

        return cls(open_dagster_pipes())

    def record(self, record: dict) -> None:
        self._context.report_custom_message(_plain(record))

    def log(self, line: str) -> None:
        self._context.log.info(line)

    def close(self) -> None:
        self._context.close()
