"""Recurring jobs: each tick enqueued exactly once, however many workers run.

A row in ``cron_ticks`` holds each schedule's next tick. A worker that finds a due tick
advances it with a compare-and-set on ``next_tick_at`` and enqueues the job in the same
transaction; a second worker's compare-and-set then matches nothing. A worker that was
down for many ticks enqueues one job for the latest missed tick, not a burst.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, update

from synckit.runtime.handlers import Recurring
from synckit.store.db import Database
from synckit.store.jobs import JobSpec, _insert, enqueue_many
from synckit.store.tables import cron_ticks


async def sync_schedules(db: Database, schedules: Sequence[Recurring], now: datetime) -> None:
    """Make sure every schedule has its row; a changed spec restarts from the next tick."""
    if not schedules:
        return
    async with db.begin() as conn:
        existing = {
            r.name: r.spec
            for r in await conn.execute(
                select(cron_ticks.c.name, cron_ticks.c.spec).where(
                    cron_ticks.c.name.in_([s.name for s in schedules])
                )
            )
        }
        for s in schedules:
            if s.name not in existing:
                ins = _insert(conn)(cron_ticks).values(
                    name=s.name, spec=s.spec, next_tick_at=s.next_after(now), enabled=True
                )
                await conn.execute(ins.on_conflict_do_nothing(index_elements=["name"]))
            elif existing[s.name] != s.spec:
                await conn.execute(
                    update(cron_ticks)
                    .where(cron_ticks.c.name == s.name)
                    .values(spec=s.spec, next_tick_at=s.next_after(now))
                )


async def fire_due(db: Database, schedules: Sequence[Recurring], now: datetime) -> int:
    """Enqueue the job of every due tick this worker wins; return how many it enqueued."""
    by_name = {s.name: s for s in schedules}
    if not by_name:
        return 0
    fired = 0
    async with db.begin() as conn:
        due = list(
            await conn.execute(
                select(cron_ticks.c.name, cron_ticks.c.next_tick_at).where(
                    cron_ticks.c.name.in_(list(by_name)),
                    cron_ticks.c.enabled.is_(True),
                    cron_ticks.c.next_tick_at <= now,
                )
            )
        )
        for row in due:
            s = by_name[row.name]
            tick = row.next_tick_at
            won = await conn.execute(
                update(cron_ticks)
                .where(cron_ticks.c.name == s.name, cron_ticks.c.next_tick_at == tick)
                .values(last_tick_at=tick, next_tick_at=s.next_after(now))
                .returning(cron_ticks.c.name)
            )
            if won.first() is None:
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
