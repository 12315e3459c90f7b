"""Terminal escapes stored in rows never reach the terminal: every read command, on both
engines, prints them escaped (``\\x1b``); ``--json`` keeps the text. The commands run in
process (tests/inprocess.py); one runs as a process too, for the bytes a terminal gets.
And a schedule past the calendar is one error line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from inprocess import run_cli  # tests/
from sqlalchemy import insert, update

from synckit.store.db import open_database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.jobs import enqueueing
from synckit.store.resources import configure_resource
from synckit.store.tables import alerts, connections, outbox, resources
from synckit.store.tables import jobs as jobs_table

SYNCKIT = [sys.executable, "-m", "synckit.cli"]
APPS = Path(__file__).parent.parent / "apps"

# Set the window title, clear the screen, a C1 CSI, a bidi override, a carriage return
# and a bell: each acts on a terminal when printed raw.
HOSTILE = "boom \x1b]0;pwned\x07 \x1b[2J\x9b31m \u202eevil\r over"
RAW = ("\x1b", "\x9b", "\u202e", "\r", "\x07")


def synckit(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "COLUMNS": "400",
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
    }
    # Bytes, decoded here: text mode would read a raw carriage return as a line end.
    raw = subprocess.run([*SYNCKIT, *args], capture_output=True, env=env, timeout=120)
    return subprocess.CompletedProcess(
        raw.args, raw.returncode, raw.stdout.decode(), raw.stderr.decode()
    )


async def _seed(url: str) -> dict[str, int]:
    now = datetime.now(UTC)
    db = open_database(url)
    try:
        async with db.begin() as conn:
            await conn.execute(
                insert(connections).values(
                    tenant="acme",
                    connector="graph",
                    resource_key="graph:acme",
                    schedule="every 5m",
                    status="paused",
                    status_reason=HOSTILE,
                    config={"note": HOSTILE},
                    created_at=now,
                    updated_at=now,
                )
            )
            got = await dlq_capture.capture(
                conn,
                tenant="acme",
                connector="graph",
                kind="record:users",
                record_id="u1",
                payload={"note": HOSTILE},
                error_class="validation",
                message=HOSTILE,
                traceback=f"Traceback\n  {HOSTILE}\nValueError: {HOSTILE}",
                now=now,
            )
            await conn.execute(
                insert(outbox).values(
                    topic="orders",
                    key="k1",
                    payload={"note": HOSTILE},
                    message_id="m-1",
                    attempts=3,
                    last_error=HOSTILE,
                    status="failed",
                    next_attempt_at=now,
                    created_at=now,
                )
            )
            await conn.execute(
                insert(alerts).values(
                    dedupe_key="x:acme:1",
                    rule="needs_reauth",
                    subject="acme",
                    window_key="1",
                    severity="warning",
                    tenant="acme",
                    connector="graph",
                    message=HOSTILE,
                    fired_at=now - timedelta(minutes=1),
                    recorded_at=now - timedelta(minutes=1),
                    delivered={},
                )
            )
        job = await enqueueing.enqueue(db, "sync.things", {"note": HOSTILE}, resource_key="r1")
        async with db.begin() as conn:
            await conn.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job.id)
                .values(last_error=HOSTILE, errors=[{"message": HOSTILE}])
            )
        await configure_resource(db, "graph:acme")
        async with db.begin() as conn:
            await conn.execute(
                update(resources)
                .where(resources.c.resource_key == "graph:acme")
                .values(last_error=HOSTILE)
            )
        return {"job": job.id, "dl": got.id}
    finally:
        await db.dispose()


def test_every_read_command_prints_stored_escapes_escaped(migrated_url: str) -> None:
    """An error text holding ESC ]0; (set title), ESC [2J (clear screen), a C1 CSI, a bidi
    override and a carriage return comes out of every read command as visible escapes
    (``\\x1b``), never raw; with --json it is the same text as a JSON string."""
    ids = _run(_seed(migrated_url))
    db = ("--database-url", migrated_url)
    shown = {
        "jobs ls": ["jobs", "ls"],
        "jobs show": ["jobs", "show", str(ids["job"])],
        "dlq ls": ["dlq", "ls"],
        "dlq show": ["dlq", "show", str(ids["dl"])],
        "tenants ls": ["tenants", "ls"],
        "tenants show": ["tenants", "show", "acme"],
        "status": ["status"],
        "outbox ls": ["outbox", "ls"],
        "breakers ls": ["breakers", "ls"],
    }
    as_json = {
        "jobs ls --json": ["jobs", "ls", "--json"],
        "dlq ls --json": ["dlq", "ls", "--json"],
        "dlq show --json": ["dlq", "show", str(ids["dl"]), "--json"],
        "dlq export": ["dlq", "export"],
        "tenants ls --json": ["tenants", "ls", "--json"],
        "status --json": ["status", "--json"],
        "outbox ls --json": ["outbox", "ls", "--json"],
        "breakers ls --json": ["breakers", "ls", "--json"],
    }
    outputs = {}
    for name, args in {**shown, **as_json}.items():
        result = run_cli(*args, *db, env={"COLUMNS": "400"})
        assert result.returncode == 0, (name, result.stderr)
        out = result.stdout + result.stderr
        assert not [c for c in RAW if c in out], (name, out)
        outputs[name] = result.stdout
    for name in shown:
        # The JSON views (jobs show, tenants show) escape as JSON does: \u001b.
        assert "\\x1b]0;pwned" in outputs[name] or "\\u001b]0;pwned" in outputs[name], name
    assert "\\u202eevil\\r over" in outputs["dlq show"]  # the traceback view escapes too
    # JSON keeps the text itself, as a JSON string.
    assert json.loads(outputs["jobs ls --json"])["last_error"] == HOSTILE
    assert json.loads(outputs["dlq show --json"])["error_message"] == HOSTILE
    assert json.loads(outputs["dlq export"])["payload"]["note"] == HOSTILE
    assert json.loads(outputs["tenants ls --json"])["status_reason"] == HOSTILE
    breakers = [json.loads(line) for line in outputs["breakers ls --json"].splitlines()]
    assert {b["resource_key"]: b["last_error"] for b in breakers}["graph:acme"] == HOSTILE
    assert json.loads(outputs["outbox ls --json"])[0]["last_error"] == HOSTILE
    status = json.loads(outputs["status --json"])
    assert [a["message"] for a in status["alerts_recent"]] == [HOSTILE]
    # The bytes a terminal gets from a real process: escaped the same way.
    process = synckit("status", *db)
    assert process.returncode == 0, process.stderr
    assert not [c for c in RAW if c in process.stdout + process.stderr], process.stdout
    assert "\\x1b]0;pwned" in process.stdout


def test_a_schedule_past_the_calendar_is_one_error_line(migrated_url: str) -> None:
    """`tenants add ... --schedule "every 99999999999999d"` was an OverflowError traceback."""
    for schedule, says in (
        ("every 99999999999999d", "at most 366d"),
        ("0 0 31 2 *", "never fires"),
    ):
        result = run_cli(
            "tenants", "add", "t1", "demo", "--set", "api_token=x",
            "--schedule", schedule, "--app", "connector_app:app",
            "--database-url", migrated_url,
        )  # fmt: skip
        assert result.returncode == 2, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert says in lines[0] and "Traceback" not in result.stderr


def _run(coro: object) -> dict[str, int]:
    return asyncio.run(coro)  # type: ignore[arg-type]
