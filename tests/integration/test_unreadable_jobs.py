"""Pending jobs whose run_at cannot be read: found on both engines, and the worker's
periodic alert evaluation warns once per job while the rest of the queue runs."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, text
from structlog.testing import capture_logs

from synckit.clock import utcnow
from synckit.errors import RetryPolicy
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.runtime.observe.alert_delivery import AlertRouter
from synckit.runtime.observe.alert_rules import RuleSet
from synckit.runtime.observe.alerts import register_alerts
from synckit.runtime.sync import cron
from synckit.store.db import Database
from synckit.store.jobs import enqueueing
from synckit.store.jobs.admin import count_unreadable_run_at, unreadable_run_at
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.tables import jobs

#: Stored run_at values no reader takes, per engine: past any time (a claim never takes
#: them) and before the readable range (a claim takes and quarantines them).
UNREADABLE = {
    "sqlite": ["'garbage'", "'9999-12-31 23:59:59'", "''"],
    "postgresql": ["'20000-01-01'::timestamptz", "'infinity'", "'0044-03-15 BC'"],
}
#: How they read back as text (PostgreSQL's in the session's time zone, so a prefix).
STORED = {
    "sqlite": ["garbage", "9999-12-31 23:59:59", ""],
    "postgresql": ["20000-01-0", "infinity", "0044-03-1"],
}


async def set_run_at(db: Database, job_id: int, sql: str, status: str = "pending") -> None:
    async with db.begin() as conn:
        await conn.execute(
            text(f"UPDATE jobs SET run_at = {sql}, status = '{status}' WHERE id = {job_id}")
        )


async def test_pending_jobs_whose_run_at_cannot_be_read_are_found(
    db: Database, engine_name: str
) -> None:
    """Keyed and unkeyed pending jobs with an unreadable run_at are counted and listed
    oldest first with the stored text; sound jobs and finished ones are not."""
    specs = [JobSpec("k", resource_key="lane:a" if i % 2 else None) for i in range(6)]
    ids = [j.id for j in await enqueueing.enqueue_many(db, specs)]
    bad = UNREADABLE[engine_name]
    for job_id, sql in zip(ids[:3], bad, strict=True):
        await set_run_at(db, job_id, sql)
    await set_run_at(db, ids[3], bad[0], status="dead")  # finished: it is not waiting
    async with db.begin() as conn:
        assert await count_unreadable_run_at(conn) == 3
        found = await unreadable_run_at(conn)
        assert await unreadable_run_at(conn, limit=2) == found[:2]
    assert [j.id for j in found] == ids[:3]
    assert [j.resource_key for j in found] == [None, "lane:a", None]
    for job, stored in zip(found, STORED[engine_name], strict=True):
        assert job.stored.startswith(stored) and job.reason.endswith(f"{job.stored!r}")
    assert found[0].reason.startswith("run_at cannot be read: ")


async def test_the_worker_warns_once_per_job_that_never_runs(
    db: Database, engine_name: str
) -> None:
    """Under a worker, the recurring alert evaluation logs one warning naming the job
    whose run_at cannot be read; evaluating again the same day logs none; the sound
    job beside it runs, and the stuck one stays pending, untouched."""
    ran: list[int] = []

    async def handle(ctx: JobContext) -> None:
        ran.append(ctx.job.id)

    reg = Registry()
    reg.add("k", handle)
    only = RuleSet(
        server_errors=None,
        tenant_outlier=None,
        deploy_regression=None,
        dlq_growth=None,
        poll_lag=None,
        needs_reauth=None,
        dead_cycles=None,
        error_budget=None,
        dlq_review=None,
    )
    evaluator = register_alerts(
        reg, rules=only, router=AlertRouter(db=db), every=timedelta(minutes=1)
    )
    stuck, sound = await enqueueing.enqueue_many(db, [JobSpec("k"), JobSpec("k")])
    await set_run_at(db, stuck.id, UNREADABLE[engine_name][0])
    now = utcnow()
    await cron.sync_schedules(db, reg.schedules, now - timedelta(minutes=2))
    with capture_logs() as logs:
        await Worker(
            db, reg, retry_policy=RetryPolicy.deterministic(), poll_interval=0.05
        ).run_until_idle()
        await evaluator.evaluate(now + timedelta(minutes=1), db=db)
    warned = [e for e in logs if e["event"] == "alert.fired"]
    assert len(warned) == 1, warned
    assert warned[0]["log_level"] == "warning" and warned[0]["subject"] == f"job:{stuck.id}"
    assert f"job {stuck.id} (k) never runs" in warned[0]["message"]
    assert ran == [sound.id]
    async with db.begin() as conn:
        status = (await conn.execute(select(jobs.c.status).where(jobs.c.id == stuck.id))).scalar()
    assert status == "pending"
