"""The demo recipe's asset graph as the Definitions expose it: every asset key, its group and upstream keys, and
every asset check key, against asset_snapshot.json. Regenerate it (PRETRAIN_WRITE_SNAPSHOT=1) for a change that
means to add, remove or rewire assets, and say so in the commit.

Code versions are not pinned here: they are derived from the code each asset runs and its recipe section
(assets/core/source_hash.py), so any edit moves them; tests/assets/test_definitions.py checks that an edit moves
exactly the assets that use the edited code.
"""

import json
import os
from pathlib import Path

from assets.recipe import DEMO_RECIPE, load_recipe

SNAPSHOT = Path(__file__).with_name("asset_snapshot.json")


def _snapshot() -> dict:
    from assets.definitions import build_defs

    graph = build_defs(load_recipe(DEMO_RECIPE)).resolve_asset_graph()
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        assets[key.to_user_string()] = {"group": node.group_name,
                                         "deps": sorted(k.to_user_string() for k in node.parent_keys)}
    checks = sorted(f"{c.asset_key.to_user_string()}:{c.name}" for c in graph.asset_check_keys)
    return {"assets": assets, "checks": checks}


def test_asset_keys_groups_deps_and_checks_match_the_snapshot():
    current = _snapshot()
    if os.environ.get("PRETRAIN_WRITE_SNAPSHOT"):
        SNAPSHOT.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    assert current == json.loads(SNAPSHOT.read_text())
