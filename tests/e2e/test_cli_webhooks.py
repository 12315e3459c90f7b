"""`synckit webhooks ls | show | replay` on both engines, run in the test's process
(tests/inprocess.py): what they print and store, exit codes and one-line errors
included, is the same as a process's; a Python start-up per command is not."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta

from inprocess import run_cli  # tests/
from sqlalchemy import Connection, select

from synckit.clock import utcnow
from synckit.runtime.sync.webhooks import process_job_spec
from synckit.store import leases
from synckit.store import webhooks as inbox
from synckit.store.db import Database
from synckit.store.tables import jobs


def synckit(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"COLUMNS": "200"})


async def seed(db: Database) -> None:
    now = utcnow()

    def tx(conn: Connection) -> None:
        events = [("evt_1", b'{"id": "evt_1", "note": "[red]markup[/red]"}'), ("evt_2", b"{}")]
        inbox.store_events(
            conn, connector="stripe", tenant="acme", events=events, headers={"a": "b"}, now=now
        )
        inbox.store_events(
            conn, connector="stripe", tenant="acme", events=events[:1], headers={}, now=now
        )
        inbox.store_events(
            conn,
            connector="stripe",
            tenant="",
            events=[("evt_9", b"{}")],
            headers={},
            now=now,
            orphan_of="acct_x",
        )
        for _ in range(3):
            inbox.count_refusal(conn, connector="stripe", tenant="acme", reason="bad", now=now)

    await db.write(tx)


async def test_ls_counts_each_outcome_per_tenant(db: Database, migrated_url: str) -> None:
    await seed(db)
    out = synckit("webhooks", "ls", "--json", "--database-url", migrated_url)
    assert out.returncode == 0, out.stderr
    rows = {(r["connector"], r["tenant"]): r for r in json.loads(out.stdout)}
    acme = rows[("stripe", "acme")]
    assert (acme["received"], acme["duplicates"], acme["refused"], acme["pending"]) == (2, 1, 3, 2)
    assert rows[("stripe", None)]["orphaned"] == 1
    table = synckit("webhooks", "ls", "--database-url", migrated_url)
    assert table.returncode == 0 and "acme" in table.stdout


async def test_show_prints_an_event_with_its_body_as_text(db: Database, migrated_url: str) -> None:
    await seed(db)
    first = (await db.run_read(inbox.recent_events))[-1]
    out = synckit("webhooks", "show", str(first.id), "--database-url", migrated_url)
    assert out.returncode == 0, out.stderr
    assert "evt_1" in out.stdout and "[red]markup[/red]" in out.stdout
    shown = json.loads(
        synckit("webhooks", "show", str(first.id), "--json", "--database-url", migrated_url).stdout
    )
    assert shown["event_id"] == "evt_1" and shown["headers"] == {"a": "b"}
    missing = synckit("webhooks", "show", "999999", "--database-url", migrated_url)
    assert missing.returncode != 0 and "no webhook event 999999" in missing.stderr
    assert "Traceback" not in missing.stderr


async def test_replay_puts_a_processed_event_back_with_its_job(
    db: Database, migrated_url: str
) -> None:
    await seed(db)
    first = (await db.run_read(inbox.recent_events))[-1]
    now = utcnow()

    def process(conn: Connection) -> None:
        lease = leases.new_lease(timedelta(minutes=1), now=now)
        rows = inbox.claim_pending(
            conn, connector="stripe", tenant="acme", lease=lease, now=now, limit=10
        )
        inbox.finish_events(conn, [r.id for r in rows], lease.token, now)
        conn.execute(jobs.delete())

    await db.write(process)
    out = synckit("webhooks", "replay", str(first.id), "--database-url", migrated_url)
    assert out.returncode == 0, out.stderr
    row = await db.run_read(inbox.event_row, first.id)
    assert row is not None and row.status == "pending"
    async with db.read() as conn:
        keys = [k for (k,) in await conn.execute(select(jobs.c.unique_key))]
    assert keys == [process_job_spec("stripe", "acme").unique_key]
