"""The scheduler: which (tenant, stream) cycles are due, and enqueueing them.

Each tenant's streams have ticks (``poll_ticks``, :mod:`synckit.store.ticks`); the
scheduler job runs bounded transactions (:func:`schedule_run`) that bring the ticks of
added, paused, resumed or rescheduled tenants up to date (:func:`plan_ticks`, pure) and
fire the due ones: advance each tick (a compare-and-set, so two schedulers fire it once)
and enqueue the cycle of an active tenant (:data:`~synckit.runtime.sync.poll.POLL_KIND`,
unique per tenant and stream). The cycle itself is :mod:`synckit.runtime.sync.poll`.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog

from synckit.clock import utcnow
from synckit.connectors.base import Connector
from synckit.connectors.schedule import DEFAULT_SCHEDULE, PollSchedule, parse_schedule
from synckit.errors.exceptions import ConfigurationError
from synckit.runtime.sync.poll import POLL_KIND, POLL_MAX_ATTEMPTS, poll_key
from synckit.store import ticks
from synckit.store.db import Conn, Database
from synckit.store.jobs.enqueueing import JobSpec, enqueue_new

__all__ = [
    "SCHEDULE_BATCH",
    "SCHEDULE_BUDGET",
    "ScheduleRun",
    "TickPlan",
    "marker_of",
    "plan_ticks",
    "poll_job_spec",
    "schedule_polls",
    "schedule_run",
]

log = structlog.get_logger("synckit.poll")

#: Due ticks (and changed tenants) one scheduler transaction takes; the rest wait for the
#: next run. Bounds the run's memory, its lock time and its statement sizes.
SCHEDULE_BATCH = 5000
#: How long :func:`schedule_polls` keeps starting bounded runs while they come back full
#: (the scheduler job's timeout is 120 s).
SCHEDULE_BUDGET = timedelta(seconds=60)
_INACTIVE = "-"


def poll_job_spec(tenant: str, connector: str, stream: str, resource_key: str) -> JobSpec:
    """The job of one cycle, as the scheduler enqueues it: unique per tenant and stream
    (a cycle already queued or running is not queued again). ``synckit sync``, webhook
    triggers and subscriptions enqueue theirs with it too."""
    return JobSpec(
        kind=POLL_KIND,
        payload={"tenant": tenant, "connector": connector, "stream": stream},
        resource_key=resource_key,
        unique_key=poll_key(tenant, stream),
        max_attempts=POLL_MAX_ATTEMPTS,
    )


@dataclass(frozen=True)
class TickPlan:
    """What the scheduler does for a tenant it has not seen as it is now.

    ``marker`` is what to store in ``connections.poll_spec``; ``ticks`` are the
    ``(stream, next_tick_at)`` to write (created or replaced), none to keep the ticks.
    """

    marker: str
    ticks: tuple[tuple[str, datetime], ...] = ()


def marker_of(status: str, schedule: str | None) -> str:
    """``connections.poll_spec`` once the scheduler has seen the tenant (as in SQL's
    :data:`~synckit.store.tables.UNSCHEDULED`)."""
    return (schedule or "") if status == "active" else _INACTIVE


def plan_ticks(
    *,
    tenant: str,
    status: str,
    schedule: str | None,
    seen: str | None,
    streams: Sequence[tuple[str, PollSchedule]],
    now: datetime,
) -> TickPlan:
    """The ticks of a tenant added, paused, resumed or rescheduled since the last run.

    A new tenant is due at once (paused or not: its ticks exist, and advance unpolled
    while it is paused); so is a resumed one. A changed schedule starts from its next
    tick. Pausing leaves the ticks as they are.
    """
    marker = marker_of(status, schedule)
    if seen is None or (status == "active" and seen == _INACTIVE):
        return TickPlan(marker, tuple((name, now) for name, _ in streams))
    if status != "active":
        return TickPlan(marker)
    return TickPlan(
        marker,
        tuple((name, sched.next_after(now, poll_key(tenant, name))) for name, sched in streams),
    )


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> PollSchedule:
    # A few distinct schedules across 100,000 tenants: parse each once per process.
    return parse_schedule(text)


def _stream_schedules(
    cls: type[Connector[Any]], tenant: str, schedule: str | None
) -> dict[str, PollSchedule]:
    out: dict[str, PollSchedule] = {}
    for s in cls.declared_streams():
        try:
            out[s.name] = _parsed(s.schedule or schedule or DEFAULT_SCHEDULE)
        except ConfigurationError as exc:
            log.warning("poll.bad_schedule", tenant=tenant, stream=s.name, error=str(exc))
    return out


# (connector, stream) pairs whose missing ticks this process has created, per database.
_reconciled: weakref.WeakKeyDictionary[Database, set[tuple[str, str]]] = weakref.WeakKeyDictionary()


async def schedule_polls(
    db: Database,
    connectors: Mapping[str, type[Connector[Any]]],
    *,
    now: datetime | None = None,
    batch: int = SCHEDULE_BATCH,
    budget: timedelta = SCHEDULE_BUDGET,
    clock: Callable[[], datetime] = utcnow,
) -> list[str]:
    """Enqueue a cycle for every due (tenant, stream) of ``connectors``; return their keys.

    Runs bounded transactions (:func:`schedule_run`, at most ``batch`` due ticks each)
    while they come back full, for at most ``budget``; what is left is due at the next
    call. Keys whose cycle was still queued or running are not in the result (their tick
    is consumed all the same).
    """
    polling = {n: c for n, c in connectors.items() if c.declared_streams()}
    if not polling:
        return []
    now = now or clock()
    await _create_missing_ticks(db, polling, now)
    fired: list[str] = []
    started = clock()
    while True:
        run = await schedule_run(db, polling, now=now, batch=batch)
        fired.extend(run.fired)
        if not run.full or clock() - started >= budget:
            break
    if fired:
        log.info("poll.scheduled", cycles=len(fired))
    return fired


@dataclass(frozen=True)
class ScheduleRun:
    """One bounded scheduler transaction: the keys it enqueued, how many due ticks and
    changed tenants it read, and whether it stopped at its bound (more may be waiting)."""

    fired: list[str]
    due: int
    changed: int
    full: bool


async def schedule_run(
    db: Database,
    connectors: Mapping[str, type[Connector[Any]]],
    *,
    now: datetime,
    batch: int = SCHEDULE_BATCH,
) -> ScheduleRun:
    """One bounded run in one transaction: bring up to ``batch`` added, paused, resumed
    or rescheduled tenants' ticks up to date, then fire up to ``batch`` due ticks (the
    earliest first): advance them and enqueue the cycles of active tenants."""
    sql = ticks.poll_ticks_of(db)
    names = sql.names(sorted(connectors))
    async with db.begin() as conn:
        changed = await sql.changed(conn, names, batch)
        if changed:
            await _apply_changes(conn, sql, connectors, changed, now)
        due = await sql.due(conn, names, now, batch)
        fired = await _fire(conn, sql, connectors, due, now) if due else []
    return ScheduleRun(fired, len(due), len(changed), len(due) >= batch or len(changed) >= batch)


async def _apply_changes(
    conn: Conn,
    sql: ticks.PollTicks,
    connectors: Mapping[str, type[Connector[Any]]],
    changed: Sequence[Any],
    now: datetime,
) -> None:
    new_ticks: list[tuple[str, str, str, datetime]] = []
    marks: list[tuple[str, str]] = []
    for r in changed:
        streams = _stream_schedules(connectors[r.connector], r.tenant, r.schedule)
        plan = plan_ticks(
            tenant=r.tenant,
            status=r.status,
            schedule=r.schedule,
            seen=r.poll_spec,
            streams=list(streams.items()),
            now=now,
        )
        marks.append((r.tenant, plan.marker))
        new_ticks.extend((r.tenant, stream, r.connector, at) for stream, at in plan.ticks)
    if new_ticks:
        await sql.upsert(conn, new_ticks)
    await sql.mark(conn, marks)


async def _fire(
    conn: Conn,
    sql: ticks.PollTicks,
    connectors: Mapping[str, type[Connector[Any]]],
    due: Sequence[Any],
    now: datetime,
) -> list[str]:
    moves: list[tuple[str, str, datetime, datetime]] = []
    gone: list[tuple[str, str]] = []
    wanted: dict[tuple[str, str], Any] = {}
    schedules: dict[tuple[str, str | None], dict[str, PollSchedule]] = {}
    for r in due:
        key = (r.connector, r.schedule)
        per = schedules.get(key)
        if per is None:
            per = schedules[key] = _stream_schedules(connectors[r.connector], r.tenant, r.schedule)
        sched = per.get(r.stream)
        if sched is None:  # a stream the connector no longer declares (or cannot parse)
            gone.append((r.tenant, r.stream))
            continue
        moves.append(
            (
                r.tenant,
                r.stream,
                r.next_tick_at,
                sched.next_after(now, poll_key(r.tenant, r.stream)),
            )
        )
        if r.status == "active":
            wanted[(r.tenant, r.stream)] = r
    if gone:
        await sql.drop(conn, gone)
    if not moves:
        return []
    won = await sql.advance(conn, moves)
    specs: list[JobSpec] = []
    for tenant, stream in won:
        r = wanted.get((tenant, stream))
        if r is None:
            continue  # paused or needing re-authorisation: the tick passes unpolled
        specs.append(poll_job_spec(tenant, r.connector, stream, r.resource_key))
    return sorted(await enqueue_new(conn, specs, now=now)) if specs else []


async def _create_missing_ticks(
    db: Database, connectors: Mapping[str, type[Connector[Any]]], now: datetime
) -> None:
    done = _reconciled.setdefault(db, set())
    todo = [
        (name, s.name)
        for name, cls in sorted(connectors.items())
        for s in cls.declared_streams()
        if (name, s.name) not in done
    ]
    if not todo:
        return
    sql = ticks.poll_ticks_of(db)
    async with db.begin() as conn:
        for name, stream in todo:
            await sql.create_missing(conn, name, stream, now)
    done.update(todo)
