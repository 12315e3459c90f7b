"""The reads the console needs that the storage modules do not offer yet, named.

Everything else the console shows or changes goes through the existing operations
(``runtime/jobs.py``, ``dlq/store.py``, ``runtime/status.py``, ``connectors/tenants.py``,
``runtime/resources.py``, ``runtime/outbox.py``, ``runtime/poll.py``). What is here is
what those lack: keyset pages (a cursor instead of an offset, so page 1,000 costs what
page 1 costs), a page of tenants joined with their resources (one statement rather than
one per tenant), counts for the overview. When the storage layer (issue 18) exists,
these move into it beside the CLI's reads.

Every page is newest (or first by name) first and returns one row more than asked,
so the caller knows whether a next page exists without counting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from sqlalchemy import func, select

from synckit.dlq import store as dlq_store
from synckit.dlq.store import DeadLetter, DlqFilter
from synckit.runtime.db import Database
from synckit.runtime.jobs import JobInfo
from synckit.runtime.outbox import OutboxInfo, _info
from synckit.runtime.schema import audit_buckets, connections, dead_letters, jobs, outbox, resources

__all__ = [
    "MAX_PAGE",
    "JobFilter",
    "Page",
    "TenantRow",
    "dlq_growth",
    "dlq_page",
    "job_page",
    "outbox_page",
    "outbox_topics",
    "poll_jobs",
    "running_counts",
    "tenant_counts",
    "tenant_page",
    "tenant_row",
    "throughput",
]

MAX_PAGE = 200


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """Rows of one page; ``next_cursor`` continues after the last (None: no more)."""

    rows: list[T]
    next_cursor: str | None


def _page_size(limit: int) -> int:
    return max(1, min(limit, MAX_PAGE))


# --- jobs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobFilter:
    kind: str | None = None
    status: str | None = None
    resource_key: str | None = None
    created_since: datetime | None = None
    created_until: datetime | None = None


async def job_page(
    db: Database, flt: JobFilter, *, before_id: int | None = None, limit: int = 50
) -> Page[JobInfo]:
    """Jobs matching ``flt``, newest first, with ids below ``before_id``."""
    size = _page_size(limit)
    c = jobs.c
    stmt = select(jobs).order_by(c.id.desc()).limit(size + 1)
    if flt.kind:
        stmt = stmt.where(c.kind == flt.kind)
    if flt.status:
        stmt = stmt.where(c.status == flt.status)
    if flt.resource_key:
        stmt = stmt.where(c.resource_key == flt.resource_key)
    if flt.created_since:
        stmt = stmt.where(c.created_at >= flt.created_since)
    if flt.created_until:
        stmt = stmt.where(c.created_at < flt.created_until)
    if before_id is not None:
        stmt = stmt.where(c.id < before_id)
    async with db.begin() as conn:
        rows = [JobInfo.from_row(r, full=False) for r in await conn.execute(stmt)]
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, str(rows[-1].id) if more else None)


async def poll_jobs(db: Database, resource_key: str, tenant: str, limit: int = 10) -> list[JobInfo]:
    """The tenant's most recent poll cycles (its resource's ``synckit.poll`` jobs)."""
    from synckit.runtime.poll import POLL_KIND

    c = jobs.c
    stmt = (
        select(jobs)
        .where(c.kind == POLL_KIND, c.resource_key == resource_key)
        .where(c.unique_key.startswith(f"poll:{tenant}:", autoescape=True))
        .order_by(c.id.desc())
        .limit(limit)
    )
    async with db.begin() as conn:
        return [JobInfo.from_row(r, full=True) for r in await conn.execute(stmt)]


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
) -> Page[TenantRow]:
    """Tenants by name after ``after``, each with its resource's breaker and pacing."""
    size = _page_size(limit)
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
    if status:
        stmt = stmt.where(c.status == status)
    if connector:
        stmt = stmt.where(c.connector == connector)
    if after:
        stmt = stmt.where(c.tenant > after)
    if only is not None:
        stmt = stmt.where(c.tenant == only)
    async with db.begin() as conn:
        rows = [
            TenantRow(
                tenant=x.tenant,
                connector=x.connector,
                resource_key=x.resource_key,
                status=x.status,
                status_reason=x.status_reason,
                schedule=x.schedule,
                breaker=x.state or "closed",
                cooldown_until=x.cooldown_until,
                next_available_at=x.next_available_at,
                paced_reason=x.paced_reason,
                max_in_flight=x.max_in_flight,
                last_error_class=x.last_error_class,
            )
            for x in await conn.execute(stmt)
        ]
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, rows[-1].tenant if more else None)


async def tenant_row(db: Database, tenant: str) -> TenantRow | None:
    """One tenant as :func:`tenant_page` shows it, or None."""
    page = await tenant_page(db, only=tenant)
    return page.rows[0] if page.rows else None


async def tenant_counts(db: Database) -> dict[str, int]:
    """Tenants by connection status."""
    async with db.begin() as conn:
        rows = await conn.execute(
            select(connections.c.status, func.count()).group_by(connections.c.status)
        )
        return {s: int(n) for s, n in rows}


async def running_counts(db: Database, resource_keys: Sequence[str]) -> dict[str, int]:
    """Running jobs per resource key (the in-flight count a limit applies to)."""
    if not resource_keys:
        return {}
    c = jobs.c
    async with db.begin() as conn:
        rows = await conn.execute(
            select(c.resource_key, func.count())
            .where(c.status == "running", c.resource_key.in_(list(resource_keys)))
            .group_by(c.resource_key)
        )
        return {k: int(n) for k, n in rows}


# --- overview ---------------------------------------------------------------------------


async def throughput(
    db: Database, *, now: datetime, minutes: int = 60
) -> list[tuple[datetime, int, int]]:
    """``(minute, ok, failed)`` for each of the last ``minutes`` minutes (audit counts),
    oldest first, minutes without outcomes included as zeros."""
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    b = audit_buckets.c
    async with db.begin() as conn:
        rows = await conn.execute(
            select(b.minute, func.sum(b.ok), func.sum(b.failed))
            .where(b.minute >= start)
            .group_by(b.minute)
        )
        found = {m.replace(second=0, microsecond=0): (int(o or 0), int(f or 0)) for m, o, f in rows}
    out = []
    for i in range(minutes):
        minute = start + timedelta(minutes=i)
        ok, failed = found.get(minute, (0, 0))
        out.append((minute, ok, failed))
    return out


async def dlq_growth(db: Database, *, now: datetime) -> tuple[int, int]:
    """Dead letters first failed in the last hour, and in the hour before it."""
    d = dead_letters.c
    hour = timedelta(hours=1)
    async with db.begin() as conn:
        last = (
            await conn.execute(select(func.count()).where(d.first_failed_at >= now - hour))
        ).scalar_one()
        before = (
            await conn.execute(
                select(func.count()).where(
                    d.first_failed_at >= now - 2 * hour, d.first_failed_at < now - hour
                )
            )
        ).scalar_one()
    return int(last), int(before)


# --- dead letters -----------------------------------------------------------------------


async def dlq_page(
    db: Database, flt: DlqFilter, *, before_id: int | None = None, limit: int = 50
) -> Page[DeadLetter]:
    """Dead letters matching ``flt``, newest first, with ids below ``before_id``."""
    size = _page_size(limit)
    rows: list[DeadLetter] = []
    # iter_rows walks by keyset on id; a page below the cursor is the id filter plus it.
    extra = [dead_letters.c.id < before_id] if before_id is not None else []
    stmt = (
        select(*dlq_store._BASE_COLUMNS)
        .where(*flt.clauses(), *extra)
        .order_by(dead_letters.c.id.desc())
        .limit(size + 1)
    )
    async with db.begin() as conn:
        rows = [DeadLetter.from_row(r) for r in await conn.execute(stmt)]
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, str(rows[-1].id) if more else None)


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
    size = _page_size(limit)
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
    async with db.begin() as conn:
        rows = [_info(r) for r in await conn.execute(stmt)]
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, str(rows[-1].id) if more else None)


async def outbox_topics(db: Database) -> list[tuple[str, str, int]]:
    """``(topic, status, count)`` for unpublished messages (pending and failed)."""
    o = outbox.c
    async with db.begin() as conn:
        rows = await conn.execute(
            select(o.topic, o.status, func.count())
            .where(o.status.in_(["pending", "failed"]))
            .group_by(o.topic, o.status)
            .order_by(o.topic, o.status)
        )
        return [(t, s, int(n)) for t, s, n in rows]
