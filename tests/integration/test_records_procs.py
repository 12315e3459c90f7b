"""kill -9 of worker processes while they land records (3 processes, both engines).

Four tenants, 15 pages of 100 orders each (and a line per order), synced by three
`synckit worker` processes that are killed with SIGKILL three times mid-sync and started
again. After every kill, each tenant's table agrees with its checkpoint (a first sync
at page p has exactly the orders of pages 1..p-1; a completed one, all of them), and at
the end every table equals the API's data exactly: no row missing, repeated or stale.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import spawn_worker, stop_all  # tests/
from sqlalchemy import text

from synckit.store.db import open_database

sys.path.insert(0, str(Path(__file__).parents[1] / "apps"))
import records_app
from records_app import OrdersApi, order

TENANTS = [f"t{i}" for i in range(4)]
ORDERS = 1500  # 15 pages of 100
#: Generous: three workers sync 6,000 records on a busy 2-core machine.
BUDGET = 300.0


@pytest.fixture
def api() -> Iterator[OrdersApi]:
    server = OrdersApi(per_page=100)
    try:
        yield server
    finally:
        server.close()


def _expected(tenant: str) -> dict[str, dict[str, Any]]:
    base = int(tenant[1:]) * 100_000
    return {o["id"]: o for o in (order(base + i) for i in range(ORDERS))}


async def _snapshot(url: str) -> dict[str, tuple[Any, dict[str, Any], int]]:
    """Per tenant, in one read transaction: its checkpoint, its live orders, its lines."""
    d = open_database(url)
    try:
        async with d.read() as conn:
            if d.is_postgres:  # one snapshot for the three statements
                await conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
            cps = {
                r.tenant: r.cursor
                for r in await conn.execute(text("SELECT tenant, cursor FROM checkpoints"))
            }
            rows: dict[str, dict[str, Any]] = {t: {} for t in TENANTS}
            found = await conn.execute(
                text(
                    "SELECT tenant, id, customer, total, tags FROM orders WHERE _deleted_at IS NULL"
                )
            )
            for r in found:
                rows[r.tenant][r.id] = r
            lines = {
                r.tenant: int(r.n)
                for r in await conn.execute(
                    text(
                        "SELECT tenant, count(*) AS n FROM order_lines"
                        " WHERE _deleted_at IS NULL GROUP BY tenant"
                    )
                )
            }
        out = {}
        for t in TENANTS:
            cp = cps.get(t)
            if isinstance(cp, str):  # SQLite hands JSON text back through text()
                import json

                cp = json.loads(cp)
            out[t] = (cp, rows[t], lines.get(t, 0))
        return out
    finally:
        await d.dispose()


def _check(snapshot: dict[str, tuple[Any, dict[str, Any], int]], *, final: bool) -> int:
    """The tables agree with their checkpoints and hold the API's values; rows landed."""
    landed = 0
    for t, (cp, rows, lines) in snapshot.items():
        expected = _expected(t)
        ordered = list(expected)
        if cp is None:
            assert rows == {}, t
        elif "page" in cp and len(rows) != ORDERS:
            # A first sync in progress: exactly the pages before the checkpoint's.
            assert set(rows) == set(ordered[: (cp["page"] - 1) * 100]), (t, cp, len(rows))
        else:
            assert set(rows) == set(expected), (t, cp, len(rows))
        for key, r in rows.items():
            want = expected[key]
            assert (r.customer, float(r.total)) == (want["customer"], want["total"]), key
        assert lines == len(rows), (t, lines, len(rows))
        if final:
            assert set(rows) == set(expected), t
        landed += len(rows)
    return landed


@pytest.mark.timeout(900)
async def test_kill_9_during_landing_leaves_every_table_equal_to_its_checkpoint(
    migrated_url: str, api: OrdersApi, tmp_path: Path
) -> None:
    d = open_database(migrated_url)
    try:
        app = records_app.App([records_app.Shop])
        await app.upgrade_records(d)
        for t in TENANTS:
            api.data[t] = list(_expected(t).values())
            await app.add_tenant(d, t, "shop", schedule="every 1s")
    finally:
        await d.dispose()
    env = {"RECORDS_APP_URL": api.url}
    log = tmp_path / "queue.log"
    total = len(TENANTS) * ORDERS
    for kill in range(3):
        workers = [
            spawn_worker(migrated_url, log, "--lease", "2s", app="records_app:app", env=env)
            for _ in range(3)
        ]
        try:
            # Kill once a share of the rows (more each round) has landed.
            goal = total * (kill + 1) // 5
            deadline = time.monotonic() + BUDGET
            while _check(await _snapshot(migrated_url), final=False) < goal:
                assert time.monotonic() < deadline, "no progress within the budget"
                assert all(w.poll() is None for w in workers), "a worker exited"
                await asyncio.sleep(0.2)  # each look reads every table: not too often
            for w in workers:
                w.send_signal(signal.SIGKILL)
            for w in workers:
                w.wait()
        finally:
            stop_all(workers)
        _check(await _snapshot(migrated_url), final=False)
    workers = [
        spawn_worker(migrated_url, log, "--lease", "2s", app="records_app:app", env=env)
        for _ in range(3)
    ]
    try:
        deadline = time.monotonic() + BUDGET
        while True:
            snap = await _snapshot(migrated_url)
            # Every tenant's first full sync completed (the next ones land no change).
            if _check(snap, final=False) == total:
                break
            assert time.monotonic() < deadline, "the syncs did not complete within the budget"
            await asyncio.sleep(0.2)
    finally:
        stop_all(workers)
    _check(await _snapshot(migrated_url), final=True)
    # Nothing was dead-lettered, and no row was written twice (one row per key).
    d = open_database(migrated_url)
    try:
        async with d.read() as conn:
            # (A poll job killed three times running may be dead-lettered as a job whose
            # worker kept crashing, on a busy machine: that is the runtime's poison guard,
            # not a record lost.)
            letters = await conn.execute(
                text("SELECT record_id, error_message FROM dead_letters WHERE kind = :k"),
                {"k": "record:orders"},
            )
            assert [tuple(r) for r in letters] == []
            n = (await conn.execute(text("SELECT count(*) FROM orders"))).scalar()
            assert n == total
    finally:
        await d.dispose()
