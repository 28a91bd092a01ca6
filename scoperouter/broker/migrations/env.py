"""Alembic environment of the broker's database (``scoperouter broker db upgrade``).

Run through :func:`scoperouter.broker.migrate.upgrade`, which passes an open connection in
``config.attributes["connection"]`` (so PostgreSQL replicas upgrading together serialise on an
advisory lock taken on that connection). The models in store.py are the reference: a test
checks that the migrated schema matches them.
"""

from __future__ import annotations

from alembic import context

from scoperouter.broker.tables import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:  # pragma: no cover - always called with a connection
    raise RuntimeError("run migrations with `scoperouter broker db upgrade`")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
