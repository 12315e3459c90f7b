"""Where the Graph mail example keeps the messages it syncs: its own table, its own SQL.

Records are the connector's business, not synckit's: ``mail_messages`` is not part of
synckit's schema, and synckit's tables are never touched here. It lives in the same
database for the example's convenience (a real connector may write anywhere), built with
SQLAlchemy Core like synckit's own tables, with synckit's ``UTCDateTime`` so that times
come back timezone-aware on SQLite too. The connector calls the operations below and
builds no SQL itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Column, MetaData, String, Table, Text, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.schema import CreateTable

from synckit.store import UTCDateTime
from synckit.store.db import Database

__all__ = [
    "create_tables",
    "forget_message",
    "forget_unseen",
    "mail_messages",
    "synced_ids",
    "upsert_message",
]

metadata = MetaData()

#: The synced messages: one row per (tenant, message id).
mail_messages = Table(
    "mail_messages",
    metadata,
    Column("tenant", String(200), primary_key=True),
    Column("id", String(500), primary_key=True),
    Column("folder", String(200), nullable=False),
    Column("internet_message_id", String(1000), nullable=False),
    Column("subject", Text, nullable=False),
    Column("sender", String(320), nullable=False),
    Column("received_at", UTCDateTime(), nullable=False),
    Column("is_read", Boolean, nullable=False),
    # When this row was last written by a cycle; a full resync removes older rows.
    Column("synced_at", UTCDateTime(), nullable=False),
)

_created: weakref.WeakSet[AsyncEngine] = weakref.WeakSet()


async def create_tables(db: Database) -> None:
    """Create ``mail_messages`` if it does not exist (once per process and database)."""
    if db.engine in _created:
        return
    async with db.begin() as conn:
        # IF NOT EXISTS: several workers may start at once on a fresh database.
        await conn.execute(CreateTable(mail_messages, if_not_exists=True))
    _created.add(db.engine)


def _upsert(conn: AsyncConnection, row: Mapping[str, Any]) -> Any:
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    stmt = insert(mail_messages).values(**row)
    changed = {k: stmt.excluded[k] for k in row if k not in ("tenant", "id")}
    return stmt.on_conflict_do_update(index_elements=["tenant", "id"], set_=changed)


async def upsert_message(db: Database, row: Mapping[str, Any]) -> None:
    """Store one message (a row of ``mail_messages``), replacing what was stored for it."""
    async with db.begin() as conn:
        await conn.execute(_upsert(conn, row))


async def forget_message(db: Database, tenant: str, message_id: str) -> None:
    """Remove a message the mailbox no longer has."""
    async with db.begin() as conn:
        await conn.execute(
            delete(mail_messages).where(
                mail_messages.c.tenant == tenant, mail_messages.c.id == message_id
            )
        )


async def forget_unseen(db: Database, tenant: str, folder: str, since: datetime) -> int:
    """Remove the folder's messages no cycle wrote since ``since``; return how many."""
    async with db.begin() as conn:
        result = await conn.execute(
            delete(mail_messages).where(
                mail_messages.c.tenant == tenant,
                mail_messages.c.folder == folder,
                mail_messages.c.synced_at < since,
            )
        )
    return int(result.rowcount or 0)


def synced_ids(conn: Connection) -> dict[str, set[str]]:
    """The ids of the synced messages per tenant, on a synchronous connection (the demo's
    reader, which reads beside the running worker)."""
    out: dict[str, set[str]] = {}
    for tenant, message_id in conn.execute(select(mail_messages.c.tenant, mail_messages.c.id)):
        out.setdefault(tenant, set()).add(message_id)
    return out
