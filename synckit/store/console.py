r"""The console's reads that no other storage module offers: bounded counts and pages.

The console (:mod:`synckit.web`) reads through the same operations as the CLI wherever the
CLI has the read (jobs, dead letters, tenants, checkpoints, resources, outbox messages,
alerts); what is here is what only the console needs: the overview's figures read at a
cost that does not grow with the tables (bounded :class:`~synckit.store.pages.Count`\ s),
a page of tenants joined with their resources (one statement rather than one per
tenant), and the audit sums of the tenant page and the overview. Jobs by state are
counted kind by kind on ``ix_jobs_kind_status``, the kinds found by a loose index scan,
so no count reads more than ``cap`` index entries per state. The keyset pages of jobs and
dead letters are :func:`synckit.store.jobs.admin.job_page` and
:func:`synckit.store.dead_letters.reads.dlq_page`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.store.audit import Totals
from synckit.store.db import Database
from synckit.store.dead_letters import rows as dlq_rows
from synckit.store.jobs.admin import JOB_STATUSES, job_kinds
from synckit.store.moments import from_row
from synckit.store.pages import COUNT_CAP, Count, Page, bounded, estimates, page_size
from synckit.store.tables import (
    audit_buckets,
    connections,
    dead_letters,
    jobs,
    outbox,
    pending_authorizations,
    poll_ticks,
    resources,
)

if TYPE_CHECKING:
    from synckit.store.outbox import OutboxInfo


__all__ = [
    "OpenBreaker",
    "TenantRow",
    "authorization_tenant",
    "burning_tenants",
    "dlq_growth",
    "dlq_open",
    "dlq_total",
    "job_counts",
    "open_breakers",
    "outbox_page",
    "outbox_pending",
    "outbox_topics",
    "outbox_total",
    "tenant_counts",
    "tenant_page",
    "tenant_row",
    "tenant_total",
    "tenant_totals",
    "throughput",
]


# --- jobs -------------------------------------------------------------------------------


async def job_counts(conn: AsyncConnection, *, cap: int = COUNT_CAP) -> dict[str, Count]:
    """Jobs by state, each count bounded: kind by kind through ``(kind, status)``, until
    ``cap`` rows of the state are seen."""
    kinds = await job_kinds(conn)
    out: dict[str, Count] = {}
    by_status: dict[str, int] | None = None
    for status in JOB_STATUSES:
        seen = 0
        for kind in kinds:
            c = await bounded(
                conn, jobs, jobs.c.kind == kind, jobs.c.status == status, cap=cap - seen
            )
            seen += c.n + (1 if c.more else 0)
            if seen > cap:
                break
        if seen > cap:
            if by_status is None:
                by_status = await estimates(conn, "jobs", "status")
            out[status] = Count(cap, True, by_status.get(status))
        else:
            out[status] = Count(seen)
    return out


# --- tenants ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantRow:
    """A tenant with what its resource says about it (no config, no tokens)."""

    tenant: str
    connector: str
    resource_key: str
    status: str
    status_reason: str | None
    schedule: str | None
    breaker: str
    cooldown_until: datetime | None
    next_available_at: datetime | None
    paced_reason: str | None
    max_in_flight: int | None
    last_error_class: str | None


async def tenant_page(
    db: Database,
    *,
    status: str | None = None,
    connector: str | None = None,
    after: str | None = None,
    limit: int = 50,
    only: str | None = None,
    prefix: str | None = None,
) -> Page[TenantRow]:
    """Tenants by name after ``after``, each with its resource's breaker and pacing;
    ``prefix``: only names starting with it (exactly, case and all, on both engines)."""
    size = page_size(limit)
    c, r = connections.c, resources.c
    stmt = (
        select(
            c.tenant,
            c.connector,
            c.resource_key,
            c.status,
            c.status_reason,
            c.schedule,
            r.state,
            r.cooldown_until,
            r.next_available_at,
            r.paced_reason,
            r.max_in_flight,
            r.last_error_class,
        )
        .select_from(connections.outerjoin(resources, r.resource_key == c.resource_key))
        .order_by(c.tenant)
        .limit(size + 1)
    )
    stmt = stmt.where(*_tenant_where(status=status, connector=connector, prefix=prefix))
    if after:
        stmt = stmt.where(c.tenant > after)
    if only is not None:
        stmt = stmt.where(c.tenant == only)
    async with db.read() as conn:
        rows = [
            from_row(TenantRow, x, breaker=x.state or "closed") for x in await conn.execute(stmt)
        ]
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, rows[-1].tenant if more else None)


def _tenant_where(*, status: str | None, connector: str | None, prefix: str | None) -> list[Any]:
    c = connections.c
    where: list[Any] = []
    if status:
        where.append(c.status == status)
    if connector:
        where.append(c.connector == connector)
    if prefix:
        # Not LIKE: SQLite's ignores case, and the prefix may hold % or _.
        where.append(func.substr(c.tenant, 1, len(prefix)) == prefix)
    return where


async def tenant_total(
    db: Database,
    *,
    status: str | None = None,
    connector: str | None = None,
    prefix: str | None = None,
    cap: int = COUNT_CAP,
) -> Count:
    """How many tenants :func:`tenant_page` lists with these filters (bounded)."""
    where = _tenant_where(status=status, connector=connector, prefix=prefix)
    async with db.read() as conn:
        return await bounded(conn, connections, *where, cap=cap)


async def has_schedule(db: Database, tenant: str) -> bool:
    """Whether the scheduler holds a tick (a next cycle time) for ``tenant``."""
    t = poll_ticks.c
    async with db.read() as conn:
        found = await conn.execute(select(t.tenant).where(t.tenant == tenant).limit(1))
        return found.first() is not None


async def tenant_row(db: Database, tenant: str) -> TenantRow | None:
    """One tenant as :func:`tenant_page` shows it, or None."""
    page = await tenant_page(db, only=tenant)
    return page.rows[0] if page.rows else None


async def tenant_counts(conn: AsyncConnection) -> dict[str, int]:
    """Tenants by connection status (one row per tenant: exact, as cheap as the
    tenants are few)."""
    rows = await conn.execute(
        select(connections.c.status, func.count()).group_by(connections.c.status)
    )
    return {s: int(n) for s, n in rows}


async def tenant_totals(db: Database, tenant: str, *, since: datetime) -> Totals:
    """The tenant's summed outcomes since ``since`` (its audit rows, by primary key)."""
    b = audit_buckets.c
    async with db.read() as conn:
        row = (
            await conn.execute(
                select(func.sum(b.ok), func.sum(b.failed)).where(
                    b.tenant == tenant, b.minute >= since
                )
            )
        ).one()
    return Totals(int(row[0] or 0), int(row[1] or 0))


async def authorization_tenant(db: Database, state: str) -> str | None:
    """The tenant a connect flow's ``state`` was issued for (None: unknown state)."""
    p = pending_authorizations.c
    async with db.read() as conn:
        found = (await conn.execute(select(p.tenant).where(p.state == state))).first()
    return str(found.tenant) if found else None


# --- overview ---------------------------------------------------------------------------


async def throughput(
    conn: AsyncConnection, *, now: datetime, minutes: int = 60
) -> list[tuple[datetime, int, int, int]]:
    """``(minute, ok, failed, paced)`` for each of the last ``minutes`` minutes (audit
    counts), oldest first, minutes without outcomes included as zeros."""
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    b = audit_buckets.c
    rows = await conn.execute(
        select(b.minute, func.sum(b.ok), func.sum(b.failed), func.sum(b.paced))
        .where(b.minute >= start)
        .group_by(b.minute)
    )
    found = {
        m.replace(second=0, microsecond=0): (int(o or 0), int(f or 0), int(p or 0))
        for m, o, f, p in rows
    }
    out = []
    for i in range(minutes):
        minute = start + timedelta(minutes=i)
        ok, failed, paced = found.get(minute, (0, 0, 0))
        out.append((minute, ok, failed, paced))
    return out


async def burning_tenants(
    conn: AsyncConnection, *, now: datetime, window: timedelta = timedelta(hours=1)
) -> list[tuple[str, Totals]]:
    """The tenants with failures over the last ``window``, each with its summed outcomes
    (the overview ranks them by error-budget burn).

    The window's audit rows are read through ``ix_audit_buckets_minute``; the CTE is
    materialised so that SQLite, without statistics, does not prefer walking the whole
    primary key because it is in tenant order.
    """
    b = audit_buckets.c
    recent = (
        select(b.tenant, b.ok, b.failed)
        .where(b.minute >= now - window)
        .cte("recent")
        .prefix_with("MATERIALIZED")
    )
    failed = func.sum(recent.c.failed)
    rows = await conn.execute(
        select(recent.c.tenant, func.sum(recent.c.ok), failed)
        .group_by(recent.c.tenant)
        .having(failed > 0)
    )
    return [(str(t), Totals(int(ok or 0), int(f or 0))) for t, ok, f in rows]


async def dlq_open(conn: AsyncConnection, *, cap: int = COUNT_CAP) -> Count:
    """Open dead letters (pending and review), bounded, through ``(status, last_attempt_at)``."""
    n = await bounded(conn, dead_letters, dead_letters.c.status.in_(["pending", "review"]), cap=cap)
    if not n.more:
        return n
    by_status = await estimates(conn, "dead_letters", "status")
    guess = sum(by_status.get(s, 0) for s in ("pending", "review"))
    return Count(n.n, True, guess or None)


async def dlq_growth(
    conn: AsyncConnection, *, now: datetime, cap: int = COUNT_CAP
) -> tuple[Count, Count]:
    """Dead letters first failed in the last hour, and in the hour before it (bounded).

    ``first_failed_at`` has no index; ``last_attempt_at`` is never earlier and has one
    (after ``status``, so every status is named): only rows touched in the last two
    hours are read.
    """
    d = dead_letters.c
    hour = timedelta(hours=1)
    touched = [d.status.in_(list(dlq_rows.STATUSES)), d.last_attempt_at >= now - 2 * hour]
    last = await bounded(conn, dead_letters, *touched, d.first_failed_at >= now - hour, cap=cap)
    before = await bounded(
        conn,
        dead_letters,
        *touched,
        d.first_failed_at >= now - 2 * hour,
        d.first_failed_at < now - hour,
        cap=cap,
    )
    return last, before


async def outbox_pending(conn: AsyncConnection, *, cap: int = COUNT_CAP) -> Count:
    """Pending outbox messages, bounded, through the relay's partial index."""
    # A literal: PostgreSQL's generic plan for a parameter could not use the partial index.
    return await bounded(conn, outbox, text("status = 'pending'"), cap=cap)


@dataclass(frozen=True)
class OpenBreaker:
    """A resource whose breaker is not closed, and the tenant it belongs to (if any)."""

    resource_key: str
    tenant: str | None
    state: str
    until: datetime | None
    last_error_class: str | None


async def open_breakers(
    conn: AsyncConnection, *, limit: int = 10, cap: int = COUNT_CAP
) -> tuple[list[OpenBreaker], Count]:
    """The first ``limit`` resources (by key) whose breaker is open or half-open, and
    how many there are (bounded)."""
    r, c = resources.c, connections.c
    not_closed = r.state != "closed"
    rows = await conn.execute(
        select(
            r.resource_key,
            c.tenant,
            r.state,
            r.cooldown_until,
            r.next_available_at,
            r.last_error_class,
        )
        .select_from(resources.outerjoin(connections, c.resource_key == r.resource_key))
        .where(not_closed)
        .order_by(r.resource_key)
        .limit(limit)
    )
    shown = [
        OpenBreaker(
            x.resource_key,
            x.tenant,
            x.state,
            x.cooldown_until or x.next_available_at,
            x.last_error_class,
        )
        for x in rows
    ]
    return shown, await bounded(conn, resources, not_closed, cap=cap)


# --- outbox -----------------------------------------------------------------------------


async def outbox_page(
    db: Database,
    *,
    status: str | None = None,
    topic: str | None = None,
    key: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> Page[OutboxInfo]:
    """Outbox messages matching every filter given, newest first, ids below ``before_id``."""
    # The rows are read as the CLI's listing reads them (store.outbox._info).
    from synckit.store.outbox import _info

    size = page_size(limit)
    o = outbox.c
    stmt = select(outbox).order_by(o.id.desc()).limit(size + 1)
    if status:
        stmt = stmt.where(o.status == status)
    if topic:
        stmt = stmt.where(o.topic == topic)
    if key:
        stmt = stmt.where(o.key == key)
    if before_id is not None:
        stmt = stmt.where(o.id < before_id)
    async with db.read() as conn:
        rows = [_info(r) for r in await conn.execute(stmt)]
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, str(rows[-1].id) if more else None)


async def outbox_total(
    db: Database,
    *,
    status: str | None = None,
    topic: str | None = None,
    key: str | None = None,
    cap: int = COUNT_CAP,
) -> Count:
    """How many messages :func:`outbox_page` lists with these filters (bounded)."""
    o = outbox.c
    where = [
        cond
        for cond, given in (
            (o.status == status, status),
            (o.topic == topic, topic),
            (o.key == key, key),
        )
        if given
    ]
    async with db.read() as conn:
        return await bounded(conn, outbox, *where, cap=cap)


async def dlq_total(db: Database, flt: dlq_rows.DlqFilter, *, cap: int = COUNT_CAP) -> Count:
    """How many dead letters :func:`~synckit.store.dead_letters.reads.dlq_page` lists (bounded)."""
    async with db.read() as conn:
        return await bounded(conn, dead_letters, *flt.clauses(), cap=cap)


async def outbox_topics(db: Database) -> list[tuple[str, str, int]]:
    """``(topic, status, count)`` for unpublished messages (pending and failed)."""
    o = outbox.c
    async with db.read() as conn:
        rows = await conn.execute(
            select(o.topic, o.status, func.count())
            .where(o.status.in_(["pending", "failed"]))
            .group_by(o.topic, o.status)
            .order_by(o.topic, o.status)
        )
        return [(t, s, int(n)) for t, s, n in rows]
