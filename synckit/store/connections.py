"""Tenants' connections: the ``connections`` table."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import update
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.store.tables import connections

# --- the runtime's operations on connections (budgets, re-authorisation) ----------------


async def pause_active(
    conn: AsyncConnection, tenants: Iterable[str], *, reason: str, now: datetime
) -> list[str]:
    """Pause the active connections of ``tenants`` (a connection waiting for
    re-authorisation or already paused is left as it is); return the tenants paused."""
    wanted = sorted(set(tenants))
    if not wanted:
        return []
    res = await conn.execute(
        update(connections)
        .where(connections.c.tenant.in_(wanted), connections.c.status == "active")
        .values(status="paused", status_reason=reason[:500], updated_at=now)
        .returning(connections.c.tenant)
    )
    return sorted(r[0] for r in res)


def mark_needs_reauth_sync(
    conn: Connection, resource_key: str, reason: str, *, now: datetime
) -> None:
    """The connection of ``resource_key`` waits for re-authorisation (``reason``, already
    redacted, is cut to 500 characters), in the caller's transaction."""
    conn.execute(
        update(connections)
        .where(connections.c.resource_key == resource_key)
        .values(status="needs_reauth", status_reason=reason[:500], updated_at=now)
    )
