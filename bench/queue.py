"""Job queue benchmark: ``python -m bench.queue [--n 20000] [--json] [--engines ...]``.

Measured per engine, with durability as shipped (SQLite WAL + synchronous=NORMAL,
PostgreSQL synchronous_commit on, logged tables):

* enqueue jobs/s, one job per call (each its own transaction) and in batches of 1,000;
* processing jobs/s of no-op jobs with one worker at concurrency 1 and 32;
* enqueue-to-start latency p50/p99 with the worker idle (one job at a time);
* peak RSS of this process;
* claim+complete cost per job with 10k versus 1M finished rows already in the table;
* RSS flatness: one long-lived worker processes N jobs five times over; the process's
  RSS after each round (``rss_rounds_mb``) and its growth from the second round to the
  last (``rss_growth_mb``; the first round warms caches and pools up);
* reference figures for the machine at the moment of the run, since a shared 2-core
  machine's speed varies from hour to hour: bare ``sqlite3`` and bare ``asyncpg`` doing
  one INSERT per transaction (``ref_bare_insert_per_s``), with the same durability.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import text

from synckit.errors import RetryPolicy
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.runtime.observe.logging import configure_logging
from synckit.store import migrate
from synckit.store.db import Database, open_database
from synckit.store.jobs import enqueueing

PG_URL = os.environ.get("SYNCKIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """This process's resident set size now (Linux)."""
    gc.collect()
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class Bench:
    def __init__(self, engine: str, charge_at: str = "start") -> None:
        self.engine = engine
        self.charge_at = charge_at
        self.tmp = tempfile.TemporaryDirectory(prefix="synckit-bench-")
        self.schema = f"bench_{uuid.uuid4().hex[:10]}"
        self.started: dict[int, float] = {}
        self.registry = Registry()

        self.job_started = asyncio.Event()

        async def noop(ctx: JobContext) -> None:
            self.started[ctx.job.id] = time.perf_counter()
            self.job_started.set()

        self.registry.add("noop", noop)
        self.counted = 0
        self.count_target = 0
        self.count_reached = asyncio.Event()

        async def count(ctx: JobContext) -> None:
            self.counted += 1
            if self.counted >= self.count_target:
                self.count_reached.set()

        self.registry.add("count", count)

    async def fresh(self) -> Database:
        """An empty migrated database."""
        if self.engine == "sqlite":
            path = Path(self.tmp.name) / f"{uuid.uuid4().hex}.db"
            db = open_database(f"sqlite:///{path}")
        else:
            admin = open_database(PG_URL)
            async with admin.begin() as conn:
                await conn.execute(text(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE"))
                await conn.execute(text(f"CREATE SCHEMA {self.schema}"))
            await admin.dispose()
            db = open_database(f"{PG_URL}?search_path={self.schema}")
        await migrate.upgrade(db)
        return db

    async def cleanup(self) -> None:
        if self.engine == "postgresql":
            admin = open_database(PG_URL)
            async with admin.begin() as conn:
                await conn.execute(text(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE"))
            await admin.dispose()
        self.tmp.cleanup()

    def worker(self, db: Database, concurrency: int) -> Worker:
        return Worker(
            db,
            self.registry,
            concurrency=concurrency,
            retry_policy=RetryPolicy.deterministic(),
            poll_interval=1.0,
            charge_at="claim" if self.charge_at == "claim" else "start",
        )

    async def enqueue_single(self, n: int) -> float:
        db = await self.fresh()
        t = time.perf_counter()
        for i in range(n):
            await enqueueing.enqueue(db, "noop", {"i": i})
        rate = n / (time.perf_counter() - t)
        await db.dispose()
        return rate

    async def enqueue_batch(self, n: int) -> float:
        db = await self.fresh()
        specs = [enqueueing.JobSpec("noop", {"i": i}) for i in range(n)]
        t = time.perf_counter()
        for k in range(0, n, 1000):
            await enqueueing.enqueue_many(db, specs[k : k + 1000])
        rate = n / (time.perf_counter() - t)
        await db.dispose()
        return rate

    async def process(self, n: int, concurrency: int, db: Database | None = None) -> float:
        own = db is None
        db = db or await self.fresh()
        for k in range(0, n, 5000):
            await enqueueing.enqueue_many(
                db, [enqueueing.JobSpec("noop", {"i": i}) for i in range(k, min(n, k + 5000))]
            )
        t = time.perf_counter()
        stats = await self.worker(db, concurrency).run_until_idle()
        elapsed = time.perf_counter() - t
        assert stats.succeeded == n, stats
        if own:
            await db.dispose()
        return n / elapsed

    async def latency(self, samples: int) -> tuple[float, float]:
        """Enqueue-to-start with an idle worker waiting for wake-ups."""
        db = await self.fresh()
        worker = self.worker(db, 4)
        running = asyncio.create_task(worker.run())
        await asyncio.sleep(0.5)  # the worker is up and idle (listening on PostgreSQL)
        lat: list[float] = []
        for _ in range(samples):
            self.job_started.clear()
            t = time.perf_counter()
            job = await enqueueing.enqueue(db, "noop", {})
            await asyncio.wait_for(self.job_started.wait(), 10)
            lat.append((self.started[job.id] - t) * 1000)
            await asyncio.sleep(0.01)
        worker.stop()
        await running
        await db.dispose()
        lat.sort()
        return statistics.median(lat), lat[int(len(lat) * 0.99) - 1]

    async def rss_rounds(self, n: int, rounds: int = 5) -> list[float]:
        """RSS after each of ``rounds`` rounds of ``n`` jobs through one long-lived worker."""
        db = await self.fresh()
        worker = self.worker(db, 32)
        running = asyncio.create_task(worker.run())
        sizes = []
        try:
            for r in range(1, rounds + 1):
                self.count_target = r * n
                self.count_reached.clear()
                for k in range(0, n, 5000):
                    specs = [
                        enqueueing.JobSpec("count", {"i": i}) for i in range(k, min(n, k + 5000))
                    ]
                    await enqueueing.enqueue_many(db, specs)
                await asyncio.wait_for(self.count_reached.wait(), 600)
                sizes.append(round(rss_mb(), 1))
        finally:
            worker.stop()
            await running
            await db.dispose()
        return sizes

    async def bare_inserts(self, n: int) -> float:
        """One INSERT per transaction with the bare driver: the machine's speed right now."""
        db = await self.fresh()
        await db.dispose()
        if self.engine == "sqlite":
            import sqlite3

            assert db.url.database is not None
            conn = sqlite3.connect(db.url.database, isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            t = time.perf_counter()
            for i in range(n):
                conn.execute(
                    "INSERT INTO jobs (kind, payload, status, run_at, created_at, updated_at)"
                    " VALUES ('noop', ?, 'pending', '2026-01-01', '2026-01-01', '2026-01-01')",
                    (json.dumps({"i": i}),),
                )
            rate = n / (time.perf_counter() - t)
            conn.close()
            return rate
        import asyncpg

        pg = await asyncpg.connect(PG_URL, server_settings={"search_path": self.schema})
        t = time.perf_counter()
        for i in range(n):
            await pg.execute(
                "INSERT INTO jobs (kind, payload, status, run_at, created_at, updated_at)"
                " VALUES ('noop', $1, 'pending', now(), now(), now())",
                json.dumps({"i": i}),
            )
        rate = n / (time.perf_counter() - t)
        await pg.close()
        return rate

    async def filler(self, db: Database, rows: int) -> None:
        """``rows`` finished jobs, as a long-lived table holds."""
        if self.engine == "postgresql":
            sql = (
                "INSERT INTO jobs (kind, payload, status, priority, attempts, max_attempts, run_at,"
                " created_at, updated_at, finished_at) SELECT 'old', '{}'::jsonb, 'succeeded',"
                " 0, 1, 5, now(), now(), now(), now() FROM generate_series(1, :n)"
            )
        else:
            stamp = "strftime('%Y-%m-%d %H:%M:%f000', 'now')"
            sql = (
                "WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM s WHERE x < :n) "
                "INSERT INTO jobs (kind, payload, status, priority, attempts, max_attempts, run_at,"
                f" created_at, updated_at, finished_at) SELECT 'old', '{{}}', 'succeeded', 0, 1, 5,"
                f" {stamp}, {stamp}, {stamp}, {stamp} FROM s"
            )
        async with db.begin() as conn:
            await conn.execute(text(sql), {"n": rows})
        # A long-lived table has been vacuumed and its WAL written back long ago; a
        # million rows inserted just now have not, and the checkpoint and hint-bit
        # writes they leave behind would land inside the measurement instead.
        if self.engine == "postgresql":
            async with db.autocommit() as conn:
                await conn.execute(text("VACUUM (ANALYZE) jobs"))
                await conn.execute(text("CHECKPOINT"))
        else:
            import sqlite3

            assert db.url.database is not None
            raw = sqlite3.connect(db.url.database)
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            raw.close()

    async def claim_cost_ratio(self, n: int) -> tuple[float, float, float]:
        """Per-job claim+complete cost with 1M versus 10k finished rows in the table."""
        costs = []
        for rows in (10_000, 1_000_000):
            db = await self.fresh()
            await self.filler(db, rows)
            rate = await self.process(n, 32, db)
            costs.append(1000 / rate)  # ms per job
            await db.dispose()
        return costs[0], costs[1], costs[1] / costs[0]


async def run_engine(engine: str, n: int, charge_at: str = "start") -> dict[str, Any]:
    b = Bench(engine, charge_at)
    try:
        out: dict[str, Any] = {}
        out["enqueue_per_s"] = round(await b.enqueue_single(min(n, 5000)))
        out["enqueue_batch_per_s"] = round(await b.enqueue_batch(n))
        out["process_c1_per_s"] = round(await b.process(min(n, 5000), 1))
        out["process_c32_per_s"] = round(await b.process(n, 32))
        b.started.clear()  # job ids restart in every fresh database
        p50, p99 = await b.latency(200)
        out["start_latency_p50_ms"] = round(p50, 2)
        out["start_latency_p99_ms"] = round(p99, 2)
        c10k, c1m, ratio = await b.claim_cost_ratio(min(n, 10_000))
        out["claim_cost_10k_ms"] = round(c10k, 4)
        out["claim_cost_1m_ms"] = round(c1m, 4)
        out["claim_cost_ratio_1m_10k"] = round(ratio, 3)
        rounds = await b.rss_rounds(n)
        out["peak_rss_mb"] = round(peak_rss_mb(), 1)
        out["rss_rounds_mb"] = rounds
        out["rss_growth_mb"] = round(rounds[-1] - rounds[1], 1)
        out["ref_bare_insert_per_s"] = round(await b.bare_inserts(min(n, 5000)))
        return out
    finally:
        await b.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="jobs per measurement")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument(
        "--charge-at",
        choices=["start", "claim"],
        default="start",
        help="when workers charge a job's attempt (Worker(charge_at=...))",
    )
    args = parser.parse_args()
    configure_logging(json_lines=True, level=logging.WARNING)
    results: dict[str, dict[str, Any]] = {}
    for engine in args.engines.split(","):
        if not args.json:
            print(f"running {engine} (n={args.n}) ...", file=sys.stderr)
        results[engine] = asyncio.run(run_engine(engine, args.n, args.charge_at))
    if args.json:
        print(json.dumps(results, sort_keys=True))
        return
    keys = list(next(iter(results.values())))
    width = max(len(k) for k in keys)
    print(f"{'':{width}}  " + "  ".join(f"{e:>12}" for e in results))
    for k in keys:
        cells = [results[e][k] for e in results]
        shown = [" ".join(map(str, c)) if isinstance(c, list) else str(c) for c in cells]
        print(f"{k:{width}}  " + "  ".join(f"{c:>12}" for c in shown))


if __name__ == "__main__":
    main()
