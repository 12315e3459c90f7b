"""Schema migrations: Alembic, shipped inside the package, driven through one connection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from synckit.store.db import Database

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


#: The PostgreSQL advisory lock every schema change holds for its transaction: two
#: ``synckit db upgrade`` started at once run one after the other (the second finds
#: nothing to do) instead of racing on CREATE TABLE (``pg_type_typname_nsp_index``).
#: SQLite's write lock (BEGIN IMMEDIATE) does the same there.
SCHEMA_LOCK = 7372146550912


def lock_schema(connection: Connection) -> None:
    """Take :data:`SCHEMA_LOCK` for the connection's transaction (PostgreSQL)."""
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")


async def upgrade(db: Database, revision: str = "head") -> None:
    """Bring the schema up to ``revision``; a no-op when it is already there.

    Public as ``synckit.migrate_database``: ``db = await open_database(url)`` then
    ``await migrate_database(db)``, both awaited (``synckit db upgrade`` does the same)."""

    def run(connection: Connection) -> None:
        lock_schema(connection)
        command.upgrade(alembic_config(connection), revision)

    async with db.begin() as conn:
        await conn.run_sync(run)


async def downgrade(db: Database, revision: str) -> None:
    """Take the schema down to ``revision`` (``base`` removes every table)."""

    def run(connection: Connection) -> None:
        command.downgrade(alembic_config(connection), revision)

    async with db.begin() as conn:
        await conn.run_sync(run)


async def current(db: Database) -> str | None:
    """The revision the database is at, or None for an unmigrated database."""

    def run(connection: Connection) -> Any:
        return MigrationContext.configure(connection).get_current_revision()

    async with db.begin() as conn:
        rev = await conn.run_sync(run)
    return str(rev) if rev is not None else None
