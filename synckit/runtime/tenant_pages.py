"""Tenants as the read commands show them: a keyset page at a time, counted in SQL, every
row read through guards.

``synckit tenants ls`` reads one page of tenants by name (``limit`` after the name
``after``) and the number of tenants by status in the same transaction, so it costs the
same at 100,000 tenants as at 10; ``synckit tenants show`` reads one tenant and its
checkpoints. A corrupt row is shown, never fatal: timestamps come back guarded
(:func:`synckit.store.jobs.guarded_moment`, so a value no datetime holds does not fail
the driver's fetch), configs and cursors as text, each parsed per row and named in
``unreadable`` when it does not read.

Rows are turned into :class:`~synckit.runtime.tenants.Tenant` by the tenants module
itself, with secrets masked (``reveal=False``): no key is needed to list tenants.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Text, cast, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

# The tenants module's own column list and row reader (config, secrets, status,
# timestamps), so that a tenant reads the same here as everywhere else.
from synckit.runtime.tenants import _COLUMNS as _TENANT_COLUMNS
from synckit.runtime.tenants import Tenant, TenantNotFound
from synckit.runtime.tenants import _tenant as _read_tenant
from synckit.store.db import Database
from synckit.store.jobs import guarded_moment, read_moment
from synckit.store.tables import checkpoints, connections

__all__ = ["Checkpoint", "TenantPage", "page_tenants", "read_checkpoints", "read_tenant"]

_GUARDED = ("created_at", "updated_at")
# The tenants module's columns with the timestamps guarded in SQL as well: read as text
# alone, a PostgreSQL year 20000 still fails the fetch in the driver.
_COLUMNS = tuple(
    guarded_moment(connections.c[c.name]) if c.name in _GUARDED else c for c in _TENANT_COLUMNS
)


@dataclass(frozen=True)
class TenantPage:
    """One page of tenants by name and what every tenant matching the filters sums to."""

    tenants: list[Tenant]
    #: Every tenant matching the filters, by stored status (an unknown one as stored).
    by_status: dict[str, int]
    #: The name to pass as ``after`` for the next page; None when this one is the last.
    next_after: str | None = None

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


def _filtered(stmt: Any, connector: str | None, status: str | None) -> Any:
    if connector:
        stmt = stmt.where(connections.c.connector == connector)
    if status:
        stmt = stmt.where(connections.c.status == status)
    return stmt


async def _page(
    conn: AsyncConnection,
    *,
    limit: int,
    after: str | None,
    connector: str | None,
    status: str | None,
) -> tuple[list[Tenant], str | None]:
    stmt = _filtered(select(*_COLUMNS), connector, status).order_by(connections.c.tenant)
    if after is not None:
        stmt = stmt.where(connections.c.tenant > after)
    # One row past the page says whether there is a next one.
    rows = list(await conn.execute(stmt.limit(limit + 1)))
    found = [_read_tenant(r, reveal=False, cipher=None) for r in rows[:limit]]
    return found, found[-1].tenant if len(rows) > limit else None


async def page_tenants(
    db: Database,
    *,
    limit: int,
    after: str | None = None,
    connector: str | None = None,
    status: str | None = None,
) -> TenantPage:
    """Up to ``limit`` tenants by name after the name ``after`` (of ``connector`` and in
    ``status``, if given), with secrets masked, and the count of every matching tenant
    by status."""
    if limit < 1:
        raise ValueError("a page holds at least one tenant")
    async with db.begin() as conn:
        counts = _filtered(
            select(connections.c.status, func.count()).group_by(connections.c.status),
            connector,
            status,
        )
        by_status = {str(s): int(n) for s, n in await conn.execute(counts)}
        found, next_after = await _page(
            conn, limit=limit, after=after, connector=connector, status=status
        )
    return TenantPage(found, by_status, next_after)


async def read_tenant(db: Database, tenant: str) -> Tenant:
    """One tenant, secrets masked, or :class:`TenantNotFound`; a corrupt row reads."""
    async with db.begin() as conn:
        row = (await conn.execute(select(*_COLUMNS).where(connections.c.tenant == tenant))).first()
    if row is None:
        raise TenantNotFound(f"no tenant {tenant!r}")
    return _read_tenant(row, reveal=False, cipher=None)


@dataclass(frozen=True)
class Checkpoint:
    """One stream's checkpoint. A cursor that is not JSON (or holds a number no reader
    takes) is None, an ``updated_at`` that is not a timestamp too; ``unreadable`` names
    each with the reason, as ``{column: reason}``."""

    connector: str
    stream: str
    cursor: Any
    updated_at: datetime | None
    unreadable: dict[str, str] = field(default_factory=dict)


def _cursor(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {str(exc)[:120]}") from None
    except ValueError as exc:  # JSON, with a number past Python's digit limit
        raise ValueError(f"cannot be read: {str(exc)[:120]}") from None


def _checkpoint(r: Any) -> Checkpoint:
    bad: dict[str, str] = {}
    try:
        cursor = _cursor(r.cursor)
    except ValueError as exc:
        cursor, bad["cursor"] = None, str(exc)
    try:
        updated = read_moment(r.updated_at)
    except ValueError as exc:
        updated, bad["updated_at"] = None, str(exc)
    return Checkpoint(r.connector, r.stream, cursor, updated, bad)


async def read_checkpoints(db: Database, tenant: str) -> list[Checkpoint]:
    """Every stream's checkpoint of ``tenant``, by connector and stream."""
    async with db.begin() as conn:
        rows = await conn.execute(
            select(
                checkpoints.c.connector,
                checkpoints.c.stream,
                # As text, parsed per row: the driver's JSON decoding would fail the read.
                cast(checkpoints.c.cursor, Text).label("cursor"),
                guarded_moment(checkpoints.c.updated_at),
            )
            .where(checkpoints.c.tenant == tenant)
            .order_by(checkpoints.c.connector, checkpoints.c.stream)
        )
        return [_checkpoint(r) for r in rows]
