"""Records landing in declared tables: ``python -m bench.records [--json]``.

``--tenants`` tenants x ``--pages`` pages x 100 records, from a fake API on loopback (a
process of its own, 0 ms latency, pages encoded once, each response in one send) into a
declared table (``bench_orders``, upsert on tenant + id), per engine (``--engines``) and
per number of ``synckit worker`` processes (``--workers 1,2``). Keys,
``<run>_<engine>_<n>w``:

* ``initial_*``: the first full sync of every tenant into an empty table;
* ``incremental_*``: the API changes 10% of the records; each tenant's cycle asks for
  what changed since its checkpoint (``changed_rows`` counts the change feed's rows);
* ``rerun_*``: the same, with nothing changed;
* ``replay_*``: every checkpoint wiped, every tenant synced again in full
  (``duplicates``: rows beyond one per key, must be 0; ``changed_rows`` must be 0).

Before them, off the clock, the workers start and sync two tenants each (a warm-up: the
first compiles, prepared statements and lazy imports are a worker's once, not each
record's; those rows are then deleted). Each run gives ``records``, ``wall_s`` (first
cycle started to last cycle finished), ``records_per_s``, ``records_per_s_per_worker``,
``worker_cpu_us_per_record`` (the workers' user + system CPU over the run, per record
fetched), ``db_cpu_us_per_record`` (PostgreSQL's server processes; on SQLite the
database runs inside the workers, so it is part of the worker figure: null; every
process of the server counts: other users of a shared server too).
``db_deadlocks`` (PostgreSQL) the deadlocks the server detected meanwhile (every
database of the server: other users of a shared server count too).
``feed_query_ms_<engine>``: one change-feed page (100 changes) read at a cursor in the
middle of a table of ``--feed-rows`` rows of one tenant (median of 20).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from synckit import App, Connector, Page, Records, Stream, SyncContext

ROOT = Path(__file__).resolve().parent.parent
PER_PAGE = 100


# --- the app the workers run (--app bench.records:app) ------------------------------------


class BenchOrder(BaseModel):
    id: str
    customer: str
    total: float
    status: str
    placed_at: datetime
    tags: list[str]
    version: int


class BenchShop(Connector):
    """Full sync page by page; then incremental: what changed since the version it saw."""

    name = "bench_shop"
    base_url = os.environ.get("BENCH_RECORDS_URL", "http://127.0.0.1:9")
    streams = (
        Stream("orders", records=Records(BenchOrder, table="bench_orders", key="id", sweep=True)),
    )

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        cp = checkpoint or {}
        since = cp.get("version")
        page = cp.get("page", 1)
        sync = cp.get("sync") or datetime.now(UTC).isoformat()
        while True:
            params: dict[str, Any] = {"tenant": self.tenant, "page": page}
            if since is not None:
                params["since"] = since
            body = (await ctx.http.get("/orders", params=params)).json()
            nxt = body["next"]
            if since is not None:  # incremental: no sweep
                done = {"version": body["version"]}
                yield Page(body["items"], checkpoint={**done, "page": nxt} if nxt else done)
            else:
                last = nxt is None
                cp_next = {"version": body["version"]} if last else {"page": nxt, "sync": sync}
                yield Page(body["items"], checkpoint=cp_next, full_sync=sync, sweep=last)
            if nxt is None:
                return
            page = nxt


app = App([BenchShop], scheduler_every=timedelta(seconds=2))


# --- the fake API (a process of its own) ----------------------------------------------------


def _record(tenant: str, i: int, version: int) -> dict[str, Any]:
    return {
        "id": f"{tenant}-{i:07d}",
        "customer": f"customer {i % 997}",
        "total": round(i * 0.25 + version, 2),
        "status": "open" if version == 0 else "changed",
        "placed_at": "2026-11-01T10:00:00+00:00",
        "tags": ["bench", f"v{version}"],
        "version": version,
    }


def serve(pages: int, port_file: str) -> None:
    """Serve ``GET /orders?tenant&page[&since]``; ``POST /version/<v>`` makes every 10th
    record change to version ``v``. Pages are encoded once per (tenant, page, version)."""
    state = {"version": 0}
    cache: dict[tuple[str, int, int, int | None], bytes] = {}

    def body(tenant: str, page: int, since: int | None) -> bytes:
        v = state["version"]
        key = (tenant, page, v, since)
        found = cache.get(key)
        if found is not None:
            return found
        if since is None:
            idx = range((page - 1) * PER_PAGE, min(page * PER_PAGE, pages * PER_PAGE))
            items = [_record(tenant, i, v if i % 10 == 0 else 0) for i in idx]
            more = page < pages
        else:
            changed = [i for i in range(0, pages * PER_PAGE, 10)] if v > since else []
            chunk = changed[(page - 1) * PER_PAGE : page * PER_PAGE]
            items = [_record(tenant, i, v) for i in chunk]
            more = page * PER_PAGE < len(changed)
        out = json.dumps({"items": items, "next": page + 1 if more else None, "version": v})
        cache[key] = out.encode()
        return cache[key]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # One send per response, no Nagle: written as headers, then body, the body waited
        # for the client's delayed ACK of the headers (~40 ms a page on loopback).
        wbufsize = 1 << 20
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            from urllib.parse import parse_qsl, urlsplit

            q = dict(parse_qsl(urlsplit(self.path).query))
            since = int(q["since"]) if "since" in q else None
            self._send(body(q["tenant"], int(q["page"]), since))

        def do_POST(self) -> None:
            state["version"] = int(self.path.rsplit("/", 1)[1])
            cache.clear()
            self._send(b"{}")

        def _send(self, data: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever()


@contextlib.contextmanager
def api_process(pages: int, tmp: Path) -> Any:
    port_file = tmp / f"port-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.records", "--serve", str(pages), str(port_file)],
        cwd=ROOT,
    )
    try:
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}"
    finally:
        proc.terminate()
        proc.wait()


# --- the runs -----------------------------------------------------------------------------


def _set_version(url: str, v: int) -> None:
    import httpx

    httpx.post(f"{url}/version/{v}").raise_for_status()


async def _enqueue(db: Any, tenants: list[str]) -> None:
    from synckit.clock import utcnow
    from synckit.runtime.sync.poll import POLL_KIND, POLL_MAX_ATTEMPTS, poll_key
    from synckit.store.jobs.enqueueing import JobSpec, enqueue_new

    specs = [
        JobSpec(
            kind=POLL_KIND,
            payload={"tenant": t, "connector": BenchShop.name, "stream": "orders"},
            resource_key=f"{BenchShop.name}:{t}",
            unique_key=poll_key(t, "orders"),
            max_attempts=POLL_MAX_ATTEMPTS,
        )
        for t in tenants
    ]
    async with db.begin() as conn:
        await enqueue_new(conn, specs, now=utcnow())


async def _finished(db: Any, after: datetime) -> tuple[int, datetime | None, datetime | None, int]:
    from sqlalchemy import text

    async with db.read() as conn:
        r = (
            await conn.execute(
                text(
                    "SELECT count(*) FILTER (WHERE status = 'succeeded'), min(started_at),"
                    " max(finished_at), count(*) FILTER (WHERE status = 'dead')"
                    " FROM jobs WHERE kind = 'synckit.poll' AND created_at >= :after"
                )
                if db.is_postgres
                else text(
                    "SELECT sum(status = 'succeeded'), min(started_at), max(finished_at),"
                    " sum(status = 'dead') FROM jobs WHERE kind = 'synckit.poll'"
                    " AND created_at >= :after"
                ),
                {"after": after if db.is_postgres else _sqlite_ts(after)},
            )
        ).one()
    return int(r[0] or 0), _ts(r[1]), _ts(r[2]), int(r[3] or 0)


def _sqlite_ts(v: datetime) -> str:
    return v.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def _ts(v: Any) -> datetime | None:
    if v is None or isinstance(v, datetime):
        return v.replace(tzinfo=UTC) if isinstance(v, datetime) and v.tzinfo is None else v
    return datetime.fromisoformat(str(v)).replace(tzinfo=UTC)


def _cpu(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


async def _run(
    db: Any, tenants: list[str], procs: list[Any], records: int, setup: Any = None
) -> dict[str, Any]:
    """Enqueue a cycle per tenant and wait for them all: figures of the run."""
    from bench.sync import postgres_cpu_seconds, postgres_deadlocks

    pids = [p.pid for p in procs]
    if setup is not None:
        await setup()
    deadlocks0 = await postgres_deadlocks(db, settle=0) if db.is_postgres else 0
    cpu0 = _cpu(pids)
    db0 = postgres_cpu_seconds() if db.is_postgres else 0.0
    after = datetime.now(UTC) - timedelta(milliseconds=1)
    t0 = time.monotonic()
    await _enqueue(db, tenants)
    while True:
        done, first, last, dead = await _finished(db, after)
        if done + dead >= len(tenants):
            break
        if time.monotonic() - t0 > 900 or any(p.poll() is not None for p in procs):
            raise RuntimeError("the run did not finish (a worker exited, or 15 minutes passed)")
        await asyncio.sleep(0.05)
    cpu = _cpu(pids) - cpu0
    db_cpu = postgres_cpu_seconds() - db0 if db.is_postgres else None
    wall = (last - first).total_seconds() if first and last else 0.0
    workers = len(procs)
    deadlocks = await postgres_deadlocks(db) - deadlocks0 if db.is_postgres else None
    return {
        "db_deadlocks": deadlocks,
        "records": records,
        "dead_cycles": dead,
        "wall_s": round(wall, 3),
        "records_per_s": round(records / wall) if wall else None,
        "records_per_s_per_worker": round(records / wall / workers) if wall else None,
        "worker_cpu_us_per_record": round(cpu * 1e6 / records, 1) if records else None,
        "db_cpu_us_per_record": round(db_cpu * 1e6 / records, 1)
        if db_cpu is not None and records
        else None,
    }


async def _table_counts(db: Any) -> tuple[int, int, int]:
    from sqlalchemy import text

    async with db.read() as conn:
        r = (
            await conn.execute(
                text(
                    "SELECT count(*), count(DISTINCT tenant || '/' || id),"
                    " coalesce(max(_seq), 0) FROM bench_orders"
                )
            )
        ).one()
    return int(r[0]), int(r[1]), int(r[2])


async def _changed_since(db: Any, seq: int) -> int:
    from sqlalchemy import text

    async with db.read() as conn:
        q = text("SELECT count(*) FROM bench_orders WHERE _seq > :s")
        return int((await conn.execute(q, {"s": seq})).scalar_one())


async def measure(
    engine: str, tenants_n: int, pages: int, workers: int, tmp: Path
) -> dict[str, Any]:
    from bench.sync import fresh_database
    from synckit.store.db import open_database

    sys.path[:0] = [str(ROOT / "tests")]
    from procs import spawn_worker, stop_all, wait_started

    out: dict[str, Any] = {}
    total = tenants_n * pages * PER_PAGE
    tenants = [f"t{i:03d}" for i in range(tenants_n)]
    warm = [f"warm{i}" for i in range(2 * workers)]
    with api_process(pages, tmp) as url:
        async with fresh_database(engine, tmp) as db_url:
            db = open_database(db_url)
            try:
                await app.upgrade_records(db)
                for t in [*warm, *tenants]:
                    await app.add_tenant(db, t, BenchShop.name, schedule="every 1d")
                await app.schedule(db)  # the ticks of the new tenants: consumed, not run
                from sqlalchemy import text

                async with db.begin() as conn:
                    await conn.execute(text("DELETE FROM jobs WHERE kind = 'synckit.poll'"))
                env = {"BENCH_RECORDS_URL": url, "PYTHONPATH": str(ROOT)}
                # Each worker runs its share of the cycles: with room for all of them, the
                # first worker to claim took every one and the others idled (the "per
                # worker" figure then divided one worker's work by two).
                share = str(-(-tenants_n // workers))
                procs = [
                    spawn_worker(
                        db_url, tmp / "w.log", "--concurrency", share, env=env,
                        app="bench.records:app",
                    )
                    for _ in range(workers)
                ]  # fmt: skip
                try:
                    # Off the clock: imports, first connections, and the warm-up sync.
                    await asyncio.to_thread(wait_started, procs)
                    await _run(db, warm, procs, len(warm) * pages * PER_PAGE)
                    async with db.begin() as conn:
                        await conn.execute(
                            text("DELETE FROM bench_orders WHERE tenant LIKE 'warm%'")
                        )
                    out["initial"] = await _run(db, tenants, procs, total)
                    _, _, seq = await _table_counts(db)
                    _set_version(url, 1)
                    out["incremental"] = await _run(db, tenants, procs, total // 10)
                    out["incremental"]["changed_rows"] = await _changed_since(db, seq)
                    _, _, seq = await _table_counts(db)
                    out["rerun"] = await _run(db, tenants, procs, 0)
                    out["rerun"]["changed_rows"] = await _changed_since(db, seq)

                    async def wipe() -> None:
                        async with db.begin() as conn:
                            await conn.execute(text("DELETE FROM checkpoints"))

                    out["replay"] = await _run(db, tenants, procs, total, setup=wipe)
                    rows, distinct, _ = await _table_counts(db)
                    out["replay"]["changed_rows"] = await _changed_since(db, seq)
                    out["replay"]["duplicates"] = rows - distinct
                    out["replay"]["rows"] = rows
                finally:
                    stop_all(procs, timeout=15)
            finally:
                await db.dispose()
    return out


async def feed_query(engine: str, rows: int, tmp: Path) -> float:
    """Median ms of one change-feed page of 100 at a mid cursor, ``rows`` rows of one
    tenant in the table (written by one bulk statement, as landing would have)."""
    from sqlalchemy import text

    from bench.sync import fresh_database
    from synckit.store.db import open_database

    async with fresh_database(engine, tmp) as db_url:
        db = open_database(db_url)
        try:
            await app.upgrade_records(db)
            cols = (
                "tenant, id, customer, total, status, placed_at, tags, version,"
                " _synced_at, _seq, _added_seq"
            )
            if db.is_postgres:
                sql = (
                    f"INSERT INTO bench_orders ({cols}) SELECT 'feed', 'r' || g, 'c', g,"
                    " 'open', now(), '[\"a\"]'::jsonb, 0, now(), g, g"
                    " FROM generate_series(1, :n) AS g"
                )
            else:
                sql = (
                    f"WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s"
                    f" WHERE g < :n) INSERT INTO bench_orders ({cols}) SELECT 'feed', 'r' || g,"
                    " 'c', g, 'open', '2026-11-01 00:00:00.000000', '[\"a\"]', 0,"
                    " '2026-11-01 00:00:00.000000', g, g FROM s"
                )
            async with db.begin() as conn:
                await conn.execute(text(sql), {"n": rows})
                await conn.execute(
                    text("UPDATE record_tables SET last_seq = :n WHERE name = 'bench_orders'"),
                    {"n": rows},
                )
            if db.is_postgres:
                async with db.begin() as conn:
                    await conn.execute(text("ANALYZE bench_orders"))
            reader = app.records("feed", "orders", db=db)
            times = []
            for i in range(21):
                t0 = time.perf_counter()
                page = await reader.changes(since=rows // 2 + i * 100, limit=100)
                times.append(time.perf_counter() - t0)
                assert len(page.changes) == 100
            return round(statistics.median(times[1:]) * 1000, 2)
        finally:
            await db.dispose()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        serve(int(argv[1]), argv[2])
        return
    doc = __doc__ or ""
    p = argparse.ArgumentParser(prog="python -m bench.records", description=doc.split("\n")[0])
    p.add_argument("--tenants", type=int, default=8)
    p.add_argument("--pages", type=int, default=25)
    p.add_argument("--engines", default="sqlite,postgresql")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--feed-rows", type=int, default=1_000_000)
    p.add_argument("--json", action="store_true", help="Print the figures as one JSON object.")
    a = p.parse_args(argv)
    import logging

    logging.disable(logging.WARNING)
    out: dict[str, Any] = {"tenants": a.tenants, "pages": a.pages, "per_page": PER_PAGE}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in a.engines.split(","):
            for w in (int(x) for x in a.workers.split(",")):
                runs = asyncio.run(measure(engine, a.tenants, a.pages, w, Path(tmp)))
                for run, figures in runs.items():
                    for k, v in figures.items():
                        out[f"{run}_{engine}_{w}w_{k}"] = v
            if a.feed_rows:
                out[f"feed_query_ms_{engine}"] = asyncio.run(
                    feed_query(engine, a.feed_rows, Path(tmp))
                )
                out[f"feed_rows_{engine}"] = a.feed_rows
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:55} {v}")


if __name__ == "__main__":
    main()
