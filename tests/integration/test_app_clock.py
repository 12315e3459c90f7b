"""An App's clock is the time of what a test writes through its database: jobs enqueued
with enqueue/enqueue_many under App(clock=FakeClock) are due on that clock, so the App's
worker runs them (on both engines)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from synckit import App, Connector, JobContext, enqueue, enqueue_many
from synckit.errors.exceptions import NothingDueWarning
from synckit.store.db import Database
from synckit.store.jobs.admin import get_job
from synckit.store.jobs.enqueueing import JobSpec
from synckit.testing import FakeClock
from synckit.testing.fixtures import run_worker_until_idle


class Quiet(Connector):
    name = "quiet"


async def test_jobs_enqueued_under_a_fake_clock_are_run_by_the_apps_worker(db: Database) -> None:
    """The FakeClock is two years behind the wall: jobs stamped by the wall clock would
    never be due; stamped by the App's clock they all run."""
    clock = FakeClock()
    app = App([Quiet], clock=clock)
    ran: list[int] = []

    @app.registry.handler("note")
    async def note(ctx: JobContext) -> None:
        ran.append(ctx.payload["n"])

    await app.add_tenant(db, "acme", "quiet")
    created = await enqueue_many(db, [JobSpec(kind="note", payload={"n": i}) for i in range(3)])
    later = await enqueue(db, "note", {"n": 9}, delay=timedelta(minutes=5))
    info = await get_job(db, created[0].id)
    assert info.run_at == clock()
    stats = await run_worker_until_idle(app, db)
    assert sorted(ran) == [0, 1, 2] and stats.succeeded == 3
    clock.advance(timedelta(minutes=5))
    await run_worker_until_idle(app, db)
    assert sorted(ran) == [0, 1, 2, 9]
    assert (await get_job(db, later.id)).status == "succeeded"


async def test_run_until_idle_says_why_when_every_job_is_due_later(db: Database) -> None:
    """A job stamped by another clock (the wall's, two years ahead of the FakeClock) is not
    run, and run_until_idle says so instead of returning silently."""
    app = App([Quiet], clock=FakeClock())

    @app.registry.handler("note")
    async def note(ctx: JobContext) -> None:
        pass

    await enqueue(db, "note", {}, now=datetime.now(UTC))
    with pytest.warns(NothingDueWarning, match="1 pending job"):
        stats = await run_worker_until_idle(app, db)
    assert stats.claimed == 0
