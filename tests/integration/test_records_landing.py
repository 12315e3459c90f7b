"""Records landing, on SQLite and PostgreSQL: what a page's changes notify, a record
landing with its child rows or not at all, and a ``hold`` stream held by a record the
database refuses."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from synckit import App, Connector, Page, Records, Stream, SyncContext
from synckit.runtime.sync.records import land, prepare
from synckit.store.db import Database, SyncConn
from synckit.store.records.statements import NOTIFY_CHANNEL

sys.path.insert(0, str(Path(__file__).parents[1] / "apps"))
import records_app
from records_app import Order, OrdersApi, order
from waits import EVENT_TIMEOUT


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[OrdersApi]:
    server = OrdersApi(per_page=100)
    monkeypatch.setattr(records_app.Shop, "base_url", server.url)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def tenant() -> str:
    # NOTIFY's channel is the database's, shared by every test: a tenant of this test's own.
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def shop(db: Database, api: OrdersApi, tenant: str) -> AsyncIterator[records_app.App]:
    app = records_app.App([records_app.Shop])
    app.bind(db)
    await app.upgrade_records(db)
    await app.add_tenant(db, tenant, "shop")
    yield app


async def rows(db: Database, table: str, tenant: str) -> dict[Any, Any]:
    async with db.read() as conn:
        found = await conn.execute(
            text(f"SELECT * FROM {table} WHERE tenant = :t ORDER BY _seq"), {"t": tenant}
        )
        out = {}
        for r in found:
            m = dict(r._mapping)
            out[m["id"] if "id" in m else (m["order_id"], m["n"])] = m
        return out


async def dead(db: Database) -> dict[str, Any]:
    async with db.read() as conn:
        found = await conn.execute(
            text("SELECT record_id, error_message, status FROM dead_letters ORDER BY id")
        )
        return {r.record_id: r for r in found}


# --- what changed, and what is notified -------------------------------------------------


async def _land_page(db: Database, tenant: str, records: list[Any], sync: str) -> int:
    """Land ``records`` as the one page of full sync ``sync``; how many rows changed."""
    landing, failures, _ = prepare(
        records_app.ORDERS, tenant, "orders", records, lambda raw, exc: exc, sync=sync
    )
    assert not failures

    def tx(conn: SyncConn) -> int:
        land(conn, landing, records_app.App([records_app.Shop]).clock())
        return landing.changed

    return int(await db.write(tx))


async def test_a_full_resync_with_nothing_changed_changes_no_row(
    db: Database, shop: records_app.App, tenant: str
) -> None:
    """A full sync marks every row it sees (``_sync``), changed or not: only the rows whose
    data changed count as changes (they are what a cycle notifies)."""
    data = [order(i, lines=2) for i in range(30)]
    assert await _land_page(db, tenant, data, "sync-1") == 30 + 60
    assert await _land_page(db, tenant, data, "sync-2") == 0
    data[4] = order(4, version=1, lines=2)  # the order and both its lines change
    assert await _land_page(db, tenant, data, "sync-3") == 3


async def test_a_cycle_notifies_only_when_rows_changed(
    db: Database, api: OrdersApi, shop: records_app.App, tenant: str
) -> None:
    """PostgreSQL: a full re-sync that changes nothing sends no NOTIFY. Notifications
    arrive in commit order, so the one after a later, changing cycle would come second
    if the unchanged one had sent any."""
    if not db.is_postgres:
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's (the changed counts: the test above)")
    got: asyncio.Queue[str] = asyncio.Queue()

    def heard(*args: Any) -> None:
        if str(args[3]).startswith(f"{tenant} "):  # other tests notify on the channel too
            got.put_nowait(str(args[3]))

    async with db.raw_pg() as raw:
        await raw.add_listener(NOTIFY_CHANNEL, heard)
        try:
            api.data[tenant] = [order(i) for i in range(100)]  # one page, one transaction
            await shop.poll(db, tenant, "orders")
            assert await asyncio.wait_for(got.get(), EVENT_TIMEOUT) == f"{tenant} orders"
            await shop.poll(db, tenant, "orders")  # nothing changed
            api.data[tenant][50] = order(50, version=1)
            await shop.poll(db, tenant, "orders")
            assert await asyncio.wait_for(got.get(), EVENT_TIMEOUT) == f"{tenant} orders"
            # That was the changing cycle's: a marker sent now arrives next, nothing before.
            await raw.execute(f"NOTIFY {NOTIFY_CHANNEL}, '{tenant} marker'")
            assert await asyncio.wait_for(got.get(), EVENT_TIMEOUT) == f"{tenant} marker"
        finally:
            await raw.remove_listener(NOTIFY_CHANNEL, heard)


# --- a record lands with its children, or not at all ------------------------------------


async def test_a_child_row_the_database_refuses_fails_its_parent_with_it(
    db: Database, api: OrdersApi, shop: records_app.App, tenant: str
) -> None:
    """A line whose quantity passes a 64-bit column: its order and its lines fail
    together (the order's row stays as it was, or absent if new), a dead letter names
    the child table; the rest of the page lands."""
    api.data[tenant] = [order(i, lines=2) for i in range(10)]
    await shop.poll(db, tenant, "orders")
    before = await rows(db, "orders", tenant)
    before_lines = await rows(db, "order_lines", tenant)
    data = [order(i, version=1, lines=2) for i in range(12)]
    data[3]["lines"][1]["qty"] = 2**70  # an order landed before
    data[11]["lines"][0]["qty"] = 2**70  # a new order
    api.data[tenant] = data
    result = await shop.poll(db, tenant, "orders")
    assert (result.ok, result.failed) == (10, 2)
    got = await rows(db, "orders", tenant)
    lines = await rows(db, "order_lines", tenant)
    assert "o000011" not in got
    assert not {k for k in lines if k[0] == "o000011"}
    assert got["o000003"]["total"] == before["o000003"]["total"]
    assert got["o000003"]["_seq"] == before["o000003"]["_seq"]
    for n in range(2):
        assert lines[("o000003", n)]["qty"] == before_lines[("o000003", n)]["qty"]
        assert lines[("o000003", n)]["_deleted_at"] is None
    assert got["o000004"]["total"] == order(4, version=1)["total"]
    assert lines[("o000004", 1)]["qty"] == order(4, version=1, lines=2)["lines"][1]["qty"]
    letters = await dead(db)
    assert set(letters) == {"o000003", "o000011"}
    assert all("order_lines" in r.error_message for r in letters.values())


# --- a hold stream holds at a record the database refuses --------------------------------


class HeldShop(Connector):
    """Pages of 10 orders at ``?page=N``; the checkpoint is the next page."""

    name = "heldshop"
    base_url = "http://127.0.0.1:9"
    streams = (
        Stream(
            "orders",
            records=Records(Order, table="held_orders", key="id", map=lambda r: r),
            policy="hold",
        ),
    )

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        page = checkpoint["page"] if isinstance(checkpoint, dict) else 1
        while True:
            body = (
                await ctx.http.get("/orders", params={"page": page, "tenant": self.tenant})
            ).json()
            nxt = body["next"]
            yield Page(body["items"], checkpoint={"page": nxt or page + 1})
            if nxt is None:
                return
            page = nxt


@pytest.fixture
async def held(db: Database, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[App, Any]]:
    server = OrdersApi(per_page=10)
    monkeypatch.setattr(HeldShop, "base_url", server.url)
    app = App([HeldShop])
    app.bind(db)
    await app.upgrade_records(db)
    await app.add_tenant(db, "acme", "heldshop")
    try:
        yield app, server
    finally:
        server.close()


async def _checkpoint(db: Database) -> Any:
    from synckit.store.checkpoints import list_checkpoints

    found = await list_checkpoints(db, "acme")
    return found[0][2] if found else None


@pytest.mark.parametrize("cause", ["model", "database"])
async def test_a_hold_stream_holds_at_a_refused_record(
    db: Database, held: tuple[App, Any], cause: str
) -> None:
    """30 orders on 3 pages, one on page 2 refused by the model or by the database
    (points past 64 bits): either way the cycle stops at page 2 with that page's other
    records landed, the checkpoint stays before it, and the next cycle reads it again."""
    app, api = held
    data = [order(i) for i in range(30)]
    if cause == "model":
        del data[15]["customer"]
    else:
        data[15]["points"] = 2**70
    api.data["acme"] = data
    result = await app.poll(db, "acme", "orders")
    assert result.held and (result.pages, result.ok, result.failed) == (2, 19, 1)
    assert await _checkpoint(db) == {"page": 2}
    got = await rows(db, "held_orders", "acme")
    assert set(got) == {f"o{i:06d}" for i in range(20) if i != 15}
    assert set(await dead(db)) == {"o000015"}
    again = await app.poll(db, "acme", "orders")  # still refused: held again at page 2
    assert again.held and (again.pages, again.ok, again.failed) == (1, 9, 1)
    assert await _checkpoint(db) == {"page": 2}
    data[15] = order(15)  # fixed at the API
    done = await app.poll(db, "acme", "orders")
    assert not done.held and done.pages == 2 and done.failed == 0
    assert await _checkpoint(db) == {"page": 4}
    assert len(await rows(db, "held_orders", "acme")) == 30


# --- a table without children: the merge takes its seqs itself ------------------------------


async def test_a_one_table_page_takes_contiguous_seqs_and_a_refusal_still_lands_the_rest(
    db: Database, held: tuple[App, Any], tenant: str
) -> None:
    """A page of a table without children (on PostgreSQL its merge takes the page's seqs
    and notifies in one statement): its rows get the next seqs in order, an unchanged
    re-sync takes seqs but changes no row, and a page with a record the database refuses
    lands the others with seqs past every earlier one; ``last_seq`` is never behind a row.
    PostgreSQL notifies the pages that changed a row, and only those."""
    decl = HeldShop.streams[0].records
    assert decl is not None and not decl.children

    async def land_page(records: list[Any], sync: str) -> tuple[int, int]:
        landing, failures, _ = prepare(decl, tenant, "orders", records, lambda r, e: e, sync=sync)
        assert not failures

        def tx(conn: SyncConn) -> tuple[int, int]:
            land(conn, landing, records_app.App([records_app.Shop]).clock())
            return landing.changed, len(landing.refused)

        return await db.write(tx)

    async def seqs() -> tuple[dict[str, int], int]:
        async with db.read() as conn:
            found = await conn.execute(
                text("SELECT id, _seq FROM held_orders WHERE tenant = :t"), {"t": tenant}
            )
            last = await conn.execute(
                text("SELECT last_seq FROM record_tables WHERE name = 'held_orders'")
            )
            return {r.id: r._seq for r in found}, int(last.scalar_one())

    heard: asyncio.Queue[str] = asyncio.Queue()

    def listener(*args: Any) -> None:
        if str(args[3]).startswith(f"{tenant} "):  # other tests notify on the channel too
            heard.put_nowait(str(args[3]))

    async def notified() -> str | None:
        if not db.is_postgres:
            return None
        async with db.raw_pg() as raw:  # a marker: every earlier notification came first
            await raw.execute(f"NOTIFY {NOTIFY_CHANNEL}, '{tenant} marker'")
        first = await asyncio.wait_for(heard.get(), EVENT_TIMEOUT)
        if first == f"{tenant} marker":
            return None
        assert await asyncio.wait_for(heard.get(), EVENT_TIMEOUT) == f"{tenant} marker"
        return first

    async with contextlib.AsyncExitStack() as stack:
        if db.is_postgres:
            raw = await stack.enter_async_context(db.raw_pg())
            await raw.add_listener(NOTIFY_CHANNEL, listener)
        data = [order(i) for i in range(30)]
        assert await land_page(data, "s1") == (30, 0)
        assert await notified() == (f"{tenant} orders" if db.is_postgres else None)
        got, last = await seqs()
        assert [got[f"o{i:06d}"] for i in range(30)] == list(range(1, 31)) and last == 30
        assert await land_page(data, "s2") == (0, 0)
        assert await notified() is None
        assert (await seqs())[0] == got
        data[7] = order(7, version=1)
        data[9]["points"] = 2**70  # past a 64-bit column: the database refuses it
        assert await land_page(data, "s3") == (1, 1)
        assert await notified() == (f"{tenant} orders" if db.is_postgres else None)
        got, last = await seqs()
        assert got["o000007"] > 60 and max(got.values()) <= last
        assert all(s <= 30 for k, s in got.items() if k != "o000007")
