"""Alembic environment: runs on the connection handed in by ``broker.db.engine.migrate``."""

from alembic import context

from broker.db.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reached from the alembic CLI without our wrapper
    raise RuntimeError("run migrations through `render-broker migrate` (broker.db.engine.migrate)")
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
