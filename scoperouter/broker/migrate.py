"""Schema migrations (Alembic) run from code: ``scoperouter broker db upgrade`` and serve's
automatic upgrade.

Why an advisory lock on PostgreSQL: replicas started together would each try to upgrade; the
first takes ``pg_advisory_xact_lock``, the others wait for it and then find the schema current.
SQLite has one writer at a time anyway (the upgrade runs in an IMMEDIATE transaction).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

from scoperouter.broker.engine import make_engine

MIGRATIONS = Path(__file__).parent / "migrations"
LOCK_ID = 0x5C0DE0B5  # pg_advisory_xact_lock key of the broker's migrations


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head() -> str:
    head_revision = ScriptDirectory.from_config(_config()).get_current_head()
    assert head_revision is not None
    return head_revision


def current(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(url: str, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade the database at `url`; returns (revision before, revision after)."""
    engine = make_engine(url, immediate=True)
    try:
        before = current(engine)
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": LOCK_ID})
            config = _config()
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
        return before, current(engine) or ""
    finally:
        engine.dispose()


def is_current(url: str) -> bool:
    engine = make_engine(url)
    try:
        return current(engine) == head()
    finally:
        engine.dispose()


def revision(message: str, url: str) -> None:  # pragma: no cover - developers only
    """Autogenerate a new revision against the database at `url` (at head)."""
    engine = make_engine(url)
    with engine.begin() as connection:
        config = _config()
        config.attributes["connection"] = connection
        command.revision(config, message=message, autogenerate=True)
