"""Pending jobs whose ``run_at`` no reader can read, and so may never run.

A claim takes a pending job once ``run_at <= now``. A stored ``run_at`` that no Python
datetime holds (SQLite text ``'garbage'``, a PostgreSQL year 20000 or ``infinity``)
compares as later than any real time, so that job stays pending forever without a
word; one below the readable range is claimed and quarantined by the claim itself.
This module finds both, by the same range :func:`synckit.store.jobs.guarded_moment`
guards, for ``synckit status``, ``synckit jobs ls`` and the alert rule
:class:`synckit.runtime.alerts.UnreadableRunAt` (which the worker's periodic alert
evaluation runs, so that the claim path pays nothing for it).

Each query walks the two partial indexes of pending jobs (``ix_jobs_due``,
``ix_jobs_lane_due``, which hold ``run_at``), never the finished bulk of the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Text, cast, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from synckit.store.jobs import OUT_OF_RANGE, guarded_moment
from synckit.store.tables import jobs

__all__ = ["StuckJob", "count_unreadable_run_at", "unreadable_run_at"]

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
