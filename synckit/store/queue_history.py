"""The queue's depth over time: one sample a minute, kept for a day. Every SQL statement
on ``queue_samples``.

A worker's maintenance loop calls :func:`sample` about once a minute; the first worker
to reach a minute writes its row, the others find it there and read nothing more (one
probe of the primary key). A sample reads the pending and running jobs kind by kind
through ``ix_jobs_kind_status`` (the kinds found by a loose index scan), at most ``cap``
of them, so its cost does not grow with the finished jobs nor past the cap with the
backlog; ``capped`` says the counts are of the first ``cap`` jobs read.

Pending jobs are told apart by what they wait for, as the claim sees them:

* ``paced``: a rate limit holds them (a job put back after a 429 until its time, or a due
  job of a resource paced until later);
* ``retrying``: put back after an error, waiting until its retry time;
* ``scheduled``: due later, never failed;
* ``ready``: due now.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, delete, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.store.db import Database
from synckit.store.jobs.admin import job_kinds
from synckit.store.jobs.enqueueing import _insert
from synckit.store.moments import from_row
from synckit.store.pages import COUNT_CAP
from synckit.store.tables import jobs, queue_samples, resources

__all__ = ["KEEP", "SERIES", "QueueSample", "history", "read_depth", "sample"]

#: How long samples are kept.
KEEP = timedelta(hours=24)
#: The series of a sample, in the order a chart stacks them.
SERIES = ("running", "ready", "retrying", "paced", "scheduled")


@dataclass(frozen=True)
class QueueSample:
    minute: datetime
    ready: int
    scheduled: int
    retrying: int
    paced: int
    running: int
    capped: bool = False

    @property
    def depth(self) -> int:
        return self.ready + self.scheduled + self.retrying + self.paced + self.running


def _category(now: datetime) -> Any:
    j, r = jobs.c, resources.c
    later = j.run_at > now
    return case(
        (j.status == "running", "running"),
        (
            or_(
                and_(later, j.error_class == "rate_limited"),
                and_(~later, r.next_available_at > now),
            ),
            "paced",
        ),
        (and_(later, j.error_class.is_not(None)), "retrying"),
        (later, "scheduled"),
        else_="ready",
    )


async def read_depth(
    conn: AsyncConnection, *, now: datetime, cap: int = COUNT_CAP
) -> tuple[dict[str, int], bool]:
    """Pending and running jobs by series (see the module), and whether the read stopped
    at ``cap`` jobs."""
    counts = dict.fromkeys(SERIES, 0)
    seen = 0
    category = _category(now).label("category")
    joined = jobs.outerjoin(resources, resources.c.resource_key == jobs.c.resource_key)
    for kind in await job_kinds(conn):
        left = cap - seen
        inner = (
            select(category)
            .select_from(joined)
            .where(jobs.c.kind == kind, jobs.c.status.in_(["pending", "running"]))
            .limit(left + 1)
            .subquery()
        )
        rows = await conn.execute(select(inner.c.category, func.count()).group_by(inner.c.category))
        n = 0
        for name, count in rows:
            counts[str(name)] += int(count)
            n += int(count)
        if n > left:
            return counts, True
        seen += n
    return counts, False


async def sample(
    db: Database, *, now: datetime, cap: int = COUNT_CAP, keep: timedelta = KEEP
) -> bool:
    """Write this minute's sample unless a worker already has, and forget samples older
    than ``keep``; True when this call wrote it."""
    minute = now.replace(second=0, microsecond=0)
    q = queue_samples.c
    async with db.read() as conn:
        if (await conn.execute(select(q.minute).where(q.minute == minute))).first():
            return False
        counts, capped = await read_depth(conn, now=now, cap=cap)
    async with db.begin() as conn:
        ins = _insert(conn)(queue_samples).values(minute=minute, capped=capped, **counts)
        await conn.execute(ins.on_conflict_do_nothing(index_elements=["minute"]))
        await conn.execute(delete(queue_samples).where(q.minute < minute - keep))
    return True


async def history(
    conn: AsyncConnection, *, now: datetime, minutes: int
) -> list[tuple[datetime, QueueSample | None]]:
    """Each of the last ``minutes`` minutes, oldest first, with its sample (None: no
    worker sampled it)."""
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    q = queue_samples.c
    rows = await conn.execute(select(queue_samples).where(q.minute >= start))
    found = {
        r.minute.replace(second=0, microsecond=0): from_row(QueueSample, r, capped=bool(r.capped))
        for r in rows
    }
    out = []
    for i in range(minutes):
        minute = start + timedelta(minutes=i)
        out.append((minute, found.get(minute)))
    return out
