"""The schema and its migrations on both engines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, insert, inspect, select

from synckit.store import migrate
from synckit.store.db import Database, open_database
from synckit.store.tables import checkpoints, jobs, metadata

TABLES = {
    "alerts",
    "jobs",
    "dead_letters",
    "checkpoints",
    "resources",
    "intents",
    "connections",
    "outbox",
    "record_tables",
    "audit_buckets",
    "cron_ticks",
    "pending_authorizations",
    "poll_ticks",
    "workers",
    "queue_samples",
    "webhook_events",
    "webhook_refusals",
    "webhook_triggers",
    "webhook_subscriptions",
}


async def _tables(d: Database) -> set[str]:
    async with d.begin() as conn:
        names = await conn.run_sync(lambda c: inspect(c).get_table_names())
    return set(names) - {"alembic_version"}


async def test_migrations_match_table_definitions(db: Database) -> None:
    """Autogenerate finds no difference between the migrated schema and schema.py."""
    async with db.begin() as conn:
        diff = await conn.run_sync(
            lambda c: compare_metadata(
                MigrationContext.configure(c, opts={"compare_type": True}), metadata
            )
        )
    assert diff == []


async def test_upgrade_downgrade_upgrade_round_trip(db_url: str) -> None:
    """upgrade creates every table, downgrade base removes them, a second upgrade is a no-op."""
    d = open_database(db_url)
    try:
        assert await migrate.current(d) is None
        await migrate.upgrade(d)
        assert await _tables(d) == TABLES
        assert await migrate.current(d) == migrate.head_revision()
        await migrate.upgrade(d)
        assert await migrate.current(d) == migrate.head_revision()
        await migrate.downgrade(d, "base")
        assert await _tables(d) == set()
        assert await migrate.current(d) is None
    finally:
        await d.dispose()


async def test_timestamps_come_back_timezone_aware_utc(db: Database) -> None:
    """A timestamp written in any zone reads back as the same instant, tz-aware UTC."""
    plus_two = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))
    async with db.begin() as conn:
        await conn.execute(
            insert(checkpoints).values(
                tenant="t", connector="c", stream="s", cursor={"a": [1, "x"]}, updated_at=plus_two
            )
        )
    async with db.begin() as conn:
        row = (await conn.execute(select(checkpoints))).one()
    assert row.updated_at == plus_two
    assert row.updated_at.tzinfo is not None
    assert row.updated_at.utcoffset() == timedelta(0)
    assert row.cursor == {"a": [1, "x"]}


async def test_naive_datetime_is_refused(db: Database) -> None:
    """A naive datetime is refused rather than guessed at."""
    with pytest.raises(Exception, match="naive datetime"):
        async with db.begin() as conn:
            await conn.execute(
                insert(checkpoints).values(
                    tenant="t", connector="c", stream="s", updated_at=datetime(2026, 1, 1)
                )
            )


async def test_timestamp_order_in_sql_is_time_order(db: Database) -> None:
    """SQL comparisons on timestamps order by instant, across zones and microseconds."""
    base = datetime(2026, 1, 1, tzinfo=UTC)
    stamps = [base + timedelta(microseconds=i * 999_999) for i in range(20)]
    async with db.begin() as conn:
        for i, ts in enumerate(stamps):
            await conn.execute(
                insert(jobs).values(
                    kind="k",
                    payload={},
                    status="pending",
                    run_at=ts,
                    created_at=ts,
                    updated_at=ts,
                    priority=i,
                )
            )
        due = (
            await conn.execute(
                select(func.count()).select_from(jobs).where(jobs.c.run_at <= stamps[9])
            )
        ).scalar_one()
    assert due == 10


async def test_sqlite_connections_carry_pragmas(db: Database) -> None:
    """Every SQLite connection runs WAL, busy_timeout, foreign keys and synchronous=NORMAL."""
    if db.dialect != "sqlite":
        pytest.skip("SQLite pragmas")
    async with db.begin() as conn:
        mode = (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar()
        busy = (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar()
        fks = (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar()
        sync = (await conn.exec_driver_sql("PRAGMA synchronous")).scalar()
    assert (mode, fks, sync) == ("wal", 1, 1)
    assert busy is not None and int(busy) >= 1000


async def test_every_partial_index_has_its_predicate_on_the_engine(db: Database) -> None:
    """The tables state each partial index's predicate once (``sqlite_where``, so that
    defining them imports no PostgreSQL dialect); opening a PostgreSQL database gives
    PostgreSQL the same predicate. Each index's DDL, compiled for the engine in use,
    ends with its ``WHERE`` (13 partial indexes)."""
    from sqlalchemy.schema import CreateIndex

    dialect = db.engine.dialect
    partial = [
        index
        for table in metadata.tables.values()
        for index in table.indexes
        if index.dialect_options["sqlite"]["where"] is not None
    ]
    assert len(partial) == 13
    for index in partial:
        where = str(index.dialect_options["sqlite"]["where"])
        ddl = str(CreateIndex(index).compile(dialect=dialect))
        assert ddl.endswith(f"WHERE {where}"), (dialect.name, ddl)
