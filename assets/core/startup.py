"""What a process builds once and keeps for its life (the imports, the recipe, the Dagster definitions, the asset
graph, the instance) is built with Python's cyclic garbage collector paused, then frozen out of its reach.

    with built_to_keep():
        defs = build_defs(recipe)

Building the definitions of 100 sources allocates a few hundred thousand objects that all stay alive; the collector
scanned them again and again while they were made, and once more at exit: 1.1 s of a 2.9 s `pretrain status`
(bench/orchestration.py). Paused, nothing is scanned; frozen afterwards (gc.freeze), later collections leave them
out, as CPython's documentation advises for a long-lived heap. The garbage already there is collected first, so
only cyclic garbage made inside the block is never collected: it wraps only what is built to stay (a nested block
leaves the pause to the outermost). That first collection scans what is not frozen yet: little in a command, where
the blocks come early, and the first block in a long process (a test worker) pays for its whole heap once.
"""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def built_to_keep():
    """The collector paused for the block; then what exists is frozen and collection starts again."""
    outermost = gc.isenabled()
    if outermost:
        gc.collect()  # not frozen with the rest: only the block's own garbage may be
    gc.disable()
    try:
        yield
    finally:
        if outermost:
            gc.freeze()
            gc.enable()
