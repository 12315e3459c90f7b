"""Fenced finishes on both engines: a holder whose lease ended and whose row another
holder took over cannot finish it, whatever the outcome it brings (jobs, intents, dead
letter replays). Outbox, OAuth refresh and alert delivery have theirs beside their other
lease tests (test_outbox.py, test_refresh_leases.py, test_alert_leases.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from synckit.store import intents as intent_store
from synckit.store.db import Database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import replay as dlq_replay
from synckit.store.jobs import admin, claiming, enqueueing, leasing, outcomes
from synckit.store.jobs._base import ClaimedJob
from synckit.store.leases import Lease
from synckit.store.tables import intents

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=5)


async def _taken_over(db: Database) -> tuple[ClaimedJob, ClaimedJob]:
    """A job claimed by worker a, rescued once a's lease ended, claimed again by b."""
    await enqueueing.enqueue(db, "k", {}, run_at=NOW)
    [a] = await claiming.claim(db, "worker-a", 1, now=NOW, lease=LEASE)
    assert await leasing.rescue_expired(db, now=NOW + 2 * LEASE) == 1
    [b] = await claiming.claim(db, "worker-b", 1, now=NOW + 3 * LEASE, lease=LEASE)
    assert a.id == b.id and a.claim_token != b.claim_token
    return a, b


async def _complete(conn: Any, a: ClaimedJob) -> object:
    return await outcomes.complete_many(conn, [(a.id, a.claim_token)], now=NOW) or None


async def _fail(conn: Any, a: ClaimedJob) -> object:
    return await outcomes.fail(
        conn, a, now=NOW, error_class="transient", message="late", retry_at=None
    )


async def _retry(conn: Any, a: ClaimedJob) -> object:
    return await outcomes.fail(
        conn, a, now=NOW, error_class="transient", message="late", retry_at=NOW
    )


async def _snooze(conn: Any, a: ClaimedJob) -> object:
    return await outcomes.snooze(conn, a, now=NOW, until=NOW) or None


async def _discard(conn: Any, a: ClaimedJob) -> object:
    return await outcomes.finish(conn, a, now=NOW, status="discarded", reason="late") or None


FINISHES: dict[str, Callable[[Any, ClaimedJob], Awaitable[object]]] = {
    "complete": _complete,
    "fail": _fail,
    "retry": _retry,
    "snooze": _snooze,
    "discard": _discard,
}


@pytest.mark.parametrize("outcome", sorted(FINISHES))
async def test_a_job_holder_taken_over_cannot_finish_it(db: Database, outcome: str) -> None:
    """Worker a's lease ran out and b holds the job: a's outcome changes nothing, its
    heartbeat and start mark hold nothing, and b's completion stands."""
    a, b = await _taken_over(db)
    async with db.begin() as conn:
        assert await FINISHES[outcome](conn, a) is None
    assert (await leasing.beat(db, "worker-a", [(a.id, a.claim_token)], lease=LEASE)).alive == set()
    held = [(a.id, a.claim_token)]
    assert await outcomes.start_many(db, held, now=NOW + 3 * LEASE, lease=LEASE) == set()
    info = await admin.get_job(db, a.id)
    assert (info.status, info.locked_by) == ("running", "worker-b")
    async with db.begin() as conn:
        assert await outcomes.complete_many(conn, [(b.id, b.claim_token)], now=NOW) == {b.id}
    assert (await admin.get_job(db, a.id)).status == "succeeded"


async def test_an_intent_holder_taken_over_cannot_release_it(db: Database) -> None:
    """Run a's lease on an intent ran out and run b took it: a's failed call releases
    nothing and leaves b's lease in place. (An intent's *success* is recorded whoever
    holds the lease, on purpose: the remote record exists; see intents.finish.)"""
    ids = {"tenant": "acme", "connector": "crm", "key": "k1", "fingerprint": "f"}
    _, took = await intent_store.claim(db, **ids, lease=Lease("a", NOW + LEASE), now=NOW)
    assert took
    later = NOW + 2 * LEASE
    _, took = await intent_store.claim(db, **ids, lease=Lease("b", later + LEASE), now=later)
    assert took
    del ids["fingerprint"]
    assert not await intent_store.release(db, **ids, token="a", error="late", now=later)
    async with db.read() as conn:
        row = (await conn.execute(select(intents))).one()
    assert (row.lease_token, row.result) == ("b", None)
    assert await intent_store.release(db, **ids, token="b", error="boom", now=later)


async def test_a_replayer_taken_over_cannot_finish_the_dead_letter(db: Database) -> None:
    """Replayer a's lease on a dead letter ran out and b claimed the row: a's resolve,
    retry and review all change nothing; b's resolve stands."""
    async with db.begin() as conn:
        captured = await dlq_capture.capture(
            conn,
            tenant="acme",
            connector="mail",
            kind="record:messages",
            record_id="r1",
            payload={"id": "r1"},
            error_class="transient",
            message="boom",
            now=NOW,
        )
    due = NOW + timedelta(minutes=2)
    async with db.begin() as conn:
        [row] = await dlq_replay.claim_due(conn, now=due, limit=1, lease=Lease("a", due + LEASE))
        later = due + 2 * LEASE
        assert [
            r.id
            for r in await dlq_replay.claim_ids(
                conn, [row.id], now=later, lease=Lease("b", later + LEASE)
            )
        ] == [captured.id]
    async with db.begin() as conn:
        assert await dlq_replay.mark_resolved(conn, [row.id], now=later, token="a") == []
        assert not await dlq_replay.schedule_retry(conn, row, later, now=later, token="a")
        assert not await dlq_replay.mark_review(conn, row, "late", now=later, token="a")
    fresh = await dlq_reads.get(db, row.id)
    assert fresh.status == "pending" and fresh.replay_attempts == 0
    async with db.begin() as conn:
        assert await dlq_replay.mark_resolved(conn, [row.id], now=later, token="b") == [row.id]
