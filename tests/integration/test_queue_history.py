"""The queue's depth history (issue 34), on SQLite and PostgreSQL: a sample tells pending
jobs apart by what they wait for (paced apart from ready, scheduled and retrying), one
row a minute however many workers sample, kept for a day."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from procs import spawn_worker, stop_all, wait_started, worker_log  # tests/
from sqlalchemy import func, select, update
from waits import await_until

from synckit.clock import utcnow
from synckit.runtime.http.pacing import defer_resource
from synckit.store import queue_history
from synckit.store.db import Database
from synckit.store.jobs import enqueueing
from synckit.store.tables import jobs, queue_samples


async def rows(db: Database) -> list[queue_history.QueueSample | None]:
    async with db.read() as conn:
        got = await queue_history.history(conn, now=utcnow() + timedelta(days=2), minutes=4000)
    return [s for _m, s in got if s is not None]


async def test_a_sample_tells_paced_jobs_from_ready_scheduled_and_retrying(db: Database) -> None:
    now = utcnow()
    later = now + timedelta(minutes=10)
    for _ in range(2):
        await enqueueing.enqueue(db, "send.invoice", {}, now=now - timedelta(seconds=5))
    await enqueueing.enqueue(db, "send.invoice", {}, run_at=later)
    retrying = await enqueueing.enqueue(db, "send.invoice", {}, run_at=later)
    limited = await enqueueing.enqueue(db, "sync.orders", {}, run_at=later)
    running = await enqueueing.enqueue(db, "sync.orders", {})
    # Due, but its resource is paced until later: paced, not ready.
    await enqueueing.enqueue(db, "sync.orders", {}, resource_key="shop:globex", now=now)
    await defer_resource(db, "shop:globex", later, "Retry-After")
    async with db.begin() as conn:
        for job_id, values in (
            (retrying.id, {"error_class": "transient", "last_error": "502"}),
            (limited.id, {"error_class": "rate_limited", "last_error": "429"}),
            (running.id, {"status": "running"}),
        ):
            await conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
        counts, capped = await queue_history.read_depth(conn, now=now)
    assert (counts, capped) == (
        {"running": 1, "ready": 2, "retrying": 1, "paced": 2, "scheduled": 1},
        False,
    )
    async with db.read() as conn:
        assert (await queue_history.read_depth(conn, now=now, cap=3))[1] is True

    assert await queue_history.sample(db, now=now) is True
    assert await queue_history.sample(db, now=now + timedelta(seconds=1)) is False
    (taken,) = await rows(db)
    assert (taken.paced, taken.ready, taken.depth) == (2, 2, 7)
    # A day on, the old sample is forgotten as the new one is written.
    assert await queue_history.sample(db, now=now + queue_history.KEEP + timedelta(minutes=2))
    (kept,) = await rows(db)
    assert kept.minute > taken.minute


async def test_workers_in_several_processes_write_one_sample_a_minute(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    procs = [spawn_worker(migrated_url, tmp_path / "log") for _ in range(3)]
    try:
        wait_started(procs)

        async def sampled() -> bool:
            async with db.read() as conn:
                n = (await conn.execute(select(func.count()).select_from(queue_samples))).scalar()
            return bool(n)

        await await_until(sampled, "no worker wrote a queue sample")
        for p in procs:
            assert p.poll() is None, worker_log(p)[-2000:]
    finally:
        stop_all(procs)
    async with db.read() as conn:
        minutes = [r.minute for r in await conn.execute(select(queue_samples.c.minute))]
    assert len(minutes) == len(set(minutes)) >= 1
    for p in procs:
        log = worker_log(p)
        assert "queue_samples" not in log and "unexpected_error" not in log, log[-2000:]
