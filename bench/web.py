"""Console page timings: ``python -m bench.web [--scale 1.0] [--engines sqlite postgresql]``.

Seeds, per engine, the issue's large tables (at scale 1: 1,000,000 jobs, 100,000 dead
letters, 10,000 tenants, 10,000 outbox messages), shaped like a week of a busy
deployment rather than one burst: most jobs finished (succeeded 90%, dead 3%, cancelled
1.8%), a backlog of 5% pending and a few running; a quarter of them poll cycles; dead
letters first failed over the last seven days, about half of them resolved or ignored;
the audit counts those jobs left (one row per tenant and minute); tenants paused,
needing re-authorisation, paced (Retry-After) and with open breakers. Tenants, pending
jobs, dead letters and outbox messages go through the storage operations; finished
jobs and audit rows are inserted as rows (no operation makes a finished job).
PostgreSQL gets ``VACUUM ANALYZE`` afterwards, as autovacuum would; SQLite is left
without statistics, as synckit leaves it.

Then it times each console page in process (httpx's ASGI transport, no network): the
median and the worst of ``--repeat`` requests, in milliseconds. The target is under
200 ms a page. Deep pages are reached by their keyset cursor, as "next page" links do.
``--database-url`` seeds (once) and keeps a database of your own, to time it again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import httpx
from pydantic import BaseModel
from sqlalchemy import func, select, update

from synckit import Connector, Page
from synckit.clock import utcnow
from synckit.runtime.admin.tenants import add_tenant, pause_tenant
from synckit.runtime.http.pacing import defer_resource
from synckit.runtime.observe.alert_delivery import record_alerts
from synckit.runtime.observe.alert_rules import Alert
from synckit.runtime.sync.poll import POLL_KIND
from synckit.runtime.writes import outbox
from synckit.store import migrate
from synckit.store.connections import mark_needs_reauth
from synckit.store.db import Database, open_database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.dead_letters import replay as dlq_replay
from synckit.store.jobs import enqueueing
from synckit.store.tables import audit_buckets, connections, dead_letters, jobs, resources
from synckit.store.tables import outbox as outbox_table
from synckit.web import WebConfig, create_app

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
KINDS = [POLL_KIND, "send.invoice", "sync.contact", "export.report"]
CLASSES = ["server_error", "validation", "timeout", "rate_limited"]
WEEK = timedelta(days=7)


class BenchConfig(BaseModel):
    region: str = "eu"


class Bench(Connector[BenchConfig]):
    name = "bench"
    base_url = "http://127.0.0.1:9"

    async def poll(self, ctx: Any, checkpoint: Any) -> AsyncIterator[Page]:
        yield Page([], checkpoint=None)

    async def handle(self, ctx: Any, record: Any) -> None:
        return None


def _finished_job(
    rng: random.Random, names: list[str], i: int, created: datetime
) -> dict[str, Any]:
    tenant = rng.choice(names)
    kind = KINDS[i % 4]
    spec = enqueueing.JobSpec(
        kind,
        {"n": i, "tenant": tenant},
        resource_key=f"bench:{tenant}",
        unique_key=f"poll:{tenant}:default" if kind == POLL_KIND else None,
    )
    row, _ = spec.row_and_json(created)
    roll = rng.random()
    status = "succeeded" if roll < 0.947 else "dead" if roll < 0.979 else "cancelled"
    finished = created + timedelta(seconds=rng.uniform(0.1, 30))
    row.update(
        status=status,
        attempts=1 if status != "dead" else row["max_attempts"],
        started_at=created,
        finished_at=finished,
        updated_at=finished,
        last_error=None,
        error_class=None,
        errors=None,
    )
    if status == "dead":
        row.update(
            last_error="HTTP 503 Service Unavailable",
            error_class="server_error",
            errors=[{"attempt": 1, "error_class": "server_error", "message": "HTTP 503"}],
        )
    return row


async def seed(db: Database, scale: float, say: Any) -> dict[str, Any]:
    rng = random.Random(7)
    n_tenants = max(10, int(10_000 * scale))
    n_jobs = max(100, int(1_000_000 * scale))
    n_letters = max(100, int(100_000 * scale))
    n_messages = max(100, int(10_000 * scale))
    now = utcnow()
    t0 = time.perf_counter()
    names = [f"tenant-{i:05d}" for i in range(n_tenants)]
    for name in names:
        await add_tenant(db, name, Bench, {})
    step = max(1, n_tenants // 100)
    for name in names[1::step]:
        await pause_tenant(db, name, "paused for the migration")
    async with db.begin() as conn:
        for name in names[2::step]:
            await mark_needs_reauth(conn, name, reason="invalid_grant: token revoked", now=now)
    for name in names[3 :: max(1, n_tenants // 200)]:
        await defer_resource(db, f"bench:{name}", now + timedelta(hours=1), "Retry-After")
    async with db.begin() as conn:
        await conn.execute(
            update(resources)
            .where(resources.c.resource_key.in_([f"bench:{n}" for n in names[4::step]]))
            .values(
                state="open",
                opened_at=now,
                cooldown_until=now + timedelta(minutes=5),
                next_available_at=now + timedelta(minutes=5),
                consecutive_failures=5,
                last_error_class="server_error",
            )
        )
    say(f"{n_tenants} tenants in {time.perf_counter() - t0:.0f}s")

    # A week of jobs, oldest first (ids grow with time): 95% finished, then the backlog.
    t0 = time.perf_counter()
    n_finished = int(n_jobs * 0.95)
    batch = 5_000
    audit: dict[tuple[str, datetime], list[int]] = {}
    for start in range(0, n_finished, batch):
        rows = []
        for i in range(start, min(n_finished, start + batch)):
            created = now - WEEK + WEEK * (i / n_finished) - timedelta(seconds=30)
            row = _finished_job(rng, names, i, created)
            rows.append(row)
            minute = row["finished_at"].replace(second=0, microsecond=0)
            counts = audit.setdefault((row["payload"]["tenant"], minute), [0, 0])
            counts[0 if row["status"] == "succeeded" else 1] += row["status"] != "cancelled"
        async with db.begin() as conn:
            await conn.execute(jobs.insert(), rows)
    pending = [
        enqueueing.JobSpec(
            KINDS[i % 4],
            {"n": i},
            resource_key=f"bench:{rng.choice(names)}",
        )
        for i in range(n_finished, n_jobs)
    ]
    for start in range(0, len(pending), 10_000):
        await enqueueing.enqueue_many(db, pending[start : start + 10_000])
    async with db.begin() as conn:
        backlog = select(jobs.c.id).where(jobs.c.status == "pending").limit(n_jobs // 500)
        await conn.execute(
            update(jobs)
            .where(jobs.c.id.in_(backlog.scalar_subquery()))
            .values(status="running", started_at=now, lease_expires_at=now + timedelta(minutes=5))
        )
    say(f"{n_jobs} jobs in {time.perf_counter() - t0:.0f}s")

    t0 = time.perf_counter()
    items = list(audit.items())
    for start in range(0, len(items), 10_000):
        async with db.begin() as conn:
            await conn.execute(
                audit_buckets.insert(),
                [
                    {
                        "tenant": tenant,
                        "connector": "bench",
                        "minute": minute,
                        "app_version": "1.0",
                        "ok": ok,
                        "failed": failed,
                        "failed_by_class": {"server_error": failed} if failed else None,
                    }
                    for (tenant, minute), (ok, failed) in items[start : start + 10_000]
                ],
            )
    say(f"{len(items)} audit rows in {time.perf_counter() - t0:.0f}s")

    # Dead letters over the week, in batches captured at their moment; then about half
    # resolved or ignored (older first), a few put in review.
    t0 = time.perf_counter()
    for start in range(0, n_letters, 2_000):
        failures = [
            dlq_capture.Failure(
                tenant=rng.choice(names),
                connector="bench",
                kind="record:default",
                record_id=f"r-{i}",
                payload={"id": i},
                error_class=rng.choice(CLASSES),
                message="HTTP 503 Service Unavailable",
                traceback="Traceback (most recent call last):\n  ...\nServerError: 503",
            )
            for i in range(start, min(n_letters, start + 2_000))
        ]
        at = now - WEEK + WEEK * (start / n_letters)
        async with db.begin() as conn:
            await dlq_capture.capture_many(conn, failures, now=at)
    async with db.begin() as conn:
        ids = [r for (r,) in await conn.execute(select(dead_letters.c.id).order_by("id"))]
        closed = ids[: len(ids) // 2]
        for start in range(0, len(closed), 5_000):
            chunk = closed[start : start + 5_000]
            await dlq_replay.mark_resolved(conn, chunk[: len(chunk) * 9 // 10], now=now)
            await dlq_replay.mark_ignored(conn, chunk[len(chunk) * 9 // 10 :], "noise", now=now)
        await conn.execute(
            update(dead_letters)
            .where(dead_letters.c.id.in_(ids[len(ids) // 2 :: 20]))
            .values(status="review", status_reason="replayed 5 times")
        )
    say(f"{n_letters} dead letters in {time.perf_counter() - t0:.0f}s")

    async with db.begin() as conn:
        for i in range(n_messages):
            await outbox.add(conn, f"topic.{i % 20}", {"i": i}, key=f"k{i % 100}")
        await conn.execute(
            update(outbox_table)
            .where(outbox_table.c.id % 10 < 6)
            .values(status="published", published_at=now)
        )
        await conn.execute(
            update(outbox_table)
            .where(outbox_table.c.id % 10 == 6)
            .values(status="failed", attempts=10, last_error="HTTP 500 from the broker")
        )
    # Alerts the worker's evaluation recorded: one every five minutes over the week.
    async with db.begin() as conn:
        alerts = [
            Alert(
                rule="poll_lag",
                subject=f"tenant {names[i % n_tenants]}",
                message="no successful poll for 45m (schedule every 5m)",
                fired_at=now - WEEK + timedelta(minutes=5 * i),
                window=str(i),
                tenant=names[i % n_tenants],
            )
            for i in range(int(WEEK / timedelta(minutes=5)))
        ]
        await record_alerts(conn, alerts, now=now)
    return await seeded_facts(db)


async def seeded_facts(db: Database) -> dict[str, Any]:
    """What the timed pages need of a seeded database: names and ids to open."""
    async with db.begin() as conn:
        names = [t for (t,) in await conn.execute(select(connections.c.tenant).order_by("tenant"))]
        max_job = (await conn.execute(select(func.max(jobs.c.id)))).scalar_one() or 1
        max_letter = (await conn.execute(select(func.max(dead_letters.c.id)))).scalar_one() or 1
        mid = names[len(names) // 2] if names else ""
        tenant_job = (
            await conn.execute(
                select(jobs.c.id)
                .where(jobs.c.resource_key == f"bench:{mid}")
                .order_by(jobs.c.id.desc())
                .offset(50)
                .limit(1)
            )
        ).scalar_one_or_none()
    return {
        "tenants": names,
        "max_job": int(max_job),
        "max_letter": int(max_letter),
        "tenant_job": int(tenant_job or max_job),
    }


PAGES = [
    ("overview", "/"),
    ("overview live", "/live/overview"),
    ("tenants", "/tenants"),
    ("tenants (deep, by cursor)", "/tenants?after={mid}"),
    ("tenants paused", "/tenants?status=paused"),
    ("tenant", "/tenants/{mid}"),
    ("tenant live", "/live/tenants/{mid}"),
    ("jobs", "/jobs"),
    ("jobs (deep, by cursor)", "/jobs?before={half_job}"),
    ("jobs of a kind", "/jobs?kind=send.invoice"),
    ("jobs by kind and state", "/jobs?kind=send.invoice&status=pending"),
    ("jobs discarded (none)", "/jobs?status=discarded"),
    ("jobs dead", "/jobs?status=dead"),
    ("jobs of a tenant", "/jobs?tenant={mid}"),
    ("jobs in the last hour", "/jobs?since=1h"),
    ("jobs, a kind in the last minute", "/jobs?kind=export.report&status=dead&since=1m"),
    ("jobs of a tenant, page 2", "/jobs?tenant={mid}&before={tenant_job}"),
    ("job", "/jobs/{half_job}"),
    ("dead letters", "/dlq"),
    ("dead letters (groups, deep)", "/dlq?groups_after={mid}"),
    ("dead letters (rows, deep)", "/dlq?before={half_letter}"),
    ("dead letters of a tenant", "/dlq?tenant={mid}"),
    ("dead letters of a class", "/dlq?class=timeout"),
    ("dead letters resolved", "/dlq?status=resolved"),
    ("dead letter", "/dlq/{half_letter}"),
    ("outbox", "/outbox"),
    ("outbox failed", "/outbox?status=failed"),
]


async def time_pages(db: Database, facts: dict[str, Any], repeat: int) -> dict[str, Any]:
    app = create_app(WebConfig(database_url=None), database=db)
    transport = httpx.ASGITransport(app=app)
    values = {
        "mid": facts["tenants"][len(facts["tenants"]) // 2],
        "half_job": facts["max_job"] // 2,
        "half_letter": facts["max_letter"] // 2,
        "tenant_job": facts["tenant_job"],
    }
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for name, template in PAGES:
            path = template.format(**values)
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                r = await client.get(path)
                times.append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 200, (path, r.status_code, r.text[:300])
            out[name] = {
                "median_ms": round(statistics.median(times), 1),
                "max_ms": round(max(times), 1),
                "rows": len(re.findall(r"<tr", r.text)),
            }
    return out


async def _pg_schema(action: str, schema: str) -> None:
    admin = open_database(PG_URL)
    try:
        async with admin.engine.connect() as conn:
            await conn.exec_driver_sql(f"{action} SCHEMA {schema}")
            await conn.commit()
    finally:
        await admin.dispose()


async def _vacuum(db: Database) -> None:
    if not db.is_postgres:
        return
    async with db.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.exec_driver_sql("VACUUM ANALYZE")


async def run_engine(
    engine: str, scale: float, repeat: int, say: Any, keep: str | None
) -> dict[str, Any]:
    schema = None
    if keep:
        url = keep
    elif engine == "sqlite":
        url = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    else:
        schema = f"bench_{uuid.uuid4().hex[:10]}"
        await _pg_schema("CREATE", schema)
        url = f"{PG_URL}?search_path={schema}"
    db = open_database(url)
    try:
        await migrate.upgrade(db)
        facts = await seeded_facts(db)
        if not facts["tenants"]:
            facts = await seed(db, scale, say)
            await _vacuum(db)
        else:
            say(f"reusing {len(facts['tenants'])} tenants, jobs up to id {facts['max_job']}")
        return await time_pages(db, facts, repeat)
    finally:
        await db.dispose()
        if schema:
            await _pg_schema("DROP", f"{schema} CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="1.0: the issue's sizes")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--engines", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument(
        "--database-url",
        help="seed this database (unless it has tenants already) and keep it; one engine",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.database_url:
        args.engines = ["postgresql" if args.database_url.startswith("postgres") else "sqlite"]
    results = {}
    for engine in args.engines:
        results[engine] = asyncio.run(
            run_engine(
                engine,
                args.scale,
                args.repeat,
                lambda m, e=engine: print(f"[{e}] {m}", flush=True),
                args.database_url,
            )
        )
    if args.json:
        print(json.dumps({"scale": args.scale, "pages": results}, indent=2))
        return
    names = [name for name, _ in PAGES]
    print(f"\nconsole pages at scale {args.scale:g} (median / worst of {args.repeat}, ms)")
    print(f"{'page':34}" + "".join(f"{e:>22}" for e in results))
    for name in names:
        cells = "".join(
            f"{results[e][name]['median_ms']:>12.1f} / {results[e][name]['max_ms']:<7.1f}"
            for e in results
        )
        print(f"{name:34}{cells}")


if __name__ == "__main__":
    main()
