"""Audit buckets that cannot be read, on SQLite and PostgreSQL: the reports that read them
(the alert rules' data, hence `synckit status`) pass over the bad value, not fail."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from audit_rows import record_audit  # tests/
from sqlalchemy import text

from synckit.store.audit import read_audit, totals_by_version
from synckit.store.db import Database

NOW = datetime(2026, 3, 4, 12, 4, tzinfo=UTC)
#: A timestamp no reader takes: SQLite keeps any text, PostgreSQL a year no datetime holds.
BAD_TIME = {"sqlite": "'garbage'", "postgresql": "'20000-01-01'::timestamptz"}
#: JSON no reader takes: SQLite keeps any text; JSONB holds only JSON, but a number of
#: 5,000 digits is past what Python's json reads.
BAD_JSON = {
    "sqlite": "'{not json'",
    "postgresql": """('{"server_error": 1' || repeat('0', 5000) || '}')::jsonb""",
}
ARRAY = {"sqlite": "'[1, 2]'", "postgresql": "'[1, 2]'::jsonb"}


async def seed(db: Database, corrupt: dict[str, str]) -> None:
    """One bucket per tenant in ``corrupt`` (version v1, 10 ok, 1 server_error, 2 min
    ago), then that tenant's SET clause (``{time}``, ``{json}``, ``{array}``) applied."""
    engine = "postgresql" if db.is_postgres else "sqlite"
    async with db.begin() as conn:
        for tenant in corrupt:
            at = NOW - timedelta(minutes=2)
            await record_audit(conn, tenant, "graph", at, 10, {"server_error": 1}, app_version="v1")
        for tenant, sets in corrupt.items():
            if sets:
                sql = sets.format(time=BAD_TIME[engine], json=BAD_JSON[engine], array=ARRAY[engine])
                await conn.execute(
                    text(f"UPDATE audit_buckets SET {sql} WHERE tenant = :t"), {"t": tenant}
                )


async def test_read_audit_passes_over_a_bucket_that_cannot_be_read(db: Database) -> None:
    """A bucket whose minute or class counts cannot be read counts for nothing; a JSON
    array for the counts reads as no classes; the sound buckets read as written."""
    await seed(
        db,
        {
            "acme": "",
            "globex": "failed_by_class = {json}",
            "hooli": "minute = {time}",
            "umbrella": "failed_by_class = {array}",
        },
    )
    async with db.begin() as conn:
        got = await read_audit(conn, since=NOW - timedelta(hours=1))
        failing = await read_audit(conn, since=NOW - timedelta(hours=1), only_failures=True)
    assert [(r.tenant, r.ok, r.failed, r.failed_by_class) for r in got] == [
        ("acme", 10, 1, {"server_error": 1}),
        ("umbrella", 10, 1, {}),
    ]
    assert [r.tenant for r in failing] == ["acme", "umbrella"]
    assert got[0].minute == NOW - timedelta(minutes=2)


async def test_totals_by_version_first_seen_passes_over_unreadable_minutes(
    db: Database,
) -> None:
    """A version's first_seen is its earliest readable minute; with none, the window's
    start (never the newest deploy); counts are summed over every bucket."""
    await seed(db, {"acme": "", "globex": "minute = {time}"})
    async with db.begin() as conn:
        await record_audit(conn, "hooli", "graph", NOW, 7, {}, app_version="v2")
        await conn.execute(
            text(f"UPDATE audit_buckets SET minute = {BAD_TIME[db.dialect]} WHERE tenant = 'hooli'")
        )
        since = NOW - timedelta(hours=1)
        totals = {t.app_version: t for t in await totals_by_version(conn, since=since)}
    assert totals["v1"].first_seen == NOW - timedelta(minutes=2)
    assert (totals["v1"].ok, totals["v1"].failed) == (20, 2)
    assert totals["v1"].attempts_by_class == {"server_error": 1}  # globex's bucket unread
    assert totals["v2"].first_seen == since and totals["v2"].ok == 7
