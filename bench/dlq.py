"""DLQ at scale: the due-rows query on a big table, and replay throughput.

    python -m bench.dlq [--n 1000000] [--small 10000] [--json]

For each engine (a temporary SQLite file; a PostgreSQL schema of its own, created and
dropped here) it fills ``dead_letters`` with a realistic mix in one set-based statement
(PostgreSQL: ``INSERT ... SELECT generate_series``; SQLite: a recursive CTE): 95%
resolved, 2% ignored, 1% review, 1% pending and due, 1% pending in the future, over 500
tenants, two of whose breakers are open. Then:

* the due-rows query (:func:`synckit.store.dead_letters.replay.due_rows`, 100 rows) is timed at
  ``--small`` rows and again after the table has grown to ``--n`` rows, with the same
  mix (so 100x more due rows too); figure: median at n / median at small (bar: <= 1.5);
* :meth:`ReplayProcessor.run_once` replays every due row of the big table (``n / 100``,
  so 10,000 by default) with a no-op replayer; figure: rows resolved per second (bar:
  >= 2,000/s). Rows of the open-breaker tenants are deferred, not counted.

``--json`` prints ``{"sqlite": {...}, "postgresql": {...}}`` with
``due_query_ratio_1m_10k`` and ``replay_per_s`` (and the raw timings) per engine.
Environment: ``SYNCKIT_BENCH_POSTGRES_URL`` (default postgresql://postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text, update

from synckit.dlq import Replayers, ReplayProcessor
from synckit.store import migrate
from synckit.store.db import Database, open_database
from synckit.store.dead_letters import replay as dlq_replay
from synckit.store.dead_letters.rows import DeadLetter
from synckit.store.tables import resources

PG_URL = os.environ.get("SYNCKIT_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
TENANTS = 500
OPEN_BREAKERS = ("tenant-7", "tenant-8")
DUE_LIMIT = 100
RUNS = 60

# One row per i, the mix decided by i % 100 (see the module docstring). Expressions are
# written per engine below; the column list is shared.
COLUMNS = (
    "tenant, connector, kind, record_id, resource_key, payload, error_class, error_message,"
    " traceback, history, trace_id, attempt_count, replay_attempts, status, status_reason,"
    " first_failed_at, last_attempt_at, next_retry_at, resolved_at"
)

PG_FILL = f"""
INSERT INTO dead_letters ({COLUMNS})
SELECT
  'tenant-' || ((g.i / 100) % {TENANTS}),
  CASE WHEN g.i % 3 = 0 THEN 'crm' ELSE 'mail' END,
  CASE WHEN g.i % 2 = 0 THEN 'record:messages' ELSE 'record:events' END,
  'rec-' || g.i,
  'tenant-' || ((g.i / 100) % {TENANTS}),
  jsonb_build_object('id', g.i, 'subject', 'Quarterly numbers ' || g.i, 'size', g.i % 9000),
  (ARRAY['transient','rate_limited','server_error','validation','not_found','conflict',
         'unknown'])[1 + g.i % 7],
  'HTTP 503 Service Unavailable on GET /v1.0/me/messages/' || g.i,
  'Traceback (most recent call last):\n  File "sync.py", line 42, in handle\nhttpx.HTTPStatusError',
  jsonb_build_array(jsonb_build_object('at', '2026-01-01T00:00:00+00:00', 'source', 'capture',
    'error_class', 'transient', 'message', 'HTTP 503', 'attempt', 1)),
  md5(g.i::text),
  1 + g.i % 4,
  CASE WHEN g.i % 100 = 0 THEN g.i % 5 ELSE 0 END,
  CASE g.i % 100 WHEN 0 THEN 'pending' WHEN 1 THEN 'pending' WHEN 2 THEN 'review'
    WHEN 3 THEN 'ignored' WHEN 4 THEN 'ignored' ELSE 'resolved' END,
  NULL,
  CAST(:now AS timestamptz) - (g.i % 86400) * interval '1 second' - interval '1 day',
  CAST(:now AS timestamptz) - (g.i % 86400) * interval '1 second',
  CASE g.i % 100 WHEN 0 THEN CAST(:now AS timestamptz) - (1 + g.i % 3600) * interval '1 second'
    WHEN 1 THEN CAST(:now AS timestamptz) + (3600 + g.i % 3600) * interval '1 second'
    ELSE NULL END,
  CASE WHEN g.i % 100 >= 3
    THEN CAST(:now AS timestamptz) - (g.i % 86400) * interval '1 second' ELSE NULL END
FROM generate_series(:start, :stop - 1) AS g(i)
"""


def _sqlite_ts(offset_seconds: str) -> str:
    # The text UTCDateTime stores on SQLite: 'YYYY-MM-DD HH:MM:SS.ffffff', naive UTC.
    return f"strftime('%Y-%m-%d %H:%M:%S', :now, ({offset_seconds}) || ' seconds') || '.000000'"


SQLITE_FILL = f"""
INSERT INTO dead_letters ({COLUMNS})
WITH RECURSIVE g(i) AS (SELECT :start UNION ALL SELECT i + 1 FROM g WHERE i + 1 < :stop)
SELECT
  'tenant-' || ((i / 100) % {TENANTS}),
  CASE WHEN i % 3 = 0 THEN 'crm' ELSE 'mail' END,
  CASE WHEN i % 2 = 0 THEN 'record:messages' ELSE 'record:events' END,
  'rec-' || i,
  'tenant-' || ((i / 100) % {TENANTS}),
  json_object('id', i, 'subject', 'Quarterly numbers ' || i, 'size', i % 9000),
  CASE i % 7 WHEN 0 THEN 'transient' WHEN 1 THEN 'rate_limited' WHEN 2 THEN 'server_error'
    WHEN 3 THEN 'validation' WHEN 4 THEN 'not_found' WHEN 5 THEN 'conflict' ELSE 'unknown' END,
  'HTTP 503 Service Unavailable on GET /v1.0/me/messages/' || i,
  'Traceback (most recent call last):' || char(10) || '  File "sync.py", line 42, in handle'
    || char(10) || 'httpx.HTTPStatusError',
  json_array(json_object('at', '2026-01-01T00:00:00+00:00', 'source', 'capture',
    'error_class', 'transient', 'message', 'HTTP 503', 'attempt', 1)),
  hex(randomblob(16)),
  1 + i % 4,
  CASE WHEN i % 100 = 0 THEN i % 5 ELSE 0 END,
  CASE i % 100 WHEN 0 THEN 'pending' WHEN 1 THEN 'pending' WHEN 2 THEN 'review'
    WHEN 3 THEN 'ignored' WHEN 4 THEN 'ignored' ELSE 'resolved' END,
  NULL,
  {_sqlite_ts("-(i % 86400) - 86400")},
  {_sqlite_ts("-(i % 86400)")},
  CASE i % 100 WHEN 0 THEN {_sqlite_ts("-(1 + i % 3600)")}
    WHEN 1 THEN {_sqlite_ts("3600 + i % 3600")} ELSE NULL END,
  CASE WHEN i % 100 >= 3 THEN {_sqlite_ts("-(i % 86400)")} ELSE NULL END
FROM g
"""


@dataclass
class Figures:
    rows: int
    small: int
    fill_s: float
    due_query_ms_small: float
    due_query_ms_big: float
    due_query_ratio_1m_10k: float
    replay_rows: int
    replay_deferred: int
    replay_s: float
    replay_per_s: float
    plan: str


async def _fill(db: Database, start: int, stop: int, now: datetime) -> None:
    if db.is_postgres:
        sql, params = PG_FILL, {"now": now, "start": start, "stop": stop}
    else:
        stamp = now.astimezone(UTC).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S")
        sql, params = SQLITE_FILL, {"now": stamp, "start": start, "stop": stop}
    step = 250_000
    for lo in range(start, stop, step):
        async with db.begin() as conn:
            await conn.execute(text(sql), {**params, "start": lo, "stop": min(stop, lo + step)})
    async with db.begin() as conn:
        await conn.exec_driver_sql("ANALYZE dead_letters" if db.is_postgres else "ANALYZE")


async def _resources(db: Database, now: datetime) -> None:
    async with db.begin() as conn:
        await conn.execute(
            resources.insert(),
            [
                {"resource_key": f"tenant-{t}", "state": "closed", "updated_at": now}
                for t in range(TENANTS)
            ],
        )
        await conn.execute(
            update(resources)
            .where(resources.c.resource_key.in_(OPEN_BREAKERS))
            .values(state="open", cooldown_until=now + timedelta(minutes=10))
        )


async def _due_query_ms(small: Database, big: Database, now: datetime) -> tuple[float, float]:
    """Median time of the due-rows query on each database, measured alternately so that
    any drift in the machine's load hits both alike."""

    async def once(db: Database) -> float:
        async with db.begin() as conn:
            start = time.perf_counter()
            rows = await dlq_replay.due_rows(conn, now, DUE_LIMIT)
            elapsed = time.perf_counter() - start
        assert len(rows) == DUE_LIMIT, f"expected {DUE_LIMIT} due rows, got {len(rows)}"
        return elapsed

    t_small, t_big = [], []
    for i in range(RUNS + 5):
        a, b = await once(small), await once(big)
        if i >= 5:  # warm-up: caches, prepared statements
            t_small.append(a)
            t_big.append(b)
    return statistics.median(t_small) * 1000, statistics.median(t_big) * 1000


async def _explain(db: Database, now: datetime) -> str:
    """The engine's plan for the due-rows query (the statement dlq_replay.due_rows builds)."""
    sql = (
        "SELECT id FROM dead_letters WHERE id IN (SELECT id FROM dead_letters"
        " WHERE status = 'pending' AND next_retry_at IS NOT NULL"
        f" ORDER BY next_retry_at, id LIMIT {DUE_LIMIT}) AND next_retry_at <= :now"
    )
    async with db.begin() as conn:
        if db.is_postgres:
            res = await conn.execute(text(f"EXPLAIN ANALYZE {sql}"), {"now": now})
            return "\n".join(r[0] for r in res)
        stamp = now.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ")
        res = await conn.execute(text(f"EXPLAIN QUERY PLAN {sql}"), {"now": stamp})
        return "\n".join(str(r[-1]) for r in res)


async def _replay(db: Database) -> tuple[int, int, float]:
    async def noop(row: DeadLetter) -> None:
        return None

    replayers = Replayers()
    replayers.register_prefix("record:", noop)
    processor = ReplayProcessor(db, replayers, batch=500, concurrency=64)
    start = time.perf_counter()
    summary = await processor.run_once(limit=10**9)
    seconds = time.perf_counter() - start
    return summary.resolved, summary.deferred, seconds


async def _bench(small_db: Database, big_db: Database, n: int, small: int) -> Figures:
    now = datetime.now(UTC)
    for db in (small_db, big_db):
        await migrate.upgrade(db)
        await _resources(db, now)
    await _fill(small_db, 0, small, now)
    t0 = time.perf_counter()
    await _fill(big_db, 0, n, now)
    fill_s = time.perf_counter() - t0
    ms_small, ms_big = await _due_query_ms(small_db, big_db, now)
    plan = await _explain(big_db, now)
    resolved, deferred, seconds = await _replay(big_db)
    return Figures(
        rows=n,
        small=small,
        fill_s=round(fill_s, 1),
        due_query_ms_small=round(ms_small, 3),
        due_query_ms_big=round(ms_big, 3),
        due_query_ratio_1m_10k=round(ms_big / ms_small, 2),
        replay_rows=resolved,
        replay_deferred=deferred,
        replay_s=round(seconds, 2),
        replay_per_s=round(resolved / seconds, 1),
        plan=plan,
    )


async def _sqlite(n: int, small: int) -> Figures:
    with tempfile.TemporaryDirectory(prefix="synckit-bench-") as tmp:
        dbs = [open_database(f"sqlite:///{Path(tmp) / name}") for name in ("small.db", "big.db")]
        try:
            return await _bench(dbs[0], dbs[1], n, small)
        finally:
            for db in dbs:
                await db.dispose()


async def _postgres(n: int, small: int) -> Figures:
    schemas = [f"bench_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    admin = open_database(PG_URL, pool_size=1)
    sep = "&" if "?" in PG_URL else "?"
    try:
        async with admin.begin() as conn:
            for schema in schemas:
                await conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        dbs = [open_database(f"{PG_URL}{sep}search_path={s}") for s in schemas]
        try:
            return await _bench(dbs[0], dbs[1], n, small)
        finally:
            for db in dbs:
                await db.dispose()
    finally:
        async with admin.begin() as conn:
            for schema in schemas:
                await conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.dispose()


async def main_async(n: int, small: int) -> dict[str, Figures]:
    return {"sqlite": await _sqlite(n, small), "postgresql": await _postgres(n, small)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dlq", description=__doc__)
    parser.add_argument("--n", type=int, default=1_000_000, help="rows in the big table")
    parser.add_argument("--small", type=int, default=10_000, help="rows in the small table")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.small < DUE_LIMIT * 100 or args.n <= args.small:
        parser.error(f"need --n > --small >= {DUE_LIMIT * 100} (1% of rows are due)")
    figures = asyncio.run(main_async(args.n, args.small))
    if args.json:
        out: dict[str, Any] = {}
        for engine, f in figures.items():
            data = asdict(f)
            del data["plan"]
            out[engine] = data
        print(json.dumps(out))
        return
    print(
        f"dead_letters: {args.small:,} then {args.n:,} rows (1% due), due query LIMIT {DUE_LIMIT}"
    )
    for engine, f in figures.items():
        print(
            f"  {engine:<10} due query {f.due_query_ms_small:7.3f} ms at {f.small:,}, "
            f"{f.due_query_ms_big:7.3f} ms at {f.rows:,}: ratio {f.due_query_ratio_1m_10k:.2f}"
            f"  (bar 1.5)"
        )
        print(
            f"  {'':<10} replay {f.replay_rows:,} rows in {f.replay_s:.2f} s: "
            f"{f.replay_per_s:,.0f} rows/s (bar 2,000; {f.replay_deferred} deferred by open "
            f"breakers); fill {f.fill_s:.0f} s"
        )
        print("  " + f.plan.replace("\n", "\n  "))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
