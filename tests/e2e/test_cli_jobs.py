"""`synckit jobs ...`, `synckit worker --burst` and `synckit breakers ...`: in process
(tests/inprocess.py), and as a process where the event loop the process runs is the point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engines import sqlite_only  # tests/
from inprocess import run_cli  # tests/
from waits import PROCESS_TIMEOUT  # tests/

APPS = Path(__file__).parent.parent / "apps"


def synckit(
    url: str, *args: str, env: dict[str, str] | None = None, process: bool = False
) -> subprocess.CompletedProcess[str]:
    if not process:
        return run_cli(*args, env={"SYNCKIT_DATABASE_URL": url, **(env or {})})
    full_env = {
        **os.environ,
        "SYNCKIT_DATABASE_URL": url,
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "synckit.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=PROCESS_TIMEOUT,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


@sqlite_only
def test_jobs_lifecycle_through_the_cli(migrated_url: str, tmp_path: Path) -> None:
    """Enqueue, list, show, reschedule, re-prioritise, cancel, retry and run jobs."""
    first = ok(synckit(migrated_url, "jobs", "enqueue", "record", "--payload", '{"n": 1}'))
    assert first.startswith("job 1 enqueued")
    ok(synckit(migrated_url, "jobs", "enqueue", "record", "--in", "2d", "--unique-key", "u"))
    again = ok(synckit(migrated_url, "jobs", "enqueue", "record", "--unique-key", "u"))
    assert "already queued" in again
    listed = [json.loads(x) for x in ok(synckit(migrated_url, "jobs", "ls", "--json")).splitlines()]
    assert [j["id"] for j in listed] == [2, 1]
    recent = ok(synckit(migrated_url, "jobs", "ls", "--json", "--created-since", "1h"))
    assert len(recent.splitlines()) == 2
    bad = synckit(migrated_url, "jobs", "ls", "--status", "finished")
    assert bad.returncode == 2 and "'finished' is not one of" in bad.stderr
    shown = json.loads(ok(synckit(migrated_url, "jobs", "show", "1")))
    assert shown["payload"] == {"n": 1} and shown["status"] == "pending"
    one_line = ok(synckit(migrated_url, "jobs", "show", "1", "--json")).strip()
    assert "\n" not in one_line and json.loads(one_line) == shown
    assert "priority 5" in ok(synckit(migrated_url, "jobs", "priority", "1", "5"))
    out = ok(synckit(migrated_url, "jobs", "reschedule", "2", "--at", "2031-01-01T00:00:00+00:00"))
    assert "2031-01-01" in out
    assert "cancelled" in ok(synckit(migrated_url, "jobs", "cancel", "2"))
    assert "pending" in ok(synckit(migrated_url, "jobs", "retry", "2"))
    ok(synckit(migrated_url, "jobs", "reschedule", "2", "--in", "0s"))
    stats = json.loads(
        ok(
            synckit(
                migrated_url,
                "worker",
                "--app",
                "queue_app:registry",
                "--burst",
                env={"QUEUE_APP_LOG": str(tmp_path / "log")},
            )
        )
    )
    assert stats["succeeded"] == 2
    done = [
        json.loads(x)
        for x in ok(
            synckit(migrated_url, "jobs", "ls", "--json", "--status", "succeeded")
        ).splitlines()
    ]
    assert len(done) == 2


@sqlite_only
def test_job_cli_errors_are_one_line(migrated_url: str) -> None:
    """Unknown ids, bad payloads and bad apps: one line, exit code 2."""
    for args, expected in [
        (("jobs", "show", "99"), "no job with id 99"),
        (("jobs", "set-payload", "99", "{not json"), "payload is not JSON"),
        (("jobs", "reschedule", "1", "--at", "2030-01-01"), "needs a time zone"),
        (("worker", "--app", "nowhere:registry", "--burst"), "no module named 'nowhere'"),
        (("worker", "--app", "queue_app:nothing", "--burst"), "has no attribute 'nothing'"),
        (("breakers", "reset", "nope"), "no resource 'nope'"),
    ]:
        result = synckit(migrated_url, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (args, result.stderr)


@sqlite_only
def test_breakers_ls_and_reset(migrated_url: str) -> None:
    """`breakers ls` shows a resource's state; `reset` closes it."""
    ok(synckit(migrated_url, "jobs", "enqueue", "record", "--resource-key", "tenant-1"))
    import asyncio

    from sqlalchemy import update

    from synckit.store.db import open_database
    from synckit.store.tables import resources

    async def open_it() -> None:
        db = open_database(migrated_url)
        async with db.begin() as conn:
            await conn.execute(update(resources).values(state="open", consecutive_failures=5))
        await db.dispose()

    asyncio.run(open_it())
    rows = [
        json.loads(x) for x in ok(synckit(migrated_url, "breakers", "ls", "--json")).splitlines()
    ]
    assert rows[0]["resource_key"] == "tenant-1" and rows[0]["state"] == "open"
    assert "breaker closed" in ok(synckit(migrated_url, "breakers", "reset", "tenant-1"))
    rows = [
        json.loads(x) for x in ok(synckit(migrated_url, "breakers", "ls", "--json")).splitlines()
    ]
    assert rows[0]["state"] == "closed" and rows[0]["consecutive_failures"] == 0


def test_jobs_ls_pages_by_keyset(migrated_url: str, tmp_path: Path) -> None:
    import asyncio

    from synckit.store.db import open_database
    from synckit.store.jobs import enqueueing

    async def enqueue() -> None:
        db = open_database(migrated_url)
        try:
            await enqueueing.enqueue_many(
                db, [enqueueing.JobSpec("record", {"n": n}) for n in range(5)]
            )
        finally:
            await db.dispose()

    asyncio.run(enqueue())
    first = synckit(migrated_url, "jobs", "ls", "--json", "--limit", "2")
    ids = [json.loads(x)["id"] for x in ok(first).splitlines()]
    assert len(ids) == 2 and ids == sorted(ids, reverse=True)
    assert f"next page: --before {ids[-1]}" in first.stderr
    second = synckit(migrated_url, "jobs", "ls", "--json", "--limit", "2", "--before", str(ids[-1]))
    more = [json.loads(x)["id"] for x in ok(second).splitlines()]
    assert len(more) == 2 and max(more) < min(ids)
    table = ok(synckit(migrated_url, "jobs", "ls", "--limit", "2"))
    assert f"--before {ids[-1]}" in table


@sqlite_only  # PostgreSQL's driver on uvloop: every worker process the suite starts
def test_the_worker_runs_on_uvloop_or_on_asyncios_own_loop(
    migrated_url: str, tmp_path: Path
) -> None:
    """The default (``--loop auto``) runs on uvloop, installed with synckit; ``--loop
    asyncio`` on asyncio's own; ``$SYNCKIT_LOOP`` is the same option."""
    ok(synckit(migrated_url, "jobs", "enqueue", "record", "--payload", '{"n": 1}'))
    env = {"QUEUE_APP_LOG": str(tmp_path / "log")}
    for args, expected, succeeded in [((), "uvloop", 1), (("--loop", "asyncio"), "asyncio", 0)]:
        result = synckit(
            migrated_url,
            "worker", "--app", "queue_app:registry", "--burst", *args, env=env, process=True,
        )  # fmt: skip
        assert json.loads(ok(result))["succeeded"] == succeeded
        started = [
            json.loads(line) for line in result.stderr.splitlines() if '"worker.started"' in line
        ]
        assert [s["loop"] for s in started] == [expected], result.stderr
    bad = synckit(
        migrated_url,
        "worker", "--app", "queue_app:registry", env={"SYNCKIT_LOOP": "trio"}, process=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "'trio' is not one of" in bad.stderr
