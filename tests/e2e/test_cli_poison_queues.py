"""Corrupt rows against `dlq ls|show|export`, `outbox ls` and `breakers ls`, in process
(tests/inprocess.py) on both engines: exit 0, no traceback, what cannot be read shown as such
(null in JSON and named with a one-line reason, ``<unreadable>`` in tables).

(Breaker times no datetime holds on PostgreSQL still fail `breakers ls`: its read lives in
resources.py.)"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sqlalchemy import insert
from test_cli_poison import (  # the sibling module: one helper, one set of corrupt values
    BAD_JSON,
    BAD_TIME,
    run_all,
    seed_tenants,
    with_db,
)

from synckit.store.db import Database
from synckit.store.tables import dead_letters, outbox

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
#: SQLite keeps any text in a JSON column; JSONB only JSON (a top-level array here).
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


def seed_rows(url: str, engine_name: str, dead: list[str], messages: list[str]) -> None:
    """Dead letters 1..len(dead) and outbox messages 1..len(messages), all sound, then each
    one's SET clause of ``dead`` / ``messages`` applied to it (``{time}`` and ``{json}``
    standing for this engine's corrupt values; an empty clause leaves the row sound)."""

    async def go(db: Database) -> None:
        async with db.begin() as conn:
            for i in range(1, len(dead) + 1):
                await conn.execute(
                    insert(dead_letters).values(
                        tenant="acme",
                        connector="demo",
                        kind="record:items",
                        record_id=f"r{i}",
                        payload={"id": i},
                        error_class="validation",
                        error_message="bad",
                        history=[{"at": NOW.isoformat(), "message": "m"}],
                        status="pending",
                        first_failed_at=NOW,
                        last_attempt_at=NOW,
                        next_retry_at=NOW,
                    )
                )
            for i in range(1, len(messages) + 1):
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
            bad = {"time": BAD_TIME[engine_name], "json": BAD_JSON[engine_name]}
            for table, sets in (("dead_letters", dead), ("outbox", messages)):
                for i, clause in enumerate(sets, 1):
                    if clause:
                        sql = f"UPDATE {table} SET {clause.format(**bad)} WHERE id = {i}"
                        await conn.exec_driver_sql(sql)

    with_db(url, go)


OUT = "a timestamp out of range"


def test_dlq_commands_name_times_and_json_that_cannot_be_read(
    migrated_url: str, engine_name: str
) -> None:
    """dlq ls (table, --json), show (table, --json) of each row and export, on each of the
    four timestamps holding a value no datetime holds ('garbage' in SQLite, year 20000 in
    PostgreSQL) and a payload and history no JSON reader takes (a 5,000-digit number in
    JSONB): exit 0; the value null, named with its reason; the sound row as it is."""
    seed_rows(
        migrated_url,
        engine_name,
        dead=[
            "first_failed_at = {time}",
            "last_attempt_at = {time}",
            "next_retry_at = {time}",
            "resolved_at = {time}, status = 'resolved'",
            "payload = {json}, history = {json}",
            "",
        ],
        messages=[],
    )
    db = ["--database-url", migrated_url]
    results = run_all(
        [
            ["dlq", "ls", *db],
            ["dlq", "ls", "--json", *db],
            ["dlq", "export", *db],
            *(["dlq", "show", str(i), *db] for i in range(1, 7)),
            *(["dlq", "show", str(i), "--json", *db] for i in range(1, 7)),
        ]
    )
    for r in results:
        assert r.returncode == 0 and "Traceback" not in r.stderr, (r.args, r.stderr)
    table, listed, exported, *shows = (r.stdout for r in results)
    expected = {
        1: {"first_failed_at": OUT},
        2: {"last_attempt_at": OUT},
        3: {"next_retry_at": OUT},
        4: {"resolved_at": OUT},
    }
    as_json = [json.loads(s) for s in shows[6:]]
    for rows in (
        {d["id"]: d for d in map(json.loads, listed.splitlines())},
        {d["id"]: d for d in map(json.loads, exported.splitlines())},
        {d["id"]: d for d in as_json},
    ):
        assert sorted(rows) == [1, 2, 3, 4, 5, 6]
        for i, bad in expected.items():
            assert rows[i]["unreadable"] == bad, (i, rows[i])
            assert all(rows[i][column] is None for column in bad)
            assert rows[i]["payload"] == {"id": i}
        five = rows[5]
        assert five["payload"] is None and five["history"] == []
        assert set(five["unreadable"]) == {"payload", "history"}
        assert five["unreadable"]["payload"] == five["payload_error"]
        assert "\n" not in five["unreadable"]["history"] + five["payload_error"]
        assert "unreadable" not in rows[6] and rows[6]["first_failed_at"] == NOW.isoformat()
    if engine_name == "postgresql":
        assert "4300 digits" in as_json[4]["payload_error"]
    assert "<unreadable>" in table  # rows 2 and 3, in the last failure and next retry columns
    for i, bad in expected.items():
        [(column, why)] = bad.items()
        assert f"unreadable in dead letter {i}: {column} ({why})" in table
        assert f"<unreadable: {why}>" in shows[i - 1]
    assert "unreadable in dead letter 5: history (" in table and ", payload (" in table
    assert "history unreadable: " in shows[4] and "does not parse: " in shows[4]
    assert "unreadable" not in shows[5] and NOW.isoformat(timespec="seconds") in shows[5]


def test_outbox_ls_names_times_and_payloads_that_cannot_be_read(
    migrated_url: str, engine_name: str
) -> None:
    """outbox ls (table, --json) on a next_attempt_at, a created_at and a published_at no
    datetime holds and a payload no JSON reader takes: exit 0; the value null, named with
    its reason; ``<unreadable>`` where the table shows that time; the sound row as it is."""
    seed_rows(
        migrated_url,
        engine_name,
        dead=[],
        messages=[
            "next_attempt_at = {time}",
            "created_at = {time}",
            "published_at = {time}, status = 'published'",
            "payload = {json}",
            "",
        ],
    )
    db = ["--database-url", migrated_url]
    results = run_all([["outbox", "ls", *db], ["outbox", "ls", "--json", *db]])
    for r in results:
        assert r.returncode == 0 and "Traceback" not in r.stderr, (r.args, r.stderr)
    table, listed = (r.stdout for r in results)
    messages = {m["id"]: m for m in json.loads(listed)}
    assert sorted(messages) == [1, 2, 3, 4, 5]
    for i, column in ((1, "next_attempt_at"), (2, "created_at"), (3, "published_at")):
        assert messages[i]["unreadable"] == {column: OUT} and messages[i][column] is None
        assert messages[i]["payload"] == {"p": i}
        assert f"unreadable in message {i}: {column} ({OUT})" in table
    assert messages[4]["payload"] is None
    assert messages[4]["unreadable"]["payload"].startswith("payload is not JSON")
    assert "unreadable" not in messages[5] and messages[5]["payload"] == {"p": 5}
    # The table's "when" is next_attempt_at for 1 and 2 (pending), published_at for 3.
    assert table.count("<unreadable>") == 2
