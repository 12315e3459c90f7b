"""The App wires the DLQ: a record that failed in a poll cycle is replayed automatically."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from sqlalchemy import select

from synckit import App, Connector, Page, SyncContext
from synckit.store.db import Database
from synckit.store.tables import dead_letters
from synckit.testing import FakeAPI, FakeClock


class Flaky(Connector):
    """Three records; record 2's sink call fails until the sink recovers."""

    name = "flaky"
    base_url = "https://api.test"

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        yield Page([{"id": "1"}, {"id": "2"}, {"id": "3"}], checkpoint={"done": True})

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        await ctx.http.post("/sink", json=record)


async def test_failed_record_is_dead_lettered_then_replayed_by_the_worker(db: Database) -> None:
    """A poll cycle dead-letters the failing record; the App's replay job resolves it later."""
    healthy = False
    received: list[str] = []

    def sink(req: Any) -> Any:
        record = req.json()
        if record["id"] == "2" and not healthy:
            from synckit.testing import Reply

            return Reply.json({"error": "bad"}, status=422)
        received.append(record["id"])
        return {"ok": True}

    api = FakeAPI()
    api.route("POST", "/sink", sink)
    clock = FakeClock()
    app = App([Flaky], transport=api.transport())
    await app.add_tenant(db, "acme", "flaky")
    await app.poll(db, "acme")
    assert sorted(received) == ["1", "3"]
    async with db.begin() as conn:
        row = (await conn.execute(select(dead_letters))).one()
    assert (row.kind, row.record_id, row.error_class) == ("record:default", "2", "validation")
    assert row.status == "review"  # validation goes straight to review, not auto-replay
    # An operator fixes the data and sends it back for replay: the App's replay job runs it.
    async with db.begin() as conn:
        await conn.execute(
            dead_letters.update().values(status="pending", next_retry_at=clock.now())
        )
    healthy = True
    await app.worker(db, clock=clock, poll_interval=0.05).run_until_idle()  # schedules ticks
    clock.advance(timedelta(minutes=5))
    stats = await app.worker(db, clock=clock, poll_interval=0.05).run_until_idle()
    assert stats.succeeded >= 1
    assert sorted(received) == ["1", "2", "3"]
    async with db.begin() as conn:
        assert (await conn.execute(select(dead_letters.c.status))).scalar_one() == "resolved"
