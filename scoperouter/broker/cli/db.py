"""``scoperouter broker db upgrade``: create or upgrade the database schema (Alembic)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from scoperouter.broker.cli.common import config_arg, guard, load

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers

UPGRADE = """\
Create or upgrade the database schema to this release's (Alembic head). Safe to run any number of
times, and from several replicas at once (PostgreSQL: serialised by an advisory lock).
"""

EPILOG = """\
example:
  scoperouter broker db upgrade --config /etc/scoperouter/broker.yaml
"""


def register(sub: Subparsers) -> argparse.ArgumentParser:
    db = sub.add_parser(
        "db",
        help="database schema (Alembic migrations)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    db_sub = db.add_subparsers(dest="db_command", metavar="COMMAND")
    db_sub.required = True
    upgrade = db_sub.add_parser(
        "upgrade",
        help="create or upgrade the schema",
        description=UPGRADE,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_arg(upgrade)
    upgrade.set_defaults(func=guard(run_upgrade))
    return db


def run_upgrade(args: argparse.Namespace) -> int:
    from scoperouter.broker import migrate

    config = load(args)
    before, after = migrate.upgrade(config.database_url())
    if before == after:
        print(f"database schema already current ({after})")
    else:
        print(f"database schema upgraded: {before or '(empty)'} -> {after}")
    return 0
