"""Where a user's local state lives: PRETRAIN_HOME (default `.pretrain/` in the working directory).

    $PRETRAIN_HOME/store     the local object store (unless PRETRAIN_STORE names another, e.g. s3://…)
    $PRETRAIN_HOME/dagster   the persistent Dagster instance (SQLite), DAGSTER_HOME points here
    $PRETRAIN_HOME/work      scratch space for outputs being built
"""

from __future__ import annotations

import os
from pathlib import Path


def pretrain_home() -> Path:
    return Path(os.environ.get("PRETRAIN_HOME") or ".pretrain").expanduser().resolve()


def store_url() -> str:
    return os.environ.get("PRETRAIN_STORE") or str(pretrain_home() / "store")


def ensure_dagster_home() -> Path:
    """Point DAGSTER_HOME at the persistent instance under PRETRAIN_HOME (unless the user set one)."""
    home = Path(os.environ.get("DAGSTER_HOME") or pretrain_home() / "dagster").resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text("# Embedded default: SQLite storage in this folder.\ntelemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(home)
    return home
