"""Recurring jobs: each tick enqueued exactly once, however many workers run.

A row in ``cron_ticks`` holds each schedule's next tick. A worker that finds a due tick
advances it with a compare-and-set on ``next_tick_at`` and enqueues the job in the same
transaction; a second worker's compare-and-set then matches nothing. A worker that was
down for many ticks enqueues one job for the latest missed tick, not a burst.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from synckit.runtime.jobs.handlers import Recurring
from synckit.store import ticks
from synckit.store.db import Database
from synckit.store.jobs.enqueueing import JobSpec, enqueue_many


async def sync_schedules(db: Database, schedules: Sequence[Recurring], now: datetime) -> None:
    """Make sure every schedule has its row; a changed spec restarts from the next tick."""
    if not schedules:
        return
    async with db.begin() as conn:
        existing = await ticks.cron_specs(conn, [s.name for s in schedules])
        for s in schedules:
            if s.name not in existing:
                await ticks.add_cron_tick(conn, s.name, s.spec, s.next_after(now))
            elif existing[s.name] != s.spec:
                await ticks.restart_cron_tick(conn, s.name, s.spec, s.next_after(now))


async def fire_due(db: Database, schedules: Sequence[Recurring], now: datetime) -> int:
    """Enqueue the job of every due tick this worker wins; return how many it enqueued."""
    by_name = {s.name: s for s in schedules}
    if not by_name:
        return 0
    fired = 0
    async with db.begin() as conn:
        due = await ticks.due_cron_ticks(conn, list(by_name), now)
        for row in due:
            s = by_name[row.name]
            tick = row.next_tick_at
            if not await ticks.advance_cron_tick(conn, s.name, tick, s.next_after(now)):
                continue
            await enqueue_many(
                conn,
                [
                    JobSpec(
                        kind=s.kind,
                        payload={} if s.payload is None else s.payload,
                        priority=s.priority,
                        unique_key=f"cron:{s.name}:{tick.isoformat()}",
                    )
                ],
                now=now,
            )
            fired += 1
    return fired
