"""Streams' positions: the ``checkpoints`` table."""

from __future__ import annotations

from typing import Any

from sqlalchemy import String, func, select, type_coerce
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.store.tables import checkpoints, connections

__all__ = ["oldest_active_checkpoints"]


async def oldest_active_checkpoints(conn: AsyncConnection) -> list[tuple[str, str, Any]]:
    """``(connector, stream, stored)`` per connector and stream: when the oldest checkpoint
    of an active tenant was stored, as the driver hands it over (text on SQLite; read it
    with :func:`~synckit.store.jobs.read_moment`, which names a value no datetime holds).
    One grouped read."""
    oldest = type_coerce(func.min(checkpoints.c.updated_at), String)
    rows = await conn.execute(
        select(checkpoints.c.connector, checkpoints.c.stream, oldest)
        .join(connections, connections.c.tenant == checkpoints.c.tenant)
        .where(connections.c.status == "active")
        .group_by(checkpoints.c.connector, checkpoints.c.stream)
    )
    return [(connector, stream, raw) for connector, stream, raw in rows]
