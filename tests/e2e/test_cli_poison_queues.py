"""Corrupt rows against `dlq ls|show|export`, `outbox ls` and `breakers ls`, as
subprocesses on both engines: exit 0, no traceback, what cannot be read shown as such.

(Timestamps no datetime holds and JSON numbers past Python's digit limit in these
tables still fail these commands: their reads live in dlq/store.py, outbox.py and
resources.py.)"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sqlalchemy import insert
from test_cli_poison import run_all, seed_tenants, with_db  # the sibling module: one helper

from synckit.runtime.db import Database
from synckit.runtime.schema import dead_letters, outbox

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
#: SQLite keeps any text in a JSON column; JSONB only JSON (a top-level array here: a
#: number past Python's digit limit, the one JSONB value no reader takes, still fails
#: the DLQ's reads, and so does a JSON string, read as text that does not parse).
NOT_JSON = {"sqlite": "'{not json'", "postgresql": "'[1, 2]'::jsonb"}
JUNK_HISTORY = {
    "sqlite": '\'[1, "x", {"at": [1]}]\'',
    "postgresql": '\'[1, "x", {"at": [1]}]\'::jsonb',
}


def seed(url: str, engine_name: str) -> None:
    """Dead letters 1-4 (1: payload not JSON on SQLite, 2: history of junk, 3: a status nobody
    writes, 4: sound), outbox messages 1-2 (1: a status nobody writes), and on SQLite,
    where a timestamp column takes any text, acme's breaker times are 'garbage'."""

    async def go(db: Database) -> None:
        await seed_tenants(db)
        async with db.begin() as conn:
            for i in range(1, 5):
                await conn.execute(
                    insert(dead_letters).values(
                        tenant="acme",
                        connector="demo",
                        kind="record:items",
                        record_id=f"r{i}",
                        payload={"id": i},
                        error_class="validation",
                        error_message="Invalid path [/v1/users]",
                        history=[{"at": NOW.isoformat(), "message": "m"}],
                        status="pending",
                        first_failed_at=NOW,
                        last_attempt_at=NOW,
                        next_retry_at=NOW,
                    )
                )
            for i in range(1, 3):
                await conn.execute(
                    insert(outbox).values(
                        topic="t",
                        key="k",
                        payload={"p": i},
                        message_id=f"m{i}",
                        status="pending",
                        next_attempt_at=NOW,
                        created_at=NOW,
                    )
                )
            await conn.exec_driver_sql(
                f"UPDATE dead_letters SET payload = {NOT_JSON[engine_name]} WHERE id = 1"
            )
            await conn.exec_driver_sql(
                f"UPDATE dead_letters SET history = {JUNK_HISTORY[engine_name]} WHERE id = 2"
            )
            await conn.exec_driver_sql("UPDATE dead_letters SET status = 'zombie' WHERE id = 3")
            await conn.exec_driver_sql("UPDATE outbox SET status = 'zombie' WHERE id = 1")
            if engine_name == "sqlite":
                await conn.exec_driver_sql(
                    "UPDATE resources SET cooldown_until = 'garbage', opened_at = 'garbage',"
                    " updated_at = 'garbage' WHERE resource_key = 'demo:acme'"
                )

    with_db(url, go)


def test_dlq_commands_read_corrupt_dead_letters(migrated_url: str, engine_name: str) -> None:
    """dlq ls (table, --json, --group-by), show (table, --json) of each row and export:
    exit 0; the payload that does not parse is named (payload_error), junk history
    entries are left out, an unknown status is listed as stored."""
    seed(migrated_url, engine_name)
    db = ["--database-url", migrated_url]
    results = run_all(
        [
            ["dlq", "ls", *db],
            ["dlq", "ls", "--json", *db],
            ["dlq", "ls", "--group-by", "status", "--json", *db],
            ["dlq", "export", *db],
            *(["dlq", "show", str(i), *db] for i in range(1, 5)),
            *(["dlq", "show", str(i), "--json", *db] for i in range(1, 5)),
        ]
    )
    for r in results:
        assert r.returncode == 0 and "Traceback" not in r.stderr, (r.args, r.stderr)
    table, listed, groups, exported, *shows = (r.stdout for r in results)
    rows = {d["id"]: d for d in map(json.loads, listed.splitlines())}
    assert sorted(rows) == [1, 2, 3, 4] and rows[3]["status"] == "zombie"
    if engine_name == "sqlite":
        assert rows[1]["payload"] is None and rows[1]["payload_error"].startswith("JSONDecodeError")
        assert "does not parse" in shows[0]
    else:
        assert rows[1]["payload"] == [1, 2]
    assert rows[2]["history"] == [{"at": [1]}] and rows[4]["payload"] == {"id": 4}
    assert {g["status"]: g["count"] for g in map(json.loads, groups.splitlines())} == {
        "pending": 3,
        "zombie": 1,
    }
    assert [json.loads(line)["id"] for line in exported.splitlines()] == [1, 2, 3, 4]
    assert "Invalid path [/v1/users]" in table and "zombie" in table
    assert [json.loads(s)["id"] for s in shows[4:]] == [1, 2, 3, 4]


def test_outbox_and_breakers_ls_read_corrupt_rows(migrated_url: str, engine_name: str) -> None:
    """outbox ls (table, --json) with a status nobody writes, and breakers ls (table,
    --json) with times that are not timestamps (SQLite): exit 0, shown as stored or
    <unreadable>."""
    seed(migrated_url, engine_name)
    db = ["--database-url", migrated_url]
    results = run_all(
        [
            ["outbox", "ls", *db],
            ["outbox", "ls", "--json", *db],
            ["breakers", "ls", *db],
            ["breakers", "ls", "--json", *db],
        ]
    )
    for r in results:
        assert r.returncode == 0 and "Traceback" not in r.stderr, (r.args, r.stderr)
    o_table, o_json, b_table, b_json = (r.stdout for r in results)
    messages = {m["id"]: m for m in json.loads(o_json)}
    assert messages[1]["status"] == "zombie" and messages[2]["payload"] == {"p": 2}
    assert "zombie" in o_table
    breakers = {d["resource_key"]: d for d in map(json.loads, b_json.splitlines())}
    if engine_name == "sqlite":
        assert set(breakers["demo:acme"]["unreadable"]) == {"cooldown_until", "opened_at"}
        assert breakers["demo:acme"]["cooldown_until"] is None
        assert "<unreadable>" in b_table
    assert "unreadable" not in breakers["demo:globex"]
