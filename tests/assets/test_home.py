"""assets/home.py: where PRETRAIN_HOME, the store and DAGSTER_HOME resolve to, and when dagster.yaml is written
(only when absent or one pretrain wrote, never over a user's own)."""

from pathlib import Path

import pytest
import yaml

from assets import home
from assets.home import PG_URL_ENV, dagster_yaml, ensure_dagster_home, pretrain_home, store_url


def test_pretrain_home_and_store_url_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PRETRAIN_HOME", str(tmp_path / "h"))
    assert pretrain_home() == (tmp_path / "h").resolve()
    assert store_url() == str((tmp_path / "h").resolve() / "store")
    monkeypatch.setenv("PRETRAIN_STORE", "s3://bucket/prefix")
    assert store_url() == "s3://bucket/prefix"
    monkeypatch.delenv("PRETRAIN_HOME")
    monkeypatch.chdir(tmp_path)
    assert pretrain_home() == (tmp_path / ".pretrain").resolve()  # the default, in the working directory
    monkeypatch.setenv("PRETRAIN_HOME", "")  # empty is unset
    assert pretrain_home() == (tmp_path / ".pretrain").resolve()
    monkeypatch.setenv("PRETRAIN_HOME", "~/somewhere")
    assert pretrain_home() == Path("~/somewhere").expanduser().resolve()


def test_dagster_home_defaults_under_pretrain_home_and_is_exported(tmp_path, monkeypatch):
    monkeypatch.setenv("PRETRAIN_HOME", str(tmp_path / "h"))
    monkeypatch.delenv("DAGSTER_HOME")
    monkeypatch.delenv(PG_URL_ENV, raising=False)
    got = ensure_dagster_home()
    assert got == (tmp_path / "h" / "dagster").resolve()
    import os
    assert os.environ["DAGSTER_HOME"] == str(got)
    assert (got / "dagster.yaml").read_text() == dagster_yaml()
    assert (got / "dagster.yaml").read_text().startswith("# Written by pretrain")
    # A DAGSTER_HOME the user set wins over PRETRAIN_HOME.
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "mine"))
    assert ensure_dagster_home() == (tmp_path / "mine").resolve()
    assert (tmp_path / "mine" / "dagster.yaml").is_file()


def test_only_a_dagster_yaml_pretrain_wrote_is_rewritten(tmp_path, monkeypatch):
    monkeypatch.delenv(PG_URL_ENV, raising=False)
    config = ensure_dagster_home() / "dagster.yaml"
    sqlite = config.read_text()
    monkeypatch.setenv(PG_URL_ENV, "postgresql+psycopg2://u:pw@db:5432/d")
    ensure_dagster_home()
    assert config.read_text() != sqlite and config.read_text().startswith("# Written by pretrain")
    # The older first line pretrain wrote is ours as well.
    config.write_text("# Embedded default: SQLite storage in this folder.\ntelemetry:\n  enabled: true\n")
    ensure_dagster_home()
    assert config.read_text() == dagster_yaml()
    # The user deleted the first line to keep their edits: left alone, whatever the environment says.
    own = "\n".join(dagster_yaml().splitlines()[1:]) + "\n# my edit\n"
    config.write_text(own)
    monkeypatch.delenv(PG_URL_ENV)
    ensure_dagster_home()
    assert config.read_text() == own
    # Same wanted text: not rewritten (the file is not touched).
    config.write_text(dagster_yaml())
    before = config.stat().st_mtime_ns
    ensure_dagster_home()
    assert config.stat().st_mtime_ns == before


def test_sqlite_is_the_default_and_postgres_comes_from_the_environment(monkeypatch):
    home = ensure_dagster_home()
    config = yaml.safe_load((home / "dagster.yaml").read_text())
    assert "storage" not in config  # Dagster's default: SQLite files in DAGSTER_HOME

    monkeypatch.setenv(PG_URL_ENV, "postgresql+psycopg2://dagster:secret@db.internal:5432/dagster")
    ensure_dagster_home()
    text = (home / "dagster.yaml").read_text()
    assert yaml.safe_load(text)["storage"] == {"postgres": {"postgres_url": {"env": PG_URL_ENV}}}
    assert "secret" not in text  # the URL is read from the environment at load, never written down

    (home / "dagster.yaml").write_text("telemetry:\n  enabled: true\n")  # the user's own file is kept
    ensure_dagster_home()
    assert (home / "dagster.yaml").read_text() == "telemetry:\n  enabled: true\n"

    for wrong in ("mysql://db/dagster", "postgresql://dagster:secret@db.internal:5432/dagster"):
        monkeypatch.setenv(PG_URL_ENV, wrong)  # a bare postgresql:// would load a driver that is not installed
        with pytest.raises(ValueError, match=r"PRETRAIN_DAGSTER_PG_URL: expected postgresql\+psycopg2://") as err:
            ensure_dagster_home()
        assert "secret" not in str(err.value)


def test_dagster_yaml_texts_parse_telemetry_is_off_and_run_monitoring_on(monkeypatch):
    monkeypatch.delenv(PG_URL_ENV, raising=False)
    monitoring = {"enabled": True, "max_resume_run_attempts": 0}
    assert yaml.safe_load(dagster_yaml()) == {"telemetry": {"enabled": False}, "run_monitoring": monitoring}
    monkeypatch.setenv(PG_URL_ENV, home.PG_SCHEME + "u@h:1/d")
    assert yaml.safe_load(dagster_yaml())["telemetry"] == {"enabled": False}
    assert yaml.safe_load(dagster_yaml())["run_monitoring"] == monitoring
