"""The operator's reads and writes of jobs: listings and pages, one job, retry,
cancel, reschedule, priority and payload changes, counts, stuck jobs, and pruning."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, Text, cast, delete, func, literal_column, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from synckit.clock import utcnow
from synckit.errors.exceptions import JobError, JobNotFound, JobStateError
from synckit.store import leases
from synckit.store import resources as lanes
from synckit.store.batches import delete_in_batches
from synckit.store.db import Database
from synckit.store.jobs._base import FINISHED, INT32, JOB_LEASE, JobStatus, check_payload
from synckit.store.moments import (
    OUT_OF_RANGE,
    from_row,
    guarded_columns,
    guarded_moment,
    read_moment,
    read_payload,
)
from synckit.store.pages import (
    COUNT_CAP,
    Count,
    Page,
    bounded,
    off_index,
    page_size,
    paged,
    scan_window,
)
from synckit.store.tables import jobs
from synckit.tracing import current_traceparent


async def prune(
    db: Database,
    *,
    older_than: timedelta = timedelta(days=7),
    batch: int = 5000,
    now: datetime | None = None,
) -> int:
    """Delete finished jobs older than ``older_than``, in batches of ``batch``; return count."""
    cutoff = (now or utcnow()) - older_than
    victims = (
        select(jobs.c.id)
        .where(jobs.c.finished_at < cutoff, jobs.c.status.in_(FINISHED))
        .limit(batch)
    )
    stmt = delete(jobs).where(leases.picked(jobs.c.id, victims))
    return await delete_in_batches(db, stmt, batch)


# --- working with jobs ----------------------------------------------------------------


@dataclass(frozen=True)
class JobInfo:
    """One job as the operator sees it. A value a corrupt row holds (a payload or error
    history that is not JSON, a timestamp no datetime holds) reads as None (``[]`` for
    ``errors``) and ``unreadable`` names it with the reason, so one row never fails a
    listing."""

    id: int
    kind: str
    status: str
    resource_key: str | None
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime | None
    created_at: datetime | None
    updated_at: datetime | None
    finished_at: datetime | None
    unique_key: str | None
    locked_by: str | None
    last_error: str | None
    error_class: str | None
    trace_id: str | None
    payload: Any = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_row(cls, r: Row[Any], *, full: bool) -> JobInfo:
        m = r._mapping
        bad: dict[str, str] = {}
        moments: dict[str, datetime | None] = {}
        for name in ("run_at", "created_at", "updated_at", "finished_at"):
            try:
                moments[name] = read_moment(m[name])
            except ValueError as exc:
                moments[name], bad[name] = None, str(exc)
        payload: Any = None
        errors: list[dict[str, Any]] = []
        if full:
            try:
                payload = read_payload(m["payload"])
            except ValueError as exc:
                bad["payload"] = str(exc)
            try:
                history = read_payload(m["errors"])
                errors = list(history) if isinstance(history, list) else []
            except ValueError as exc:
                bad["errors"] = str(exc)
        return from_row(cls, r, payload=payload, errors=errors, unreadable=bad, **moments)


# ``jobs`` as the operator's views read it: JSON as text and timestamps guarded, parsed
# per row (:meth:`JobInfo.from_row`), so that one corrupt row cannot fail the listing.
_INFO: Any = select(*guarded_columns(jobs.c, as_text=("payload", "errors")))


async def list_jobs(
    db: Database,
    *,
    status: str | None = None,
    kind: str | None = None,
    resource_key: str | None = None,
    created_since: datetime | None = None,
    updated_since: datetime | None = None,
    limit: int = 100,
    before: int | None = None,
) -> list[JobInfo]:
    """Jobs matching every filter given, newest first; ``before``: only ids below it
    (the keyset of the next page: the last id of this one)."""
    stmt = _INFO.order_by(jobs.c.id.desc()).limit(limit)
    if before is not None:
        stmt = stmt.where(jobs.c.id < before)
    if status:
        stmt = stmt.where(jobs.c.status == status)
    if kind:
        stmt = stmt.where(jobs.c.kind == kind)
    if resource_key:
        stmt = stmt.where(jobs.c.resource_key == resource_key)
    if created_since:
        stmt = stmt.where(jobs.c.created_at >= created_since)
    if updated_since:
        stmt = stmt.where(jobs.c.updated_at >= updated_since)
    async with db.read() as conn:
        return [JobInfo.from_row(r, full=False) for r in await conn.execute(stmt)]


async def get_job(db: Database, job_id: int) -> JobInfo:
    """One job with its payload and error history; :class:`JobNotFound` if absent."""
    async with db.read() as conn:
        row = (await conn.execute(_INFO.where(jobs.c.id == job_id))).first()
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    return JobInfo.from_row(row, full=True)


async def _change(
    db: Database, job_id: int, action: str, values: dict[str, Any], *, allow_running: bool = False
) -> JobInfo:
    now = utcnow()
    values = {**values, "updated_at": now}
    async with db.begin() as conn:
        row = (
            await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id).with_for_update())
        ).first()
        if row is None:
            raise JobNotFound(f"no job with id {job_id}")
        if row.status == "running" and not allow_running:
            raise JobStateError(f"job {job_id} is running; cannot {action} it until it stops")
        try:
            await conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
        except IntegrityError as exc:
            raise JobStateError(
                f"cannot {action} job {job_id}: another unfinished job has its unique key"
            ) from exc
        if "run_at" in values:  # pending now (retry), or its time moved (reschedule)
            await conn.run_sync(lanes.mark_lanes_of_sync, [job_id], now)
    return await get_job(db, job_id)


async def cancel_job(db: Database, job_id: int, reason: str = "cancelled by operator") -> JobInfo:
    """Cancel a job; a running job's handler is told to stop at its next heartbeat."""
    info = await get_job(db, job_id)
    if info.status in FINISHED:
        raise JobStateError(f"job {job_id} already ended ({info.status})")
    return await _change(
        db,
        job_id,
        "cancel",
        {
            "status": "cancelled",
            "last_error": reason,
            "finished_at": utcnow(),
            **JOB_LEASE.released(),
        },
        allow_running=True,
    )


async def unfinished_with_key(db: Database, unique_key: str) -> JobInfo | None:
    """The pending or running job holding ``unique_key`` (at most one exists), or None."""
    stmt = _INFO.where(jobs.c.unique_key == unique_key, jobs.c.status.in_(["pending", "running"]))
    async with db.read() as conn:
        row = (await conn.execute(stmt.limit(1))).first()
    return JobInfo.from_row(row, full=False) if row is not None else None


async def retry_job(db: Database, job_id: int) -> JobInfo:
    """Run the job again now; an ended job starts over with fresh attempts."""
    info = await get_job(db, job_id)
    values: dict[str, Any] = {"status": "pending", "run_at": utcnow(), "finished_at": None}
    if info.status in FINISHED:
        values["attempts"] = 0
    if (parent := current_traceparent()) is not None:
        # Re-run inside a span (a DLQ replay, `synckit jobs retry` traced): its new run
        # continues that trace.
        values["trace_parent"] = parent
    return await _change(db, job_id, "retry", values)


async def reschedule_job(db: Database, job_id: int, run_at: datetime) -> JobInfo:
    """Move a job's next run to ``run_at``."""
    info = await get_job(db, job_id)
    if info.status in FINISHED:
        raise JobStateError(f"job {job_id} already ended ({info.status}); use retry")
    return await _change(db, job_id, "reschedule", {"run_at": run_at})


async def set_priority(db: Database, job_id: int, priority: int) -> JobInfo:
    """Change a job's priority (higher runs first)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise JobError(f"job {job_id}: priority must be a whole number")
    if not INT32[0] <= priority <= INT32[1]:
        raise JobError(
            f"job {job_id}: priority must be a whole number from {INT32[0]} to {INT32[1]}"
        )
    return await _change(db, job_id, "change the priority of", {"priority": priority})


async def replace_payload(db: Database, job_id: int, payload: Any) -> JobInfo:
    """Replace a job's payload (for example, to fix the data that made it fail)."""
    info = await get_job(db, job_id)
    check_payload(info.kind, payload)
    return await _change(db, job_id, "replace the payload of", {"payload": payload})


async def count_by_status(db: Database) -> dict[str, int]:
    async with db.read() as conn:
        rows = await conn.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status))
        return {s: c for s, c in rows}


# --- pending jobs whose run_at cannot be read (synckit.runtime.jobs.unreadable) ---------

#: How much of a stored value a report quotes.
_QUOTED = 60


@dataclass(frozen=True)
class StuckJob:
    """A pending job whose ``run_at`` cannot be read, with the stored value as text."""

    id: int
    kind: str
    resource_key: str | None
    stored: str

    @property
    def reason(self) -> str:
        return f"run_at cannot be read: {self.stored[:_QUOTED]!r}"


# The guard's marker as SQL: a CASE that gives it back is a value out of range. A typed
# literal compares as time on PostgreSQL and as text on SQLite, as the guard's own does.
_MARKER: ColumnElement[Any] = literal_column(f"'{OUT_OF_RANGE.isoformat(sep=' ')}'")


def _unreadable(lane_keyed: bool) -> Any:
    """The predicate of one partial index of pending jobs (spelt as the index is, so a
    planner uses it) and a ``run_at`` the guard marks out of range."""
    lane = jobs.c.resource_key.is_not(None) if lane_keyed else jobs.c.resource_key.is_(None)
    # 'pending' as a literal: a bound parameter does not imply an index's predicate.
    pending = jobs.c.status == literal_column("'pending'")
    return (pending, lane, guarded_moment(jobs.c.run_at) == _MARKER)


def _stuck(lane_keyed: bool) -> Any:
    return select(
        jobs.c.id,
        jobs.c.kind,
        jobs.c.resource_key,
        cast(jobs.c.run_at, Text).label("stored"),
    ).where(*_unreadable(lane_keyed))


async def unreadable_run_at(conn: AsyncConnection, *, limit: int = 100) -> list[StuckJob]:
    """Up to ``limit`` pending jobs whose ``run_at`` cannot be read, by id."""
    found: list[StuckJob] = []
    for keyed in (False, True):
        # No ORDER BY in SQL: SQLite would walk the whole table in id order for it
        # instead of the partial index; there are few such jobs to sort here.
        rows = await conn.execute(_stuck(keyed).limit(limit))
        found += (StuckJob(int(r.id), r.kind, r.resource_key, str(r.stored)[:200]) for r in rows)
    return sorted(found, key=lambda j: j.id)[:limit]


async def count_unreadable_run_at(conn: AsyncConnection) -> int:
    """How many pending jobs have a ``run_at`` that cannot be read."""
    total = 0
    for keyed in (False, True):
        stmt = select(func.count()).select_from(jobs).where(*_unreadable(keyed))
        total += int((await conn.execute(stmt)).scalar_one())
    return total


# --- the operator's pages of jobs (the console) -------------------------------------------
# Keyset pages served by an index whatever the filter (see synckit.store.pages); the
# console reads jobs through these, `synckit jobs list` through list_jobs above.

JOB_STATUSES: tuple[JobStatus, ...] = (
    "pending",
    "running",
    "succeeded",
    "dead",
    "cancelled",
    "discarded",
)
#: The predicate of ``ix_jobs_finished_by_resource`` (migration 0009), spelt as the index
#: spells it: SQLite uses a partial index only for a query that states its predicate.
_FINISHED_BY_RESOURCE = (
    "status IN ('succeeded', 'dead', 'cancelled', 'discarded') AND resource_key IS NOT NULL"
)
#: The same for the partial indexes of unfinished jobs by resource (tables.py). Literals,
#: not parameters: PostgreSQL's generic plan for a parameter cannot use a partial index.
_UNFINISHED_BY_RESOURCE = {
    "pending": "status = 'pending' AND resource_key IS NOT NULL",
    "running": "status = 'running'",
}


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


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a listing shows; ``hidden_kinds`` are left out unless ``kind`` names
    one (the console hides the runtime's own housekeeping jobs by default)."""

    kind: str | None = None
    status: str | None = None
    resource_key: str | None = None
    created_since: datetime | None = None
    created_until: datetime | None = None
    hidden_kinds: tuple[str, ...] = ()

    @property
    def hides(self) -> tuple[str, ...]:
        return () if self.kind else self.hidden_kinds


def _job_where(flt: JobFilter, kind: Any = jobs.c.kind) -> list[Any]:
    c = jobs.c
    where: list[Any] = []
    if flt.kind:
        where.append(kind == flt.kind)
    if flt.hides:
        where.append(kind.not_in(flt.hides))
    if flt.status:
        where.append(c.status == flt.status)
    if flt.resource_key:
        where.append(c.resource_key == flt.resource_key)
    if flt.created_since:
        where.append(c.created_at >= flt.created_since)
    if flt.created_until:
        where.append(c.created_at < flt.created_until)
    return where


def _job_select(
    flt: JobFilter,
    before_id: int | None,
    floor: int | None,
    size: int,
    *extra: Any,
    kind: Any = jobs.c.kind,
) -> Any:
    c = jobs.c
    stmt = _INFO.where(*extra, *_job_where(flt, kind)).order_by(c.id.desc()).limit(size + 1)
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
            [text(_UNFINISHED_BY_RESOURCE[s])] for s in ("pending", "running") if s in wanted
        ]
        if any(s in FINISHED for s in wanted):
            parts.append([text(_FINISHED_BY_RESOURCE)])
        return parts
    if conn.dialect.name == "sqlite" and not flt.kind and (flt.status or flt.hides):
        # Hidden kinds too: the other kinds pair by pair, each walked newest first.
        kinds = [k for k in await job_kinds(conn) if k not in flt.hides]
        statuses = [flt.status] if flt.status else list(JOB_STATUSES)
        return [[jobs.c.kind == k, jobs.c.status == s] for k in kinds for s in statuses]
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
    kind = off_index(conn, jobs.c.kind) if flt.resource_key else jobs.c.kind
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
    size = page_size(limit)
    async with db.read() as conn:
        floor, top = None, 0
        if flt.created_since or flt.created_until:
            floor, top = await scan_window(conn, jobs, before_id)
        raw = await _rows(conn, flt, before_id, floor, size)
    rows = [JobInfo.from_row(r, full=False) for r in raw]
    return paged(rows, size, lambda j: j.id, floor, top)


async def count_jobs(db: Database, flt: JobFilter, *, cap: int = COUNT_CAP) -> Count | None:
    """How many jobs match ``flt``, read through the indexes :func:`job_page` uses and no
    further than ``cap`` rows (see :class:`~synckit.store.pages.Count`); None for a
    creation-time filter, which no index serves (counting it could read every job)."""
    if flt.created_since or flt.created_until:
        return None
    async with db.read() as conn:
        kind = off_index(conn, jobs.c.kind) if flt.resource_key else jobs.c.kind
        total = Count(0)
        for extra in await _parts(conn, flt):
            if total.more:
                break
            total += await bounded(conn, jobs, *extra, *_job_where(flt, kind), cap=cap - total.n)
    return Count(min(total.n, cap), total.more or total.n > cap)


async def poll_jobs(
    db: Database, resource_key: str, tenant: str, *, kind: str, limit: int = 10
) -> list[JobInfo]:
    """The tenant's most recent poll cycles (its resource's jobs of ``kind``, the poll
    kind, whose unique key names the tenant), through the indexes of the resource's jobs."""
    flt = JobFilter(kind=kind, resource_key=resource_key)
    mine = jobs.c.unique_key.startswith(f"poll:{tenant}:", autoescape=True)
    async with db.read() as conn:
        found: list[Any] = []
        kind_column = off_index(conn, jobs.c.kind)
        for extra in await _parts(conn, flt):
            stmt = _job_select(flt, None, None, limit - 1, *extra, mine, kind=kind_column)
            found += list(await conn.execute(stmt))
    found.sort(key=lambda r: -int(r.id))
    return [JobInfo.from_row(r, full=True) for r in found[:limit]]


async def running_counts(db: Database, resource_keys: Sequence[str]) -> dict[str, int]:
    """Running jobs per resource key (the in-flight count a limit applies to)."""
    if not resource_keys:
        return {}
    c = jobs.c
    async with db.read() as conn:
        rows = await conn.execute(
            select(c.resource_key, func.count())
            .where(
                text(_UNFINISHED_BY_RESOURCE["running"]), c.resource_key.in_(list(resource_keys))
            )
            .group_by(c.resource_key)
        )
        return {k: int(n) for k, n in rows}


__all__ = [
    "JOB_STATUSES",
    "JobFilter",
    "JobInfo",
    "StuckJob",
    "cancel_job",
    "count_by_status",
    "count_jobs",
    "count_unreadable_run_at",
    "get_job",
    "job_kinds",
    "job_page",
    "list_jobs",
    "poll_jobs",
    "prune",
    "replace_payload",
    "reschedule_job",
    "retry_job",
    "running_counts",
    "set_priority",
    "unfinished_with_key",
    "unreadable_run_at",
]
