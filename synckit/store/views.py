"""Named reads of what the operator sees: ``synckit status`` (and the metrics
collector) and ``synckit sync --wait``.

Counts are summed in SQL; nothing here reads a table whole. Rows a hand edit broke do
not fail a read: a breaker's time is read guarded and parsed per row
(:class:`BreakerInfo.unreadable` names what it holds instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select

from synckit.store.alerts import among
from synckit.store.audit import Totals
from synckit.store.db import Conn
from synckit.store.moments import guarded_moment
from synckit.store.resources import BREAKER_STATES, read_moments
from synckit.store.tables import (
    audit_buckets,
    checkpoints,
    connections,
    dead_letters,
    jobs,
    outbox,
    resources,
)

__all__ = [
    "BreakerInfo",
    "CycleCounts",
    "audit_totals_of",
    "breaker_states",
    "breakers_by_state",
    "checkpoint_moment",
    "cycle_counts",
    "dead_letter_counts",
    "dead_letter_totals",
    "job_created_at",
    "outbox_pending",
    "queue_depth",
    "tenants_by_status",
]


async def queue_depth(
    conn: Conn, *, statuses: tuple[str, ...] | None = None
) -> dict[str, dict[str, int]]:
    """Job counts by kind, then status."""
    stmt = select(jobs.c.kind, jobs.c.status, func.count()).group_by(jobs.c.kind, jobs.c.status)
    if statuses is not None:
        stmt = stmt.where(jobs.c.status.in_(statuses))
    out: dict[str, dict[str, int]] = {}
    for kind, status, count in await conn.execute(stmt):
        out.setdefault(kind, {})[status] = int(count)
    return out


async def dead_letter_counts(
    conn: Conn, *, tenants: Sequence[str] | None = None
) -> dict[tuple[str, str, str], int]:
    """Dead letters by ``(tenant, connector, status)`` (of ``tenants`` only, if given)."""
    stmt = select(
        dead_letters.c.tenant, dead_letters.c.connector, dead_letters.c.status, func.count()
    ).group_by(dead_letters.c.tenant, dead_letters.c.connector, dead_letters.c.status)
    if tenants is not None:
        stmt = stmt.where(among(conn, dead_letters.c.tenant, tenants))
    rows = await conn.execute(stmt)
    return {(t, c, s): int(n) for t, c, s, n in rows}


async def dead_letter_totals(conn: Conn) -> dict[str, int]:
    """Dead letters by status."""
    rows = await conn.execute(
        select(dead_letters.c.status, func.count()).group_by(dead_letters.c.status)
    )
    return {s: int(n) for s, n in rows}


async def outbox_pending(conn: Conn) -> int:
    """Outbox messages not published yet."""
    stmt = select(func.count()).select_from(outbox).where(outbox.c.status == "pending")
    return int((await conn.execute(stmt)).scalar_one())


async def tenants_by_status(conn: Conn) -> dict[str, int]:
    """Every tenant (connections row) counted by status, as stored."""
    stmt = select(connections.c.status, func.count()).group_by(connections.c.status)
    return {st: int(n) for st, n in await conn.execute(stmt)}


async def breakers_by_state(conn: Conn) -> dict[str, int]:
    """Every resource counted by breaker state, as stored."""
    stmt = select(resources.c.state, func.count()).group_by(resources.c.state)
    return {st: int(n) for st, n in await conn.execute(stmt)}


@dataclass(frozen=True)
class BreakerInfo:
    resource_key: str
    state: str
    next_available_at: datetime | None
    consecutive_failures: int
    last_error_class: str | None
    #: ``(column, reason)`` of what a corrupt row holds (see ResourceInfo.unreadable).
    unreadable: tuple[tuple[str, str], ...] = ()


async def breaker_states(
    conn: Conn, *, keys: Sequence[str] | None = None
) -> dict[str, BreakerInfo]:
    """Every resource's breaker (of ``keys`` only, if given), by resource key."""
    stmt = select(
        resources.c.resource_key,
        resources.c.state,
        # Guarded in SQL: a value no datetime holds fails the driver's fetch otherwise.
        guarded_moment(resources.c.next_available_at),
        resources.c.consecutive_failures,
        resources.c.last_error_class,
    )
    if keys is not None:
        stmt = stmt.where(among(conn, resources.c.resource_key, keys))
    out: dict[str, BreakerInfo] = {}
    for r in await conn.execute(stmt):
        # Read as text and parsed here: one corrupt row must not fail the whole report.
        moments, bad = read_moments(r._mapping, ("next_available_at",))
        if r.state not in BREAKER_STATES:
            bad += (("state", f"unknown state {str(r.state)[:60]!r}"),)
        out[r.resource_key] = BreakerInfo(
            r.resource_key,
            r.state,
            moments["next_available_at"],
            r.consecutive_failures,
            r.last_error_class,
            bad,
        )
    return out


async def audit_totals_of(
    conn: Conn, tenants: Sequence[str], *, since: datetime
) -> dict[str, Totals]:
    """Summed ``ok``/``failed`` of ``tenants`` (all connectors and versions) since
    ``since``: one page's worth of :func:`synckit.store.audit.totals_by_tenant`."""
    if not tenants:
        return {}
    rows = await conn.execute(
        select(
            audit_buckets.c.tenant,
            func.coalesce(func.sum(audit_buckets.c.ok), 0),
            func.coalesce(func.sum(audit_buckets.c.failed), 0),
        )
        .where(audit_buckets.c.minute >= since, among(conn, audit_buckets.c.tenant, tenants))
        .group_by(audit_buckets.c.tenant)
    )
    return {t: Totals(int(ok), int(failed)) for t, ok, failed in rows}


# --- synckit sync --wait --------------------------------------------------------------


@dataclass(frozen=True)
class CycleCounts:
    """What a tenant's connector did since a moment: outcomes and dead letters."""

    ok: int = 0
    failed: int = 0
    dead_letters: int = 0


async def cycle_counts(conn: Conn, tenant: str, connector: str, since: datetime) -> CycleCounts:
    """Audited outcomes of ``tenant``'s ``connector`` from the minute of ``since`` on,
    and its dead letters last failed since ``since``."""
    minute = since.replace(second=0, microsecond=0)
    ok, failed = (
        await conn.execute(
            select(
                func.coalesce(func.sum(audit_buckets.c.ok), 0),
                func.coalesce(func.sum(audit_buckets.c.failed), 0),
            ).where(
                audit_buckets.c.tenant == tenant,
                audit_buckets.c.connector == connector,
                audit_buckets.c.minute >= minute,
            )
        )
    ).one()
    letters = (
        await conn.execute(
            select(func.count()).where(
                dead_letters.c.tenant == tenant,
                dead_letters.c.connector == connector,
                dead_letters.c.last_attempt_at >= since,
            )
        )
    ).scalar_one()
    return CycleCounts(int(ok), int(failed), int(letters))


async def checkpoint_moment(
    conn: Conn, tenant: str, connector: str, stream: str
) -> datetime | None:
    """When the checkpoint of ``tenant``'s stream was last written (None: never)."""
    at: datetime | None = (
        await conn.execute(
            select(checkpoints.c.updated_at).where(
                checkpoints.c.tenant == tenant,
                checkpoints.c.connector == connector,
                checkpoints.c.stream == stream,
            )
        )
    ).scalar()
    return at


async def job_created_at(conn: Conn, job_id: int) -> datetime | None:
    """When job ``job_id`` was enqueued (None: no such job)."""
    at: datetime | None = (
        await conn.execute(select(jobs.c.created_at).where(jobs.c.id == job_id))
    ).scalar()
    return at
