"""Lanes with work are marked (``resources.due_at``), and claims start from the marks.

The invariant every test here holds: a lane with a pending job has a mark no later than
that job's ``run_at``; a lane whose mark is stale costs one empty look, which corrects it.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import func, select, text, update
from waits import EVENT_TIMEOUT  # tests/

from synckit.store import migrate
from synckit.store import resources as resources_store
from synckit.store.db import Database, open_database
from synckit.store.jobs import admin, claiming, enqueueing, leasing, outcomes
from synckit.store.jobs._base import ClaimedJob
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.tables import jobs, resources

T0 = datetime(2026, 11, 26, 12, tzinfo=UTC)
LEASE = timedelta(seconds=60)


async def marks(db: Database) -> dict[str, datetime | None]:
    async with db.begin() as conn:
        rows = await conn.execute(select(resources.c.resource_key, resources.c.due_at))
        return {k: d for k, d in rows}


async def unmarked_work(db: Database) -> list[tuple[str, datetime, datetime | None]]:
    """Lanes breaking the invariant: (lane, earliest pending run_at, its mark)."""
    async with db.begin() as conn:
        earliest = (
            select(jobs.c.resource_key, func.min(jobs.c.run_at).label("first"))
            .where(jobs.c.status == "pending", jobs.c.resource_key.is_not(None))
            .group_by(jobs.c.resource_key)
            .subquery()
        )
        rows = await conn.execute(
            select(earliest.c.resource_key, earliest.c.first, resources.c.due_at).join(
                resources,
                resources.c.resource_key == earliest.c.resource_key,
                isouter=True,
            )
        )
        return [(key, first, due) for key, first, due in rows if due is None or due > first]


async def claim_all(db: Database, now: datetime, limit: int = 100) -> list[ClaimedJob]:
    return await claiming.claim(db, "w", limit, now=now, lease=LEASE)


async def test_every_way_a_job_becomes_pending_marks_its_lane(db: Database) -> None:
    """Enqueue (one job, a batch, the caller's transaction, unique keys, enqueue_new),
    a retry, a snooze, a release, a lease rescue, an operator's retry and reschedule:
    each leaves the job's lane marked no later than the job's run_at."""
    at = T0 + timedelta(minutes=5)
    await enqueueing.enqueue(db, "k", resource_key="one", run_at=at, now=T0)
    await enqueueing.enqueue_many(
        db, [JobSpec("k", resource_key="batch", run_at=at + timedelta(minutes=i)) for i in (3, 1)]
    )
    async with db.begin() as conn:
        await enqueueing.enqueue(conn, "k", resource_key="caller", run_at=at, now=T0)
    await enqueueing.enqueue(db, "k", resource_key="unique", unique_key="u", run_at=at, now=T0)
    async with db.begin() as conn:
        await enqueueing.enqueue_new(
            conn, [JobSpec("k", resource_key="new", unique_key="n", run_at=at)], now=T0
        )
    assert await marks(db) == {
        "one": at,
        "batch": at + timedelta(minutes=1),
        "caller": at,
        "unique": at,
        "new": at,
    }
    assert await unmarked_work(db) == []

    # Every lane emptied by claims: no marks left.
    claimed = await claim_all(db, at + timedelta(minutes=5))
    assert len(claimed) == 6
    assert set((await marks(db)).values()) == {None}
    by_lane = {j.resource_key: j for j in claimed}

    later = at + timedelta(hours=1)
    async with db.begin() as conn:
        await outcomes.fail(
            conn,
            by_lane["one"],
            now=at,
            error_class="transient",
            message="retry",
            retry_at=later,
        )
        await outcomes.snooze(conn, by_lane["caller"], now=at, until=later + timedelta(minutes=1))
    assert await leasing.release(db, [(by_lane["unique"].id, by_lane["unique"].claim_token)]) == 1
    rescue_at = at + timedelta(minutes=5) + 2 * LEASE
    assert await leasing.rescue_expired(db, now=rescue_at) == 3  # batch (2) and new
    assert await unmarked_work(db) == []
    got = await marks(db)
    assert got["one"] == later and got["caller"] == later + timedelta(minutes=1)
    assert got["unique"] is not None and got["batch"] is not None and got["new"] is not None

    # An operator's retry of a dead job, and a reschedule to earlier.
    (dead,) = await claim_all(db, later + timedelta(minutes=1), limit=1)
    async with db.begin() as conn:
        await outcomes.fail(
            conn, dead, now=later, error_class="permanent", message="no", retry_at=None
        )
    await claim_all(db, later + timedelta(days=1))  # empties every lane
    assert set((await marks(db)).values()) == {None}
    await admin.retry_job(db, dead.id)
    job = await enqueueing.enqueue(db, "k", resource_key="moved", run_at=later + timedelta(days=9))
    soon = later + timedelta(days=2)
    await admin.reschedule_job(db, job.id, soon)
    assert (await marks(db))["moved"] == soon
    assert await unmarked_work(db) == []


async def test_a_claim_sets_a_short_lanes_mark_to_its_next_due_time(db: Database) -> None:
    """A lane whose due jobs are all claimed keeps a mark at its earliest pending job
    of any priority (here a low-priority job due before a high-priority one); a lane
    left with nothing is unmarked."""
    await enqueueing.enqueue_many(
        db,
        [
            JobSpec("k", resource_key="a", run_at=T0),
            JobSpec("k", resource_key="a", priority=9, run_at=T0 + timedelta(hours=2)),
            JobSpec("k", resource_key="a", priority=0, run_at=T0 + timedelta(hours=1)),
            JobSpec("k", resource_key="a", priority=5, run_at=T0 + timedelta(hours=3)),
            JobSpec("k", resource_key="b", run_at=T0),
        ],
    )
    assert len(await claim_all(db, T0)) == 2
    assert await marks(db) == {"a": T0 + timedelta(hours=1), "b": None}
    # Not due yet: the lane is not looked at.
    assert await claim_all(db, T0 + timedelta(minutes=59)) == []
    (job,) = await claim_all(db, T0 + timedelta(hours=1))
    assert job.run_at == T0 + timedelta(hours=1)
    assert (await marks(db))["a"] == T0 + timedelta(hours=2)


async def test_a_stale_mark_costs_one_empty_look_and_clears(db: Database) -> None:
    """A lane marked with no pending job is looked at once, gives nothing, is unmarked,
    and does not count as served."""
    await enqueueing.enqueue(db, "k", resource_key="gone", run_at=T0)
    async with db.begin() as conn:
        await conn.execute(update(jobs).values(status="cancelled"))
    assert (await marks(db))["gone"] == T0
    assert await claim_all(db, T0) == []
    assert (await marks(db))["gone"] is None
    async with db.begin() as conn:
        served = (await conn.execute(select(resources.c.last_claimed_at))).scalar()
    assert served is None


async def test_the_invariant_holds_through_random_operations(db: Database) -> None:
    """400 random enqueues, claims, outcomes and operator actions over five lanes, the
    clock moving forward: after each, every lane with a pending job is marked no later
    than it; at the end, claims far in the future take every pending job."""
    rng = random.Random(17)
    lanes = [f"lane-{i}" for i in range(5)]
    now = T0
    held: list[ClaimedJob] = []
    for step in range(400):
        now += timedelta(seconds=rng.randint(0, 30))
        roll = rng.random()
        lane = rng.choice(lanes)
        when = now + timedelta(seconds=rng.randint(-30, 120))
        if roll < 0.3:
            await enqueueing.enqueue(
                db, "k", resource_key=lane, priority=rng.randint(0, 3), run_at=when, now=now
            )
        elif roll < 0.4:
            specs = [
                JobSpec("k", resource_key=rng.choice(lanes), priority=rng.randint(0, 3), run_at=w)
                for w in (when, when + timedelta(seconds=40))
            ]
            await enqueueing.enqueue_many(db, specs, now=now)
        elif roll < 0.7:
            held += await claiming.claim(db, "w", rng.randint(1, 6), now=now, lease=LEASE)
        elif roll < 0.9 and held:
            job = held.pop(rng.randrange(len(held)))
            async with db.begin() as conn:
                if rng.random() < 0.4:
                    await outcomes.complete_many(conn, [(job.id, job.claim_token)], now=now)
                elif rng.random() < 0.5:
                    await outcomes.fail(
                        conn,
                        job,
                        now=now,
                        error_class="transient",
                        message="again",
                        retry_at=now + timedelta(seconds=rng.randint(0, 90)),
                    )
                else:
                    await outcomes.snooze(conn, job, now=now, until=when)
        elif roll < 0.95:
            pending = [j for j in await admin.list_jobs(db, status="pending")]
            if pending:
                target = rng.choice(pending)
                await admin.reschedule_job(db, target.id, when)
        else:
            await leasing.rescue_expired(db, now=now + 2 * LEASE)
            held = []
        assert await unmarked_work(db) == [], f"step {step}"
    await leasing.release(db, [(j.id, j.claim_token) for j in held])
    async with db.begin() as conn:
        pending = (
            await conn.execute(select(func.count()).where(jobs.c.status == "pending"))
        ).scalar_one()
    assert pending > 0
    taken = 0
    while batch := await claim_all(db, now + timedelta(days=1)):
        taken += len(batch)
    assert taken == pending
    assert set((await marks(db)).values()) == {None}


async def test_enqueue_many_takes_12000_distinct_lanes(db: Database) -> None:
    """A batch of 12,000 jobs in 12,000 lanes: past PostgreSQL's 32,767 bind parameters
    had each lane's row taken three; every lane is marked and claimable. Heartbeats and
    releases of 12,000 held jobs go through as well."""
    n = 12_000
    specs = [JobSpec("k", {"i": i}, resource_key=f"tenant-{i:05d}") for i in range(n)]
    made = await enqueueing.enqueue_many(db, specs, now=T0)
    assert len({e.id for e in made}) == n and all(e.created for e in made)
    got = await marks(db)
    assert len(got) == n and set(got.values()) == {T0}
    async with db.begin() as conn:
        await resources_store.ensure_lanes(conn, [f"other-{i}" for i in range(n)], T0)
        assert (await conn.execute(select(func.count()).select_from(resources))).scalar() == 2 * n
    held = await claiming.claim(db, "w", n, now=T0, lease=LEASE)
    assert len(held) == n
    pairs = [(j.id, j.claim_token) for j in held]
    alive = (await leasing.beat(db, "w", pairs, lease=LEASE, now=T0 + timedelta(seconds=1))).alive
    assert alive == {j.id for j in held}
    assert await leasing.release(db, pairs) == n
    assert await unmarked_work(db) == []


async def test_migration_0008_marks_the_lanes_that_have_work(db_url: str) -> None:
    """Upgrading a database with pending, running and finished jobs marks exactly the
    lanes with a pending job, at their earliest run_at."""
    d = open_database(db_url)
    try:
        await migrate.upgrade(d, "0007")
        stamp = "'2026-01-01 00:00:00'" if d.is_postgres else "'2026-01-01 00:00:00.000000'"
        later = "'2026-01-02 00:00:00'" if d.is_postgres else "'2026-01-02 00:00:00.000000'"
        async with d.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO resources (resource_key, state, updated_at) VALUES"
                    f" ('busy', 'closed', {stamp}), ('running', 'closed', {stamp}),"
                    f" ('idle', 'closed', {stamp})"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO jobs (kind, payload, resource_key, status, run_at, created_at,"
                    f" updated_at) VALUES ('k', '{{}}', 'busy', 'pending', {later}, {stamp},"
                    f" {stamp}), ('k', '{{}}', 'busy', 'pending', {stamp}, {stamp}, {stamp}),"
                    f" ('k', '{{}}', 'running', 'running', {stamp}, {stamp}, {stamp}),"
                    f" ('k', '{{}}', 'idle', 'succeeded', {stamp}, {stamp}, {stamp})"
                )
            )
        await migrate.upgrade(d)
        assert await marks(d) == {
            "busy": datetime(2026, 1, 1, tzinfo=UTC),
            "running": None,
            "idle": None,
        }
        (job,) = await claiming.claim(d, "w", 5, now=datetime(2026, 1, 1, 1, tzinfo=UTC))
        assert job.resource_key == "busy"
    finally:
        await d.dispose()


# --- concurrency ------------------------------------------------------------------------

# One racing process: an enqueuer puts jobs into random lanes of 100 (one at a time and in
# pairs); a claimer claims up to 64 jobs at a time and completes them at once, so lanes
# keep emptying while jobs arrive in them. Each runs for the seconds given.
_RACER = """
import asyncio, os, random, sys, time
from synckit.clock import utcnow
from synckit.store.db import open_database
from synckit.store.jobs.claiming import claim
from synckit.store.jobs.enqueueing import JobSpec, enqueue, enqueue_many
from synckit.store.jobs.outcomes import complete_many

async def main(url, role, seed, stop, cap):
    rng = random.Random(seed)
    db = open_database(url)
    end = time.monotonic() + cap  # a bound for a test that died; the stop file ends it
    try:
        while not os.path.exists(stop) and time.monotonic() < end:
            if role == "enqueue":
                lane = f"lane-{rng.randrange(100)}"
                if rng.random() < 0.7:
                    await enqueue(db, "k", resource_key=lane)
                else:
                    await enqueue_many(db, [JobSpec("k", resource_key=lane)] * 2)
            else:
                got = await claim(db, f"w{seed}", 64)
                async with db.begin() as conn:
                    await complete_many(
                        conn, [(j.id, j.claim_token) for j in got], now=utcnow()
                    )
    finally:
        await db.dispose()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])))
"""


#: The race runs at least this long and until it was looked at this many times: on a
#: busy machine a look waits longer for SQLite's lock (36 looks in 8 s under stress).
RACE_SECONDS = 8.0
RACE_LOOKS = 50


async def test_concurrent_enqueues_and_claims_leave_no_lane_unmarked(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """Two processes enqueue into 100 lanes while two others claim and complete there,
    so claims keep emptying lanes as jobs arrive in them. Watched all along, no pending
    job is ever seen in a lane without a mark at or before it (an enqueue and a claim
    emptying its lane are ordered by the lane row's lock), and a last claim takes every
    job left."""
    stop = tmp_path / "stop"
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _RACER,
            migrated_url,
            role,
            str(seed),
            str(stop),
            str(EVENT_TIMEOUT),
            stderr=asyncio.subprocess.PIPE,
        )
        for seed, role in enumerate(["enqueue", "claim", "enqueue", "claim"])
    ]
    waiting = [asyncio.create_task(p.communicate()) for p in procs]
    seen: list[tuple[str, datetime, datetime | None]] = []
    looks = 0
    started = time.monotonic()
    while not all(w.done() for w in waiting):
        seen += await unmarked_work(db)
        looks += 1
        if looks >= RACE_LOOKS and time.monotonic() - started >= RACE_SECONDS:
            stop.touch()
        await asyncio.sleep(0.005)
    outcomes = [await w for w in waiting]
    errors = [err.decode()[-2000:] for _, err in outcomes]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    assert stop.exists(), f"the racers ended before {RACE_LOOKS} looks: {errors}"
    assert seen == []
    assert await unmarked_work(db) == []
    async with db.begin() as conn:
        left = (
            await conn.execute(select(func.count()).where(jobs.c.status == "pending"))
        ).scalar_one()
    taken = 0
    while batch := await claiming.claim(db, "last", 100):
        taken += len(batch)
    assert taken == left
