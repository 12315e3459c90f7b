"""Tenants as the read commands show them: a keyset page at a time, counted in SQL, every
row read through guards.

``synckit tenants ls`` reads one page of tenants by name (``limit`` after the name
``after``) and the number of tenants by status in the same transaction, so it costs the
same at 100,000 tenants as at 10; ``synckit tenants show`` reads one tenant and its
checkpoints. A corrupt row is shown, never fatal: timestamps come back guarded
(:func:`synckit.store.moments.guarded_moment`, so a value no datetime holds does not fail
the driver's fetch), configs and cursors as text, each parsed per row and named in
``unreadable`` when it does not read.

Rows are turned into :class:`~synckit.runtime.admin.tenants.Tenant` by the tenants module
itself, with secrets masked (``reveal=False``): no key is needed to list tenants.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from synckit.errors.exceptions import TenantNotFound
from synckit.runtime.admin.tenants import Tenant

# The tenants module's own row reader (config, secrets, status, timestamps), so that a
# tenant reads the same here as everywhere else.
from synckit.runtime.admin.tenants import _tenant as _read_tenant
from synckit.store import connections as connection_store
from synckit.store.db import Conn, Database
from synckit.store.moments import read_moment

__all__ = ["Checkpoint", "TenantPage", "page_tenants", "read_checkpoints", "read_tenant"]


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


async def _page(
    conn: Conn,
    *,
    limit: int,
    after: str | None,
    connector: str | None,
    status: str | None,
) -> tuple[list[Tenant], str | None]:
    # One row past the page says whether there is a next one.
    rows = await connection_store.tenant_page_rows(
        conn, limit=limit + 1, after=after, connector=connector, status=status
    )
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
    async with db.read() as conn:
        by_status = await connection_store.count_tenants_by_status(
            conn, connector=connector, status=status
        )
        found, next_after = await _page(
            conn, limit=limit, after=after, connector=connector, status=status
        )
    return TenantPage(found, by_status, next_after)


async def read_tenant(db: Database, tenant: str) -> Tenant:
    """One tenant, secrets masked, or :class:`TenantNotFound`; a corrupt row reads."""
    async with db.read() as conn:
        row = await connection_store.read_tenant_row(conn, tenant, guarded=True)
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
    async with db.read() as conn:
        rows = await connection_store.checkpoint_rows(conn, tenant)
    return [_checkpoint(r) for r in rows]
