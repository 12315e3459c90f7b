"""The one-job enqueue fast paths, on SQLite and PostgreSQL.

A single job takes a shortcut on each engine: one autocommitted statement on PostgreSQL,
and on SQLite a raw ``sqlite3`` transaction on the caller's own thread when the write
lock is free (``InlineSqlite``). These tests hold the shortcuts to the general path's
results and to its durability.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from waits import PROCESS_TIMEOUT, await_until, wait_until  # tests/

from synckit.errors.exceptions import DatabaseError, DatabaseUnavailable, JobError, PayloadError
from synckit.store.db import Database, open_database
from synckit.store.jobs import admin, enqueueing
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.sqlite_writer import BUSY, InlineSqlite
from synckit.store.tables import jobs, resources

NOW = datetime(2026, 11, 22, 3, 4, 5, 678901, tzinfo=UTC)


async def rows(db: Database) -> list[dict[str, Any]]:
    async with db.begin() as conn:
        result = await conn.execute(select(jobs).order_by(jobs.c.id))
        return [dict(r._mapping) for r in result]


async def test_one_job_is_stored_exactly_as_a_batch_stores_it(db: Database) -> None:
    """Every column the shortcut writes equals what the general (batch) path writes."""
    spec = JobSpec(
        "mail.send",
        {"to": ["a@example.com"], "n": 1.5, "nested": {"ü": None}},
        resource_key="tenant-a",
        priority=7,
        delay=timedelta(days=2, microseconds=3),
        max_attempts=9,
        trace_id="trace-1",
    )
    one = await enqueueing.enqueue_many(db, [spec], now=NOW)
    two = await enqueueing.enqueue_many(db, [spec, spec], now=NOW)
    assert [e.created for e in one + two] == [True, True, True]
    stored = await rows(db)
    assert len(stored) == 3
    for r in stored:
        r.pop("id")
    assert stored[0] == stored[1] == stored[2]
    assert stored[0]["run_at"] == NOW + timedelta(days=2, microseconds=3)
    assert stored[0]["created_at"] == NOW and stored[0]["run_at"].tzinfo is not None
    async with db.begin() as conn:
        lanes = (await conn.execute(select(resources.c.resource_key, resources.c.state))).all()
    assert [tuple(x) for x in lanes] == [("tenant-a", "closed")]


async def test_a_database_stays_hashable_and_equal_to_itself(db: Database) -> None:
    """The writer thread's state lives in the Database without making it unhashable."""
    await enqueueing.enqueue(db, "k", {})  # the inline connection (SQLite) now exists
    await enqueueing.enqueue_many(db, [JobSpec("k"), JobSpec("k")])  # and the writer's
    assert {db: 1}[db] == 1 and db == db


async def test_one_job_is_refused_before_anything_is_written(db: Database) -> None:
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        await enqueueing.enqueue(db, "k", {"when": object()})
    assert await rows(db) == []


def _hold_write_lock(path: str) -> subprocess.Popen[str]:
    """Another OS process that takes SQLite's write lock and keeps it until its stdin is
    closed."""
    code = textwrap.dedent(
        f"""
        import sqlite3, sys
        c = sqlite3.connect({path!r}, isolation_level=None)
        c.execute("BEGIN IMMEDIATE")
        print("locked", flush=True)
        sys.stdin.read()
        c.execute("COMMIT")
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


async def test_sqlite_enqueue_waits_for_another_writer_without_blocking_the_loop(
    engine_name: str, db: Database
) -> None:
    """A write lock held by another process: the shortcut steps aside, the loop keeps going."""
    if engine_name != "sqlite":
        pytest.skip("SQLite's write lock; PostgreSQL inserts do not wait for each other")
    assert db.url.database is not None
    holder = _hold_write_lock(db.url.database)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async def ticked() -> bool:
        return ticks > 10

    tick = asyncio.create_task(ticker())
    try:
        assert db.try_inline(lambda conn: 1) is BUSY
        enqueue = asyncio.create_task(enqueueing.enqueue(db, "k", {"a": 1}))
        await await_until(ticked, "the event loop to run on")  # it keeps running...
        assert not enqueue.done()  # ...while the enqueue waits for the lock
    finally:
        tick.cancel()
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(PROCESS_TIMEOUT)
    job = await enqueue
    assert job.created
    assert [r["payload"] for r in await rows(db)] == [{"a": 1}]


async def test_sqlite_inline_busy_midway_rolls_back_and_steps_aside(
    engine_name: str, db: Database
) -> None:
    """A lock wait after BEGIN (at COMMIT, say) is BUSY too, with nothing written."""
    if engine_name != "sqlite":
        pytest.skip("SQLite's write lock")

    def write_then_find_it_locked(conn: sqlite3.Connection) -> int:
        conn.execute(
            "INSERT INTO resources (resource_key, state, updated_at)"
            " VALUES ('x', 'closed', '2026-01-01 00:00:00.000000')"
        )
        raise sqlite3.OperationalError("database is locked")

    assert db.try_inline(write_then_find_it_locked) is BUSY
    async with db.begin() as conn:
        assert (await conn.execute(select(resources.c.resource_key))).all() == []
    with pytest.raises(DatabaseError, match="no such table"):  # other errors still raise
        db.try_inline(lambda conn: conn.execute("SELECT * FROM nowhere"))


async def test_sqlite_inline_writes_ask_for_wal_checkpoints(
    engine_name: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inline connection never checkpoints; every Nth commit asks the writer thread to."""
    if engine_name != "sqlite":
        pytest.skip("SQLite's WAL")
    monkeypatch.setattr(InlineSqlite, "CHECKPOINT_EVERY", 10)
    calls: list[float] = []
    real = Database._checkpoint

    def spy(self: Database) -> None:
        calls.append(time.monotonic())
        real(self)

    monkeypatch.setattr(Database, "_checkpoint", spy)
    for i in range(35):
        await enqueueing.enqueue(db, "k", {"i": i})

    async def three() -> bool:
        return len(calls) >= 3

    await await_until(three, "three checkpoints", interval=0.01)
    assert len(calls) == 3
    assert len(await rows(db)) == 35


_ENQUEUER = """
import asyncio, sys
from synckit.store.db import open_database
from synckit.store.jobs import enqueueing

async def main():
    db = open_database(sys.argv[1])
    i = 0
    while True:
        job = await enqueueing.enqueue(db, "k", {"i": i})
        print(job.id, i, flush=True)
        i += 1

asyncio.run(main())
"""


def _enqueue_then_kill_9(url: str, out: Path, acks: int) -> None:
    """Run the enqueuer until it has acknowledged ``acks`` jobs, then kill -9 it."""
    with open(out, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-c", _ENQUEUER, url], stdout=sink)
        try:
            wait_until(
                lambda: out.read_text().count("\n") >= acks or proc.poll() is not None,
                f"{acks} acknowledged enqueues",
                interval=0.05,
            )
            proc.send_signal(signal.SIGKILL)
            proc.wait(PROCESS_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()


async def test_every_acknowledged_enqueue_survives_kill_9(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """A process enqueuing one job at a time is killed -9: every job it was told of exists."""
    out = tmp_path / "acks.txt"
    await asyncio.to_thread(_enqueue_then_kill_9, migrated_url, out, 300)
    acked = {}
    for line in out.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:  # the last line may have been cut by the kill
            acked[int(parts[0])] = int(parts[1])
    assert len(acked) >= 300
    stored = {r["id"]: r["payload"] for r in await rows(db)}
    missing = [job_id for job_id in acked if job_id not in stored]
    assert not missing, f"{len(missing)} acknowledged jobs lost"
    assert all(stored[job_id] == {"i": i} for job_id, i in acked.items())
    assert json.dumps(sorted(acked.values())[:3]) == "[0, 1, 2]"


async def test_a_batch_returns_each_jobs_own_id_in_order(db: Database) -> None:
    """Ids come back in the order of the specs, keyed and un-keyed rows mixed."""
    specs = [
        JobSpec("k", {"i": i}, unique_key=f"u{i}" if i % 7 == 0 else None, priority=i % 3)
        for i in range(500)
    ]
    await enqueueing.enqueue(db, "k", {"i": 0}, unique_key="u0")  # the batch's u0 finds this one
    out = await enqueueing.enqueue_many(db, specs)
    assert [e.created for e in out] == [i != 0 for i in range(500)]
    stored = {r["id"]: r for r in await rows(db)}
    for i, e in enumerate(out):
        assert stored[e.id]["payload"] == {"i": i}
        assert stored[e.id]["priority"] == (i % 3 if i else 0)


async def test_a_refused_job_is_one_clear_error_and_the_connection_lives_on(
    db: Database,
) -> None:
    """PostgreSQL's jsonb refuses a lone surrogate: a one-line error, the pool still works.
    (A NUL, which it refuses too, is refused by name before the database on both engines:
    test_what_the_jobs_table_cannot_hold_is_refused_by_name.)"""
    if not db.is_postgres:
        pytest.skip("SQLite stores the escape as given")
    for _ in range(3):  # more times than the pool has idle connections to hide behind
        with pytest.raises(DatabaseError) as caught:
            await enqueueing.enqueue(db, "k", {"text": "a\ud800b"})
        assert "\n" not in str(caught.value) and "invalid input syntax" in str(caught.value)
    job = await enqueueing.enqueue(db, "k", {"ok": True})
    assert [r["id"] for r in await rows(db)] == [job.id]


async def test_an_unreachable_server_is_database_unavailable(engine_name: str) -> None:
    if engine_name != "postgresql":
        pytest.skip("a server to be unreachable")
    db = open_database("postgresql://nobody:secret@127.0.0.1:1/none")
    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            await enqueueing.enqueue(db, "k", {})
        assert "secret" not in str(caught.value) and "\n" not in str(caught.value)
    finally:
        await db.dispose()


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (JobSpec("k", {"text": "a\u0000b"}), "payload of job 'k' contains a NUL character"),
        (JobSpec("k", {"a\u0000": 1}), "payload of job 'k' contains a NUL character"),
        (JobSpec("k\u0000"), "kind holds a NUL character"),
        (JobSpec("k", resource_key="r" * 201), "resource_key is longer than 200"),
        (JobSpec("k", unique_key="u\u0000"), "unique_key holds a NUL character"),
        (JobSpec("k", trace_id="t" * 65), "trace_id is longer than 64"),
        (JobSpec("k", priority=2**31), "priority must be from"),
        (JobSpec("k", max_attempts=-1), "max_attempts must be from 0"),
    ],
    ids=["nul-value", "nul-key", "nul-kind", "long-key", "nul-unique", "long-trace", "priority",
         "attempts"],
)  # fmt: skip
async def test_what_the_jobs_table_cannot_hold_is_refused_by_name(
    db: Database, spec: JobSpec, says: str
) -> None:
    """Refused before any write, on both engines alike (PostgreSQL refuses a NUL, a value
    past a column, an integer past 32 bits; SQLite stores them): one job and a batch."""
    with pytest.raises(JobError, match=says):
        await enqueueing.enqueue(db, spec.kind, spec.payload, **_options(spec))
    with pytest.raises(JobError, match=says):
        await enqueueing.enqueue_many(db, [JobSpec("fine"), spec])
    assert await admin.count_by_status(db) == {}


def _options(spec: JobSpec) -> dict[str, Any]:
    names = ("resource_key", "priority", "max_attempts", "unique_key", "trace_id")
    return {n: getattr(spec, n) for n in names if getattr(spec, n) not in (None, 0)}
