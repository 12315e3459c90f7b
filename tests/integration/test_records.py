"""Records landing in declared tables, on SQLite and PostgreSQL: batched, in the page's
transaction, with per-record isolation, deletes, sweeps and the change feed."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from synckit.store.db import Database

sys.path.insert(0, str(Path(__file__).parents[1] / "apps"))
import records_app
from records_app import OrdersApi, order


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


def _key(r: Any) -> Any:
    m = r._mapping
    return m["id"] if "id" in m else (m["order_id"], m["n"])


async def rows(db: Database, table: str, tenant: str = "acme") -> dict[str, Any]:
    async with db.read() as conn:
        found = await conn.execute(
            text(f"SELECT * FROM {table} WHERE tenant = :t ORDER BY _seq"), {"t": tenant}
        )
        return {_key(r): dict(r._mapping) for r in found}


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


async def dead(db: Database) -> dict[str, Any]:
    async with db.read() as conn:
        found = await conn.execute(
            text("SELECT record_id, error_message, status, id FROM dead_letters ORDER BY id")
        )
        return {r.record_id: r for r in found}


async def test_one_record_the_model_refuses_and_one_the_db_refuses_fail_alone_then_replay(
    db: Database, api: OrdersApi, shop: records_app.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of 100 records, one without a customer (the model) and one whose points pass a
    64-bit column (the database): 98 land, two dead letters name the causes, and a
    replay after the data is fixed lands both."""
    data = [order(i) for i in range(100)]
    del data[10]["customer"]
    data[20]["points"] = 2**70
    api.data["acme"] = data
    result = await shop.poll(db, "acme", "orders")
    assert (result.ok, result.failed) == (98, 2)
    got = await rows(db, "orders")
    assert len(got) == 98 and "o000010" not in got and "o000020" not in got
    letters = await dead(db)
    assert set(letters) == {"o000010", "o000020"}
    assert "customer: Field required" in letters["o000010"].error_message
    assert "database refused" in letters["o000020"].error_message
    assert "orders" in letters["o000020"].error_message

    # The fix: the mapping fills what the API leaves out and caps what the table cannot hold.
    def fixed(raw: dict[str, Any]) -> dict[str, Any]:
        points = raw.get("points")
        return {
            "customer": "unknown",
            **raw,
            "points": None if points is None else min(points, 2**62),
        }

    monkeypatch.setattr(records_app, "fix", fixed)
    from synckit.dlq.replay import ReplayProcessor, replayers_from_app

    replayers, _ = replayers_from_app(shop, db)
    summary = await ReplayProcessor(db, replayers).replay_ids(
        [letters["o000010"].id, letters["o000020"].id]
    )
    assert summary.resolved == 2, summary
    got = await rows(db, "orders")
    assert len(got) == 100
    assert got["o000010"]["customer"] == "unknown" and got["o000020"]["points"] == 2**62


async def test_a_nul_in_text_is_refused_by_postgresql_alone(
    db: Database, api: OrdersApi, shop: records_app.App
) -> None:
    """PostgreSQL text cannot hold NUL: that record alone is dead-lettered (SQLite
    stores it)."""
    data = [order(i) for i in range(5)]
    data[2]["customer"] = "a\x00b"
    api.data["acme"] = data
    result = await shop.poll(db, "acme", "orders")
    got = await rows(db, "orders")
    if db.is_postgres:
        assert (result.ok, result.failed) == (4, 1) and "o000002" not in got
        assert "database refused" in (await dead(db))["o000002"].error_message
    else:
        assert (result.ok, result.failed) == (5, 0) and got["o000002"]["customer"] == "a\x00b"


async def test_a_completed_full_sync_sweeps_exactly_the_rows_it_did_not_see(
    db: Database, api: OrdersApi, shop: records_app.App
) -> None:
    api.data["acme"] = [order(i, lines=2) for i in range(250)]
    await shop.poll(db, "acme", "orders")
    feed = shop.records("acme", "orders")
    start = (await feed.changes(since=0, limit=10_000)).cursor
    gone = {5, 150, 249}
    api.data["acme"] = [order(i, lines=2) for i in range(250) if i not in gone]
    await shop.poll(db, "acme", "orders")
    got = await rows(db, "orders")
    deleted = {k for k, r in got.items() if r["_deleted_at"] is not None}
    assert deleted == {f"o{i:06d}" for i in gone}
    lines = await rows(db, "order_lines")
    assert {k for k, r in lines.items() if r["_deleted_at"] is not None} == {
        (f"o{i:06d}", n) for i in gone for n in range(2)
    }
    changes = await feed.changes(since=start, limit=100)
    assert [(c.op, c.key) for c in changes.changes] == [
        ("deleted", (f"o{i:06d}",)) for i in sorted(gone)
    ]


async def test_a_full_sync_failing_part_way_deletes_nothing(
    db: Database, api: OrdersApi, shop: records_app.App
) -> None:
    api.data["acme"] = [order(i) for i in range(250)]
    await shop.poll(db, "acme", "orders")
    api.data["acme"] = [order(i) for i in range(250) if i != 3]
    api.fail_page["acme"] = 3
    with pytest.raises(Exception, match="400"):
        await shop.poll(db, "acme", "orders")
    got = await rows(db, "orders")
    assert len(got) == 250 and all(r["_deleted_at"] is None for r in got.values())


async def test_the_change_feed_pages_adds_updates_and_deletes_in_order(
    db: Database, api: OrdersApi, shop: records_app.App
) -> None:
    """Adds, updates and explicit deletes (``@removed``), read 7 at a time from a cursor:
    every change once, in order, the last state of each row."""
    api.data["acme"] = [order(i) for i in range(20)]
    await shop.poll(db, "acme", "orders")
    feed = shop.records("acme", "orders")
    cursor = (await feed.changes(since=0, limit=1000)).cursor
    batch = [order(i, version=1) for i in (3, 4)] + [order(i) for i in range(20, 23)]
    batch += [{"id": "o000007", "@removed": {"reason": "deleted"}}]
    api.data["acme"] = [order(i) for i in range(20) if i not in (3, 4)] + batch
    # The same full sync also sweeps nothing else: every other row is seen unchanged.
    await shop.poll(db, "acme", "orders")
    seen: list[tuple[str, str]] = []
    while True:
        page = await feed.changes(since=cursor, limit=2)
        seen += [(c.op, c.key[0]) for c in page.changes]
        assert page.cursor >= cursor
        cursor = page.cursor
        if not page.more:
            break
    assert sorted(seen) == sorted(
        [("updated", "o000003"), ("updated", "o000004"), ("deleted", "o000007")]
        + [("added", f"o{i:06d}") for i in range(20, 23)]
    )
    assert len(seen) == 6
    row = await feed.get("o000003")
    assert row is not None and row["total"] == order(3, version=1)["total"]
