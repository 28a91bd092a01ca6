"""The SQLAlchemy engine of the broker's database: what differs between SQLite and PostgreSQL
(the store's docstring says why)."""

from __future__ import annotations

import sqlite3

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.pool import ConnectionPoolEntry, SingletonThreadPool


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


CONNECT_TIMEOUT = 10  # seconds, PostgreSQL


def make_engine(url: str, *, immediate: bool | None = False, pool_size: int = 10) -> Engine:
    """An engine for `url`. On SQLite, connections use WAL and a busy timeout, and
    `immediate` says how transactions begin: True ``BEGIN IMMEDIATE`` (writers: the write lock
    up front), False ``BEGIN``, None no BEGIN at all (autocommit: each statement reads its own
    consistent snapshot, the cheapest for the polling path's one-statement reads)."""
    if is_sqlite(url):
        connect_args = {"timeout": 30, "check_same_thread": False}
        if immediate is None:
            # Autocommit reads hold no transaction, so a connection can stay with its thread
            # (no pool queue per checkout) and needs no ROLLBACK when it is given back.
            engine = create_engine(
                url,
                connect_args=connect_args,
                poolclass=SingletonThreadPool,
                pool_reset_on_return=None,
            )
        else:
            engine = create_engine(url, connect_args=connect_args)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
            # let SQLAlchemy's BEGIN below be the only transaction control
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        if immediate is not None:

            @event.listens_for(engine, "begin")
            def _on_begin(connection: Connection) -> None:
                connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    # connect_timeout: a database that does not answer fails a request in seconds, not after
    # the kernel's TCP retries (minutes)
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=20,
        pool_pre_ping=True,
        connect_args={"connect_timeout": CONNECT_TIMEOUT},
    )
