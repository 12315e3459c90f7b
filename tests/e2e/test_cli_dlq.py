"""`synckit dlq ...` run as subprocesses against a real database, on both engines."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from engines import sqlite_only  # tests/
from inprocess import run_cli  # tests/
from sqlalchemy import update
from waits import PROCESS_TIMEOUT  # tests/

from synckit.store.db import Database, open_database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import replay as dlq_replay
from synckit.store.dead_letters import rows as dlq_rows
from synckit.store.jobs import admin, enqueueing, outcomes
from synckit.store.tables import dead_letters
from synckit.store.tables import jobs as jobs_table

SYNCKIT = [sys.executable, "-m", "synckit.cli"]
APPS = Path(__file__).parent.parent / "apps"
T = TypeVar("T")


def synckit(
    *args: str, env: dict[str, str] | None = None, process: bool = False
) -> subprocess.CompletedProcess[str]:
    """``synckit ARGS`` in process (tests/inprocess.py), or as a process: the console
    entry's own acceptance, kept for one test per command family."""
    if not process:
        return run_cli(*args, env={"COLUMNS": "250", **(env or {})})
    full_env = {
        **os.environ,
        "COLUMNS": "250",
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    return subprocess.run(
        [*SYNCKIT, *args], capture_output=True, text=True, env=full_env, timeout=PROCESS_TIMEOUT
    )


def ok(*args: str, env: dict[str, str] | None = None, process: bool = False) -> str:
    result = synckit(*args, env=env, process=process)
    assert result.returncode == 0, result.stderr
    return result.stdout


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def with_db(url: str, make: Callable[[Database], Awaitable[T]]) -> T:
    async def go() -> T:
        db = open_database(url)
        try:
            return await make(db)
        finally:
            await db.dispose()

    return asyncio.run(go())


def seed(url: str) -> dict[str, int]:
    """A small realistic DLQ: due records of two tenants (one failing on replay, one of an
    unknown connector), a validation row in review, a dead job, and old closed rows."""
    now = datetime.now(UTC)

    async def go(db: Database) -> dict[str, int]:
        ids: dict[str, int] = {}

        async def cap(name: str, **kw: Any) -> None:
            args: dict[str, Any] = {
                "tenant": "acme",
                "connector": "mail",
                "kind": "record:messages",
                "record_id": name,
                "payload": {"id": name},
                "error_class": "transient",
                "message": f"{name} failed",
                "traceback": f"Traceback for {name}",
                "now": now - timedelta(minutes=5),
                **kw,
            }
            async with db.begin() as conn:
                ids[name] = (await dlq_capture.capture(conn, **args)).id

        await cap("a1")
        await cap("a2", payload={"id": "a2", "fail": "transient"})
        await cap("g1", tenant="globex", error_class="server_error")
        await cap("lost", tenant="globex", connector="unknown")
        await cap("bad", error_class="validation")
        await cap("old-resolved", tenant="globex", now=now - timedelta(days=60))
        await cap("old-ignored", tenant="globex", now=now - timedelta(days=60))
        await cap("new-resolved", tenant="globex")
        job = await enqueueing.enqueue(db, "sync_job", {"tenant": "acme"})
        async with db.begin() as conn:
            await conn.execute(
                update(jobs_table).where(jobs_table.c.id == job.id).values(status="dead")
            )
            await outcomes.dead_letter_job(
                conn,
                job_id=job.id,
                kind="sync_job",
                payload={"tenant": "acme"},
                resource_key=None,
                error_class="transient",
                message="job died",
                traceback=None,
                trace_id=None,
                attempts=5,
                now=now - timedelta(minutes=5),
            )
            ids["job"] = (
                (
                    await conn.execute(
                        dead_letters.select().where(dead_letters.c.record_id == f"job:{job.id}")
                    )
                )
                .one()
                .id
            )
            old = now - timedelta(days=60)
            await dlq_replay.mark_resolved(conn, [ids["old-resolved"]], now=old)
            await dlq_replay.mark_ignored(conn, [ids["old-ignored"]], "noise", now=old)
            await dlq_replay.mark_resolved(conn, [ids["new-resolved"]], now=now)
        ids["job_id"] = job.id
        return ids

    return with_db(url, go)


@sqlite_only
def test_ls_lists_filters_and_groups(migrated_url: str) -> None:
    """ls: newest first as JSON lines, filters combine, --group-by counts, a table by default."""
    ids = seed(migrated_url)
    every = lines(ok("dlq", "ls", "--json", "--database-url", migrated_url))
    assert len(every) == 9 and [r["id"] for r in every] == sorted(r["id"] for r in every)[::-1]
    acme_pending = lines(
        ok(
            "dlq",
            "ls",
            "--json",
            "--tenant",
            "acme",
            "--status",
            "pending",
            "--database-url",
            migrated_url,
        )
    )
    assert {r["record_id"] for r in acme_pending} == {"a1", "a2", f"job:{ids['job_id']}"}
    review = lines(
        ok("dlq", "ls", "--json", "--class", "validation", "--database-url", migrated_url)
    )
    assert [(r["record_id"], r["status"]) for r in review] == [("bad", "review")]
    records = lines(ok("dlq", "ls", "--json", "--kind", "record:*", "--database-url", migrated_url))
    assert len(records) == 8
    assert lines(ok("dlq", "ls", "--json", "--since", "1d", "--database-url", migrated_url))
    assert (
        len(lines(ok("dlq", "ls", "--json", "--limit", "2", "--database-url", migrated_url))) == 2
    )

    groups = lines(
        ok("dlq", "ls", "--group-by", "tenant,class", "--json", "--database-url", migrated_url)
    )
    assert {(g["tenant"], g["class"]): g["count"] for g in groups} == {
        ("acme", "transient"): 3,
        ("acme", "validation"): 1,
        ("globex", "transient"): 4,
        ("globex", "server_error"): 1,
    }
    table = ok("dlq", "ls", "--group-by", "tenant,class", "--database-url", migrated_url)
    assert "globex" in table and "9 rows in 4 groups" in table
    listing = ok("dlq", "ls", "--status", "review", "--database-url", migrated_url)
    assert "bad" in listing and "1 of 1 matching" in listing
    bad = synckit("dlq", "ls", "--group-by", "payload", "--database-url", migrated_url)
    assert bad.returncode == 2 and "choose among" in bad.stderr


def test_show_prints_payload_history_and_traceback(migrated_url: str) -> None:
    """show ID: the row's facts, payload, history and traceback; --json gives them all."""
    ids = seed(migrated_url)
    out = ok("dlq", "show", str(ids["a2"]), "--database-url", migrated_url, process=True)
    assert '"fail": "transient"' in out and "Traceback for a2" in out and "a2 failed" in out
    data = json.loads(ok("dlq", "show", str(ids["a2"]), "--json", "--database-url", migrated_url))
    assert data["payload"] == {"id": "a2", "fail": "transient"}
    assert data["history"][0]["source"] == "capture" and data["traceback"] == "Traceback for a2"
    missing = synckit("dlq", "show", "999999", "--database-url", migrated_url, process=True)
    assert missing.returncode == 2 and "no dead letter with id 999999" in missing.stderr


@sqlite_only
def test_replay_dry_run_changes_nothing(migrated_url: str) -> None:
    """--dry-run says, per plan and kind, what a replay would do, and writes nothing."""
    seed(migrated_url)
    before = ok("dlq", "ls", "--json", "--database-url", migrated_url)
    out = json.loads(
        ok("dlq", "replay", "--all", "--dry-run", "--json", "--database-url", migrated_url)
    )
    plans = {(p["plan"].split(" (")[0], p["kind"]): p["rows"] for p in out["plans"]}
    assert out["rows"] == 6
    assert plans[("re-run job", "sync_job")] == 1
    assert plans[("skip: needs --app", "record:messages")] == 5
    with_app = json.loads(
        ok(
            "dlq",
            "replay",
            "--all",
            "--dry-run",
            "--json",
            "--app",
            "dlq_app:app",
            "--database-url",
            migrated_url,
        )
    )
    assert {p["plan"] for p in with_app["plans"]} == {"replay", "re-run job"}
    table = ok("dlq", "replay", "--tenant", "acme", "--dry-run", "--database-url", migrated_url)
    assert "would be replayed" in table
    assert ok("dlq", "ls", "--json", "--database-url", migrated_url) == before


def test_replay_without_an_app_re_runs_jobs_and_leaves_records(migrated_url: str) -> None:
    """No --app: dead jobs go back to the queue (row resolved), record rows are reported as
    needing --app and left as they were."""
    ids = seed(migrated_url)
    out = json.loads(ok("dlq", "replay", "--all", "--json", "--database-url", migrated_url))
    assert out["resolved"] == 1 and out["skipped"] == 5
    assert any("needs --app" in r["reason"] for r in out["reasons"])
    row = with_db(migrated_url, lambda d: dlq_reads.get(d, ids["job"]))
    assert row.status == "resolved"
    job = with_db(migrated_url, lambda d: admin.get_job(d, ids["job_id"]))
    assert job.status == "pending"
    still = with_db(migrated_url, lambda d: dlq_reads.get(d, ids["a1"]))
    assert still.status == "pending" and still.replay_attempts == 0


def test_replay_with_the_app_by_ids_and_by_filter(migrated_url: str, tmp_path: Path) -> None:
    """--app: records replay through App.replay_record; a failure is rescheduled, an unknown
    connector is ignored, a validation row replays from review; the summary says so."""
    ids = seed(migrated_url)
    log = tmp_path / "app.log"
    env = {"DLQ_APP_LOG": str(log)}
    out = json.loads(
        ok(
            "dlq",
            "replay",
            str(ids["a1"]),
            "--json",
            "--app",
            "dlq_app:app",
            "--database-url",
            migrated_url,
            env=env,
        )
    )
    assert out["resolved"] == 1 and out["claimed"] == 1
    assert log.read_text().split()[:3] == ["acme", "record:messages", "a1"]
    table = ok(
        "dlq",
        "replay",
        "--status",
        "pending,review",
        "--app",
        "dlq_app:app",
        "--database-url",
        migrated_url,
        env={**env, "SYNCKIT_APP": ""},
    )
    assert "Replay of" in table and "retry" in table and "unknown connector" in table

    def row(name: str) -> dlq_rows.DeadLetter:
        return with_db(migrated_url, lambda d: dlq_reads.get(d, ids[name]))

    assert row("a2").status == "pending" and row("a2").replay_attempts == 1
    assert row("lost").status == "ignored" and "unknown" in (row("lost").status_reason or "")
    assert row("bad").status == "resolved" and row("g1").status == "resolved"
    assert row("job").status == "resolved"
    nothing = synckit("dlq", "replay", "--database-url", migrated_url)
    assert nothing.returncode == 2 and "--all" in nothing.stderr


@sqlite_only
def test_resolve_and_ignore_by_id_and_filter(migrated_url: str) -> None:
    """resolve/ignore change open rows by id or by filter and keep the reason."""
    ids = seed(migrated_url)
    assert (
        ok(
            "dlq",
            "resolve",
            str(ids["a1"]),
            "--reason",
            "fixed upstream",
            "--database-url",
            migrated_url,
        ).strip()
        == "1 dead letter resolved"
    )
    out = ok(
        "dlq",
        "ignore",
        "--tenant",
        "globex",
        "--reason",
        "tenant left",
        "--database-url",
        migrated_url,
    )
    assert out.strip() == "2 dead letters ignored"
    rows = {
        r["record_id"]: r for r in lines(ok("dlq", "ls", "--json", "--database-url", migrated_url))
    }
    assert rows["a1"]["status"] == "resolved" and rows["a1"]["status_reason"] == "fixed upstream"
    assert rows["g1"]["status_reason"] == "tenant left" and rows["lost"]["status"] == "ignored"
    assert rows["new-resolved"]["status"] == "resolved"  # closed rows are not re-ignored


@sqlite_only
def test_purge_deletes_old_resolved_and_ignored_only(migrated_url: str) -> None:
    """purge --older-than 30d removes the two 60-day-old closed rows and nothing else."""
    seed(migrated_url)
    out = ok("dlq", "purge", "--older-than", "30d", "--database-url", migrated_url)
    assert out.strip() == "2 resolved or ignored dead letters purged"
    left = {
        r["record_id"] for r in lines(ok("dlq", "ls", "--json", "--database-url", migrated_url))
    }
    assert "old-resolved" not in left and "old-ignored" not in left
    assert {"a1", "bad", "new-resolved"} <= left and len(left) == 7


@sqlite_only
def test_export_writes_json_lines(migrated_url: str, tmp_path: Path) -> None:
    """export: every matching row with payload, history and traceback, to stdout or a file."""
    seed(migrated_url)
    rows = lines(ok("dlq", "export", "--tenant", "acme", "--database-url", migrated_url))
    assert len(rows) == 4 and {"payload", "history", "traceback"} <= set(rows[0])
    target = tmp_path / "dlq.jsonl"
    result = synckit("dlq", "export", "-o", str(target), "--database-url", migrated_url)
    assert result.returncode == 0 and "9 dead letters written" in result.stderr
    assert len(lines(target.read_text())) == 9


def test_ls_and_export_stream_five_thousand_rows(migrated_url: str, tmp_path: Path) -> None:
    """ls --json and export walk 5,000 rows page by page (five pages of the store's
    1,000) and print every one."""
    now = datetime.now(UTC)

    async def fill(db: Database) -> None:
        async with db.begin() as conn:
            for start in range(0, 5_000, 1000):
                await conn.execute(
                    dead_letters.insert(),
                    [
                        {
                            "tenant": f"t{i % 7}",
                            "connector": "mail",
                            "kind": "record:messages",
                            "record_id": f"r{i}",
                            "payload": {"id": i, "body": "x" * 50},
                            "error_class": "transient",
                            "error_message": "x",
                            "status": "resolved" if i % 2 else "pending",
                            "first_failed_at": now,
                            "last_attempt_at": now,
                            "next_retry_at": now,
                        }
                        for i in range(start, start + 1000)
                    ],
                )

    with_db(migrated_url, fill)
    out = ok("dlq", "ls", "--json", "--database-url", migrated_url)
    assert out.count("\n") == 5_000
    target = tmp_path / "all.jsonl"
    synckit("dlq", "export", "-o", str(target), "--database-url", migrated_url)
    exported = target.read_text().splitlines()
    assert len(exported) == 5_000
    assert len({json.loads(line)["id"] for line in exported}) == 5_000
    pending = ok("dlq", "export", "--status", "pending", "--database-url", migrated_url)
    assert pending.count("\n") == 2_500


@sqlite_only
def test_ls_pages_by_before_with_a_next_page_hint(migrated_url: str) -> None:
    """ls --limit N says `next page: --before ID` (stderr with --json, the caption in a
    table) only when more rows follow; --before ID walks on, with filters too, and the
    pages chain to the whole listing without a gap or a repeat."""
    seed(migrated_url)
    db = ["--database-url", migrated_url]
    every = [r["id"] for r in lines(ok("dlq", "ls", "--json", *db))]
    assert len(every) == 9
    pages: list[list[int]] = []
    before: list[str] = []
    while True:
        result = synckit("dlq", "ls", "--json", "--limit", "4", *before, *db)
        assert result.returncode == 0, result.stderr
        pages.append([r["id"] for r in lines(result.stdout)])
        if not result.stderr:
            break
        assert result.stderr == f"next page: --before {pages[-1][-1]}\n"
        before = ["--before", str(pages[-1][-1])]
    assert pages == [every[:4], every[4:8], every[8:]]
    exact = synckit("dlq", "ls", "--json", "--limit", "9", *db)
    assert len(lines(exact.stdout)) == 9 and exact.stderr == ""  # nothing follows: no hint
    first = ok("dlq", "ls", "--limit", "4", *db)
    assert f"4 of 9 matching (tries: failures/replays); next page: --before {every[3]}" in first
    last = ok("dlq", "ls", "--limit", "4", "--before", str(every[7]), *db)
    assert "1 of 9 matching" in last and "next page" not in last
    globex = [r["id"] for r in lines(ok("dlq", "ls", "--json", "--tenant", "globex", *db))]
    older = ok("dlq", "ls", "--json", "--tenant", "globex", "--before", str(globex[1]), *db)
    assert [r["id"] for r in lines(older)] == globex[2:]
