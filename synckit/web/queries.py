"""The reads the console needs that the storage modules do not offer yet, named.

Everything else the console shows or changes goes through the existing operations
(``store/jobs.py``, ``store/dead_letters.py``, ``runtime/status.py``, ``connectors/tenants.py``,
``store/resources.py``, ``runtime/outbox.py``, ``runtime/poll.py``). What is here is
what those lack: keyset pages (a cursor instead of an offset, so page 1,000 costs what
page 1 costs), a page of tenants joined with their resources (one statement rather than
one per tenant), and the overview's figures read at a cost that does not grow with the
tables. When the storage layer (issue 18) exists, these move into it beside the CLI's
reads.

Every page is newest (or first by name) first and returns one row more than asked,
so the caller knows whether a next page exists without counting.

**Counts are bounded.** A page refreshed every two seconds cannot count a million jobs
each time. :class:`Count` is read through an index and no further than ``cap`` rows:
exact below it, "at least" at it (``10,000+``); on PostgreSQL a capped count carries the
planner's estimate (``pg_class.reltuples`` times the value's frequency in ``pg_stats``),
shown as an estimate. Jobs by state are counted kind by kind on ``ix_jobs_kind_status``,
the kinds found by a loose index scan, so no count reads more than ``cap`` index entries
per state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from sqlalchemy import Table, case, func, literal, literal_column, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.runtime.alerts import Alert, recent_alerts
from synckit.runtime.audit import Totals
from synckit.runtime.budget import BudgetPolicy, BudgetStatus
from synckit.runtime.outbox import OutboxInfo, _info
from synckit.store import dead_letters as dlq_store
from synckit.store.db import Database
from synckit.store.dead_letters import DeadLetter, DlqFilter
from synckit.store.jobs import JobInfo
from synckit.store.tables import (
    audit_buckets,
    connections,
    dead_letters,
    jobs,
    outbox,
    pending_authorizations,
    resources,
)

__all__ = [
    "COUNT_CAP",
    "MAX_PAGE",
    "SCAN_WINDOW",
    "Count",
    "DlqGroup",
    "JobFilter",
    "OpenBreaker",
    "Page",
    "TenantRow",
    "authorization_tenant",
    "budget_burners",
    "dlq_groups",
    "dlq_growth",
    "dlq_open",
    "dlq_page",
    "fired_alerts",
    "job_counts",
    "job_kinds",
    "job_page",
    "open_breakers",
    "outbox_page",
    "outbox_pending",
    "outbox_topics",
    "poll_jobs",
    "running_counts",
    "tenant_budget",
    "tenant_counts",
    "tenant_page",
    "tenant_row",
    "throughput",
]

MAX_PAGE = 200
#: Counts on the overview read no further than this many rows.
COUNT_CAP = 10_000
#: A page whose filter no index serves in id order reads at most this many rows below
#: its cursor, and says which ids it searched (``Page.searched``).
SCAN_WINDOW = 20_000
JOB_STATUSES = ("pending", "running", "succeeded", "dead", "cancelled", "discarded")
FINISHED_STATUSES = ("succeeded", "dead", "cancelled", "discarded")
#: The predicate of ``ix_jobs_finished_by_resource`` (migration 0009), spelt as the index
#: spells it: SQLite uses a partial index only for a query that states its predicate.
FINISHED = "status IN ('succeeded', 'dead', 'cancelled', 'discarded') AND resource_key IS NOT NULL"
#: The same for the partial indexes of unfinished jobs by resource (schema.py). Literals,
#: not parameters: PostgreSQL's generic plan for a parameter cannot use a partial index.
_UNFINISHED = {
    "pending": "status = 'pending' AND resource_key IS NOT NULL",
    "running": "status = 'running'",
}


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """Rows of one page; ``next_cursor`` continues after the last (None: no more).

    ``searched`` is set when the page stopped at its scan window rather than at a full
    page: ``(lowest, highest)`` ids read, the next page going on below ``lowest``.
    """

    rows: list[T]
    next_cursor: str | None
    searched: tuple[int, int] | None = None


def _page_size(limit: int) -> int:
    return max(1, min(limit, MAX_PAGE))


# --- bounded counts ---------------------------------------------------------------------


@dataclass(frozen=True)
class Count:
    """A count read no further than a cap: exactly ``n`` unless ``more`` (then at least
    ``n``). ``estimate`` is PostgreSQL's statistics' figure for a capped count."""

    n: int
    more: bool = False
    estimate: int | None = None

    def __add__(self, other: Count) -> Count:
        estimate = None
        if self.more or other.more:
            estimate = (self.estimate if self.more else self.n) or 0
            estimate += (other.estimate if other.more else other.n) or 0
            estimate = estimate if (self.estimate or other.estimate) else None
        return Count(self.n + other.n, self.more or other.more, estimate)

    @property
    def text(self) -> str:
        """``1,234``; ``10,000+``; ``10,000+ (~1,200,000 estimated)``."""
        if not self.more:
            return f"{self.n:,}"
        shown = f"{self.n:,}+"
        if self.estimate is not None and self.estimate > self.n:
            shown += f" (~{self.estimate:,} estimated)"
        return shown


async def _bounded(conn: AsyncConnection, table: Table, *where: Any, cap: int) -> Count:
    inner = select(literal(1).label("one")).select_from(table).where(*where).limit(cap + 1)
    n = int((await conn.execute(select(func.count()).select_from(inner.subquery()))).scalar_one())
    return Count(min(n, cap), n > cap)


async def _estimates(conn: AsyncConnection, table: str, column: str) -> dict[str, int]:
    """PostgreSQL's estimate of the rows holding each common value of ``column``: the
    table's ``reltuples`` times the value's frequency (empty before the first ANALYZE,
    and on SQLite, which keeps no such statistics unless told to)."""
    if conn.dialect.name != "postgresql":
        return {}
    # Two steps: pg_stats joined to pg_class by name seq-scans pg_attribute; by constant
    # schema and table names it reads a few index entries.
    rel = (
        await conn.execute(
            text(
                "SELECT n.nspname, c.relname, c.reltuples FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.oid = to_regclass(:table)"
            ),
            {"table": table},
        )
    ).first()
    if rel is None or rel.reltuples is None or rel.reltuples < 0:
        return {}
    row = (
        await conn.execute(
            text(
                "SELECT most_common_vals::text::text[], most_common_freqs FROM pg_stats"
                " WHERE schemaname = :schema AND tablename = :table AND attname = :column"
            ),
            {"schema": rel.nspname, "table": rel.relname, "column": column},
        )
    ).first()
    if row is None or row[0] is None:
        return {}
    return {str(v): int(rel.reltuples * f) for v, f in zip(row[0], row[1], strict=False)}


def _off_index(conn: AsyncConnection, column: Any) -> Any:
    """``column`` in a term SQLite must not pick an index for.

    Without statistics SQLite takes any index an equality matches, even one that yields
    every row of a common value to be sorted when the walk in id order would stop after
    a page; a unary plus keeps the term out of its choice. PostgreSQL chooses by its
    statistics and gets the column itself.
    """
    if conn.dialect.name == "sqlite":
        return literal_column(f"+{column.table.name}.{column.name}", column.type)
    return column


async def _window(
    conn: AsyncConnection, table: Table, before_id: int | None
) -> tuple[int | None, int]:
    """``(floor, top)``: the :data:`SCAN_WINDOW` ids below ``before_id`` (or the newest)
    are ``floor <= id < top``; ``floor`` is None when fewer rows are left."""
    ids = table.c.id
    top = before_id
    if top is None:
        newest = (await conn.execute(select(func.max(ids)))).scalar_one()
        top = int(newest) + 1 if newest is not None else 1
    floor = (
        await conn.execute(
            select(ids).where(ids < top).order_by(ids.desc()).offset(SCAN_WINDOW - 1).limit(1)
        )
    ).scalar_one_or_none()
    return (int(floor) if floor is not None else None), top


def _paged(rows: list[T], size: int, cursor: Any, floor: int | None, top: int) -> Page[T]:
    """A page of ``rows`` (``size + 1`` read): the next cursor after its last row, or,
    when the scan window ended it first, below the window."""
    if len(rows) > size:
        rows = rows[:size]
        return Page(rows, str(cursor(rows[-1])))
    if floor is not None:
        return Page(rows, str(floor), searched=(floor, top - 1))
    return Page(rows, None)


# --- jobs -------------------------------------------------------------------------------


async def job_kinds(conn: AsyncConnection, *, limit: int = 1000) -> list[str]:
    """The kinds of jobs in the table, by a loose index scan of ``ix_jobs_kind_status``:
    one index probe per kind, however many jobs each has."""
    rows = await conn.execute(
        text(
            "WITH RECURSIVE k(kind) AS ("
            " SELECT (SELECT min(kind) FROM jobs)"
            " UNION ALL"
            " SELECT (SELECT min(kind) FROM jobs WHERE kind > k.kind) FROM k"
            " WHERE k.kind IS NOT NULL"
            ") SELECT kind FROM k WHERE kind IS NOT NULL LIMIT :limit"
        ),
        {"limit": limit},
    )
    return [str(k) for (k,) in rows]


async def job_counts(conn: AsyncConnection, *, cap: int = COUNT_CAP) -> dict[str, Count]:
    """Jobs by state, each count bounded: kind by kind through ``(kind, status)``, until
    ``cap`` rows of the state are seen."""
    kinds = await job_kinds(conn)
    out: dict[str, Count] = {}
    estimates: dict[str, int] | None = None
    for status in JOB_STATUSES:
        seen = 0
        for kind in kinds:
            c = await _bounded(
                conn, jobs, jobs.c.kind == kind, jobs.c.status == status, cap=cap - seen
            )
            seen += c.n + (1 if c.more else 0)
            if seen > cap:
                break
        if seen > cap:
            if estimates is None:
                estimates = await _estimates(conn, "jobs", "status")
            out[status] = Count(cap, True, estimates.get(status))
        else:
            out[status] = Count(seen)
    return out


@dataclass(frozen=True)
class JobFilter:
    kind: str | None = None
    status: str | None = None
    resource_key: str | None = None
    created_since: datetime | None = None
    created_until: datetime | None = None


def _job_select(
    flt: JobFilter,
    before_id: int | None,
    floor: int | None,
    size: int,
    *extra: Any,
    kind: Any = jobs.c.kind,
) -> Any:
    from synckit.store.jobs import _INFO

    c = jobs.c
    stmt = _INFO.where(*extra).order_by(c.id.desc()).limit(size + 1)
    if flt.kind:
        stmt = stmt.where(kind == flt.kind)
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
    if floor is not None:
        stmt = stmt.where(c.id >= floor)
    return stmt


async def _parts(conn: AsyncConnection, flt: JobFilter) -> list[list[Any]]:
    """The ways in: one statement's extra conditions per index that serves ``flt``.

    * a tenant's (resource's) jobs: its pending, running and finished jobs, each under
      the partial predicate of its index, which a query must state;
    * on SQLite, a state without a kind, or a kind without a state: ``(kind, status)``
      pair by pair (the kinds found by :func:`job_kinds`), each walked newest first.
      Without statistics SQLite would sort every job of a kind, or read the whole table
      for a rare state. PostgreSQL plans the one statement from its statistics (a walk
      back from the newest id, or ``(kind, status)`` read by its second column for a rare
      state), which measured faster than the pairs there;
    * anything else: one statement.
    """
    if flt.resource_key:
        wanted = [flt.status] if flt.status else list(JOB_STATUSES)
        parts: list[list[Any]] = [
            [text(_UNFINISHED[s])] for s in ("pending", "running") if s in wanted
        ]
        if any(s in FINISHED_STATUSES for s in wanted):
            parts.append([text(FINISHED)])
        return parts
    if conn.dialect.name == "sqlite" and flt.status and not flt.kind:
        return [[jobs.c.kind == k] for k in await job_kinds(conn)]
    if conn.dialect.name == "sqlite" and flt.kind and not flt.status:
        return [[jobs.c.status == s] for s in JOB_STATUSES]
    return [[]]


async def _rows(
    conn: AsyncConnection, flt: JobFilter, before_id: int | None, floor: int | None, size: int
) -> list[Any]:
    """The newest ``size + 1`` rows matching ``flt`` below ``before_id`` (and from
    ``floor``), each part read through its index and the parts merged."""
    # A tenant's jobs are reached by resource: a kind given too must not lead SQLite
    # to (kind, status) and every pending job of that kind.
    kind = _off_index(conn, jobs.c.kind) if flt.resource_key else jobs.c.kind
    found: list[Any] = []
    for extra in await _parts(conn, flt):
        stmt = _job_select(flt, before_id, floor, size, *extra, kind=kind)
        found += list(await conn.execute(stmt))
    found.sort(key=lambda r: -int(r.id))
    return found[: size + 1]


async def job_page(
    db: Database, flt: JobFilter, *, before_id: int | None = None, limit: int = 50
) -> Page[JobInfo]:
    """Jobs matching ``flt``, newest first, with ids below ``before_id``.

    Each filter is served by an index: kind and state by ``(kind, status)``, a tenant's
    jobs by the indexes of its pending, running and finished jobs (see :func:`_parts`).
    Creation time has none: a page filtered by it reads at most :data:`SCAN_WINDOW` jobs
    below the cursor, and when that ends the page before it is full, ``searched`` says
    which ids were read and the next page goes on below them.
    """
    size = _page_size(limit)
    async with db.read() as conn:
        floor, top = None, 0
        if flt.created_since or flt.created_until:
            floor, top = await _window(conn, jobs, before_id)
        raw = await _rows(conn, flt, before_id, floor, size)
    rows = [JobInfo.from_row(r, full=False) for r in raw]
    return _paged(rows, size, lambda j: j.id, floor, top)


async def poll_jobs(db: Database, resource_key: str, tenant: str, limit: int = 10) -> list[JobInfo]:
    """The tenant's most recent poll cycles (its resource's ``synckit.poll`` jobs whose
    unique key names the tenant), through the indexes of the resource's jobs."""
    from synckit.runtime.poll import POLL_KIND

    flt = JobFilter(kind=POLL_KIND, resource_key=resource_key)
    mine = jobs.c.unique_key.startswith(f"poll:{tenant}:", autoescape=True)
    async with db.read() as conn:
        found: list[Any] = []
        kind = _off_index(conn, jobs.c.kind)
        for extra in await _parts(conn, flt):
            stmt = _job_select(flt, None, None, limit - 1, *extra, mine, kind=kind)
            found += list(await conn.execute(stmt))
    found.sort(key=lambda r: -int(r.id))
    return [JobInfo.from_row(r, full=True) for r in found[:limit]]


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
    async with db.read() as conn:
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


async def tenant_counts(conn: AsyncConnection) -> dict[str, int]:
    """Tenants by connection status (one row per tenant: exact, as cheap as the
    tenants are few)."""
    rows = await conn.execute(
        select(connections.c.status, func.count()).group_by(connections.c.status)
    )
    return {s: int(n) for s, n in rows}


async def running_counts(db: Database, resource_keys: Sequence[str]) -> dict[str, int]:
    """Running jobs per resource key (the in-flight count a limit applies to)."""
    if not resource_keys:
        return {}
    c = jobs.c
    async with db.read() as conn:
        rows = await conn.execute(
            select(c.resource_key, func.count())
            .where(text(_UNFINISHED["running"]), c.resource_key.in_(list(resource_keys)))
            .group_by(c.resource_key)
        )
        return {k: int(n) for k, n in rows}


async def tenant_budget(
    db: Database, tenant: str, *, since: datetime, policy: BudgetPolicy
) -> BudgetStatus | None:
    """The tenant's error budget since ``since`` (its audit rows, by primary key), or
    None without outcomes."""
    b = audit_buckets.c
    async with db.read() as conn:
        row = (
            await conn.execute(
                select(func.sum(b.ok), func.sum(b.failed)).where(
                    b.tenant == tenant, b.minute >= since
                )
            )
        ).one()
    ok, failed = int(row[0] or 0), int(row[1] or 0)
    return policy.status(Totals(ok, failed)) if ok + failed else None


async def authorization_tenant(db: Database, state: str) -> str | None:
    """The tenant a connect flow's ``state`` was issued for (None: unknown state)."""
    p = pending_authorizations.c
    async with db.read() as conn:
        found = (await conn.execute(select(p.tenant).where(p.state == state))).first()
    return str(found.tenant) if found else None


# --- overview ---------------------------------------------------------------------------


async def throughput(
    conn: AsyncConnection, *, now: datetime, minutes: int = 60
) -> list[tuple[datetime, int, int]]:
    """``(minute, ok, failed)`` for each of the last ``minutes`` minutes (audit counts),
    oldest first, minutes without outcomes included as zeros."""
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    b = audit_buckets.c
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


async def budget_burners(
    conn: AsyncConnection,
    *,
    now: datetime,
    policy: BudgetPolicy,
    window: timedelta = timedelta(hours=1),
    limit: int = 10,
) -> list[tuple[str, BudgetStatus]]:
    """The tenants burning their error budget fastest over the last ``window`` (an hour:
    the short window of multi-window burn-rate alerting), each with its status.

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
    burning = [(str(t), policy.status(Totals(int(ok or 0), int(f or 0)))) for t, ok, f in rows]
    burning.sort(key=lambda x: (-x[1].burn, x[0]))
    return burning[:limit]


async def dlq_open(conn: AsyncConnection, *, cap: int = COUNT_CAP) -> Count:
    """Open dead letters (pending and review), bounded, through ``(status, last_attempt_at)``."""
    n = await _bounded(
        conn, dead_letters, dead_letters.c.status.in_(["pending", "review"]), cap=cap
    )
    if not n.more:
        return n
    estimates = await _estimates(conn, "dead_letters", "status")
    guess = sum(estimates.get(s, 0) for s in ("pending", "review"))
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
    touched = [d.status.in_(list(dlq_store.STATUSES)), d.last_attempt_at >= now - 2 * hour]
    last = await _bounded(conn, dead_letters, *touched, d.first_failed_at >= now - hour, cap=cap)
    before = await _bounded(
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
    return await _bounded(conn, outbox, text("status = 'pending'"), cap=cap)


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
    return shown, await _bounded(conn, resources, not_closed, cap=cap)


async def fired_alerts(conn: AsyncConnection, *, since: datetime, limit: int = 20) -> list[Alert]:
    """Alerts the worker's evaluation recorded since ``since``, newest first (a quiet
    hour costs an index probe of ``ix_alerts_fired_at``)."""
    return await recent_alerts(conn, since=since, limit=limit)


# --- dead letters -----------------------------------------------------------------------


def _dlq_where(conn: AsyncConnection, flt: DlqFilter) -> list[Any]:
    """``flt``'s clauses, its states kept off SQLite's index choice: led by status,
    ``ix_dead_letters_status_last`` would yield every resolved row to be sorted by id
    (or grouped by tenant) where a walk in id (or tenant) order stops after a page."""
    clauses = replace(flt, statuses=()).clauses()
    if flt.statuses:
        clauses.append(_off_index(conn, dead_letters.c.status).in_(list(flt.statuses)))
    return clauses


async def dlq_page(
    db: Database, flt: DlqFilter, *, before_id: int | None = None, limit: int = 50
) -> Page[DeadLetter]:
    """Dead letters matching ``flt``, newest first, with ids below ``before_id``.

    Unfiltered, or by tenant (``ix_dead_letters_tenant_status``), a page reads its rows;
    any other filter is checked on the rows walked in id order, at most
    :data:`SCAN_WINDOW` of them below the cursor (``searched`` says which).
    """
    size = _page_size(limit)
    d = dead_letters.c
    windowed = not flt.tenants and not flt.ids and not flt.is_empty
    async with db.read() as conn:
        floor, top = await _window(conn, dead_letters, before_id) if windowed else (None, 0)
        bounds = [d.id < before_id] if before_id is not None else []
        bounds += [d.id >= floor] if floor is not None else []
        stmt = (
            select(*dlq_store._BASE_COLUMNS)
            .where(*_dlq_where(conn, flt), *bounds)
            .order_by(d.id.desc())
            .limit(size + 1)
        )
        rows = [DeadLetter.from_row(r) for r in await conn.execute(stmt)]
    return _paged(rows, size, lambda r: r.id, floor, top)


@dataclass(frozen=True)
class DlqGroup:
    """Matching dead letters of one tenant and error class: how many, and how many of
    them last failed since the trend's start (the last 24 hours)."""

    tenant: str
    error_class: str
    count: int
    recent: int


async def dlq_groups(
    db: Database,
    flt: DlqFilter,
    *,
    after: str | None = None,
    tenants: int = 25,
    recent_since: datetime,
) -> Page[DlqGroup]:
    """Groups (tenant and error class) of the rows matching ``flt``, a page of tenants at a
    time by name after ``after``.

    Reads only the page's rows: the page's tenants by walking
    ``ix_dead_letters_tenant_status`` in tenant order, then their rows grouped. Largest
    first would read every matching row on each refresh; by name, a page costs what its
    rows cost however many dead letters there are.
    """
    d = dead_letters.c
    async with db.read() as conn:
        where = _dlq_where(conn, flt)
        names_stmt = (
            select(d.tenant).where(*where).group_by(d.tenant).order_by(d.tenant).limit(tenants + 1)
        )
        if after is not None:
            names_stmt = names_stmt.where(d.tenant > after)
        names = [str(t) for (t,) in await conn.execute(names_stmt)]
        more = len(names) > tenants
        names = names[:tenants]
        groups: list[DlqGroup] = []
        if names:
            recent = func.sum(case((d.last_attempt_at >= recent_since, 1), else_=0))
            rows = await conn.execute(
                select(d.tenant, d.error_class, func.count(), recent)
                .where(*where, d.tenant.in_(names))
                .group_by(d.tenant, d.error_class)
                .order_by(d.tenant, d.error_class)
            )
            groups = [DlqGroup(str(t), str(c), int(n), int(r or 0)) for t, c, n, r in rows]
    return Page(groups, names[-1] if more else None)


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
    async with db.read() as conn:
        rows = [_info(r) for r in await conn.execute(stmt)]
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, str(rows[-1].id) if more else None)


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
