"""The benches count PostgreSQL's deadlocks (``bench.sync.postgres_deadlocks``): the
heartbeat's lock cycles with page commits cost a second each, every few seconds under
load, and no figure showed them."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import text
from waits import EVENT_TIMEOUT  # tests/

from bench.sync import postgres_deadlocks
from synckit.store.db import Database, open_database


async def test_a_deadlock_between_two_transactions_is_counted(
    db: Database, migrated_url: str
) -> None:
    if not db.is_postgres:
        pytest.skip("SQLite has one writer: it cannot deadlock")
    async with db.begin() as conn:
        await conn.execute(text("CREATE TABLE dl_probe (k int PRIMARY KEY, v int)"))
        await conn.execute(text("INSERT INTO dl_probe VALUES (1, 0), (2, 0)"))
    before = await postgres_deadlocks(db, settle=0)
    other = open_database(migrated_url)
    try:
        async with db.engine.connect() as a, other.engine.connect() as b:
            await a.execute(text("UPDATE dl_probe SET v = 1 WHERE k = 1"))
            await b.execute(text("UPDATE dl_probe SET v = 1 WHERE k = 2"))
            crossed = await asyncio.gather(
                a.execute(text("UPDATE dl_probe SET v = 2 WHERE k = 2")),
                b.execute(text("UPDATE dl_probe SET v = 2 WHERE k = 1")),
                return_exceptions=True,
            )
            failed = [r for r in crossed if isinstance(r, BaseException)]
            assert len(failed) == 1 and "deadlock detected" in str(failed[0]), crossed
            await a.rollback()
            await b.rollback()
    finally:
        await other.dispose()  # its server process ends and reports its counts
    deadline = time.monotonic() + EVENT_TIMEOUT
    while (after := await postgres_deadlocks(db, settle=0.2)) == before:
        assert time.monotonic() < deadline, "the deadlock was never counted"
    assert after >= before + 1  # the server's total: tests running beside may add theirs
