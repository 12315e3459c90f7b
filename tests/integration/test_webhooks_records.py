"""Webhook events landing through the records path, on both engines: a claimed batch's
records land in the stream's table in one transaction with the events' processed marks;
a failing event becomes one dead letter (replayable) while the rest land; an event
older than its row (a version column) never regresses it, whatever the order of
arrival."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, SecretStr

from synckit import App, Connector, Page, Records, Stream, SyncContext
from synckit.connectors.webhooks import StripeSignature, WebhookEvent, Webhooks, sign_stripe
from synckit.dlq.replay import ReplayProcessor, replayers_from_app
from synckit.runtime.sync import webhooks as webhooks_runtime
from synckit.runtime.sync.webhooks import dead_letter_kind, process_events
from synckit.store import webhooks as inbox
from synckit.store.db import Database
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import rows as dlq_rows
from synckit.web.webhooks import webhook_app

SECRET = "whsec_records_test"


class Cfg(BaseModel):
    webhook_secret: SecretStr


class Charge(BaseModel):
    id: str
    amount: int
    updated_at: datetime


BROKEN: set[str] = set()


class Charges(Connector[Cfg]):
    name = "charges"
    base_url = "http://127.0.0.1:9/"
    streams = [
        Stream(
            "charges",
            records=Records(
                Charge, table="wh_charges", map=lambda e: e["data"], version="updated_at"
            ),
        )
    ]
    webhooks = Webhooks(verify=StripeSignature(secret_field="webhook_secret"), records="charges")

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        if False:  # pragma: no cover - nothing to poll here
            yield Page([])

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        return None

    async def webhook_records(self, ctx: SyncContext, event: WebhookEvent) -> list[Any]:
        if event.event_id in BROKEN:
            raise RuntimeError(f"cannot read event {event.event_id}")
        return [event.json()]


@pytest.fixture
async def app(db: Database) -> App:
    BROKEN.clear()
    a = App(connectors=[Charges])
    await a.upgrade_records(db)
    await a.add_tenant(db, "t1", "charges", {"webhook_secret": SECRET})
    return a


@pytest.fixture
async def client(db: Database, app: App) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=webhook_app(app, database=db))
    async with httpx.AsyncClient(transport=transport, base_url="http://hooks") as c:
        yield c


def _event(eid: str, charge: str, amount: Any, at: str) -> dict[str, Any]:
    body = json.dumps(
        {"id": eid, "data": {"id": charge, "amount": amount, "updated_at": at}}
    ).encode()
    return {
        "content": body,
        "headers": {"Stripe-Signature": sign_stripe(SECRET, int(time.time()), body)},
    }


async def _rows(app: App, db: Database) -> dict[str, int]:
    rows = await app.records("t1", "charges", db=db).rows(limit=100)
    return {r["id"]: r["amount"] for r in rows}


async def test_events_land_in_the_table_in_one_transaction_per_batch(
    db: Database, app: App, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(30):
        r = await client.post(
            "/charges/t1", **_event(f"evt_{i}", f"ch_{i}", i, "2026-01-01T00:00:00Z")
        )
        assert r.status_code == 200
    landings: list[int] = []
    real = webhooks_runtime.land

    def counted(conn: Any, landing: Any, now: datetime) -> None:
        landings.append(len(landing.batches[0].rows))
        real(conn, landing, now)

    monkeypatch.setattr(webhooks_runtime, "land", counted)
    assert await process_events(db, app, "charges", "t1") == 30
    assert landings == [30]  # one landing (one statement per table) for the batch
    assert await _rows(app, db) == {f"ch_{i}": i for i in range(30)}
    counts = {(c.connector, c.tenant): c for c in await db.run_read(inbox.webhook_counts)}
    assert counts[("charges", "t1")].processed == 30


async def test_a_failing_event_is_one_dead_letter_the_rest_land_and_replay_lands_it(
    db: Database, app: App, client: httpx.AsyncClient
) -> None:
    BROKEN.add("evt_hook")
    await client.post("/charges/t1", **_event("evt_ok", "ch_ok", 1, "2026-01-01T00:00:00Z"))
    await client.post("/charges/t1", **_event("evt_hook", "ch_hook", 2, "2026-01-01T00:00:00Z"))
    await client.post(
        "/charges/t1", **_event("evt_model", "ch_model", "lots", "2026-01-01T00:00:00Z")
    )
    await client.post("/charges/t1", **_event("evt_nul", "ch_nul\x00", 4, "2026-01-01T00:00:00Z"))
    # PostgreSQL refuses a NUL in text (its event fails in the landing transaction);
    # SQLite stores it.
    pg = db.is_postgres
    assert await process_events(db, app, "charges", "t1") == (1 if pg else 2)
    assert await _rows(app, db) == ({"ch_ok": 1} if pg else {"ch_ok": 1, "ch_nul\x00": 4})
    letters = [
        d
        async for d in dlq_reads.iter_rows(
            db, dlq_rows.DlqFilter(kinds=(dead_letter_kind("charges"),))
        )
    ]
    failed = ["event:evt_hook", "event:evt_model", *(["event:evt_nul"] if pg else [])]
    assert sorted(d.record_id for d in letters) == failed
    assert any(
        "cannot read event" in d.error_message for d in letters if d.record_id == "event:evt_hook"
    )
    status = {e.event_id: e.status for e in await db.run_read(lambda c: inbox.recent_events(c))}
    nul = "failed" if pg else "processed"
    assert status == {
        "evt_ok": "processed",
        "evt_hook": "failed",
        "evt_model": "failed",
        "evt_nul": nul,
    }
    # Replayed once the connector can read it: the event lands and its letter resolves.
    BROKEN.clear()
    replayers, registry = replayers_from_app(app, db)
    hook = next(d for d in letters if d.record_id == "event:evt_hook")
    await ReplayProcessor(db, replayers, registry=registry).replay_ids([hook.id])
    assert await process_events(db, app, "charges", "t1") == 1
    assert (await _rows(app, db))["ch_hook"] == 2
    assert (await dlq_reads.get(db, hook.id)).status == "resolved"


async def test_an_older_event_never_regresses_a_row_in_any_order(
    db: Database, app: App, client: httpx.AsyncClient
) -> None:
    # Newest first, across batches: the older ones leave the row alone.
    await client.post("/charges/t1", **_event("e3", "ch_a", 3, "2026-01-03T00:00:00Z"))
    assert await process_events(db, app, "charges", "t1") == 1
    await client.post("/charges/t1", **_event("e1", "ch_a", 1, "2026-01-01T00:00:00Z"))
    await client.post("/charges/t1", **_event("e2", "ch_a", 2, "2026-01-02T00:00:00Z"))
    assert await process_events(db, app, "charges", "t1") == 2
    assert await _rows(app, db) == {"ch_a": 3}
    # Out of order within one batch: the newest wins, not the last to arrive.
    await client.post("/charges/t1", **_event("f5", "ch_b", 5, "2026-02-05T00:00:00Z"))
    await client.post("/charges/t1", **_event("f4", "ch_b", 4, "2026-02-04T00:00:00Z"))
    await client.post("/charges/t1", **_event("f6", "ch_a", 6, "2026-02-06T00:00:00Z"))
    assert await process_events(db, app, "charges", "t1") == 3
    assert await _rows(app, db) == {"ch_a": 6, "ch_b": 5}


async def test_console_page_lists_events_per_connector_and_replays_one(
    db: Database, migrated_url: str, app: App, client: httpx.AsyncClient
) -> None:
    from starlette.testclient import TestClient

    from synckit.web import WebConfig, create_app
    from synckit.web.base import CSRF_COOKIE

    BROKEN.add("evt_bad")
    await client.post("/charges/t1", **_event("evt_good", "ch_g", 1, "2026-01-01T00:00:00Z"))
    await client.post("/charges/t1", **_event("evt_bad", "ch_b", 2, "2026-01-01T00:00:00Z"))
    await process_events(db, app, "charges", "t1")
    bad = next(e for e in await db.run_read(inbox.recent_events) if e.event_id == "evt_bad")

    def browse(read_only: bool) -> tuple[str, str, int]:
        config = WebConfig(database_url=migrated_url, app=app, read_only=read_only)
        with TestClient(create_app(config), base_url="http://127.0.0.1") as c:
            page = c.get("/webhook-events").text
            failed = c.get("/webhook-events?connector=charges&status=failed").text
            c.get("/login")
            token = c.cookies.get(CSRF_COOKIE)
            r = c.post(
                "/webhook-events/replay",
                data={"csrf": token, "ids": [str(bad.id)]},
                follow_redirects=False,
            )
            return page, failed, r.status_code

    page, failed, status = await asyncio.to_thread(browse, True)
    assert "evt_good" in page and "evt_bad" in page and 'href="/webhook-events"' in page
    assert "evt_bad" in failed and "evt_good" not in failed
    assert status == 403  # read-only: no replay
    assert (await db.run_read(inbox.event_row, bad.id)).status == "failed"
    _, _, status = await asyncio.to_thread(browse, False)
    assert status == 303
    assert (await db.run_read(inbox.event_row, bad.id)).status == "pending"
