"""`jobs ls` and `jobs show` on a corrupt row, in process (tests/inprocess.py) on both
engines: the cell shows as unreadable and the command exits 0."""

from __future__ import annotations

import asyncio
import json
import subprocess

from inprocess import run_cli  # tests/
from sqlalchemy import text

from synckit.store.db import open_database
from synckit.store.jobs import enqueueing
from synckit.store.jobs.enqueueing import JobSpec

BAD_PAYLOAD = {"sqlite": "'{not json'", "postgresql": "('1' || repeat('0', 5000))::jsonb"}
BAD_TIME = {"sqlite": "'garbage'", "postgresql": "'20000-01-01'::timestamptz"}


def synckit(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"COLUMNS": "250"})  # in process (tests/inprocess.py)


def test_jobs_ls_and_show_read_a_corrupt_job_as_unreadable(
    migrated_url: str, engine_name: str
) -> None:
    """A job with a payload and run_at no reader can read, beside a sound one: `jobs ls`
    (table and --json) and `jobs show` exit 0 and mark those cells unreadable."""

    async def seed() -> tuple[int, int]:
        db = open_database(migrated_url)
        try:
            bad, good = await enqueueing.enqueue_many(db, [JobSpec("x"), JobSpec("y", {"a": 1})])
            async with db.begin() as conn:
                await conn.execute(
                    text(
                        f"UPDATE jobs SET payload = {BAD_PAYLOAD[engine_name]},"
                        f" run_at = {BAD_TIME[engine_name]} WHERE id = {bad.id}"
                    )
                )
            return bad.id, good.id
        finally:
            await db.dispose()

    bad, good = asyncio.run(seed())
    url = ["--database-url", migrated_url]
    table = synckit("jobs", "ls", *url)
    assert table.returncode == 0, table.stderr
    assert "<unreadable>" in table.stdout
    listed = synckit("jobs", "ls", "--json", *url)
    assert listed.returncode == 0, listed.stderr
    rows = {r["id"]: r for r in map(json.loads, listed.stdout.splitlines())}
    assert rows[bad]["run_at"] is None and "run_at" in rows[bad]["unreadable"]
    assert rows[good]["unreadable"] == {}
    shown = synckit("jobs", "show", str(bad), *url)
    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    assert info["payload"] is None and set(info["unreadable"]) == {"payload", "run_at"}
    sound = json.loads(synckit("jobs", "show", str(good), *url).stdout)
    assert sound["payload"] == {"a": 1} and sound["unreadable"] == {}


def test_jobs_ls_names_pending_jobs_that_never_run(migrated_url: str, engine_name: str) -> None:
    """A pending job whose run_at cannot be read is never claimed: `jobs ls` says how many
    below the table (stderr with --json) and `--unreadable` lists exactly those; a job in
    a status nobody writes and one whose error history is not JSON list as they are."""

    async def seed() -> tuple[int, int, int]:
        db = open_database(migrated_url)
        try:
            stuck, odd, sound = await enqueueing.enqueue_many(
                db, [JobSpec("x"), JobSpec("y", resource_key="lane:1"), JobSpec("z")]
            )
            history = "'{not json'" if engine_name == "sqlite" else BAD_PAYLOAD[engine_name]
            async with db.begin() as conn:
                await conn.execute(
                    text(f"UPDATE jobs SET run_at = {BAD_TIME[engine_name]} WHERE id = {stuck.id}")
                )
                await conn.execute(
                    text(
                        f"UPDATE jobs SET status = 'zombie', errors = {history} WHERE id = {odd.id}"
                    )
                )
            return stuck.id, odd.id, sound.id
        finally:
            await db.dispose()

    stuck, odd, sound = asyncio.run(seed())
    url = ["--database-url", migrated_url]
    table = synckit("jobs", "ls", *url)
    listed = synckit("jobs", "ls", "--json", *url)
    only = synckit("jobs", "ls", "--unreadable", "--json", *url)
    only_table = synckit("jobs", "ls", "--unreadable", *url)
    shown = synckit("jobs", "show", str(odd), *url)
    for r in (table, listed, only, only_table, shown):
        assert r.returncode == 0 and "Traceback" not in r.stderr, (r.args, r.stderr)
    says = "1 pending job(s) never run: their run_at cannot be read"
    assert says in table.stdout and says in listed.stderr
    assert "Queue: 3 jobs (2 pending, 1 zombie)" in table.stdout
    assert {r["id"] for r in map(json.loads, listed.stdout.splitlines())} == {stuck, odd, sound}
    assert [r["id"] for r in map(json.loads, only.stdout.splitlines())] == [stuck]
    assert only.stderr == ""
    assert "never run (run_at unreadable) (1)" in only_table.stdout
    info = json.loads(shown.stdout)
    assert info["status"] == "zombie" and set(info["unreadable"]) == {"errors"}
