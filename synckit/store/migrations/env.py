"""Alembic environment: synckit always hands it an open connection (see synckit.store.migrate)."""

from __future__ import annotations

from alembic import context

from synckit.store.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reachable by running alembic by hand
    raise RuntimeError("run migrations through `synckit db upgrade`, not the alembic CLI")

context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
