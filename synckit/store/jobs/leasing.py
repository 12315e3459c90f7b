"""The job lease after the claim: heartbeats that extend it, the rescue of jobs whose
lease ended, and the release of jobs given back at shutdown."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, select, text, update

from synckit.clock import utcnow
from synckit.store import leases
from synckit.store import resources as lanes
from synckit.store.db import Database
from synckit.store.jobs._base import JOB_LEASE, RUNNING, UNCHARGED
from synckit.store.jobs.outcomes import dead_letter_job
from synckit.store.tables import jobs

# ``(job id, claim token)`` pairs as two arrays (PostgreSQL: each id with its own token,
# ids being unique) or one JSON text of pairs (SQLite): two parameters for any number.
_HELD: dict[str, Any] = {
    "postgresql": text(
        f"jobs.id = ANY(CAST(:ids AS bigint[])) AND jobs.{JOB_LEASE.token} ="
        " (CAST(:tokens AS bigint[]))[array_position(CAST(:ids AS bigint[]), jobs.id)]"
    ),
    "sqlite": text(
        f"(jobs.id, jobs.{JOB_LEASE.token}) IN (SELECT json_extract(value, '$[0]'),"
        " json_extract(value, '$[1]') FROM json_each(:held))"
    ),
}


def _held_params(dialect: str, held: Sequence[tuple[int, int]]) -> dict[str, Any]:
    if dialect == "postgresql":
        return {"ids": [i for i, _ in held], "tokens": [t for _, t in held]}
    return {"held": json.dumps([[i, t] for i, t in held])}


async def release(
    db: Database, held: Sequence[tuple[int, int]], *, now: datetime | None = None
) -> int:
    """Give claimed jobs back (shutdown): pending again, the attempt not counted."""
    if not held:
        return 0
    now = now or utcnow()
    async with db.begin() as conn:
        dialect = conn.dialect.name
        res = await conn.execute(
            update(jobs)
            .where(_HELD[dialect], jobs.c.status == RUNNING)
            .values(
                status="pending",
                attempts=UNCHARGED,
                **JOB_LEASE.released(),
                updated_at=now,
            )
            .returning(jobs.c.id, jobs.c.resource_key),
            _held_params(dialect, held),
        )
        released = list(res)
        await lanes.clear_probes(conn, released, now)
        await conn.run_sync(lanes.mark_lanes_of_sync, [r.id for r in released], now)
    return len(released)


@dataclass(frozen=True)
class Beat:
    """What a heartbeat found: the ids the worker still holds (``alive``), and among them
    those whose row another transaction held (``busy``, PostgreSQL): not extended."""

    alive: set[int]
    busy: set[int]


async def beat(
    db: Database,
    worker_id: str,
    held: Sequence[tuple[int, int]],
    *,
    lease: timedelta,
    now: datetime | None = None,
    start_lease: timedelta | None = None,
) -> Beat:
    """Extend the leases of the jobs this worker still holds.

    Started jobs get ``lease``; jobs claimed ahead and not started get ``start_lease``
    (default: ``lease``), so that a crash gives them to other workers soon.
    A job missing from ``alive`` was rescued or cancelled: its handler should stop.
    On PostgreSQL a job whose row another transaction holds right now is not waited
    for: it counts as held, is named in ``busy``, and its lease is not extended; the
    caller beats it again soon (the worker: a retry of those alone, not the next full
    beat, so that its own page commits cannot use up a lease beat after beat).
    """
    if not held:
        return Beat(set(), set())
    now = now or utcnow()
    async with db.begin() as conn:
        dialect = conn.dialect.name
        busy: set[int] = set()
        if dialect == "postgresql":
            # Only the rows no other transaction holds. The worker's own page commits,
            # start marks and completions lock some of these rows while they write; an
            # UPDATE of them all, in whatever order the plan visits them, waited on one
            # while holding another that such a transaction wanted next: 'deadlock
            # detected' (each one a second of both transactions' time, some every few
            # seconds under load). A job whose row is held is still this worker's as far
            # as anyone can tell: its lease is extended at the next beat.
            ids = [i for i, _ in held]
            free = {int(r[0]) for r in await conn.execute(_PG_LOCK_FREE, {"ids": ids})}
            busy = set(ids) - free
            held = [(i, t) for i, t in held if i in free]
            if not held:
                return Beat(busy, busy)
        res = await conn.execute(
            update(jobs)
            .where(_HELD[dialect], jobs.c.status == RUNNING, jobs.c.locked_by == worker_id)
            .values(
                heartbeat_at=now,
                lease_expires_at=case(
                    (jobs.c.started_at.is_(None), now + (start_lease or lease)), else_=now + lease
                ),
            )
            .returning(jobs.c.id),
            _held_params(dialect, held),
        )
        return Beat({r[0] for r in res} | busy, busy)


_PG_LOCK_FREE: Any = text(
    "SELECT id FROM jobs WHERE id = ANY(CAST(:ids AS bigint[])) FOR UPDATE SKIP LOCKED"
)


async def rescue_expired(
    db: Database,
    *,
    now: datetime | None = None,
    limit: int = 500,
    max_attempts_by_kind: Mapping[str, int] | None = None,
) -> int:
    """Return jobs whose lease expired to pending (their attempt stays counted).

    A job that has used all its attempts ends dead instead (it keeps killing workers) and
    is dead-lettered in the same transaction. A job claimed ahead that never started was
    charged nothing: it goes back to pending as it was, never dead. ``max_attempts_by_kind``
    overrides the row's limit for those kinds, as a handler registered with
    ``max_attempts`` does for ordinary failures.
    """
    now = now or utcnow()
    limit_of: Any = jobs.c.max_attempts
    if max_attempts_by_kind:
        limit_of = case(
            {k: int(v) for k, v in max_attempts_by_kind.items()},
            value=jobs.c.kind,
            else_=jobs.c.max_attempts,
        )
    async with db.begin() as conn:
        expired = (
            select(jobs.c.id)
            .where(jobs.c.status == RUNNING, leases.ended(jobs, now, JOB_LEASE))
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        message = "lease expired: the worker stopped heart-beating (crashed or hung)"
        unstarted = jobs.c.started_at.is_(None)
        dies = and_(~unstarted, jobs.c.attempts >= limit_of)
        res = await conn.execute(
            update(jobs)
            .where(leases.picked(jobs.c.id, expired))
            .values(
                status=case((dies, "dead"), else_="pending"),
                finished_at=case((dies, now), else_=None),
                run_at=case((unstarted, jobs.c.run_at), else_=now),
                **JOB_LEASE.released(),
                last_error=case((unstarted, jobs.c.last_error), else_=message),
                error_class=case((unstarted, jobs.c.error_class), else_="transient"),
                max_attempts=limit_of,  # the limit it was held to, shown as it
                updated_at=now,
            )
            .returning(
                jobs.c.id,
                jobs.c.status,
                jobs.c.kind,
                jobs.c.payload,
                jobs.c.resource_key,
                jobs.c.trace_id,
                jobs.c.attempts,
            )
        )
        rescued = list(res)
        for r in rescued:
            if r.status == "dead":
                await dead_letter_job(
                    conn,
                    job_id=r.id,
                    kind=r.kind,
                    payload=r.payload,
                    resource_key=r.resource_key,
                    error_class="transient",
                    message=message,
                    traceback=None,
                    trace_id=r.trace_id,
                    attempts=r.attempts,
                    now=now,
                )
        await lanes.clear_probes(conn, rescued, now)
        await conn.run_sync(lanes.mark_lanes_of_sync, [r.id for r in rescued], now)
    return len(rescued)


__all__ = [
    "Beat",
    "beat",
    "release",
    "rescue_expired",
]
