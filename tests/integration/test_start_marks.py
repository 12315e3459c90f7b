"""Attempts are charged when a job starts: real worker processes killed by kill -9, and
the start marks themselves (their own small transactions) on both engines."""

from __future__ import annotations

import asyncio
import itertools
import signal
import sqlite3
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from procs import read_log, spawn_worker, stop_all  # type: ignore[import-not-found]
from sqlalchemy import select
from waits import EVENT_TIMEOUT, PROCESS_TIMEOUT, await_until  # tests/

from synckit.clock import utcnow
from synckit.store.db import Database
from synckit.store.jobs import admin, claiming, enqueueing, outcomes
from synckit.store.jobs._base import ClaimedJob
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.tables import jobs

#: Claimed-ahead jobs of a killed worker run elsewhere within this (a busy machine's
#: worker start-up included), where only a started job's lease (an hour) could hold them.
RESCUE_BUDGET = EVENT_TIMEOUT


async def test_kill_9_gives_claimed_ahead_jobs_to_others_uncharged(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """Jobs claimed ahead by a killed worker run elsewhere within seconds, attempts 0 -> 1."""
    log = tmp_path / "exec.log"
    await enqueueing.enqueue_many(db, [JobSpec("record", {"sleep": 0.01}) for _ in range(3000)])
    # A lease for started jobs far longer than the rescue may take (RESCUE_BUDGET), so
    # that only the start lease can explain the rescue.
    victim = spawn_worker(migrated_url, log, "--concurrency", "1", "--lease", "1h")

    async def claimed_ahead() -> bool:
        async with db.begin() as conn:
            ahead = (
                await conn.execute(
                    select(jobs.c.id).where(jobs.c.status == "running", jobs.c.started_at.is_(None))
                )
            ).scalars()
            return len(list(ahead)) >= 10

    try:
        await await_until(claimed_ahead, "the worker to hold jobs claimed ahead")
        victim.send_signal(signal.SIGKILL)
        victim.wait(PROCESS_TIMEOUT)
        killed_at = time.monotonic()
        async with db.begin() as conn:
            never_started = list(
                (
                    await conn.execute(
                        select(jobs.c.id).where(
                            jobs.c.status == "running", jobs.c.started_at.is_(None)
                        )
                    )
                ).scalars()
            )
        assert never_started
        for job_id in never_started:
            assert (await admin.get_job(db, job_id)).attempts == 0
        rescuer = spawn_worker(migrated_url, log, "--concurrency", "8", "--lease", "1h")

        async def rescued() -> bool:
            infos = [await admin.get_job(db, j) for j in never_started]
            return all(i.status == "succeeded" for i in infos)

        try:
            await await_until(rescued, "the claimed-ahead jobs to run", interval=0.2)
            took = time.monotonic() - killed_at
        finally:
            stop_all([rescuer])
    finally:
        stop_all([victim])
    infos = [await admin.get_job(db, j) for j in never_started]
    assert all(i.status == "succeeded" and i.attempts == 1 for i in infos), infos[:3]
    assert took < RESCUE_BUDGET, f"claimed-ahead jobs waited {took:.1f}s after the crash"
    ran = {job_id for _, job_id, *_ in read_log(log)}
    assert set(never_started) <= ran


async def test_a_job_that_kills_its_worker_runs_out_of_attempts(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """Its start is charged before it runs: three crashes and it is dead; others uncharged."""
    log = tmp_path / "exec.log"
    await enqueueing.enqueue_many(
        db,
        [JobSpec("crash", max_attempts=3)]
        + [JobSpec("record", {"sleep": 0.01}) for _ in range(20)],
    )
    [killer] = await admin.list_jobs(db, kind="crash")
    for _ in range(8):
        if (await admin.get_job(db, killer.id)).status == "dead":
            break
        proc = spawn_worker(migrated_url, log, "--concurrency", "1", "--lease", "1s")

        async def crashed_or_dead(proc: subprocess.Popen[bytes] = proc) -> bool:
            return proc.poll() is not None or (
                (await admin.get_job(db, killer.id)).status == "dead"
            )

        try:
            await await_until(crashed_or_dead, "the crash job to kill its worker")
        finally:
            stop_all([proc])
    info = await admin.get_job(db, killer.id)
    assert info.status == "dead" and info.attempts == 3
    finisher = spawn_worker(migrated_url, log, "--concurrency", "4", "--lease", "1s")

    async def finished() -> bool:
        return (await admin.count_by_status(db)).get("succeeded", 0) == 20

    try:
        await await_until(finished, "the other 20 jobs", interval=0.2)
    finally:
        stop_all([finisher])
    others = [i for i in await admin.list_jobs(db, kind="record")]
    assert len(others) == 20
    assert all(i.status == "succeeded" and i.attempts == 1 for i in others), [
        (i.id, i.status, i.attempts, i.last_error)
        for i in others
        if i.status != "succeeded" or i.attempts != 1
    ]


NOW = utcnow()
LEASE = timedelta(seconds=60)


async def claimed_ahead(db: Database, n: int) -> list[ClaimedJob]:
    """``n`` jobs claimed ahead by one claim: running, not started, nothing charged."""
    await enqueueing.enqueue_many(db, [JobSpec("record") for _ in range(n)], now=NOW)
    got = await claiming.claim(db, "w", n, now=NOW, start=0)
    assert len(got) == n and not any(j.started for j in got)
    return got


async def test_a_start_mark_charges_held_unstarted_jobs_once(db: Database) -> None:
    """Only jobs still held under their claim token start; a second mark charges nothing."""
    first = await claimed_ahead(db, 2)
    second = await claimed_ahead(db, 2)
    held = [
        (first[0].id, first[0].claim_token),
        (first[1].id, first[1].claim_token + 1),  # a claim lost to a rescue
        (second[0].id, second[0].claim_token),  # another claim's token, same mark
    ]
    assert await outcomes.start_many(db, held, now=NOW, lease=LEASE) == {first[0].id, second[0].id}
    assert await outcomes.start_many(db, held[:1], now=NOW, lease=LEASE) == set()
    attempts = {j.id: (await admin.get_job(db, j.id)).attempts for j in first + second}
    assert attempts == {first[0].id: 1, first[1].id: 0, second[0].id: 1, second[1].id: 0}
    async with db.begin() as conn:
        row = (
            await conn.execute(
                select(jobs.c.started_at, jobs.c.lease_expires_at).where(jobs.c.id == first[0].id)
            )
        ).one()
    assert row.started_at == NOW and row.lease_expires_at == NOW + LEASE


async def test_start_marks_find_their_jobs_by_primary_key(db: Database) -> None:
    """With thousands of running jobs and no statistics, a mark is a primary-key lookup,
    not a walk of every running job."""
    ahead = await claimed_ahead(db, 3000)
    async with db.begin() as conn:
        if db.is_postgres:
            raw = await conn.get_raw_connection()
            rows = await raw.driver_connection.fetch(  # type: ignore[union-attr]
                "EXPLAIN " + outcomes._PG_START_MANY, NOW, NOW + LEASE, [ahead[5].id], [1]
            )
            plan = "\n".join(r[0] for r in rows)
            assert "pk_jobs" in plan and "ix_jobs_running" not in plan, plan
        else:
            rows = (
                await conn.exec_driver_sql(
                    "EXPLAIN QUERY PLAN " + outcomes._SQLITE_START_MANY,
                    ("a", "a", "a", "a", "[1]", 1),
                )
            ).all()
            plan = "\n".join(str(r) for r in rows)
            assert "PRIMARY KEY" in plan and "ix_jobs_running" not in plan, plan


async def test_a_postgres_start_mark_commits_asynchronously_in_its_own_transaction(
    db: Database,
) -> None:
    """synchronous_commit is off for the mark's own transaction only, never for the
    pooled connection it leaves behind."""
    if not db.is_postgres:
        pytest.skip("PostgreSQL's commit mode")
    [job] = await claimed_ahead(db, 1)
    async with db.raw_pg() as conn:
        async with conn.transaction():
            got = await conn.fetch(
                outcomes._PG_START_MANY, NOW, NOW + LEASE, [job.id], [job.claim_token]
            )
            assert [r[0] for r in got] == [job.id]
            assert await conn.fetchval("SHOW synchronous_commit") == "off"
        assert await conn.fetchval("SHOW synchronous_commit") == "on"
        # Autocommitted, as the worker sends it: the connection is left as it was.
        await conn.fetch(outcomes._PG_START_MANY, NOW, NOW + LEASE, [job.id], [job.claim_token])
        assert await conn.fetchval("SHOW synchronous_commit") == "on"
    assert (await admin.get_job(db, job.id)).attempts == 1


async def test_a_start_mark_waits_for_another_sqlite_writer(db: Database) -> None:
    """Inline only when the write lock is free this instant; otherwise the writer thread
    waits for the lock, and the mark commits once it is released."""
    if db.is_postgres:
        pytest.skip("SQLite's inline path")
    [job] = await claimed_ahead(db, 1)
    held = [(job.id, job.claim_token)]
    other = sqlite3.connect(str(db.url.database), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        assert outcomes.try_start_inline(db, held, now=NOW, lease=LEASE) is None
        marking = asyncio.create_task(outcomes.start_many(db, held, now=NOW, lease=LEASE))
        await asyncio.sleep(0.2)
        assert not marking.done()
        other.execute("COMMIT")
        assert await asyncio.wait_for(marking, 10) == {job.id}
    finally:
        other.close()
    assert (await admin.get_job(db, job.id)).attempts == 1
    assert outcomes.try_start_inline(db, held, now=NOW, lease=LEASE) == set()


async def complete_and_start(
    db: Database, done: list[tuple[int, int]], held: list[tuple[int, int]]
) -> tuple[set[int], set[int]] | None:
    """The worker's one-transaction path for plain successes and start marks."""
    if db.is_postgres:
        return await outcomes.complete_and_start_pg(db, done, held, now=NOW, lease=LEASE)
    return outcomes.try_complete_and_start_inline(db, done, held, now=NOW, lease=LEASE)


async def test_plain_successes_and_start_marks_commit_in_one_transaction(db: Database) -> None:
    """Successes complete and marks charge only under their claim token, together; a
    success whose claim was lost, or a job started twice, changes nothing."""
    a, b, c, d = await claimed_ahead(db, 4)
    assert await outcomes.start_many(db, [(a.id, a.claim_token)], now=NOW, lease=LEASE) == {a.id}
    done = [(a.id, a.claim_token), (c.id, c.claim_token + 1)]  # c: a claim lost
    got = await complete_and_start(db, done, [(b.id, b.claim_token), (a.id, a.claim_token)])
    assert got == ({a.id}, {b.id})
    assert (await complete_and_start(db, done, [(b.id, b.claim_token)])) == (set(), set())
    info = {j: await admin.get_job(db, j) for j in (a.id, b.id, c.id, d.id)}
    assert (info[a.id].status, info[a.id].attempts) == ("succeeded", 1)
    assert (info[b.id].status, info[b.id].attempts) == ("running", 1)
    assert (info[c.id].status, info[c.id].attempts) == ("running", 0)
    assert (info[d.id].status, info[d.id].attempts) == ("running", 0)
    async with db.begin() as conn:
        started = await conn.execute(select(jobs.c.id, jobs.c.started_at, jobs.c.finished_at))
        rows = {r.id: r for r in started}
    assert rows[b.id].started_at is not None and rows[b.id].finished_at is None
    assert rows[c.id].started_at is None and rows[a.id].finished_at is not None
    # Marks alone, and successes alone, each work too.
    assert (await complete_and_start(db, [], [(d.id, d.claim_token)])) == (set(), {d.id})
    assert (await complete_and_start(db, [(b.id, b.claim_token)], [])) == ({b.id}, set())


async def test_plain_successes_wait_for_another_sqlite_writer(db: Database) -> None:
    """Inline only when SQLite's write lock is free this instant: otherwise nothing is
    written and the worker takes its general path."""
    if db.is_postgres:
        pytest.skip("SQLite's inline path")
    a, b = await claimed_ahead(db, 2)
    assert await outcomes.start_many(db, [(a.id, a.claim_token)], now=NOW, lease=LEASE) == {a.id}
    other = sqlite3.connect(str(db.url.database), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        got = await complete_and_start(db, [(a.id, a.claim_token)], [(b.id, b.claim_token)])
        assert got is None
        other.execute("COMMIT")
    finally:
        other.close()
    assert (await admin.get_job(db, a.id)).status == "running"
    assert (await admin.get_job(db, b.id)).attempts == 0


async def test_charge_at_claim_charges_every_claimed_job_in_the_claim(db: Database) -> None:
    """The opt-in old mode: attempts charged by the claim, no start marks, jobs all run."""
    from synckit.runtime.jobs.handlers import JobContext, Registry
    from synckit.runtime.jobs.worker import Worker

    reg = Registry()

    @reg.handler("noop")
    async def noop(ctx: JobContext) -> None:
        return None

    await enqueueing.enqueue_many(db, [JobSpec("noop") for _ in range(40)])
    worker = Worker(db, reg, concurrency=2, charge_at="claim")
    stats = await worker.run_until_idle()
    assert stats.succeeded == 40
    infos = await admin.list_jobs(db, kind="noop", limit=100)
    assert [i.attempts for i in infos] == [1] * 40
    with pytest.raises(ValueError, match="charge_at"):
        Worker(db, reg, charge_at="never")  # type: ignore[arg-type]


async def test_a_stop_before_the_handlers_begin_gives_their_attempts_back(
    db: Database,
) -> None:
    """SIGTERM landing between a claim that started (charged) jobs and their handlers'
    first step: the jobs were never run, so they are released pending, attempts 0."""
    from typing import Any, ClassVar, cast

    from synckit.runtime.jobs.handlers import JobContext, Registry
    from synckit.runtime.jobs.worker import Worker
    from synckit.store.jobs.claiming import ClaimStore

    reg = Registry()
    ran: list[int] = []

    @reg.handler("noop")
    async def noop(ctx: JobContext) -> None:
        ran.append(ctx.job.id)

    ids = [j.id for j in await enqueueing.enqueue_many(db, [JobSpec("noop") for _ in range(4)])]
    claimed: list[Any] = []

    class StopAfterClaim:
        """The real store's claim, with the worker told to stop as it returns."""

        async def claim(self, *args: Any, **kwargs: Any) -> Any:
            batch = await claiming.claim(*args, **kwargs)
            claimed.extend(batch)
            worker.stop()
            return batch

    class StoppedWorker(Worker):
        claims: ClassVar[ClaimStore] = cast(ClaimStore, StopAfterClaim())

    worker = StoppedWorker(db, reg, concurrency=2)
    await asyncio.wait_for(worker.run(), 30)
    assert len(claimed) == 2 and all(j.started for j in claimed), claimed
    assert ran == []
    for job_id in ids:
        info = await admin.get_job(db, job_id)
        assert (info.status, info.attempts) == ("pending", 0), info


#: How soon after a kill -9 the jobs the dead worker had claimed ahead (not started) must
#: start in a surviving worker, with the lease at its default (60 s). The mechanism (a
#: 2 s start lease renewed by the heartbeat, rescue every second) takes about 3 s on a
#: quiet machine; 5.6 s was seen with the cores oversubscribed 14 times. The budget is
#: a third of the default lease: still well short of what waiting for the lease to
#: expire would take, so the test fails if the start lease stops doing its work.
TAKEOVER_BUDGET = 20.0


def _by_pid(pid: int) -> object:
    # Worker ids are host:pid:random (runtime/jobs/worker.py).
    return jobs.c.locked_by.like(f"%:{pid}:%")


async def test_kill_9_claimed_ahead_jobs_start_elsewhere_within_the_takeover_budget(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """With a surviving worker running and the default lease, the jobs a killed worker had
    claimed ahead start in the survivor within TAKEOVER_BUDGET of the kill, each once (no
    execution of any job overlaps another of the same job), charged one attempt."""
    log = tmp_path / "exec.log"
    await enqueueing.enqueue_many(db, [JobSpec("record", {"sleep": 0.01}) for _ in range(4000)])
    victim = spawn_worker(migrated_url, log, "--concurrency", "1")
    survivor = spawn_worker(migrated_url, log, "--concurrency", "4")
    try:
        deadline = time.monotonic() + 60
        ahead: list[int] = []
        survivor_up = False
        while time.monotonic() < deadline and not (len(ahead) >= 10 and survivor_up):
            await asyncio.sleep(0.05)
            async with db.read() as conn:
                ahead = list(
                    (
                        await conn.execute(
                            select(jobs.c.id).where(
                                jobs.c.status == "running",
                                jobs.c.started_at.is_(None),
                                _by_pid(victim.pid),
                            )
                        )
                    ).scalars()
                )
            survivor_up = any(pid == survivor.pid for _, _, pid, _, _ in read_log(log))
        assert len(ahead) >= 10 and survivor_up, "the victim should hold jobs claimed ahead"
        victim.send_signal(signal.SIGKILL)
        killed_at = time.time()
        victim.wait(10)
        async with db.read() as conn:
            never_started = list(
                (
                    await conn.execute(
                        select(jobs.c.id).where(
                            jobs.c.status == "running",
                            jobs.c.started_at.is_(None),
                            _by_pid(victim.pid),
                        )
                    )
                ).scalars()
            )
        assert never_started, "the victim died holding no job claimed ahead"
        # Wait for the event (each of them ran), not for the clock; 60 s only bounds a hang.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            infos = [await admin.get_job(db, j) for j in never_started]
            if all(i.status == "succeeded" for i in infos):
                break
            await asyncio.sleep(0.2)
    finally:
        stop_all([victim, survivor])
    infos = [await admin.get_job(db, j) for j in never_started]
    assert all(i.status == "succeeded" and i.attempts == 1 for i in infos), [
        (i.id, i.status, i.attempts) for i in infos if i.status != "succeeded" or i.attempts != 1
    ]
    runs: dict[int, list[tuple[int, float, float]]] = {}
    for _, job_id, pid, start, end in read_log(log):
        runs.setdefault(job_id, []).append((pid, start, end))
    for job_id, spans in runs.items():  # no job ever ran twice at once, anywhere
        spans.sort(key=lambda s: s[1])
        for (_, _, end), (_, start, _) in itertools.pairwise(spans):
            assert start >= end, f"job {job_id} ran twice at once: {spans}"
    late = {}
    for job_id in never_started:
        [(pid, start, _)] = runs[job_id]  # once, in the survivor
        assert pid == survivor.pid
        late[job_id] = start - killed_at
    took = max(late.values())
    assert took <= TAKEOVER_BUDGET, (
        f"claimed-ahead jobs started {took:.1f}s after the kill (budget {TAKEOVER_BUDGET}s)"
    )
