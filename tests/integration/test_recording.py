"""Recording outcomes: one outcome never stalls the batch; the claim's SQL is the breaker's
pure decision."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, select

from synckit.errors.exceptions import RetryableError
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.store.db import Database
from synckit.store.jobs import admin, enqueueing
from synckit.store.jobs.enqueueing import JobSpec


async def test_a_3_000_000_day_wait_is_clamped_and_the_batch_beside_it_records(
    db: Database,
) -> None:
    """Ten normal jobs and one asking for a 3,000,000-day wait: all recorded, the wait 24 h."""
    reg = Registry()

    @reg.handler("ok")
    async def ok(ctx: JobContext) -> None:
        return None

    @reg.handler("huge")
    async def huge(ctx: JobContext) -> None:
        raise RetryableError("come back much later", retry_after=timedelta(days=3_000_000))

    await enqueueing.enqueue_many(db, [JobSpec("ok") for _ in range(10)] + [JobSpec("huge")])
    before = datetime.now(UTC)
    stats = await Worker(db, reg, concurrency=4).run_until_idle()
    assert (stats.succeeded, stats.retried) == (10, 1)
    [info] = await admin.list_jobs(db, kind="huge")
    assert info.status == "pending" and info.attempts == 1
    assert before + timedelta(hours=23) < info.run_at <= datetime.now(UTC) + timedelta(hours=24)


async def test_an_outcome_the_database_refuses_is_recorded_as_a_failure(db: Database) -> None:
    """An error text with NUL bytes (refused by PostgreSQL) fails only its own job."""
    reg = Registry()

    @reg.handler("ok")
    async def ok(ctx: JobContext) -> None:
        return None

    @reg.handler("nul")
    async def nul(ctx: JobContext) -> None:
        raise RuntimeError("bad \x00 byte")

    await enqueueing.enqueue_many(db, [JobSpec("ok") for _ in range(5)] + [JobSpec("nul")])
    stats = await Worker(db, reg, concurrency=2).run_until_idle()
    assert stats.succeeded == 5
    [info] = await admin.list_jobs(db, kind="nul")
    assert info.status == "pending" and info.attempts == 1 and info.last_error


async def test_a_follow_up_the_database_refuses_fails_only_its_own_job(db: Database) -> None:
    """Successes with follow-ups and messages commit together; one whose follow-up cannot
    be written (here, one appended past ctx.enqueue's checks; on PostgreSQL also a
    payload with a lone surrogate, which jsonb refuses) is recorded as a failure with its
    reason, its follow-up not created, and the batch beside it commits. Before, the
    recorder retried the whole batch for ever and run_until_idle never returned."""
    reg = Registry()

    @reg.handler("parent")
    async def parent(ctx: JobContext) -> None:
        ctx.enqueue("child", {"n": ctx.payload["n"]})

    @reg.handler("broken")
    async def broken(ctx: JobContext) -> None:
        ctx.enqueue("child", {"n": -1})
        ctx.followups.append(JobSpec(kind=None))  # type: ignore[arg-type]

    @reg.handler("surrogate")
    async def surrogate(ctx: JobContext) -> None:
        ctx.enqueue("child", {"text": "\ud800"})

    @reg.handler("child")
    async def child(ctx: JobContext) -> None:
        return None

    specs = [JobSpec("parent", {"n": n}) for n in range(8)] + [JobSpec("broken")]
    if db.is_postgres:
        specs.append(JobSpec("surrogate"))
    await enqueueing.enqueue_many(db, specs)
    worker = Worker(db, reg, concurrency=16)
    await asyncio.wait_for(worker.run_until_idle(), 60)
    parents = await admin.list_jobs(db, kind="parent", limit=100)
    assert {p.status for p in parents} == {"succeeded"}
    children = [await admin.get_job(db, c.id) for c in await admin.list_jobs(db, kind="child")]
    assert sorted(c.payload["n"] for c in children) == list(range(8))
    refused = await admin.list_jobs(db, kind="broken") + await admin.list_jobs(db, kind="surrogate")
    for info in refused:
        assert info.status == "pending" and info.attempts == 1, info
        assert "outcome could not be recorded" in (info.last_error or ""), info.last_error


async def test_a_needs_reauth_reason_is_stored_redacted(db: Database) -> None:
    """The reason a connection needs re-authorisation passes the redaction step."""
    from synckit.errors.exceptions import NeedsReauth
    from synckit.store.tables import connections

    reg = Registry()

    @reg.handler("call")
    async def call(ctx: JobContext) -> None:
        raise NeedsReauth("refused https://api.example.com/me?access_token=tok_SEEKRIT_4242")

    now = datetime.now(UTC)
    async with db.begin() as conn:
        await conn.execute(
            insert(connections).values(
                tenant="acme",
                connector="c",
                resource_key="c:acme",
                status="active",
                created_at=now,
                updated_at=now,
            )
        )
    await enqueueing.enqueue(db, "call", {}, resource_key="c:acme")
    await Worker(db, reg, concurrency=1).run_until_idle()
    async with db.begin() as conn:
        row = (await conn.execute(select(connections.c.status, connections.c.status_reason))).one()
    assert row.status == "needs_reauth"
    assert "tok_SEEKRIT_4242" not in row.status_reason and "access_token" in row.status_reason
