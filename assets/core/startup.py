"""What a process builds once and keeps for its life (the imports, the recipe, the Dagster definitions, the asset
graph, the instance) is built with Python's cyclic garbage collector paused, then frozen out of its reach.

    with built_to_keep():
        defs = build_defs(recipe)

Building the definitions of 100 sources allocates a few hundred thousand objects that all stay alive; the collector
scanned them again and again while they were made, and once more at exit: 1.1 s of a 2.9 s `pretrain status`
(bench/orchestration.py). Paused, nothing is scanned; frozen afterwards (gc.freeze), later collections leave them
out, as CPython's documentation advises for a long-lived heap. The garbage already there is collected first, so
only cyclic garbage made inside the block is never collected (a nested block leaves the pause to the outermost).

Frozen objects are never collected, even once they are garbage, so only a process that owns what it builds may
freeze it: the code location's (assets/definitions.py builds `defs` once a process) and a `pretrain` command's own
process (`own_process()`, called by the main() of assets/cli/command.py when it reads sys.argv). A caller that runs the command
as a function (a test, another program) runs it many times in one process: there the block does nothing, or each
run's definitions would stay in memory for good, and each block's first collection would scan the whole heap.
"""

from __future__ import annotations

import contextlib
import gc

_owned = {"process": False}


def own_process() -> None:
    """This process runs one command and ends: what `built_to_keep(only_in_own_process=True)` wraps lives as long
    as it."""
    _owned["process"] = True


@contextlib.contextmanager
def built_to_keep(only_in_own_process: bool = False):
    """The collector paused for the block; then what exists is frozen and collection starts again. With
    `only_in_own_process` (a pretrain command's set-up), only where own_process() was called."""
    outermost = gc.isenabled()
    if (only_in_own_process and not _owned["process"]) or not outermost:
        yield
        return
    gc.collect()  # not frozen with the rest: only the block's own garbage may be
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
