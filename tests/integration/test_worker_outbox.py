"""Jobs publish through the outbox: the message commits with the job's success."""

from __future__ import annotations

import asyncio
from typing import Any

from synckit.errors import RetryPolicy
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.runtime.writes import outbox
from synckit.runtime.writes.outbox import CallbackPublisher
from synckit.store.db import Database
from synckit.store.jobs import admin, enqueueing


async def test_worker_relays_messages_of_succeeded_jobs_only(db: Database) -> None:
    """A job's message is relayed after its success; a failed job's message never exists."""
    reg = Registry(retry_policy=RetryPolicy.deterministic())

    @reg.handler("invoice.send")
    async def send(ctx: JobContext) -> None:
        ctx.publish("invoices", {"invoice": ctx.payload["n"]}, key=f"customer-{ctx.payload['n']}")
        if ctx.payload.get("fail"):
            raise ValueError("the send failed after publishing")

    published: list[Any] = []

    async def record(message: Any) -> None:
        published.append(message)

    await enqueueing.enqueue(db, "invoice.send", {"n": 1})
    await enqueueing.enqueue(db, "invoice.send", {"n": 2, "fail": True}, max_attempts=1)
    worker = Worker(db, reg, poll_interval=0.05, outbox_publisher=CallbackPublisher(record))
    running = asyncio.create_task(worker.run())
    try:
        for _ in range(200):
            # The relay marks a message sent after its publisher returns: wait for the mark
            # too (stopped between the two, the message stays pending and the next relay
            # sends it again, which the outbox allows: at least once).
            if (
                published
                and (await admin.count_by_status(db)).get("pending", 0) == 0
                and await outbox.pending_count(db) == 0
            ):
                break
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await running
    assert len(published) == 1
    assert published[0].payload == {"invoice": 1}
    assert published[0].message_id.startswith("job-")
    assert await outbox.pending_count(db) == 0
