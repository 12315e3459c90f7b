"""The job queue in one process, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, insert, select, update
from waits import EVENT_TIMEOUT, await_until  # tests/

from synckit.errors import RetryPolicy
from synckit.errors.exceptions import (
    Cancel,
    Discard,
    JobNotFound,
    JobStateError,
    PayloadError,
    RateLimited,
    RetryableError,
    Snooze,
)
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.store.db import Database
from synckit.store.jobs import admin, claiming, enqueueing, leasing, outcomes
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.tables import connections, dead_letters, jobs, resources


def make_worker(db: Database, registry: Registry, **kw: Any) -> Worker:
    kw.setdefault("retry_policy", RetryPolicy.deterministic())
    kw.setdefault("poll_interval", 0.05)
    return Worker(db, registry, **kw)


async def statuses(db: Database) -> dict[str, int]:
    return await admin.count_by_status(db)


async def test_each_job_runs_once_and_succeeds(db: Database) -> None:
    """Enqueued jobs each run exactly once and end succeeded."""
    reg = Registry()
    seen: list[int] = []

    @reg.handler("noop")
    async def noop(ctx: JobContext) -> None:
        seen.append(ctx.payload["i"])

    await enqueueing.enqueue_many(db, [JobSpec("noop", {"i": i}) for i in range(300)])
    stats = await make_worker(db, reg, concurrency=8).run_until_idle()
    assert sorted(seen) == list(range(300))
    assert stats.succeeded == 300
    assert await statuses(db) == {"succeeded": 300}


async def test_enqueue_joins_the_callers_transaction(db: Database) -> None:
    """A job enqueued on the caller's connection commits or rolls back with it."""
    with pytest.raises(RuntimeError):
        async with db.begin() as conn:
            await enqueueing.enqueue(conn, "k", {"a": 1})
            raise RuntimeError("caller's business write failed")
    assert await statuses(db) == {}
    async with db.begin() as conn:
        await conn.execute(update(resources).values(updated_at=datetime.now(UTC)))
        await enqueueing.enqueue(conn, "k", {"a": 1})
    assert await statuses(db) == {"pending": 1}


async def test_unique_key_returns_the_unfinished_job(db: Database) -> None:
    """A unique key naming an unfinished job returns it; once finished, a new one is made."""
    a = await enqueueing.enqueue(db, "k", {}, unique_key="order-1")
    b = await enqueueing.enqueue(db, "k", {}, unique_key="order-1")
    assert a.created and not b.created and a.id == b.id
    batch = await enqueueing.enqueue_many(
        db, [JobSpec("k", unique_key="order-1"), JobSpec("k", unique_key="order-2")]
    )
    assert batch[0].id == a.id and batch[1].created
    reg = Registry()
    reg.add("k", _noop)
    await make_worker(db, reg).run_until_idle()
    c = await enqueueing.enqueue(db, "k", {}, unique_key="order-1")
    assert c.created and c.id != a.id


async def _noop(ctx: JobContext) -> None:
    return None


async def test_payload_that_is_not_json_is_refused(db: Database) -> None:
    """A payload that cannot be serialised to JSON is refused at enqueue, naming the kind."""
    with pytest.raises(PayloadError, match="payload of job 'k' is not JSON-serialisable"):
        await enqueueing.enqueue(db, "k", {"when": datetime.now(UTC)})
    with pytest.raises(PayloadError):
        await enqueueing.enqueue(db, "k", {"x": float("nan")})
    assert await statuses(db) == {}


async def test_unknown_kind_fails_with_reason_and_is_dead_lettered(db: Database) -> None:
    """A job whose kind has no handler ends dead with the reason, and lands in the DLQ."""
    job = await enqueueing.enqueue(db, "nobody-handles-this", {"x": 1}, max_attempts=5)
    stats = await make_worker(db, Registry()).run_until_idle()
    assert stats.dead == 1
    info = await admin.get_job(db, job.id)
    assert info.status == "dead"
    assert "no handler registered for job kind 'nobody-handles-this'" in (info.last_error or "")
    async with db.begin() as conn:
        row = (await conn.execute(select(dead_letters))).one()
    assert row.kind == "nobody-handles-this" and row.record_id == f"job:{job.id}"
    assert row.payload == {"x": 1} and row.status == "review"


async def test_priority_then_run_at_order(db: Database) -> None:
    """Higher priority runs first; within a priority, the oldest run_at first."""
    reg = Registry()
    order: list[str] = []

    @reg.handler("k")
    async def k(ctx: JobContext) -> None:
        order.append(ctx.payload["n"])

    base = datetime.now(UTC) - timedelta(minutes=5)
    await enqueueing.enqueue(db, "k", {"n": "low-old"}, priority=0, run_at=base)
    await enqueueing.enqueue(db, "k", {"n": "high-new"}, priority=10, run_at=base + timedelta(1e-3))
    await enqueueing.enqueue(db, "k", {"n": "high-old"}, priority=10, run_at=base)
    await enqueueing.enqueue(db, "k", {"n": "mid"}, priority=5, run_at=base)
    await make_worker(db, reg, concurrency=1, claim_batch=1).run_until_idle()
    assert order == ["high-old", "high-new", "mid", "low-old"]


async def test_delayed_jobs_wait_for_their_time(db: Database) -> None:
    """A job days ahead is not run now, and runs once its time has come."""
    reg = Registry()
    reg.add("k", _noop)
    job = await enqueueing.enqueue(db, "k", {}, delay=timedelta(days=3))
    assert (await make_worker(db, reg).run_until_idle()).claimed == 0
    later = datetime.now(UTC) + timedelta(days=3, seconds=1)
    stats = await make_worker(db, reg, clock=lambda: later).run_until_idle()
    assert stats.succeeded == 1
    assert (await admin.get_job(db, job.id)).status == "succeeded"


async def test_hanging_handler_is_cancelled_and_counts_as_transient(db: Database) -> None:
    """A handler past its kind's timeout is cancelled; the attempt is a transient failure."""
    reg = Registry()

    @reg.handler("hang", timeout=0.2)
    async def hang(ctx: JobContext) -> None:
        await asyncio.sleep(3600)

    job = await enqueueing.enqueue(db, "hang", {}, max_attempts=2)
    stats = await make_worker(db, reg).run_until_idle()
    info = await admin.get_job(db, job.id)
    assert info.status == "dead" and info.attempts == 2 and stats.dead == 1
    assert info.error_class == "transient"
    assert "exceeded its 0.2s timeout" in (info.last_error or "")
    assert [e["attempt"] for e in info.errors] == [1, 2]


async def test_failure_retries_then_succeeds(db: Database) -> None:
    """A failing attempt is retried by the retry policy and may then succeed."""
    reg = Registry()
    calls = 0

    @reg.handler("flaky")
    async def flaky(ctx: JobContext) -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("reset by peer")

    job = await enqueueing.enqueue(db, "flaky", {})
    stats = await make_worker(db, reg).run_until_idle()
    assert calls == 3 and stats.retried == 2
    info = await admin.get_job(db, job.id)
    assert info.status == "succeeded" and info.attempts == 3 and len(info.errors) == 2


async def test_retry_waits_computed_backoff(db: Database) -> None:
    """With the default policy, a failed attempt is rescheduled into the future."""
    reg = Registry()

    @reg.handler("fails")
    async def fails(ctx: JobContext) -> None:
        raise ConnectionError("boom")

    job = await enqueueing.enqueue(db, "fails", {})
    before = datetime.now(UTC)
    await make_worker(db, reg, retry_policy=RetryPolicy()).run_until_idle()
    info = await admin.get_job(db, job.id)
    assert info.status == "pending" and info.attempts == 1
    assert info.run_at >= before + timedelta(milliseconds=500)


async def test_snooze_cancel_discard(db: Database) -> None:
    """Snooze re-queues without spending an attempt; cancel and discard end the job."""
    reg = Registry()
    snoozed = 0

    @reg.handler("snooze")
    async def snooze(ctx: JobContext) -> None:
        nonlocal snoozed
        snoozed += 1
        if snoozed == 1:
            raise Snooze(timedelta(0))

    @reg.handler("cancel")
    async def cancel(ctx: JobContext) -> None:
        raise Cancel("the invoice was deleted")

    @reg.handler("discard")
    async def discard(ctx: JobContext) -> None:
        raise Discard("stale")

    s = await enqueueing.enqueue(db, "snooze", {}, max_attempts=1)
    c = await enqueueing.enqueue(db, "cancel", {})
    d = await enqueueing.enqueue(db, "discard", {})
    await make_worker(db, reg).run_until_idle()
    si = await admin.get_job(db, s.id)
    assert si.status == "succeeded" and si.attempts == 1 and snoozed == 2
    ci = await admin.get_job(db, c.id)
    assert ci.status == "cancelled" and ci.last_error == "the invoice was deleted"
    assert (await admin.get_job(db, d.id)).status == "discarded"
    async with db.begin() as conn:
        assert (await conn.execute(select(func.count()).select_from(dead_letters))).scalar() == 0


async def test_followups_commit_only_with_success(db: Database) -> None:
    """A follow-up commits with its parent's success; a parent that fails leaves none."""
    reg = Registry()
    ran: list[str] = []

    @reg.handler("parent")
    async def parent(ctx: JobContext) -> None:
        ctx.enqueue("child", {"from": ctx.job.id})
        if ctx.payload.get("fail"):
            raise ValueError("parent failed after enqueueing")

    @reg.handler("child")
    async def child(ctx: JobContext) -> None:
        ran.append("child")

    await enqueueing.enqueue(db, "parent", {"fail": True}, max_attempts=1)
    await make_worker(db, reg).run_until_idle()
    assert ran == []
    assert [j.kind for j in await admin.list_jobs(db)] == ["parent"]
    await enqueueing.enqueue(db, "parent", {})
    await make_worker(db, reg).run_until_idle()
    assert ran == ["child"]


async def test_lease_rescue_and_fencing(db: Database) -> None:
    """An expired lease is rescued; the old holder cannot overwrite the new outcome."""
    job = await enqueueing.enqueue(db, "k", {})
    now = datetime.now(UTC)
    [a] = await claiming.claim(db, "worker-a", 10, now=now, lease=timedelta(seconds=5))
    assert await leasing.rescue_expired(db, now=now + timedelta(seconds=1)) == 0
    assert await leasing.rescue_expired(db, now=now + timedelta(seconds=6)) == 1
    info = await admin.get_job(db, job.id)
    assert info.status == "pending" and info.attempts == 1
    [b] = await claiming.claim(db, "worker-b", 10, now=now + timedelta(seconds=7))
    assert b.attempts == 2 and b.claim_token != a.claim_token
    async with db.begin() as conn:
        assert await outcomes.complete_many(conn, [(a.id, a.claim_token)], now=now) == set()
        assert (
            await outcomes.fail(
                conn, a, now=now, error_class="transient", message="late", retry_at=None
            )
            is None
        )
    async with db.begin() as conn:
        assert await outcomes.complete_many(conn, [(b.id, b.claim_token)], now=now) == {b.id}
    assert (await admin.get_job(db, job.id)).status == "succeeded"


async def test_job_that_keeps_killing_workers_ends_dead(db: Database) -> None:
    """A job whose lease expires on its last attempt ends dead and is dead-lettered."""
    job = await enqueueing.enqueue(db, "k", {}, max_attempts=2)
    now = datetime.now(UTC)
    for i in range(2):
        t = now + timedelta(minutes=i * 10)
        assert len(await claiming.claim(db, f"w{i}", 1, now=t, lease=timedelta(seconds=1))) == 1
        assert await leasing.rescue_expired(db, now=t + timedelta(seconds=2)) == 1
    info = await admin.get_job(db, job.id)
    assert info.status == "dead" and "lease expired" in (info.last_error or "")
    async with db.begin() as conn:
        assert (await conn.execute(select(func.count()).select_from(dead_letters))).scalar() == 1


async def test_rescue_applies_the_handlers_max_attempts(db: Database) -> None:
    """A kind registered with max_attempts=1 ends dead at its first expired lease."""
    fragile = await enqueueing.enqueue(db, "fragile", {}, max_attempts=5)
    other = await enqueueing.enqueue(db, "other", {}, max_attempts=5)
    now = datetime.now(UTC)
    assert len(await claiming.claim(db, "w", 2, now=now, lease=timedelta(seconds=1))) == 2
    later = now + timedelta(seconds=2)
    assert await leasing.rescue_expired(db, now=later, max_attempts_by_kind={"fragile": 1}) == 2
    assert (await admin.get_job(db, fragile.id)).status == "dead"
    assert (await admin.get_job(db, other.id)).status == "pending"
    # The worker passes its registry's limits to the rescue it runs.
    reg = Registry()
    reg.add("other", _noop, max_attempts=1)
    assert len(await claiming.claim(db, "w", 1, now=later, lease=timedelta(seconds=1))) == 1
    worker = make_worker(db, reg, clock=lambda: later + timedelta(seconds=2))
    await worker._maintenance_once(rescue=True)
    assert (await admin.get_job(db, other.id)).status == "dead"


async def _noop(ctx: JobContext) -> None:
    return None


async def test_pruning_removes_old_finished_jobs_in_batches(db: Database) -> None:
    """Finished jobs past retention are deleted in bounded batches; others stay."""
    old = datetime.now(UTC) - timedelta(days=8)
    async with db.begin() as conn:
        await conn.execute(
            insert(jobs),
            [
                dict(
                    kind="k",
                    payload={},
                    status=s,
                    run_at=old,
                    created_at=old,
                    updated_at=old,
                    finished_at=old if s != "pending" else None,
                )
                for s in ["succeeded"] * 25 + ["dead"] * 5 + ["pending"] * 3
            ],
        )
        await conn.execute(
            insert(jobs).values(
                kind="k",
                payload={},
                status="succeeded",
                run_at=old,
                created_at=old,
                updated_at=old,
                finished_at=datetime.now(UTC),
            )
        )
    assert await admin.prune(db, older_than=timedelta(days=7), batch=7) == 30
    assert await statuses(db) == {"pending": 3, "succeeded": 1}


async def test_job_management_operations(db: Database) -> None:
    """List, show, cancel, retry, reschedule, re-prioritise and replace payloads."""
    a = await enqueueing.enqueue(db, "k", {"v": 1}, resource_key="tenant-1")
    b = await enqueueing.enqueue(db, "other", {"v": 2})
    assert {j.id for j in await admin.list_jobs(db, kind="k")} == {a.id}
    assert {j.id for j in await admin.list_jobs(db, resource_key="tenant-1")} == {a.id}
    assert len(await admin.list_jobs(db, status="pending")) == 2
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert (await admin.reschedule_job(db, a.id, when)).run_at == when
    assert (await admin.set_priority(db, a.id, 7)).priority == 7
    assert (await admin.replace_payload(db, a.id, {"v": 3})).payload == {"v": 3}
    with pytest.raises(PayloadError):
        await admin.replace_payload(db, a.id, {"bad": {1, 2}})
    assert (await admin.cancel_job(db, b.id)).status == "cancelled"
    with pytest.raises(JobStateError, match="already ended"):
        await admin.cancel_job(db, b.id)
    retried = await admin.retry_job(db, b.id)
    assert retried.status == "pending" and retried.attempts == 0
    with pytest.raises(JobNotFound):
        await admin.get_job(db, 999_999)


async def test_operations_refuse_a_running_job(db: Database) -> None:
    """Retry, reschedule, priority and payload changes refuse a running job; cancel works."""
    job = await enqueueing.enqueue(db, "k", {})
    await claiming.claim(db, "w", 1)
    for op in (
        admin.retry_job(db, job.id),
        admin.reschedule_job(db, job.id, datetime.now(UTC)),
        admin.set_priority(db, job.id, 1),
        admin.replace_payload(db, job.id, {}),
    ):
        with pytest.raises(JobStateError, match="is running"):
            await op
    assert (await admin.cancel_job(db, job.id)).status == "cancelled"


async def test_cancelled_running_job_is_stopped_at_heartbeat(db: Database) -> None:
    """Cancelling a running job stops its handler, and its late outcome is fenced off."""
    reg = Registry()
    started = asyncio.Event()
    stopped = asyncio.Event()

    @reg.handler("long")
    async def long(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise

    job = await enqueueing.enqueue(db, "long", {})
    worker = make_worker(db, reg, lease=timedelta(seconds=0.6))
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    await admin.cancel_job(db, job.id)
    await asyncio.wait_for(stopped.wait(), 10)
    worker.stop()
    await asyncio.wait_for(run, 10)
    assert (await admin.get_job(db, job.id)).status == "cancelled"


async def test_a_heartbeat_of_a_retried_jobs_old_claim_does_not_stop_its_next_attempt(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heartbeat reports on the claims it was sent. Attempt 1 fails and is retried while
    a heartbeat that still carries attempt 1's claim is on its way; the same worker claims
    attempt 2 meanwhile. That beat's answer (attempt 1's claim is gone) once stopped
    attempt 2 as a lost claim, and the job then waited out its whole lease (30 s in the
    demo, whose sends converged late or not at all on a loaded machine)."""
    reg = Registry()
    old_beat_sent = asyncio.Event()
    second_running = asyncio.Event()
    beat_answered = asyncio.Event()
    attempts: list[int] = []
    cancelled: list[int] = []
    real_beat = leasing.beat

    async def slow_beat(
        db_: Database, worker_id: str, held: list[tuple[int, int]], **kw: Any
    ) -> leasing.Beat:
        if not old_beat_sent.is_set() and attempts == [1]:
            old_beat_sent.set()
            await second_running.wait()  # the retry is recorded and claimed again meanwhile
            found = await real_beat(db_, worker_id, held, **kw)
            beat_answered.set()
            return found
        return await real_beat(db_, worker_id, held, **kw)

    monkeypatch.setattr(leasing, "beat", slow_beat)

    @reg.handler("flaky")
    async def flaky(ctx: JobContext) -> None:
        attempts.append(ctx.job.attempts)
        try:
            if ctx.job.attempts == 1:
                await old_beat_sent.wait()
                raise RetryableError("the first attempt fails")
            second_running.set()
            await beat_answered.wait()
            await asyncio.sleep(0)  # the worker acts on the beat's answer here, if at all
        except asyncio.CancelledError:
            cancelled.append(ctx.job.attempts)
            raise

    job = await enqueueing.enqueue(db, "flaky", {})
    # A lease of a second beats every third of a second; a stopped attempt would come
    # back as attempt 3 once its lease ran out, which the asserts below tell apart.
    worker = make_worker(db, reg, lease=timedelta(seconds=1))
    run = asyncio.create_task(worker.run())
    try:
        await await_until(
            lambda: _status_is(db, job.id, "succeeded"), lambda: f"attempts {attempts}"
        )
    finally:
        worker.stop()
        await asyncio.wait_for(run, EVENT_TIMEOUT)
    assert cancelled == []
    assert attempts == [1, 2]
    assert (await admin.get_job(db, job.id)).attempts == 2


async def test_a_late_outcome_of_a_rescued_attempt_leaves_the_new_claim_held(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's own job is rescued while its attempt still runs (its lease ran out: a
    stalled machine) and the same worker claims it again. The old attempt's outcome is
    fenced off when it comes; recording it must not drop the new claim from what the
    worker holds, or that claim gets no heartbeats and is rescued once more."""
    reg = Registry()
    first: list[int] = []  # attempt 1's claim token
    first_running = asyncio.Event()
    second_running = asyncio.Event()
    attempts: list[int] = []
    real_beat = leasing.beat

    async def beat(
        db_: Database, worker_id: str, held: list[tuple[int, int]], **kw: Any
    ) -> leasing.Beat:
        # Attempt 1's claim is not asked about: its loss is not what this test is about
        # (a heartbeat noticing it first would stop attempt 1, a behaviour of its own).
        old = {job_id for job_id, token in held if token in first}
        found = await real_beat(db_, worker_id, [h for h in held if h[1] not in first], **kw)
        return leasing.Beat(found.alive | old, found.busy)

    monkeypatch.setattr(leasing, "beat", beat)

    async def lease_of(job_id: int) -> tuple[int | None, Any]:
        async with db.read() as conn:
            row = (
                await conn.execute(
                    select(jobs.c.claim_token, jobs.c.lease_expires_at).where(jobs.c.id == job_id)
                )
            ).one()
        return row[0], row[1]

    @reg.handler("long")
    async def long(ctx: JobContext) -> None:
        attempts.append(ctx.job.attempts)
        if ctx.job.attempts == 1:
            first.append(ctx.job.claim_token)
            first_running.set()
            await second_running.wait()
            return  # a success whose claim is gone: fenced
        second_running.set()
        await await_until(lambda: _true_if(worker.stats.fenced == 1), "attempt 1 recorded")
        # Attempt 1's end left this attempt's task in the worker's books (a heartbeat
        # that finds this claim gone stops it; a shutdown waits for it).
        assert worker._tasks.get(ctx.job.id) is asyncio.current_task()
        token, lease = await lease_of(ctx.job.id)
        # A heartbeat extends this claim's lease, unless the worker no longer holds it
        # (then it runs out and another claim takes the job).
        moved = await await_until(
            lambda: _lease_moved(lease_of, ctx.job.id, token, lease), "the lease unchanged"
        )
        assert moved == "extended", moved

    job = await enqueueing.enqueue(db, "long", {})
    worker = make_worker(db, reg, lease=timedelta(seconds=1))
    run = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(first_running.wait(), EVENT_TIMEOUT)
        async with db.begin() as conn:
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == job.id, jobs.c.claim_token == first[0])
                .values(lease_expires_at=datetime.now(UTC) - timedelta(hours=1))
            )
        # This rescue or the worker's own takes attempt 1's claim back: attempt 1 gets no
        # heartbeat here, so its 1 s lease also runs out by itself, and the worker rescues
        # every second (on a loaded machine, before this). Only attempt 1's claim is
        # expired above, never attempt 2's; the attempts below show the rescue happened.
        await leasing.rescue_expired(db)
        await await_until(
            lambda: _status_is(db, job.id, "succeeded"), lambda: f"attempts {attempts}"
        )
    finally:
        worker.stop()
        await asyncio.wait_for(run, EVENT_TIMEOUT)
    assert attempts == [1, 2]
    assert worker.stats.fenced == 1
    assert (await admin.get_job(db, job.id)).attempts == 2


async def _true_if(value: bool) -> bool:
    return value


async def _lease_moved(lease_of: Any, job_id: int, token: int | None, lease: Any) -> str:
    now_token, now_lease = await lease_of(job_id)
    if now_token != token:
        return "claimed again"
    return "extended" if now_lease is not None and lease is not None and now_lease > lease else ""


async def _status_is(db: Database, job_id: int, status: str) -> bool:
    return (await admin.get_job(db, job_id)).status == status


async def test_a_heartbeat_never_waits_for_a_row_another_transaction_holds(db: Database) -> None:
    """While another transaction holds one of a worker's job rows (its own page commit
    or completion, on PostgreSQL), the heartbeat extends the others at once, counts
    that one still held, and extends it at the next beat. Waiting for it instead made a
    cycle with such transactions ('deadlock detected', a second of both's time)."""
    a, b = await enqueueing.enqueue(db, "k", {}), await enqueueing.enqueue(db, "k", {})
    claimed = await claiming.claim(db, "w", 2)
    held = [(j.id, j.claim_token) for j in claimed]
    assert {i for i, _ in held} == {a.id, b.id}
    now = datetime.now(UTC)
    if db.is_postgres:
        async with db.engine.connect() as other:
            await other.execute(select(jobs.c.id).where(jobs.c.id == b.id).with_for_update())
            found = await asyncio.wait_for(
                leasing.beat(db, "w", held, lease=timedelta(minutes=5), now=now), 5
            )
            assert found.alive == {a.id, b.id}
            assert found.busy == {b.id}  # the worker asks about it again soon
            async with db.begin() as conn:
                leases = dict(
                    (await conn.execute(select(jobs.c.id, jobs.c.lease_expires_at))).all()
                )
            assert leases[a.id] == now + timedelta(minutes=5)
            assert leases[b.id] < now + timedelta(minutes=5)  # held: not extended this beat
            await other.rollback()
    later = now + timedelta(seconds=1)
    alive = (await leasing.beat(db, "w", held, lease=timedelta(minutes=5), now=later)).alive
    assert alive == {a.id, b.id}
    async with db.begin() as conn:
        leases = dict((await conn.execute(select(jobs.c.id, jobs.c.lease_expires_at))).all())
    assert leases == {a.id: later + timedelta(minutes=5), b.id: later + timedelta(minutes=5)}


async def test_a_worker_beats_a_busy_row_again_at_once_not_at_its_next_full_beat(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A beat that found one of the worker's job rows held by another transaction (on
    PostgreSQL, mostly the worker's own page commit of that job) left its lease as it was
    until the next full beat. Under load a walk's commits held the row at beat after beat,
    and its lease (3 s in a test) ran out while its worker was alive: the worker rescued
    its own job. The worker now beats such a job again alone, soon, until its lease is
    extended; the other jobs wait for their next full beat."""
    if not db.is_postgres:
        pytest.skip("row locks that a heartbeat skips: PostgreSQL (SQLite has one writer)")
    reg = Registry()
    release = asyncio.Event()
    running: set[int] = set()

    @reg.handler("long")
    async def long(ctx: JobContext) -> None:
        running.add(ctx.job.id)
        await release.wait()

    beats: list[tuple[list[int], set[int]]] = []
    real_beat = leasing.beat

    async def recorded(
        db_: Database, worker_id: str, held: list[tuple[int, int]], **kw: Any
    ) -> leasing.Beat:
        found = await real_beat(db_, worker_id, held, **kw)
        beats.append((sorted(i for i, _ in held), found.busy))
        return found

    monkeypatch.setattr(leasing, "beat", recorded)
    a, b = await enqueueing.enqueue(db, "long", {}), await enqueueing.enqueue(db, "long", {})
    worker = make_worker(db, reg, concurrency=2, lease=timedelta(seconds=60))
    run = asyncio.create_task(worker.run())

    async def lease_of(job_id: int) -> Any:
        async with db.read() as conn:
            return (
                await conn.execute(select(jobs.c.lease_expires_at).where(jobs.c.id == job_id))
            ).scalar_one()

    try:
        await await_until(lambda: _true_if(running == {a.id, b.id}), "both jobs running")
        async with db.engine.connect() as other:
            await other.execute(select(jobs.c.id).where(jobs.c.id == b.id).with_for_update())
            seen = len(beats)
            await await_until(
                lambda: _true_if(any(busy == {b.id} for _, busy in beats[seen:])),
                lambda: f"a beat finding job b's row busy: {beats[seen:]}",
            )
            # While the row stays held, the worker keeps asking about b alone.
            await await_until(
                lambda: _true_if(any(held == [b.id] for held, _ in beats[seen:])),
                lambda: f"a beat of job b alone: {beats[seen:]}",
            )
            held_lease = await lease_of(b.id)
            await other.rollback()
        # Once the row is free, the next retry extends b's lease.
        await await_until(
            lambda: _lease_later(lease_of, b.id, held_lease), "job b's lease extended"
        )
        assert all(held in ([b.id], [a.id, b.id]) for held, _ in beats[seen:])
    finally:
        release.set()
        worker.stop()
        await asyncio.wait_for(run, EVENT_TIMEOUT)
    assert worker.stats.rescued == 0
    assert (await admin.get_job(db, b.id)).attempts == 1


async def _lease_later(lease_of: Any, job_id: int, lease: Any) -> bool:
    return bool(await lease_of(job_id) > lease)


async def test_fairness_backlog_does_not_hold_back_another_tenant(db: Database) -> None:
    """10 jobs of tenant B, enqueued after 100,000 of tenant A, are claimed in the first batches."""
    now = datetime.now(UTC)
    await enqueueing.enqueue_many(
        db, [JobSpec("k", resource_key="tenant-a") for _ in range(100_000)], now=now
    )
    await enqueueing.enqueue_many(
        db,
        [JobSpec("k", resource_key="tenant-b") for _ in range(10)],
        now=now + timedelta(seconds=1),
    )
    later = now + timedelta(seconds=2)
    got_b = []
    for _ in range(2):
        batch = await claiming.claim(db, "w", 16, now=later)
        assert len(batch) == 16
        got_b += [j for j in batch if j.resource_key == "tenant-b"]
    assert len(got_b) == 10


async def test_unavailable_resources_are_left_out_by_the_claim(db: Database) -> None:
    """Open breakers, future next_available_at and inactive connections keep jobs unclaimed."""
    now = datetime.now(UTC)
    for key in ("open", "paced", "reauth", "fine"):
        await enqueueing.enqueue(db, "k", {}, resource_key=key, now=now)
    async with db.begin() as conn:
        await conn.execute(
            update(resources)
            .where(resources.c.resource_key == "open")
            .values(state="open", cooldown_until=now + timedelta(minutes=1))
        )
        await conn.execute(
            update(resources)
            .where(resources.c.resource_key == "paced")
            .values(next_available_at=now + timedelta(minutes=1))
        )
        await conn.execute(
            insert(connections).values(
                tenant="t-reauth",
                connector="c",
                resource_key="reauth",
                status="needs_reauth",
                created_at=now,
                updated_at=now,
            )
        )
    claimed = await claiming.claim(db, "w", 10, now=now)
    assert [j.resource_key for j in claimed] == ["fine"]
    later = now + timedelta(minutes=2)
    again = await claiming.claim(db, "w", 10, now=later)
    # The open breaker's cool-down has passed: exactly one probe; pacing has passed too.
    assert sorted(j.resource_key for j in again) == ["open", "paced"]
    assert [j.probe for j in again if j.resource_key == "open"] == [True]


async def test_half_open_breaker_gives_exactly_one_probe(db: Database) -> None:
    """Past the cool-down, a resource with many due jobs gives out exactly one, its probe."""
    now = datetime.now(UTC)
    await enqueueing.enqueue_many(db, [JobSpec("k", resource_key="r") for _ in range(5)], now=now)
    async with db.begin() as conn:
        await conn.execute(
            update(resources).values(state="open", cooldown_until=now - timedelta(seconds=1))
        )
    first = await claiming.claim(db, "w1", 10, now=now)
    second = await claiming.claim(db, "w2", 10, now=now)
    assert len(first) == 1 and first[0].probe and second == []
    async with db.begin() as conn:
        row = (await conn.execute(select(resources))).one()
    assert row.state == "half_open" and row.probe_job_id == first[0].id


async def test_in_flight_limit_in_one_process(db: Database) -> None:
    """A resource's max_in_flight bounds its running jobs across claims."""
    now = datetime.now(UTC)
    await enqueueing.enqueue_many(
        db, [JobSpec("k", resource_key="mbox") for _ in range(6)], now=now
    )
    async with db.begin() as conn:
        await conn.execute(update(resources).values(max_in_flight=2))
    assert len(await claiming.claim(db, "w1", 10, now=now)) == 2
    assert await claiming.claim(db, "w2", 10, now=now) == []


async def test_rate_limited_failure_paces_the_whole_resource(db: Database) -> None:
    """A job failing with RateLimited(7 s) defers its resource by 7 s, attempt not spent."""
    reg = Registry()

    calls = 0

    @reg.handler("call")
    async def call(ctx: JobContext) -> None:
        nonlocal calls
        calls += 1
        raise RateLimited("429", retry_after=timedelta(seconds=7))

    first = await enqueueing.enqueue(db, "call", {}, resource_key="tenant-x")
    second = await enqueueing.enqueue(db, "call", {}, resource_key="tenant-x")
    before = datetime.now(UTC)
    w = make_worker(db, reg, retry_policy=RetryPolicy(), concurrency=1, claim_batch=1)
    stats = await w.run_until_idle()
    assert calls == 1  # the second job of the resource did not run
    async with db.begin() as conn:
        row = (await conn.execute(select(resources))).one()
    # Paced for the server's wait (no retry buffer: the server knows when it resets).
    assert row.next_available_at >= before + timedelta(seconds=7)
    assert row.next_available_at <= datetime.now(UTC) + timedelta(seconds=7 + 1)
    assert row.state == "closed" and row.consecutive_failures == 0  # not a health failure
    for job_id in (first.id, second.id):
        info = await admin.get_job(db, job_id)
        # Run or claimed ahead, it waits for the resource without spending an attempt.
        assert info.status == "pending" and info.attempts == 0
        assert info.run_at >= row.next_available_at - timedelta(milliseconds=1)
    assert (stats.paced, stats.retried, stats.dead) == (1, 0, 0)


async def test_handler_max_attempts_sets_the_limit_for_its_kind(db: Database) -> None:
    """A handler registered with max_attempts=2 ends its jobs dead after two attempts."""
    reg = Registry()
    calls = 0

    @reg.handler("fragile", max_attempts=2)
    async def fragile(ctx: JobContext) -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError("reset")

    job = await enqueueing.enqueue(db, "fragile", {})
    await make_worker(db, reg).run_until_idle()
    assert calls == 2
    assert (await admin.get_job(db, job.id)).status == "dead"


async def test_unique_key_enqueue_survives_generic_plans(db: Database) -> None:
    """Unique-key enqueues keep working past PostgreSQL's switch to generic plans."""
    for n in range(8):
        async with db.begin() as conn:
            out = await enqueueing.enqueue_many(
                conn, [JobSpec("k", unique_key=f"u{n}-{i}") for i in range(3)]
            )
        assert all(e.created for e in out)


async def test_failure_rate_opens_the_breaker_without_a_run_of_failures(db: Database) -> None:
    """Every other call failing opens the resource's breaker by rate, shared in the DB."""
    from synckit.errors import BreakerPolicy

    policy = BreakerPolicy(failure_threshold=50, rate_threshold=0.5, rate_min_calls=10)
    reg = Registry(breaker_policy=policy, retry_policy=RetryPolicy.deterministic())
    calls = 0

    @reg.handler("call")
    async def call(ctx: JobContext) -> None:
        nonlocal calls
        calls += 1
        if ctx.payload["n"] % 2 == 0:
            raise ConnectionError("reset")

    await enqueueing.enqueue_many(
        db,
        [JobSpec("call", {"n": n}, resource_key="flaky-api", max_attempts=1) for n in range(30)],
    )
    await make_worker(db, reg, concurrency=1, claim_batch=1).run_until_idle()
    async with db.begin() as conn:
        row = (await conn.execute(select(resources))).one()
    assert row.state == "open"
    assert calls < 30  # once open, the rest waited for the cool-down


async def test_a_claim_over_many_lanes_is_fair_capped_and_in_priority_order(
    db: Database,
) -> None:
    """30 lanes in one claim (one statement on PostgreSQL): every lane served, a capped
    lane held to its cap, each lane's jobs taken highest priority first."""
    from synckit.store.resources import configure_resource

    specs = [
        JobSpec("k", {"lane": i, "p": p}, resource_key=f"lane-{i:02d}", priority=p)
        for i in range(30)
        for p in (1, 5, 3, 9, 7)
    ]
    await enqueueing.enqueue_many(db, specs)
    await configure_resource(db, "lane-07", max_in_flight=2)
    first = await claiming.claim(db, "w", 60)
    assert len(first) == 60
    by_lane: dict[str | None, list[int]] = {}
    for job in first:
        by_lane.setdefault(job.resource_key, []).append(job.priority)
    assert len(by_lane) == 30  # every lane got its share
    assert len(by_lane["lane-07"]) == 2
    for lane, prios in by_lane.items():
        assert prios == sorted(prios, reverse=True), lane
        assert prios[0] == 9, lane  # the lane's highest priority first
    rest = await claiming.claim(db, "w", 500)
    counts = {k: len(v) for k, v in by_lane.items()}
    for job in rest:
        counts[job.resource_key] = counts.get(job.resource_key, 0) + 1
    assert counts.pop("lane-07") == 2  # its cap holds across claims
    assert set(counts.values()) == {5}
