"""Attempts are charged when a job starts, with real worker processes killed by kill -9."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from procs import read_log, spawn_worker, stop_all  # type: ignore[import-not-found]
from sqlalchemy import select

from synckit.runtime import jobs as store
from synckit.runtime.db import Database
from synckit.runtime.jobs import JobSpec
from synckit.runtime.schema import jobs


async def test_kill_9_gives_claimed_ahead_jobs_to_others_uncharged(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """Jobs claimed ahead by a killed worker run elsewhere within seconds, attempts 0 -> 1."""
    log = tmp_path / "exec.log"
    await store.enqueue_many(db, [JobSpec("record", {"sleep": 0.01}) for _ in range(3000)])
    # Long lease for started jobs, so that only the start lease can explain a fast rescue.
    victim = spawn_worker(migrated_url, log, "--concurrency", "1", "--lease", "60s")
    try:
        deadline = time.monotonic() + 60
        ahead: list[int] = []
        while time.monotonic() < deadline and len(ahead) < 10:
            await asyncio.sleep(0.05)
            async with db.begin() as conn:
                ahead = list(
                    (
                        await conn.execute(
                            select(jobs.c.id).where(
                                jobs.c.status == "running", jobs.c.started_at.is_(None)
                            )
                        )
                    ).scalars()
                )
        assert len(ahead) >= 10, "the worker should hold jobs claimed ahead"
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
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
            assert (await store.get_job(db, job_id)).attempts == 0
        rescuer = spawn_worker(migrated_url, log, "--concurrency", "8", "--lease", "60s")
        try:
            while time.monotonic() - killed_at < 25:
                infos = [await store.get_job(db, j) for j in never_started]
                if all(i.status == "succeeded" for i in infos):
                    break
                await asyncio.sleep(0.2)
            took = time.monotonic() - killed_at
        finally:
            stop_all([rescuer])
    finally:
        stop_all([victim])
    infos = [await store.get_job(db, j) for j in never_started]
    assert all(i.status == "succeeded" and i.attempts == 1 for i in infos), infos[:3]
    assert took < 20, f"claimed-ahead jobs waited {took:.1f}s after the crash"
    ran = {job_id for _, job_id, *_ in read_log(log)}
    assert set(never_started) <= ran


async def test_a_job_that_kills_its_worker_runs_out_of_attempts(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """Its start is charged before it runs: three crashes and it is dead; others uncharged."""
    log = tmp_path / "exec.log"
    await store.enqueue_many(
        db,
        [JobSpec("crash", max_attempts=3)]
        + [JobSpec("record", {"sleep": 0.01}) for _ in range(20)],
    )
    [killer] = await store.list_jobs(db, kind="crash")
    for _ in range(8):
        if (await store.get_job(db, killer.id)).status == "dead":
            break
        proc = spawn_worker(migrated_url, log, "--concurrency", "1", "--lease", "1s")
        try:
            deadline = time.monotonic() + 20
            while proc.poll() is None and time.monotonic() < deadline:
                if (await store.get_job(db, killer.id)).status == "dead":
                    break
                await asyncio.sleep(0.1)
        finally:
            stop_all([proc])
    info = await store.get_job(db, killer.id)
    assert info.status == "dead" and info.attempts == 3
    finisher = spawn_worker(migrated_url, log, "--concurrency", "4", "--lease", "1s")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (await store.count_by_status(db)).get("succeeded", 0) == 20:
                break
            await asyncio.sleep(0.2)
    finally:
        stop_all([finisher])
    others = [i for i in await store.list_jobs(db, kind="record")]
    assert len(others) == 20
    assert all(i.status == "succeeded" and i.attempts == 1 for i in others)
