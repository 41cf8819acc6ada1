"""The demo recipe's asset graph as the Definitions expose it: every asset key, its group, code version and
upstream keys, and every asset check key, against asset_snapshot.json.

A code version that changes makes every existing materialization of that asset stale, so a refactor that
only moves code must leave this file as it is. Regenerate it (PRETRAIN_WRITE_SNAPSHOT=1) only for a change
that means to make outputs stale, and say so in the commit.
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
        assets[key.to_user_string()] = {"group": node.group_name, "code_version": node.code_version,
                                         "deps": sorted(k.to_user_string() for k in node.parent_keys)}
    checks = sorted(f"{c.asset_key.to_user_string()}:{c.name}" for c in graph.asset_check_keys)
    return {"assets": assets, "checks": checks}


def test_asset_keys_groups_code_versions_and_checks_match_the_snapshot():
    current = _snapshot()
    if os.environ.get("PRETRAIN_WRITE_SNAPSHOT"):
        SNAPSHOT.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    assert current == json.loads(SNAPSHOT.read_text())
