"""The job queue across real worker processes (`synckit worker` subprocesses)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import read_begun, read_log, spawn_worker, stop_all  # type: ignore[import-not-found]
from sqlalchemy import select, text
from waits import PROCESS_TIMEOUT, await_until  # tests/

from synckit.errors.exceptions import DatabaseUnavailable
from synckit.store import migrate
from synckit.store.db import Database, open_database
from synckit.store.jobs import admin, enqueueing
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.resources import configure_resource
from synckit.store.tables import jobs

#: A worker polling every 30 s is woken by another process's enqueue within this
#: (generous for a busy machine, well short of the poll it would otherwise wait for).
#: Workers started and killed at most, until one kill lands while jobs are claimed.
KILL_TRIES = 5
WAKE_BUDGET = 10.0


async def wait_until(check: Callable[[], object], what: str, interval: float = 0.1) -> None:
    """Until ``check()`` (or the coroutine it returns) is truthy; EVENT_TIMEOUT fails it."""

    async def checked() -> object:
        result = check()
        return await result if asyncio.iscoroutine(result) else result

    await await_until(checked, what, interval=interval)


async def all_final(db: Database) -> bool:
    counts = await admin.count_by_status(db)
    return counts.get("pending", 0) == 0 and counts.get("running", 0) == 0


async def test_four_processes_run_each_job_exactly_once(
    engine_name: str, db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """Four worker processes, 10,000 jobs: each executed exactly once."""
    if engine_name != "postgresql":
        pytest.skip("many workers on many hosts is what PostgreSQL is for")
    log = tmp_path / "exec.log"
    await enqueueing.enqueue_many(db, [JobSpec("record", {"i": i}) for i in range(10_000)])
    procs = [spawn_worker(migrated_url, log, "--concurrency", "16") for _ in range(4)]
    try:
        await wait_until(lambda: all_final(db), "10,000 jobs to finish")
    finally:
        stop_all(procs)
    execs = read_log(log)
    per_job = collections.Counter(job_id for _, job_id, *_ in execs)
    assert len(per_job) == 10_000
    assert max(per_job.values()) == 1
    assert len({pid for _, _, pid, *_ in execs}) == 4  # every process took part
    assert await admin.count_by_status(db) == {"succeeded": 10_000}


async def test_kill_9_mid_batch_loses_nothing(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """kill -9 of a worker mid-batch: another worker rescues its jobs; every job finishes."""
    log = tmp_path / "exec.log"
    # Long enough handlers that the kill lands while a batch is running, not between batches.
    await enqueueing.enqueue_many(db, [JobSpec("record", {"sleep": 0.1}) for _ in range(400)])

    async def holding() -> bool:
        counts = await admin.count_by_status(db)
        return counts.get("running", 0) > 0

    victims: list[subprocess.Popen[bytes]] = []
    running: list[Any] = []
    try:
        # All jobs take the same time, so batches end together: the kill is meant to land
        # while one runs. On a busy machine it can still land in the moment between
        # recording a batch and claiming the next (nothing left claimed, nothing to
        # rescue): then another worker is started and killed, up to KILL_TRIES times.
        for _ in range(KILL_TRIES):
            done_before = len(read_log(log))
            victim = spawn_worker(migrated_url, log, "--concurrency", "8", "--lease", "2s")
            victims.append(victim)
            await wait_until(
                lambda n=done_before: len(read_log(log)) >= n + 24, "the worker to get going"
            )
            await wait_until(holding, "the worker to hold running jobs", interval=0.01)
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            async with db.begin() as conn:
                running = list(
                    (
                        await conn.execute(
                            select(jobs.c.id, jobs.c.attempts).where(jobs.c.status == "running")
                        )
                    ).all()
                )
            if running:
                break
        counts = await admin.count_by_status(db)
        assert running, f"{KILL_TRIES} kills all left no claimed job behind: {counts}"
        rescuer = spawn_worker(migrated_url, log, "--concurrency", "8", "--lease", "2s")
        try:
            await wait_until(lambda: all_final(db), "every job to finish after the kill")
        finally:
            stop_all([rescuer])
    finally:
        stop_all(victims)
    assert await admin.count_by_status(db) == {"succeeded": 400}
    executed = {job_id for _, job_id, *_ in read_log(log)}
    assert len(executed) == 400
    for job_id, attempts_at_kill in running:
        info = await admin.get_job(db, job_id)
        if attempts_at_kill >= 1:  # started by the victim: the killed attempt counted
            assert info.attempts >= 2, info
        else:  # claimed, never started (its start mark waited on unrecorded outcomes)
            assert info.attempts == 1, info


async def test_in_flight_limit_holds_across_three_processes(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """A per-resource limit of 2 holds across 3 worker processes."""
    log = tmp_path / "exec.log"
    await configure_resource(db, "mailbox-1", max_in_flight=2)
    await enqueueing.enqueue_many(
        db, [JobSpec("record", {"sleep": 0.15}, resource_key="mailbox-1") for _ in range(24)]
    )
    procs = [
        # One job at a time per process: three processes could run three, the limit is two.
        spawn_worker(migrated_url, log, "--concurrency", "1", "--poll-interval", "0.05")
        for _ in range(3)
    ]
    try:
        await wait_until(lambda: all_final(db), "the limited jobs to finish")
    finally:
        stop_all(procs)
    execs = read_log(log)
    assert len(execs) == 24
    events = sorted(
        [(start, 1) for *_, start, _end in execs] + [(end, -1) for *_, _start, end in execs],
        key=lambda e: (e[0], e[1]),
    )
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak == 2
    assert len({pid for _, _, pid, *_ in execs}) >= 2  # so the limit held across processes


async def test_cron_ticks_enqueue_exactly_once_with_three_processes(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """An every-second schedule run by 3 worker processes enqueues each tick once."""
    log = tmp_path / "exec.log"
    env = {"QUEUE_APP_CRON": "1"}
    procs = [spawn_worker(migrated_url, log, "--poll-interval", "0.2", env=env) for _ in range(3)]
    try:
        await wait_until(lambda: len(read_log(log)) >= 5, "five ticks")
    finally:
        stop_all(procs)
    async with db.begin() as conn:
        ticks = (
            (await conn.execute(select(jobs.c.unique_key).where(jobs.c.kind == "tick")))
            .scalars()
            .all()
        )
    assert len(ticks) >= 5
    assert len(set(ticks)) == len(ticks)
    executed = collections.Counter(job_id for _, job_id, *_ in read_log(log))
    assert max(executed.values()) == 1


async def test_sigterm_finishes_in_flight_work_and_releases_nothing_else(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """SIGTERM: claiming stops, in-flight jobs finish within the grace period, exit 0."""
    log = tmp_path / "exec.log"
    await enqueueing.enqueue_many(db, [JobSpec("record", {"sleep": 1.0}) for _ in range(6)])
    proc = spawn_worker(migrated_url, log, "--concurrency", "2", "--grace", "20")
    try:
        # Their handlers, not just their rows: a job the claim marked running but whose
        # handler has not begun when SIGTERM lands is released (its attempt given back).
        async def two_running() -> bool:
            return len(read_begun(log)) == 2

        await wait_until(two_running, "two handlers to begin")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(PROCESS_TIMEOUT) == 0
    finally:
        stop_all([proc])
    assert await admin.count_by_status(db) == {"succeeded": 2, "pending": 4}
    assert len(read_log(log)) == 2


async def test_grace_period_over_releases_jobs_without_spending_attempts(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """A job still running when the grace period ends is released to pending, attempt kept."""
    log = tmp_path / "exec.log"
    job = await enqueueing.enqueue(db, "record", {"sleep": 60})
    proc = spawn_worker(migrated_url, log, "--grace", "0.5")
    try:

        async def running() -> bool:
            return read_begun(log) == [job.id]

        await wait_until(running, "the job's handler to begin")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(PROCESS_TIMEOUT) == 0
    finally:
        stop_all([proc])
    info = await admin.get_job(db, job.id)
    assert info.status == "pending" and info.attempts == 0


class PrivatePostgres:
    """A PostgreSQL server of this test's own, so that restarting it disturbs nobody
    (the shared server on 5432 serves every other test, in parallel ones included)."""

    def __init__(self, bindir: Path, root: Path) -> None:
        self.bindir, self.root = bindir, root
        self.data = root / "data"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *args: str) -> None:
        # Output to a file, not a pipe: the server that pg_ctl starts inherits it, and a
        # pipe would stay open for as long as the server runs.
        with open(self.root / "ctl.log", "ab") as out:
            subprocess.run(
                ["runuser", "-u", "postgres", "--", *args],
                check=True,
                stdout=out,
                stderr=out,
                timeout=PROCESS_TIMEOUT,
            )

    def start(self) -> None:
        self._as_postgres(
            str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
            "--no-sync",
        )  # fmt: skip
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._as_postgres(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", options,
            "-l", str(self.root / "server.log"), "-w", "start",
        )  # fmt: skip

    def pg_ctl(self, *args: str) -> None:
        self._as_postgres(str(self.bindir / "pg_ctl"), "-D", str(self.data), *args)

    def restart(self) -> None:
        self.pg_ctl("-w", "-m", "fast", "-l", str(self.root / "server.log"), "restart")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            self.pg_ctl("-m", "immediate", "stop")


@pytest.fixture
def private_postgres(engine_name: str) -> Iterator[PrivatePostgres]:
    if engine_name != "postgresql":
        pytest.skip("PostgreSQL restart")
    bindirs = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    if not bindirs or os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs PostgreSQL's server binaries and root to run a server of its own")
    root = Path(tempfile.mkdtemp(prefix="synckit-pg-"))
    shutil.chown(root, "postgres", "postgres")
    server = PrivatePostgres(bindirs[-1], root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def test_worker_survives_a_postgres_restart(
    private_postgres: PrivatePostgres, tmp_path: Path
) -> None:
    """The server restarts under a running worker: it reconnects and loses no job."""
    url = private_postgres.url
    setup = open_database(url)
    await migrate.upgrade(setup)
    await setup.dispose()
    log = tmp_path / "exec.log"
    db = open_database(url)
    try:
        await enqueueing.enqueue_many(db, [JobSpec("record", {"sleep": 0.01}) for _ in range(300)])
        proc = spawn_worker(url, log, "--concurrency", "4", "--lease", "5s")
        try:
            await wait_until(lambda: len(read_log(log)) >= 30, "the worker to get going")
            await db.engine.dispose()
            # An application enqueuing one job at a time, its pool full of connections
            # that the restart will kill: at most one enqueue fails (and clearly).
            app = open_database(url)
            await asyncio.gather(*(enqueueing.enqueue(app, "record", {}) for _ in range(6)))
            await asyncio.to_thread(private_postgres.restart)
            await enqueueing.enqueue_many(db, [JobSpec("record", {}) for _ in range(44)])
            failures = 0
            for _ in range(10):
                try:
                    await enqueueing.enqueue(app, "record", {})
                except DatabaseUnavailable as exc:
                    failures += 1
                    assert "\n" not in str(exc)
            await app.dispose()
            assert failures <= 1
            await wait_until(lambda: all_final(db), "every job after the restart")
            assert proc.poll() is None, "the worker died with the database"
        finally:
            stop_all([proc])
        assert await admin.count_by_status(db) == {"succeeded": 360 - failures}
        async with db.begin() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
    finally:
        await db.dispose()


async def test_an_idle_worker_claims_another_processs_job_well_within_its_poll_interval(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """A worker polling every 30 s runs a job this process enqueues within about a second:
    woken by NOTIFY on PostgreSQL, by the file's data_version on SQLite."""
    log = tmp_path / "exec.log"
    procs = [spawn_worker(migrated_url, log, "--poll-interval", "30")]
    try:
        # The first job shows the worker is up (its first claim needs no wake-up).
        await enqueueing.enqueue_many(db, [JobSpec("record", {"i": 0})])
        await wait_until(lambda: len(read_log(log)) == 1, "the first job")
        await asyncio.sleep(0.5)  # settling into idle, waiting up to 30 s
        enqueued = time.time()
        await enqueueing.enqueue_many(db, [JobSpec("record", {"i": 1})])
        await wait_until(lambda: len(read_log(log)) == 2, "the second job")
    finally:
        stop_all(procs)
    started = read_log(log)[1][3]
    assert started - enqueued < WAKE_BUDGET
