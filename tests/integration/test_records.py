"""Records landing in declared tables, on SQLite and PostgreSQL: batched, in the page's
transaction, with per-record isolation, deletes, sweeps and the change feed."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from synckit.store import dead_letters as dlq_store
from synckit.store.db import Database

sys.path.insert(0, str(Path(__file__).parents[1] / "apps"))
import records_app  # noqa: E402
from records_app import OrdersApi, order  # noqa: E402


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[OrdersApi]:
    server = OrdersApi(per_page=100)
    monkeypatch.setattr(records_app.Shop, "base_url", server.url)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
async def shop(db: Database, api: OrdersApi) -> AsyncIterator[records_app.App]:
    app = records_app.App([records_app.Shop])
    app.bind(db)
    await app.upgrade_records(db)
    await app.add_tenant(db, "acme", "shop")
    yield app


async def rows(db: Database, table: str, tenant: str = "acme") -> dict[str, Any]:
    async with db.read() as conn:
        found = await conn.execute(
            text(f"SELECT * FROM {table} WHERE tenant = :t ORDER BY _seq"), {"t": tenant}
        )
        return {
            (r._mapping["id"] if "id" in r._mapping else (r.order_id, r.n)): dict(r._mapping)
            for r in found
        }


async def test_a_cycle_lands_every_page_in_its_table_with_children(
    db: Database, api: OrdersApi, shop: records_app.App
) -> None:
    """250 orders on 3 pages land as 250 rows and their 500 lines, with growing seqs."""
    api.data["acme"] = [order(i, lines=2) for i in range(250)]
    result = await shop.poll(db, "acme", "orders")
    assert (result.pages, result.ok, result.failed) == (3, 250, 0)
    got = await rows(db, "orders")
    assert set(got) == {f"o{i:06d}" for i in range(250)}
    assert got["o000007"]["total"] == 10.5 and got["o000007"]["customer"] == "c7"
    seqs = [r["_seq"] for r in got.values()]
    assert seqs == sorted(seqs) and len(set(seqs)) == 250
    lines = await rows(db, "order_lines")
    assert len(lines) == 500


async def test_a_rerun_with_nothing_changed_reports_no_change(
    db: Database, api: OrdersApi, shop: records_app.App
) -> None:
    api.data["acme"] = [order(i) for i in range(120)]
    await shop.poll(db, "acme", "orders")
    feed = shop.records("acme", "orders")
    first = await feed.changes(since=0, limit=1000)
    assert len(first.changes) == 120 and {c.op for c in first.changes} == {"added"}
    await shop.poll(db, "acme", "orders")
    again = await feed.changes(since=first.cursor)
    assert again.changes == [] and again.cursor == first.cursor
