"""Console page timings: ``python -m bench.web [--scale 1.0] [--engines sqlite postgresql]``.

Seeds, per engine, the issue's large tables through the storage operations (at scale 1:
1,000,000 jobs, 100,000 dead letters, 10,000 tenants, 10,000 outbox messages), then times
each console page in process (httpx's ASGI transport, no network): the median and the
worst of ``--repeat`` requests, in milliseconds. The target is under 200 ms a page.
Deep pages are reached by their keyset cursor, as the "next page" link does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
from pydantic import BaseModel

from synckit import Connector, Page
from synckit.connectors.tenants import add_tenant
from synckit.dlq import store as dlq_store
from synckit.runtime import jobs as job_store
from synckit.runtime import migrate, outbox
from synckit.runtime.db import Database, open_database
from synckit.runtime.jobs import utcnow
from synckit.runtime.pacing import defer_resource
from synckit.web import WebConfig, create_app

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


class BenchConfig(BaseModel):
    region: str = "eu"


class Bench(Connector[BenchConfig]):
    name = "bench"
    base_url = "http://127.0.0.1:9"

    async def poll(self, ctx: Any, checkpoint: Any) -> AsyncIterator[Page]:
        yield Page([], checkpoint=None)

    async def handle(self, ctx: Any, record: Any) -> None:
        return None


async def seed(db: Database, scale: float, say: Any) -> dict[str, Any]:
    rng = random.Random(7)
    n_tenants = max(10, int(10_000 * scale))
    n_jobs = max(100, int(1_000_000 * scale))
    n_letters = max(100, int(100_000 * scale))
    n_messages = max(100, int(10_000 * scale))
    t0 = time.perf_counter()
    names = [f"tenant-{i:05d}" for i in range(n_tenants)]
    for name in names:
        await add_tenant(db, name, Bench, {})
    for name in names[:: max(1, n_tenants // 50)]:
        await defer_resource(db, f"bench:{name}", utcnow() + timedelta(hours=1), "Retry-After")
    say(f"{n_tenants} tenants in {time.perf_counter() - t0:.0f}s")
    t0 = time.perf_counter()
    kinds = ["synckit.poll", "send.invoice", "sync.contact", "export.report"]
    batch = 10_000
    for start in range(0, n_jobs, batch):
        specs = [
            job_store.JobSpec(
                rng.choice(kinds),
                {"n": i},
                resource_key=f"bench:{rng.choice(names)}",
            )
            for i in range(start, min(n_jobs, start + batch))
        ]
        await job_store.enqueue_many(db, specs)
    say(f"{n_jobs} jobs in {time.perf_counter() - t0:.0f}s")
    t0 = time.perf_counter()
    classes = ["server_error", "validation", "timeout", "rate_limited"]
    now = utcnow()
    for start in range(0, n_letters, 2_000):
        failures = [
            dlq_store.Failure(
                tenant=rng.choice(names),
                connector="bench",
                kind="record:default",
                record_id=f"r-{i}",
                payload={"id": i},
                error_class=rng.choice(classes),
                message="HTTP 503 Service Unavailable",
            )
            for i in range(start, min(n_letters, start + 2_000))
        ]
        async with db.begin() as conn:
            await dlq_store.capture_many(conn, failures, now=now)
    say(f"{n_letters} dead letters in {time.perf_counter() - t0:.0f}s")
    async with db.begin() as conn:
        for i in range(n_messages):
            await outbox.add(conn, f"topic.{i % 20}", {"i": i}, key=f"k{i % 100}")
    return {"tenants": names, "jobs": n_jobs, "letters": n_letters}


async def time_pages(db: Database, seeded: dict[str, Any], repeat: int) -> dict[str, Any]:
    app = create_app(WebConfig(database_url=None), database=db)
    transport = httpx.ASGITransport(app=app)
    mid = seeded["tenants"][len(seeded["tenants"]) // 2]
    pages = {
        "overview": "/",
        "overview live": "/live/overview",
        "tenants": "/tenants",
        "tenants (deep, by cursor)": f"/tenants?after={mid}",
        "tenants paused": "/tenants?status=paused",
        "tenant": f"/tenants/{mid}",
        "jobs": "/jobs",
        "jobs (deep, by cursor)": f"/jobs?before={seeded['jobs'] // 2}",
        "jobs by kind and state": "/jobs?kind=send.invoice&status=pending",
        "jobs of a tenant": f"/jobs?tenant={mid}",
        "job": f"/jobs/{seeded['jobs'] // 2}",
        "dead letters": "/dlq",
        "dead letters of a tenant": f"/dlq?tenant={mid}",
        "dead letter": f"/dlq/{seeded['letters'] // 2}",
        "outbox": "/outbox",
    }
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for name, path in pages.items():
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                r = await client.get(path)
                times.append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 200, (path, r.status_code, r.text[:300])
            out[name] = {
                "median_ms": round(statistics.median(times), 1),
                "max_ms": round(max(times), 1),
            }
    return out


async def run_engine(engine: str, scale: float, repeat: int, say: Any) -> dict[str, Any]:
    schema = None
    if engine == "sqlite":
        url = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    else:
        schema = f"bench_{uuid.uuid4().hex[:10]}"
        admin = open_database(PG_URL)
        async with admin.engine.connect() as conn:
            await conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
            await conn.commit()
        await admin.dispose()
        url = f"{PG_URL}?search_path={schema}"
    db = open_database(url)
    try:
        await migrate.upgrade(db)
        seeded = await seed(db, scale, say)
        return await time_pages(db, seeded, repeat)
    finally:
        await db.dispose()
        if schema:
            admin = open_database(PG_URL)
            async with admin.engine.connect() as conn:
                await conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
                await conn.commit()
            await admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--engines", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    for engine in args.engines:
        results[engine] = asyncio.run(
            run_engine(engine, args.scale, args.repeat, lambda m, e=engine: print(f"[{e}] {m}"))
        )
    if args.json:
        print(json.dumps({"scale": args.scale, "pages": results}, indent=2))
        return
    names = list(next(iter(results.values())))
    print(f"\nconsole pages at scale {args.scale:g} (median / worst of {args.repeat}, ms)")
    print(f"{'page':32}" + "".join(f"{e:>22}" for e in results))
    for name in names:
        cells = "".join(
            f"{results[e][name]['median_ms']:>12.1f} / {results[e][name]['max_ms']:<7.1f}"
            for e in results
        )
        print(f"{name:32}{cells}")


if __name__ == "__main__":
    main()
