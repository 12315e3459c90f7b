"""Worker processes as the database knows them: each registers when it starts, heartbeats
while it runs (jobs in flight included) and says when it stops; one silent for longer than
:data:`LOST_AFTER_BEATS` of its own heartbeat periods is *lost* (killed, frozen, or cut off
from the database). Every SQL statement on ``workers``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update

from synckit.store.db import Database
from synckit.store.tables import workers

__all__ = [
    "LOST_AFTER_BEATS",
    "WorkerRow",
    "alive_count",
    "beat",
    "list_workers",
    "prune",
    "register",
    "stopped",
    "worker_state",
]

#: A worker not seen for this many of its heartbeat periods is lost.
LOST_AFTER_BEATS = 3


def worker_state(
    *, last_seen_at: datetime, stopped_at: datetime | None, heartbeat_seconds: float, now: datetime
) -> str:
    """``alive``, ``stopped`` (it said so) or ``lost`` (silent too long): pure."""
    if stopped_at is not None:
        return "stopped"
    silent = (now - last_seen_at).total_seconds()
    return "lost" if silent > LOST_AFTER_BEATS * heartbeat_seconds else "alive"


@dataclass(frozen=True)
class WorkerRow:
    worker_id: str
    host: str
    pid: int
    version: str
    concurrency: int
    heartbeat_seconds: float
    in_flight: int
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    state: str

    @property
    def lost_after(self) -> timedelta:
        return timedelta(seconds=LOST_AFTER_BEATS * self.heartbeat_seconds)


async def register(
    db: Database,
    worker_id: str,
    *,
    host: str,
    pid: int,
    version: str,
    concurrency: int,
    heartbeat_seconds: float,
    now: datetime,
) -> None:
    """Record a worker that starts (a restarted id starts afresh)."""
    async with db.begin() as conn:
        await conn.execute(delete(workers).where(workers.c.worker_id == worker_id))
        await conn.execute(
            insert(workers).values(
                worker_id=worker_id,
                host=host[:255],
                pid=pid,
                version=version[:64],
                concurrency=concurrency,
                heartbeat_seconds=heartbeat_seconds,
                in_flight=0,
                started_at=now,
                last_seen_at=now,
            )
        )


async def beat(db: Database, worker_id: str, *, in_flight: int, now: datetime) -> bool:
    """The worker is alive at ``now`` with ``in_flight`` jobs; False when its row is gone
    (pruned): the caller registers again."""
    async with db.begin() as conn:
        res = await conn.execute(
            update(workers)
            .where(workers.c.worker_id == worker_id)
            .values(last_seen_at=now, in_flight=in_flight, stopped_at=None)
        )
        return bool(res.rowcount)


async def stopped(db: Database, worker_id: str, *, now: datetime) -> None:
    """The worker stopped cleanly."""
    async with db.begin() as conn:
        await conn.execute(
            update(workers)
            .where(workers.c.worker_id == worker_id)
            .values(stopped_at=now, last_seen_at=now, in_flight=0)
        )


async def list_workers(
    db: Database, *, now: datetime, since: timedelta = timedelta(days=1), limit: int = 500
) -> list[WorkerRow]:
    """Workers seen within ``since``, the most recently seen first, each with its state."""
    c = workers.c
    async with db.read() as conn:
        rows = await conn.execute(
            select(workers)
            .where(c.last_seen_at >= now - since)
            .order_by(c.last_seen_at.desc(), c.worker_id)
            .limit(limit)
        )
        out = []
        for r in rows:
            m = r._mapping
            out.append(
                WorkerRow(
                    **{k: m[k] for k in m.keys()},  # noqa: SIM118 - a RowMapping
                    state=worker_state(
                        last_seen_at=m["last_seen_at"],
                        stopped_at=m["stopped_at"],
                        heartbeat_seconds=m["heartbeat_seconds"],
                        now=now,
                    ),
                )
            )
        return out


async def alive_count(db: Database, *, now: datetime) -> int:
    """How many workers are alive at ``now``."""
    return sum(1 for w in await list_workers(db, now=now) if w.state == "alive")


async def prune(db: Database, *, older_than: timedelta, now: datetime) -> int:
    """Forget workers not seen for ``older_than``; return how many."""
    async with db.begin() as conn:
        res = await conn.execute(delete(workers).where(workers.c.last_seen_at < now - older_than))
        return int(res.rowcount or 0)
