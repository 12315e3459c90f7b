"""Poison rows in the queue, on both engines: one row the runtime cannot read is
quarantined or read as harmless, named in a warning, and a canary beside it still runs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import structlog
from sqlalchemy import insert, select, text
from structlog.testing import capture_logs

from synckit.errors.exceptions import RetryableError
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.recorder import WorkerStats
from synckit.runtime.jobs.worker import Worker
from synckit.store.db import Database
from synckit.store.jobs import enqueueing
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.tables import connections, jobs, resources

# What each engine can hold that no reader can read.
BAD_PAYLOAD = {
    "sqlite": "'{not json'",
    # JSONB holds only JSON, but a 5,000-digit number is past what Python's json reads.
    "postgresql": "('1' || repeat('0', 5000))::jsonb",
}
# Due (before now), yet no datetime: text that sorts first on SQLite, a BC date on PostgreSQL.
BAD_DUE_TIME = {"sqlite": "'0000 garbage'", "postgresql": "'0044-03-15 BC'::timestamptz"}
# Later than now as stored, yet no datetime.
BAD_LATER_TIME = {"sqlite": "'garbage'", "postgresql": "'20000-01-01'::timestamptz"}


def registry() -> Registry:
    reg = Registry()

    @reg.handler("ok")
    async def ok(ctx: JobContext) -> None:
        return None

    @reg.handler("flaky")
    async def flaky(ctx: JobContext) -> None:
        raise RetryableError("try again")

    return reg


async def drain(db: Database) -> tuple[WorkerStats, list[dict[str, object]]]:
    with capture_logs() as logs:
        stats = await asyncio.wait_for(Worker(db, registry(), concurrency=4).run_until_idle(), 20)
    structlog.reset_defaults()
    return stats, logs


async def statuses(db: Database) -> dict[int, tuple[str, str | None]]:
    async with db.begin() as conn:
        rows = await conn.execute(select(jobs.c.id, jobs.c.status, jobs.c.last_error))
        return {r.id: (r.status, r.last_error) for r in rows}


async def poison_job(db: Database, column: str, value: str) -> tuple[int, list[int]]:
    """A poisoned job in lane "t1" among canaries in its lane, another lane and none."""
    made = await enqueueing.enqueue_many(
        db,
        [
            JobSpec("ok", resource_key="t1"),
            JobSpec("ok", resource_key="t1"),
            JobSpec("ok", resource_key="t2"),
            JobSpec("ok"),
        ],
    )
    bad, *canaries = [e.id for e in made]
    async with db.begin() as conn:
        await conn.execute(text(f"UPDATE jobs SET {column} = {value} WHERE id = {bad}"))
    return bad, canaries


async def test_a_job_whose_payload_cannot_be_read_is_quarantined_and_the_rest_runs(
    db: Database, engine_name: str
) -> None:
    """A payload no reader can read: that job dead, 'unreadable row: payload ...', named
    in a warning; its lane's, another lane's and the keyless canaries all succeed."""
    bad, canaries = await poison_job(db, "payload", BAD_PAYLOAD[engine_name])
    stats, logs = await drain(db)
    got = await statuses(db)
    assert stats.succeeded == 3
    assert all(got[c][0] == "succeeded" for c in canaries)
    status, error = got[bad]
    assert status == "dead" and error is not None and error.startswith("unreadable row: payload")
    assert [e["job_id"] for e in logs if e["event"] == "job.unreadable"] == [bad]


async def test_a_job_whose_run_time_cannot_be_read_is_quarantined_and_the_rest_runs(
    db: Database, engine_name: str
) -> None:
    """A due run_at no datetime can hold: that job dead, 'unreadable row: run_at ...'; the
    canaries succeed."""
    bad, canaries = await poison_job(db, "run_at", BAD_DUE_TIME[engine_name])
    stats, logs = await drain(db)
    got = await statuses(db)
    assert stats.succeeded == 3
    assert all(got[c][0] == "succeeded" for c in canaries)
    status, error = got[bad]
    assert status == "dead" and error is not None and error.startswith("unreadable row: run_at")
    assert [e["job_id"] for e in logs if e["event"] == "job.unreadable"] == [bad]


async def test_a_resource_in_an_unknown_state_reads_as_closed_and_the_batch_records(
    db: Database,
) -> None:
    """Resource state 'exploded': its jobs are claimed and recorded as for a closed
    breaker (a warning names it, the row is written back closed); another tenant's
    outcomes in the same batches record too."""
    specs = [JobSpec("ok", resource_key=k) for k in ("bad", "good") for _ in range(3)]
    specs += [JobSpec("flaky", resource_key=k, max_attempts=1) for k in ("bad", "good")]
    await enqueueing.enqueue_many(db, specs)
    async with db.begin() as conn:
        await conn.execute(
            text("UPDATE resources SET state = 'exploded' WHERE resource_key = 'bad'")
        )
    stats, logs = await drain(db)
    assert (stats.succeeded, stats.dead) == (6, 2)
    assert all(s != "pending" and s != "running" for s, _ in (await statuses(db)).values())
    warned = [e for e in logs if e["event"] == "resource.unreadable"]
    assert warned and {e["resource_key"] for e in warned} == {"bad"}
    async with db.begin() as conn:
        state = (
            await conn.execute(select(resources.c.state).where(resources.c.resource_key == "bad"))
        ).scalar_one()
    assert state == "closed"


async def test_a_resource_paced_until_an_unreadable_time_is_not_held_back(
    db: Database, engine_name: str
) -> None:
    """next_available_at no datetime can hold: the lane is claimed as unpaced, a failure in
    it records (warning naming the resource), and the other tenant runs."""
    specs = [JobSpec("ok", resource_key=k) for k in ("bad", "good") for _ in range(3)]
    specs += [JobSpec("flaky", resource_key=k, max_attempts=1) for k in ("bad", "good")]
    await enqueueing.enqueue_many(db, specs)
    async with db.begin() as conn:
        await conn.execute(
            text(
                f"UPDATE resources SET next_available_at = {BAD_LATER_TIME[engine_name]}"
                " WHERE resource_key = 'bad'"
            )
        )
    stats, logs = await drain(db)
    assert (stats.succeeded, stats.dead) == (6, 2)
    assert {e["resource_key"] for e in logs if e["event"] == "resource.unreadable"} == {"bad"}


async def test_a_connection_in_an_unknown_status_does_not_stop_other_tenants(
    db: Database,
) -> None:
    """connections.status 'exploded': that tenant's job waits (only 'active' runs), every
    other tenant's jobs run."""
    now = datetime.now(UTC)
    async with db.begin() as conn:
        await conn.execute(
            insert(connections),
            [
                {
                    "tenant": t,
                    "connector": "c",
                    "resource_key": t,
                    "status": status,
                    "created_at": now,
                    "updated_at": now,
                }
                for t, status in (("odd", "exploded"), ("good", "active"))
            ],
        )
    made = await enqueueing.enqueue_many(
        db, [JobSpec("ok", resource_key=k) for k in ("odd", "good", "good")] + [JobSpec("ok")]
    )
    stats, _ = await drain(db)
    got = await statuses(db)
    assert stats.succeeded == 3
    assert got[made[0].id][0] == "pending"
    assert all(got[e.id][0] == "succeeded" for e in made[1:])
