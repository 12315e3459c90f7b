"""The claim queries walk the due indexes in claim order, on SQLite and PostgreSQL.

A claim must cost about the same with 100 or 100,000 jobs waiting. The failure this
guards against is silent: SQLite once answered every claim from an index led by
``status``, which meant fetching every pending row and sorting them all, per claim.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.runtime import jobs as store
from synckit.runtime import outbox
from synckit.runtime.db import Database

NOW = datetime(2026, 11, 22, tzinfo=UTC)
PARAMS: dict[str, Any] = {
    "now": NOW,
    "lim": 100,
    "worker": "w",
    "token": 1,
    "until": NOW + timedelta(minutes=1),
    "charge": 0,
    "started": None,
    "lane": "tenant-1",
}


async def plan(conn: AsyncConnection, stmt: Any, **params: Any) -> str:
    """The engine's plan for ``stmt`` with :data:`PARAMS` (and ``params``) bound, as one
    string."""
    compiled = stmt.compile(dialect=conn.dialect)
    values = compiled.construct_params({**PARAMS, **params})
    processors = compiled._bind_processors
    ordered = tuple(
        processors[name](values[name]) if name in processors else values[name]
        for name in compiled.positiontup
    )
    prefix = "EXPLAIN QUERY PLAN " if conn.dialect.name == "sqlite" else "EXPLAIN "
    rows = (await conn.exec_driver_sql(prefix + compiled.string, ordered)).all()
    return "\n".join(" ".join(str(c) for c in r) for r in rows)


async def backlog(db: Database, rows: int) -> None:
    """``rows`` pending jobs, half of them in lanes."""
    if db.is_postgres:
        sql = (
            "INSERT INTO jobs (kind, payload, status, run_at, created_at, updated_at,"
            " resource_key) SELECT 'k', '{}', 'pending', now(), now(), now(),"
            " CASE WHEN g % 2 = 0 THEN 'tenant-' || (g % 10) END"
            " FROM generate_series(1, :n) g"
        )
    else:
        sql = (
            "WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < :n)"
            " INSERT INTO jobs (kind, payload, status, run_at, created_at, updated_at,"
            " resource_key) SELECT 'k', '{}', 'pending', '2026-01-01', '2026-01-01',"
            " '2026-01-01', CASE WHEN g % 2 = 0 THEN 'tenant-' || (g % 10) END FROM s"
        )
    async with db.begin() as conn:
        await conn.execute(text(sql), {"n": rows})
        if db.is_postgres:
            # autovacuum would; SQLite users rarely run ANALYZE, so its plan must be
            # right without statistics.
            await conn.execute(text("ANALYZE jobs"))


async def test_claims_walk_the_due_indexes(db: Database) -> None:
    await backlog(db, 20_000)
    async with db.begin() as conn:
        unkeyed = await plan(conn, store._CLAIM_UNKEYED)
        keyed = await plan(conn, store._CLAIM_KEYED)
        lanes = await plan(conn, store._LANES)
    assert "ix_jobs_due" in unkeyed, unkeyed
    assert "ix_jobs_lane_due" in keyed, keyed
    if not db.is_postgres:
        # No sort of the backlog: the index gives the claim order.
        assert "TEMP B-TREE" not in unkeyed, unkeyed
        assert "TEMP B-TREE" not in keyed, keyed
        # Per lane: its due jobs and its running jobs come from the partial indexes.
        assert "ix_jobs_lane_due" in lanes and "ix_jobs_running" in lanes, lanes


async def outbox_backlog(db: Database, rows: int) -> None:
    """``rows`` pending outbox messages over 50 keys, a few of them waiting for a retry."""
    if db.is_postgres:
        sql = (
            "INSERT INTO outbox (topic, key, payload, message_id, status, next_attempt_at,"
            " created_at) SELECT 't', (g % 50)::text, '{}', 'm' || g, 'pending',"
            " CASE WHEN g % 1000 = 0 THEN now() + interval '1 hour' ELSE now() END, now()"
            " FROM generate_series(1, :n) g"
        )
    else:
        sql = (
            "WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < :n)"
            " INSERT INTO outbox (topic, key, payload, message_id, status, next_attempt_at,"
            " created_at) SELECT 't', CAST(g % 50 AS TEXT), '{}', 'm' || g, 'pending',"
            " CASE WHEN g % 1000 = 0 THEN '2099-01-01' ELSE '2026-01-01' END, '2026-01-01'"
            " FROM s"
        )
    async with db.begin() as conn:
        await conn.execute(text(sql), {"n": rows})
        if db.is_postgres:
            await conn.execute(text("ANALYZE outbox"))


async def test_the_outbox_claim_reads_about_a_batch_whatever_the_backlog(db: Database) -> None:
    """Pending messages in id order from their partial index; waiting keys through
    next_attempt_at; each key's first blocker by one probe of (key, id)."""
    await outbox_backlog(db, 20_000)
    async with db.begin() as conn:
        claim = await plan(conn, outbox._claim_statement(datetime.now(UTC), 500))
        if db.is_postgres:
            ids: Any = [1, 2]
            keys: Any = ["1", "2"]
        else:
            ids, keys = "[1, 2]", '["1", "2"]'
        blockers = await plan(conn, outbox._BLOCKERS[conn.dialect.name], ids=ids, keys=keys)
    assert "ix_outbox_pending_id" in claim, claim
    # PostgreSQL may walk pending ids until a key turns up instead, when keys are as
    # evenly spread as here; either way no whole scan.
    assert "Seq Scan" not in blockers and "SCAN o\n" not in blockers + "\n", blockers
    if not db.is_postgres:
        assert "ix_outbox_pending_key" in blockers, blockers
        # The waiting keys through next_attempt_at, not a walk of every keyed message.
        assert "ix_outbox_pending (next_attempt_at>?)" in claim, claim
        assert "SCAN outbox USING INDEX ix_outbox_pending_key" not in claim, claim
        assert "TEMP B-TREE FOR ORDER BY" not in claim, claim
