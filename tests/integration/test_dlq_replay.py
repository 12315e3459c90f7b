"""The replay processor on both engines: outcomes, backoff, review, ignore, breakers, jobs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text, update
from structlog.testing import capture_logs

from synckit.dlq import DLQ_REPLAY_KIND, Replayers, ReplayProcessor, register_dlq_replay
from synckit.errors.exceptions import PermanentError, RateLimited, RetryableError, Unreplayable
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.store.db import Database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import rows as dlq_rows
from synckit.store.dead_letters.rows import DeadLetter
from synckit.store.jobs import admin, enqueueing, outcomes
from synckit.store.resources import configure_resource
from synckit.store.tables import dead_letters, resources
from synckit.store.tables import jobs as jobs_table

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


class Fixed:
    def __init__(self, value: float = 0.0) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


async def cap(db: Database, record_id: str, **kw: Any) -> int:
    args: dict[str, Any] = {
        "tenant": "acme",
        "connector": "mail",
        "kind": "record:messages",
        "record_id": record_id,
        "payload": {"id": record_id},
        "error_class": "transient",
        "message": "first failure",
        "now": T0 - timedelta(minutes=1),
        **kw,
    }
    async with db.begin() as conn:
        return (await dlq_capture.capture(conn, **args)).id


def recorder(
    fail: Callable[[DeadLetter], BaseException | None] = lambda r: None,
) -> tuple[Replayers, list[int]]:
    seen: list[int] = []

    async def replay(row: DeadLetter) -> None:
        seen.append(row.id)
        exc = fail(row)
        if exc is not None:
            raise exc

    replayers = Replayers()
    replayers.register_prefix("record:", replay)
    return replayers, seen


def processor(db: Database, replayers: Replayers, clock: Clock, **kw: Any) -> ReplayProcessor:
    return ReplayProcessor(db, replayers, rng=Fixed(0.0), clock=clock, **kw)


async def test_a_successful_replay_resolves_the_row(db: Database) -> None:
    """Due rows are replayed once each and resolved; rows not yet due are left alone."""
    a, b = await cap(db, "a"), await cap(db, "b")
    later = await cap(db, "later", retry_at=T0 + timedelta(hours=1))
    replayers, seen = recorder()
    summary = await processor(db, replayers, Clock()).run_once()
    assert sorted(seen) == sorted([a, b])
    assert summary.resolved == 2 and summary.claimed == 2
    ra = await dlq_reads.get(db, a)
    assert ra.status == "resolved" and ra.resolved_at == T0 and ra.replay_attempts == 1
    assert (await dlq_reads.get(db, later)).status == "pending"
    assert (await processor(db, replayers, Clock()).run_once()).claimed == 0


async def test_a_failed_replay_is_retried_with_backoff(db: Database) -> None:
    """A transient failure: pending, one replay attempt spent, next try in 2^1 minutes."""
    a = await cap(db, "a")
    replayers, _ = recorder(lambda r: RetryableError("503 again"))
    summary = await processor(db, replayers, Clock()).run_once()
    assert summary.retry == 1
    row = await dlq_reads.get(db, a)
    assert row.status == "pending" and row.replay_attempts == 1
    assert row.next_retry_at == T0 + timedelta(minutes=2)
    assert row.error_class == "transient" and "503 again" in row.error_message
    assert row.history[-1]["source"] == "replay" and row.traceback
    assert row.status_reason is None
    assert (row.lease_token, row.lease_expires_at, row.leased) == (None, None, False)  # released


async def test_the_backoff_sequence_across_replays_and_the_retry_after_floor(db: Database) -> None:
    """Successive failures wait 2, 4, 8... minutes; a longer server wait wins."""
    a = await cap(db, "a")
    clock = Clock()
    replayers, _ = recorder(lambda r: RetryableError("again"))
    proc = processor(db, replayers, clock, max_attempts=20)
    waits = []
    for _ in range(5):
        await proc.run_once()
        row = await dlq_reads.get(db, a)
        assert row.next_retry_at is not None
        waits.append(row.next_retry_at - clock.now)
        clock.now = row.next_retry_at
    assert waits == [timedelta(minutes=m) for m in (2, 4, 8, 16, 32)]
    b = await cap(db, "b", now=clock.now - timedelta(minutes=1))
    replayers2, _ = recorder(lambda r: RateLimited("slow down", retry_after=timedelta(hours=3)))
    await processor(db, replayers2, clock).run_once()
    row = await dlq_reads.get(db, b)
    assert row.next_retry_at == clock.now + timedelta(hours=3)
    assert row.error_class == "rate_limited"


async def test_review_after_the_attempt_limit_with_one_alert_per_tenant_and_class(
    db: Database,
) -> None:
    """After max_attempts failed replays rows go to review; one dlq.review event and one
    on_review call per (tenant, error class) of the run."""
    ids = [await cap(db, f"r{i}", tenant="acme" if i < 3 else "globex") for i in range(4)]
    clock = Clock()
    alerts: list[tuple[str, str, int]] = []
    replayers, _ = recorder(lambda r: RetryableError("still down"))
    proc = processor(
        db, replayers, clock, max_attempts=3, on_review=lambda t, c, n: alerts.append((t, c, n))
    )
    for _ in range(2):
        await proc.run_once()
        clock.advance(timedelta(hours=1))
    assert [(await dlq_reads.get(db, i)).status for i in ids] == ["pending"] * 4
    with capture_logs() as logs:
        summary = await proc.run_once()
    assert summary.review == 4
    rows = [await dlq_reads.get(db, i) for i in ids]
    assert all(r.status == "review" and r.replay_attempts == 3 for r in rows)
    assert "3 times" in (rows[0].status_reason or "")
    assert sorted(alerts) == [("acme", "transient", 3), ("globex", "transient", 1)]
    events = [e for e in logs if e["event"] == "dlq.review"]
    assert sorted((e["tenant"], e["count"]) for e in events) == [("acme", 3), ("globex", 1)]
    clock.advance(timedelta(days=2))
    assert (await proc.run_once()).claimed == 0  # review rows are not replayed again


async def test_validation_failure_on_replay_goes_straight_to_review(db: Database) -> None:
    """A permanent (validation) failure needs a human: review after one replay."""
    a = await cap(db, "a")
    replayers, _ = recorder(lambda r: PermanentError("422: bad field"))
    alerts: list[tuple[str, str, int]] = []
    proc = processor(db, replayers, Clock(), on_review=lambda t, c, n: alerts.append((t, c, n)))
    summary = await proc.run_once()
    assert summary.review == 1
    row = await dlq_reads.get(db, a)
    assert row.status == "review" and row.error_class == "validation"
    assert alerts == [("acme", "validation", 1)]


async def test_rows_that_cannot_be_replayed_are_ignored_and_the_rest_go_on(db: Database) -> None:
    """Unknown kind, Unreplayable (unknown connector) and a payload of the wrong shape are
    ignored with their reason; a replayer that raises anything else does not stop the run."""
    good = await cap(db, "good")
    unknown_kind = await cap(db, "x", kind="webhook:thing")
    unknown_connector = await cap(db, "y", connector="gone")
    wrong_shape = await cap(db, "z", payload=["not", "a", "record"])
    crashes = await cap(db, "crash")

    def fail(row: DeadLetter) -> BaseException | None:
        if row.connector == "gone":
            return Unreplayable("connector 'gone' is not installed")
        if row.record_id == "crash":
            return ZeroDivisionError("bug in the handler")
        return None

    replayers, seen = recorder(fail)
    summary = await processor(db, replayers, Clock()).run_once()
    assert summary.ignored == 3 and summary.resolved == 1 and summary.retry == 1
    assert (await dlq_reads.get(db, good)).status == "resolved"
    kind_row = await dlq_reads.get(db, unknown_kind)
    assert kind_row.status == "ignored" and "webhook:thing" in (kind_row.status_reason or "")
    conn_row = await dlq_reads.get(db, unknown_connector)
    assert conn_row.status == "ignored" and "not installed" in (conn_row.status_reason or "")
    shape_row = await dlq_reads.get(db, wrong_shape)
    assert shape_row.status == "ignored" and "not a JSON object" in (shape_row.status_reason or "")
    assert wrong_shape not in seen
    crash_row = await dlq_reads.get(db, crashes)
    assert crash_row.status == "pending" and "ZeroDivisionError" in crash_row.error_message


async def test_a_payload_that_does_not_parse_is_ignored(db: Database) -> None:
    """Corrupt JSON in the payload column (SQLite can hold it): ignored with the parse error."""
    if db.is_postgres:
        pytest.skip("JSONB cannot hold text that is not JSON")
    bad = await cap(db, "bad")
    good = await cap(db, "good")
    async with db.begin() as conn:
        await conn.execute(
            text("UPDATE dead_letters SET payload = '{\"id\": ' WHERE id = :i"), {"i": bad}
        )
    replayers, seen = recorder()
    summary = await processor(db, replayers, Clock()).run_once()
    assert summary.ignored == 1 and summary.resolved == 1 and seen == [good]
    row = await dlq_reads.get(db, bad)
    assert row.status == "ignored" and "does not parse" in (row.status_reason or "")


async def test_rows_of_a_resource_with_an_open_breaker_wait_without_spending_attempts(
    db: Database,
) -> None:
    """Breaker open (or resource paced): rows are pushed to when it is available, attempts
    untouched; once it is, they are replayed."""
    await configure_resource(db, "acme-mail")
    await configure_resource(db, "globex-mail")
    cooldown = T0 + timedelta(minutes=10)
    paced = T0 + timedelta(minutes=3)
    async with db.begin() as conn:
        await conn.execute(
            update(resources)
            .where(resources.c.resource_key == "acme-mail")
            .values(state="open", cooldown_until=cooldown)
        )
        await conn.execute(
            update(resources)
            .where(resources.c.resource_key == "globex-mail")
            .values(next_available_at=paced)
        )
    a = await cap(db, "a", resource_key="acme-mail")
    g = await cap(db, "g", tenant="globex", resource_key="globex-mail")
    free = await cap(db, "free", tenant="initech", resource_key="initech-mail")
    clock = Clock()
    replayers, seen = recorder()
    proc = processor(db, replayers, clock)
    summary = await proc.run_once()
    assert seen == [free] and summary.deferred == 2
    ra, rg = await dlq_reads.get(db, a), await dlq_reads.get(db, g)
    assert ra.status == "pending" and ra.replay_attempts == 0 and ra.next_retry_at == cooldown
    assert "breaker open" in (ra.status_reason or "")
    assert rg.replay_attempts == 0 and rg.next_retry_at == paced
    clock.now = cooldown
    await proc.run_once()
    assert sorted(seen) == sorted([free, a, g])


async def dead_job(db: Database, kind: str = "sync_job", payload: Any = None) -> tuple[int, int]:
    """A job that died, dead-lettered as the worker does; returns (job id, dead letter id)."""
    payload = {"tenant": "acme", "n": 1} if payload is None else payload
    job = await enqueueing.enqueue(db, kind, payload, now=T0 - timedelta(hours=1))
    async with db.begin() as conn:
        await conn.execute(
            update(jobs_table)
            .where(jobs_table.c.id == job.id)
            .values(status="dead", attempts=5, finished_at=T0)
        )
        await outcomes.dead_letter_job(
            conn,
            job_id=job.id,
            kind=kind,
            payload=payload,
            resource_key=None,
            error_class="transient",
            message="timeout",
            traceback=None,
            trace_id="trace-1",
            attempts=5,
            now=T0 - timedelta(minutes=5),
        )
        dl = (
            await conn.execute(
                dead_letters.select().where(dead_letters.c.record_id == f"job:{job.id}")
            )
        ).one()
    return job.id, dl.id


async def test_a_dead_job_is_run_again_and_its_row_resolved(db: Database) -> None:
    """A dead job whose row still exists is put back in the queue with fresh attempts; its
    dead letter is resolved, with the next replay's time kept for if it dies again."""
    job_id, dl = await dead_job(db)
    registry = Registry()

    @registry.handler("sync_job")
    async def sync_job(ctx: JobContext) -> None: ...

    summary = await ReplayProcessor(db, registry=registry, rng=Fixed(), clock=Clock()).run_once()
    assert summary.resolved == 1
    info = await admin.get_job(db, job_id)
    assert info.status == "pending" and info.attempts == 0
    row = await dlq_reads.get(db, dl)
    assert row.status == "resolved" and f"job {job_id} re-run" == row.status_reason
    assert row.replay_attempts == 1 and row.next_retry_at == T0 + timedelta(minutes=2)


async def test_a_job_that_is_gone_is_enqueued_anew(db: Database) -> None:
    """The job row was pruned: a new job of the same kind and payload is enqueued,
    atomically with resolving the row."""
    job_id, dl = await dead_job(db, payload={"tenant": "acme", "n": 7})
    async with db.begin() as conn:
        await conn.execute(jobs_table.delete().where(jobs_table.c.id == job_id))
    summary = await ReplayProcessor(db, rng=Fixed(), clock=Clock()).run_once()
    assert summary.resolved == 1
    row = await dlq_reads.get(db, dl)
    assert row.status_reason is not None and row.status_reason.startswith("re-enqueued as job ")
    new_id = int(row.status_reason.rsplit(" ", 1)[1])
    info = await admin.get_job(db, new_id)
    assert (info.kind, info.payload, info.status) == (
        "sync_job",
        {"tenant": "acme", "n": 7},
        "pending",
    )


async def test_a_job_kind_the_registry_does_not_know_is_ignored(db: Database) -> None:
    """With a job registry that has no handler for the kind, the row is ignored."""
    _, dl = await dead_job(db, kind="retired_job")
    summary = await ReplayProcessor(db, registry=Registry(), clock=Clock()).run_once()
    assert summary.ignored == 1
    row = await dlq_reads.get(db, dl)
    assert row.status == "ignored" and "retired_job" in (row.status_reason or "")


async def test_a_re_run_job_that_keeps_dying_reaches_review(db: Database) -> None:
    """Re-running the same job keeps one dead letter whose replay count carries on: after
    max_attempts replays that each died again, the row goes to review, not round again."""
    job_id, dl = await dead_job(db)
    clock = Clock()
    proc = ReplayProcessor(db, rng=Fixed(), clock=clock, max_attempts=2)
    for _ in range(2):
        assert (await proc.run_once()).resolved == 1
        async with db.begin() as conn:  # the worker runs it and it dies again
            await conn.execute(
                update(jobs_table).where(jobs_table.c.id == job_id).values(status="dead")
            )
            await outcomes.dead_letter_job(
                conn,
                job_id=job_id,
                kind="sync_job",
                payload={"tenant": "acme", "n": 1},
                resource_key=None,
                error_class="transient",
                message="timeout",
                traceback=None,
                trace_id=None,
                attempts=5,
                now=clock.now,
            )
        clock.advance(timedelta(hours=1))
    summary = await proc.run_once()
    assert summary.review == 1
    assert (await dlq_reads.get(db, dl)).status == "review"


async def test_a_slow_replayer_times_out_and_is_retried(db: Database) -> None:
    """A replay longer than its timeout counts as a transient failure."""
    a = await cap(db, "a")

    async def slow(row: DeadLetter) -> None:
        await asyncio.sleep(5)

    replayers = Replayers()
    replayers.register_prefix("record:", slow)
    summary = await processor(db, replayers, Clock(), timeout=0.05).run_once()
    assert summary.retry == 1
    row = await dlq_reads.get(db, a)
    assert row.error_class == "transient" and "timeout" in row.error_message


async def test_a_broken_alert_callback_does_not_stop_replays(db: Database) -> None:
    """on_review raising is logged; the run still returns its summary."""
    await cap(db, "a")
    replayers, _ = recorder(lambda r: PermanentError("bad"))

    def broken(tenant: str, error_class: str, count: int) -> None:
        raise RuntimeError("alert sink down")

    with capture_logs() as logs:
        summary = await processor(db, replayers, Clock(), on_review=broken).run_once()
    assert summary.review == 1
    assert any(e["event"] == "dlq.review_callback_failed" for e in logs)


async def test_manual_replay_takes_rows_whenever_due_including_review(db: Database) -> None:
    """replay_ids ignores next_retry_at and also replays review rows."""
    future = await cap(db, "f", retry_at=T0 + timedelta(days=1))
    review = await cap(db, "v", error_class="validation")
    replayers, seen = recorder()
    summary = await processor(db, replayers, Clock()).replay_ids([future, review])
    assert summary.resolved == 2 and sorted(seen) == sorted([future, review])


async def test_register_dlq_replay_runs_the_processor_as_a_recurring_job(db: Database) -> None:
    """The helper registers the synckit.dlq_replay handler and its schedule; a run of that
    job replays due rows."""
    a = await cap(db, "a", now=datetime.now(UTC) - timedelta(minutes=5))
    replayers, seen = recorder()
    registry = Registry()
    register_dlq_replay(
        registry, lambda: ReplayProcessor(db, replayers), every=timedelta(minutes=1)
    )
    assert registry.get(DLQ_REPLAY_KIND) is not None
    assert [s.kind for s in registry.schedules] == [DLQ_REPLAY_KIND]
    await enqueueing.enqueue(db, DLQ_REPLAY_KIND)
    stats = await Worker(db, registry).run_until_idle()
    assert stats.succeeded >= 1 and seen == [a]
    assert (await dlq_reads.get(db, a)).status == "resolved"


async def test_a_pending_row_without_a_replay_time_is_made_due(db: Database) -> None:
    """A pending row left without next_retry_at (the worker reopening a review row) is not
    stranded: the processor schedules it and replays it."""
    a = await cap(db, "a")
    async with db.begin() as conn:
        await conn.execute(
            update(dead_letters).where(dead_letters.c.id == a).values(next_retry_at=None)
        )
    replayers, seen = recorder()
    summary = await processor(db, replayers, Clock()).run_once()
    assert seen == [a] and summary.resolved == 1


async def test_a_dead_cycle_whose_next_cycle_is_queued_is_resolved_without_a_re_run(
    db: Database,
) -> None:
    """A dead poll cycle cannot be re-run while its stream's next cycle (same unique key)
    is queued: the row is resolved as not re-run, naming that cycle; nothing runs, no
    replay is counted, and the console says so (issue 34)."""
    from synckit.web.queue_pages import replay_message

    key = "poll:acme:orders"
    dead = await enqueueing.enqueue(db, "synckit.poll", {"tenant": "acme"}, unique_key=key)
    async with db.begin() as conn:
        await conn.execute(
            update(jobs_table).where(jobs_table.c.id == dead.id).values(status="dead", attempts=5)
        )
        await outcomes.dead_letter_job(
            conn,
            job_id=dead.id,
            kind="synckit.poll",
            payload={"tenant": "acme"},
            resource_key=None,
            error_class="transient",
            message="timeout",
            traceback=None,
            trace_id=None,
            attempts=5,
            now=T0 - timedelta(minutes=5),
        )
    queued = await enqueueing.enqueue(db, "synckit.poll", {"tenant": "acme"}, unique_key=key)
    assert queued.id != dead.id
    summary = await ReplayProcessor(db, rng=Fixed(), clock=Clock()).run_once()
    assert (summary.claimed, summary.not_rerun, summary.resolved) == (1, 1, 0)
    (row,) = [r async for r in dlq_reads.iter_rows(db, dlq_rows.DlqFilter())]
    assert row.status == "resolved" and row.replay_attempts == 0
    assert f"job {queued.id} (pending) holds its unique key" in (row.status_reason or "")
    assert (await admin.get_job(db, dead.id)).status == "dead"
    text, bad = replay_message(summary)
    assert "1 resolved without re-run (not re-run: job" in text and not bad
    assert "replayed and resolved" not in text


async def test_a_job_that_succeeded_since_is_not_re_run(db: Database) -> None:
    job_id, dl = await dead_job(db)
    async with db.begin() as conn:
        await conn.execute(
            update(jobs_table).where(jobs_table.c.id == job_id).values(status="succeeded")
        )
    summary = await ReplayProcessor(db, rng=Fixed(), clock=Clock()).run_once()
    assert summary.not_rerun == 1 and summary.resolved == 0
    row = await dlq_reads.get(db, dl)
    assert row.status_reason == f"not re-run: job {job_id} has succeeded since"
