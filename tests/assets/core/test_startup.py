"""assets/core/startup.py: the collector paused while a process builds what it keeps, then frozen; only in a process
that owns what it builds."""

import json
import subprocess
import sys
import textwrap

from tests.conftest import REPO


def test_what_is_built_to_keep_is_built_with_the_collector_paused_then_frozen():
    # In a process of its own: freezing is for the life of a process, and this one is pytest's.
    probe = textwrap.dedent("""
        import gc, json, weakref
        from assets.core.startup import built_to_keep, own_process

        class Node:
            pass

        gc.disable()  # so that only the block collects it
        node = Node()
        node.self = node
        before_block = weakref.ref(node)
        del node  # garbage from before the block: collected, not frozen
        gc.enable()
        seen = {"before": gc.get_freeze_count()}
        with built_to_keep():
            seen["paused"] = not gc.isenabled()
            with built_to_keep():  # nested: the outermost block resumes collection
                kept = [[] for _ in range(1000)]
            seen["paused_after_nested"] = not gc.isenabled()
        seen["enabled"] = gc.isenabled()
        seen["collected"] = before_block() is None
        # A command's set-up pauses and freezes only in the command's own process, not in a caller's.
        frozen = gc.get_freeze_count()
        with built_to_keep(only_in_own_process=True):
            seen["paused_in_a_caller"] = not gc.isenabled()
        seen["frozen_in_a_caller"] = gc.get_freeze_count() - frozen
        own_process()
        with built_to_keep(only_in_own_process=True):
            seen["paused_in_its_own"] = not gc.isenabled()
        seen["frozen"] = gc.get_freeze_count() - seen["before"]
        print(json.dumps(seen))
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    seen = json.loads(done.stdout)
    assert seen["paused"] and seen["paused_after_nested"] and seen["enabled"] and seen["collected"]
    assert seen["frozen"] >= 1000  # the block's lists, at least
    assert not seen["paused_in_a_caller"] and seen["frozen_in_a_caller"] == 0 and seen["paused_in_its_own"]
