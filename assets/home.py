"""Where a user's local state lives: PRETRAIN_HOME (default `.pretrain/` in the working directory).

    $PRETRAIN_HOME/store     the local object store (unless PRETRAIN_STORE names another, e.g. s3://…)
    $PRETRAIN_HOME/dagster   the persistent Dagster instance, DAGSTER_HOME points here
    $PRETRAIN_HOME/work      scratch space for outputs being built

The Dagster instance keeps its runs, event log and schedules in SQLite files in that folder (the embedded
default), or in PostgreSQL when PRETRAIN_DAGSTER_PG_URL is set (postgresql+psycopg2://user:password@host:5432/db):
the production setting, where several processes (the daemon, the UI, concurrent runs) write at once.
"""

from __future__ import annotations

import os
from pathlib import Path

PG_URL_ENV = "PRETRAIN_DAGSTER_PG_URL"
PG_SCHEME = "postgresql+psycopg2://"
# Files that ensure_dagster_home wrote start with one of these lines; it rewrites only those, never a user's own.
_OURS = ("# Written by pretrain", "# Embedded default: SQLite storage in this folder.")

# Run monitoring (the daemon): a run whose worker died is marked failed instead of hanging as "started"; its
# training job goes on (trainer/job/detach.py), and training_follow_sensor (assets/training/follow.py) materializes the
# stage again, which follows the job. The default run launcher cannot resume a run itself (set
# max_resume_run_attempts with the Kubernetes or Docker one).
_MONITORING = """run_monitoring:
  enabled: true
  max_resume_run_attempts: 0
"""

_SQLITE = f"""# Written by pretrain (assets/home.py): the embedded default, SQLite storage in this folder.
# Set PRETRAIN_DAGSTER_PG_URL for PostgreSQL; delete this first line to keep your own edits.
{_MONITORING}telemetry:
  enabled: false
"""

# The URL is read from the environment when the instance loads, so no password is written to disk.
_POSTGRES = f"""# Written by pretrain (assets/home.py): runs, event log and schedules in PostgreSQL at ${PG_URL_ENV}.
# Delete this first line to keep your own edits.
storage:
  postgres:
    postgres_url:
      env: {PG_URL_ENV}
{_MONITORING}telemetry:
  enabled: false
"""


def pretrain_home() -> Path:
    return Path(os.environ.get("PRETRAIN_HOME") or ".pretrain").expanduser().resolve()


def store_url() -> str:
    return os.environ.get("PRETRAIN_STORE") or str(pretrain_home() / "store")


def dagster_yaml() -> str:
    """The instance configuration the environment asks for: PostgreSQL when PRETRAIN_DAGSTER_PG_URL is set."""
    url = os.environ.get(PG_URL_ENV)
    if url is None:
        return _SQLITE
    if not url.startswith(PG_SCHEME):
        # SQLAlchemy 2.1 maps a bare postgresql:// to the psycopg 3 driver, which is not installed, and
        # dagster-postgres retries only psycopg2's errors (two processes creating tables at once).
        raise ValueError(f"{PG_URL_ENV}: expected {PG_SCHEME}user:password@host:port/database "
                         f"(the driver named), got {url.split('@')[-1] if '@' in url else url.split(':')[0] + '://…'}")
    return _POSTGRES


def ensure_dagster_home() -> Path:
    """Point DAGSTER_HOME at the persistent instance under PRETRAIN_HOME (unless the user set one), with a
    dagster.yaml for SQLite or PostgreSQL as the environment says. A dagster.yaml the user wrote is kept."""
    home = Path(os.environ.get("DAGSTER_HOME") or pretrain_home() / "dagster").resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    wanted = dagster_yaml()
    if not config.exists() or (config.read_text().startswith(_OURS) and config.read_text() != wanted):
        config.write_text(wanted)
    os.environ["DAGSTER_HOME"] = str(home)
    return home
