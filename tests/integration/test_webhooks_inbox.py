"""The webhook inbox on both engines: verified deliveries are stored before their 2xx,
once per event id; refused ones are counted and never stored; processing triggers the
stream's cycle (coalesced) or runs ``on_webhook``, marking each event processed once."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, SecretStr
from sqlalchemy import select

from synckit import App, Connector, Page, Stream, SyncContext
from synckit.connectors.webhooks import (
    GitHubSignature,
    GraphNotifications,
    StandardWebhooks,
    StripeSignature,
    TenantFromBody,
    WebhookEvent,
    Webhooks,
    sign_github,
    sign_standard,
    sign_stripe,
)
from synckit.runtime.sync.webhooks import PROCESS_KIND, process_events
from synckit.store import webhooks as inbox
from synckit.store.db import Database
from synckit.store.tables import jobs, webhook_events
from synckit.web.webhooks import webhook_app

SECRET = "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM="


class HookConfig(BaseModel):
    webhook_secret: SecretStr
    account: str = ""


class Base(Connector[HookConfig]):
    base_url = "http://127.0.0.1:9/"
    streams = [Stream("charges", webhook_window=timedelta(minutes=10))]

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        if False:  # pragma: no cover - nothing to list: the cycle finishes at once
            yield Page([])

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        return None


class Stripeish(Base):
    name = "stripeish"
    webhooks = Webhooks(verify=StripeSignature(secret_field="webhook_secret"), max_body=4096)


class Standard(Base):
    name = "standard"
    webhooks = Webhooks(verify=StandardWebhooks(secret_field="webhook_secret"))


class Hub(Base):
    name = "hub"
    webhooks = Webhooks(
        verify=GitHubSignature(secret_field="webhook_secret"),
        tenant=TenantFromBody("account", config_field="account"),
    )


class Graphish(Base):
    name = "graphish"
    webhooks = Webhooks(verify=GraphNotifications(secret_field="webhook_secret"))


class Endpoint(Base):
    name = "endpoint"
    webhooks = Webhooks(
        verify=GitHubSignature(secret_field="unused"),
        tenant=TenantFromBody("account", config_field="account"),
        secret_env="TEST_ENDPOINT_SECRET",
    )


SEEN: list[str] = []


class Hooked(Base):
    name = "hooked"
    webhooks = Webhooks(verify=StripeSignature(secret_field="webhook_secret"))

    async def on_webhook(self, ctx: SyncContext, events: Sequence[WebhookEvent]) -> None:
        for e in events:
            if e.json().get("poison"):
                raise ValueError("poison event")
        SEEN.extend(e.event_id for e in events)


ALL = [Stripeish, Standard, Hub, Graphish, Endpoint, Hooked]


@pytest.fixture
async def app(db: Database) -> App:
    a = App(connectors=ALL)
    for cls, tenant in [(c, c.name + "-t") for c in ALL]:
        await a.add_tenant(
            db, tenant, cls.name, {"webhook_secret": SECRET, "account": "acct_" + cls.name}
        )
    return a


@pytest.fixture
async def client(db: Database, app: App) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=webhook_app(app, database=db))
    async with httpx.AsyncClient(transport=transport, base_url="http://hooks") as c:
        yield c


def _stripe(body: dict[str, Any], *, ts: int | None = None, secret: str = SECRET) -> dict[str, Any]:
    raw = json.dumps(body).encode()
    t = int(time.time()) if ts is None else ts
    return {"content": raw, "headers": {"Stripe-Signature": sign_stripe(secret, t, raw)}}


async def _events(db: Database) -> list[Any]:
    async with db.read() as conn:
        return list(
            (await conn.execute(select(webhook_events).order_by(webhook_events.c.id))).all()
        )


async def _counts(db: Database) -> dict[tuple[str, str], inbox.WebhookCounts]:
    rows = await db.run_read(inbox.webhook_counts)
    return {(r.connector, r.tenant): r for r in rows}


async def test_verified_delivery_is_stored_then_answered_and_queues_its_processing(
    db: Database, client: httpx.AsyncClient
) -> None:
    r = await client.post("/stripeish/stripeish-t", **_stripe({"id": "evt_1", "type": "x"}))
    assert r.status_code == 200 and r.json() == {"stored": 1, "duplicates": 0}
    (row,) = await _events(db)
    assert (row.tenant, row.event_id, row.status) == ("stripeish-t", "evt_1", "pending")
    assert json.loads(row.body)["id"] == "evt_1"
    async with db.read() as conn:
        kinds = [k for (k,) in await conn.execute(select(jobs.c.kind))]
    assert PROCESS_KIND in kinds


async def test_a_provider_retry_is_a_duplicate_answered_2xx_and_stored_once(
    db: Database, client: httpx.AsyncClient
) -> None:
    """The same event id for the same tenant (a retry, or a replay within the tolerance)."""
    for _ in range(3):
        r = await client.post("/stripeish/stripeish-t", **_stripe({"id": "evt_1"}))
        assert r.status_code == 200
    assert r.json() == {"stored": 0, "duplicates": 1}
    assert len(await _events(db)) == 1
    c = (await _counts(db))[("stripeish", "stripeish-t")]
    assert (c.received, c.duplicates, c.pending) == (1, 2, 1)


@pytest.mark.parametrize(
    "case",
    ["tampered", "stale", "unsigned", "wrong secret", "unknown tenant"],
)
async def test_unverifiable_delivery_is_401_counted_and_never_stored(
    db: Database, client: httpx.AsyncClient, case: str
) -> None:
    kw = _stripe({"id": "evt_x"})
    path = "/stripeish/stripeish-t"
    if case == "tampered":
        kw["content"] = kw["content"].replace(b"evt_x", b"evt_y")
    elif case == "stale":
        kw = _stripe({"id": "evt_x"}, ts=int(time.time()) - 3600)
    elif case == "unsigned":
        kw["headers"] = {}
    elif case == "wrong secret":
        kw = _stripe({"id": "evt_x"}, secret="whsec_other")
    else:
        path = "/stripeish/nobody"
    r = await client.post(path, **kw)
    assert r.status_code == 401
    assert await _events(db) == []
    counts = await _counts(db)
    key = ("stripeish", "" if case == "unknown tenant" else "stripeish-t")
    assert counts[key].refused == 1


async def test_body_over_the_cap_is_413_and_not_stored(
    db: Database, client: httpx.AsyncClient
) -> None:
    kw = _stripe({"id": "evt_big", "pad": "x" * 5000})
    r = await client.post("/stripeish/stripeish-t", **kw)
    assert r.status_code == 413
    assert await _events(db) == []


async def test_unknown_connector_is_404(client: httpx.AsyncClient) -> None:
    assert (await client.post("/nope/t", content=b"{}")).status_code == 404


async def test_standard_webhooks_valid_and_replayed(
    db: Database, client: httpx.AsyncClient
) -> None:
    body, ts = b'{"type": "invoice.paid"}', int(time.time())
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(ts),
        "webhook-signature": sign_standard(SECRET, "msg_1", ts, body),
    }
    assert (
        await client.post("/standard/standard-t", content=body, headers=headers)
    ).status_code == 200
    assert (
        await client.post("/standard/standard-t", content=body, headers=headers)
    ).status_code == 200
    stale = {**headers, "webhook-timestamp": str(ts - 1000)}
    stale["webhook-signature"] = sign_standard(SECRET, "msg_2", ts - 1000, body)
    stale["webhook-id"] = "msg_2"
    assert (
        await client.post("/standard/standard-t", content=body, headers=stale)
    ).status_code == 401
    assert [r.event_id for r in await _events(db)] == ["msg_1"]


async def test_github_tenant_from_body_and_delivery_id(
    db: Database, client: httpx.AsyncClient
) -> None:
    body = json.dumps({"account": "acct_hub", "action": "opened"}).encode()
    headers = {"X-Hub-Signature-256": sign_github(SECRET, body), "X-GitHub-Delivery": "d-1"}
    assert (await client.post("/hub", content=body, headers=headers)).status_code == 200
    (row,) = await _events(db)
    assert (row.tenant, row.event_id, row.headers["x-github-delivery"]) == ("hub-t", "d-1", "d-1")
    unknown = json.dumps({"account": "acct_nobody"}).encode()
    headers = {"X-Hub-Signature-256": sign_github(SECRET, unknown), "X-GitHub-Delivery": "d-2"}
    assert (await client.post("/hub", content=unknown, headers=headers)).status_code == 401
    assert len(await _events(db)) == 1


async def test_endpoint_secret_keeps_an_unknown_tenant_aside_as_an_orphan(
    db: Database, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_ENDPOINT_SECRET", "endpoint-secret")
    body = json.dumps({"account": "acct_stranger"}).encode()
    headers = {
        "X-Hub-Signature-256": sign_github("endpoint-secret", body),
        "X-GitHub-Delivery": "o-1",
    }
    assert (await client.post("/endpoint", content=body, headers=headers)).status_code == 200
    (row,) = await _events(db)
    assert (row.tenant, row.status, row.claimed) == ("", "orphaned", "acct_stranger")
    bad = {**headers, "X-Hub-Signature-256": sign_github("wrong", body)}
    assert (await client.post("/endpoint", content=body, headers=bad)).status_code == 401
    assert (await _counts(db))[("endpoint", "")].orphaned == 1


async def test_graph_handshake_echoes_the_token_and_stores_nothing(
    db: Database, client: httpx.AsyncClient
) -> None:
    r = await client.post("/graphish/graphish-t", params={"validationToken": "Validation: abc <x>"})
    assert r.status_code == 200 and r.text == "Validation: abc <x>"
    assert r.headers["content-type"].startswith("text/plain")
    assert await _events(db) == []


async def test_graph_client_state_checked_on_every_notification(
    db: Database, client: httpx.AsyncClient
) -> None:
    def body(*states: str) -> bytes:
        return json.dumps(
            {
                "value": [
                    {"id": f"n{i}", "clientState": s, "resource": "m"} for i, s in enumerate(states)
                ]
            }
        ).encode()

    assert (
        await client.post("/graphish/graphish-t", content=body(SECRET, "forged"))
    ).status_code == 401
    assert await _events(db) == []
    assert (
        await client.post("/graphish/graphish-t", content=body(SECRET, SECRET))
    ).status_code == 200
    assert sorted(r.event_id for r in await _events(db)) == ["n0", "n1"]


async def test_events_trigger_one_cycle_per_stream_per_window_and_are_processed_once(
    db: Database, app: App, client: httpx.AsyncClient
) -> None:
    for i in range(5):
        await client.post("/stripeish/stripeish-t", **_stripe({"id": f"evt_{i}"}))
    assert await process_events(db, app, "stripeish", "stripeish-t") == 5
    assert await process_events(db, app, "stripeish", "stripeish-t") == 0  # nothing twice
    async with db.read() as conn:
        polls = (await conn.execute(select(jobs).where(jobs.c.kind == "synckit.poll"))).all()
    assert len(polls) == 1 and polls[0].payload["stream"] == "charges"
    first_run = polls[0].run_at
    # More events while that cycle is queued coalesce into it.
    await client.post("/stripeish/stripeish-t", **_stripe({"id": "evt_more"}))
    assert await process_events(db, app, "stripeish", "stripeish-t") == 1
    async with db.read() as conn:
        polls = (await conn.execute(select(jobs).where(jobs.c.kind == "synckit.poll"))).all()
    assert len(polls) == 1
    # Once it ran, the next triggered cycle waits for the stream's window.
    async with db.begin() as conn:
        await conn.execute(
            jobs.update().where(jobs.c.kind == "synckit.poll").values(status="succeeded")
        )
    await client.post("/stripeish/stripeish-t", **_stripe({"id": "evt_later"}))
    await process_events(db, app, "stripeish", "stripeish-t")
    async with db.read() as conn:
        due = (
            await conn.execute(
                select(jobs.c.run_at).where(
                    jobs.c.kind == "synckit.poll", jobs.c.status == "pending"
                )
            )
        ).scalar_one()
    assert due == first_run + timedelta(minutes=10)
    c = (await _counts(db))[("stripeish", "stripeish-t")]
    assert (c.processed, c.pending) == (7, 0)


async def test_on_webhook_hook_runs_and_a_failing_event_fails_alone(
    db: Database, app: App, client: httpx.AsyncClient
) -> None:
    SEEN.clear()
    await client.post("/hooked/hooked-t", **_stripe({"id": "good_1"}))
    await client.post("/hooked/hooked-t", **_stripe({"id": "bad", "poison": True}))
    await client.post("/hooked/hooked-t", **_stripe({"id": "good_2"}))
    with pytest.raises(Exception, match="poison"):
        await process_events(db, app, "hooked", "hooked-t")
    assert sorted(SEEN) == ["good_1", "good_2"]
    rows = {r.event_id: r for r in await _events(db)}
    assert rows["good_1"].status == rows["good_2"].status == "processed"
    assert rows["bad"].status == "pending" and "poison" in rows["bad"].last_error
    assert rows["bad"].lease_token is None


async def test_worker_runs_the_processing_job_and_the_triggered_cycle(
    db: Database, app: App, client: httpx.AsyncClient
) -> None:
    await client.post("/stripeish/stripeish-t", **_stripe({"id": "evt_w"}))
    await app.worker(db, poll_interval=0.05).run_until_idle()
    (row,) = await _events(db)
    assert row.status == "processed"
    async with db.read() as conn:
        statuses = dict(
            (
                await conn.execute(
                    select(jobs.c.kind, jobs.c.status).where(
                        jobs.c.kind.in_([PROCESS_KIND, "synckit.poll"])
                    )
                )
            ).all()
        )
    assert statuses == {PROCESS_KIND: "succeeded", "synckit.poll": "succeeded"}


async def test_synckit_web_serves_webhooks_outside_the_console_guard(
    db: Database, app: App
) -> None:
    """The console wants a token and a CSRF value; a signed delivery needs neither."""
    from synckit.web.app import create_app
    from synckit.web.base import WebConfig

    console = create_app(WebConfig(database_url=None, app=app, token="t0ken"), database=db)
    transport = httpx.ASGITransport(app=console)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        r = await c.post("/webhooks/stripeish/stripeish-t", **_stripe({"id": "evt_web"}))
        assert r.status_code == 200
        assert (await c.post("/tenants/stripeish-t/pause")).status_code == 401
    assert [r.event_id for r in await _events(db)] == ["evt_web"]


async def test_mounted_in_the_users_own_starlette_app(db: Database, app: App) -> None:
    """``Mount("/webhooks", app=webhook_app(app))`` as docs/connectors.md shows it."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    asgi = Starlette(routes=[Mount("/webhooks", app=webhook_app(app, database=db))])
    transport = httpx.ASGITransport(app=asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://mine") as c:
        r = await c.post("/webhooks/stripeish/stripeish-t", **_stripe({"id": "evt_mount"}))
    assert r.status_code == 200
    assert [r.event_id for r in await _events(db)] == ["evt_mount"]


async def test_metrics_count_each_outcome(db: Database, client: httpx.AsyncClient) -> None:
    from prometheus_client import REGISTRY

    def value(outcome: str) -> float:
        labels = {"connector": "stripeish", "outcome": outcome}
        return REGISTRY.get_sample_value("synckit_webhooks_total", labels) or 0.0

    before = {o: value(o) for o in ("stored", "duplicate", "refused", "too_large")}
    await client.post("/stripeish/stripeish-t", **_stripe({"id": "evt_m"}))
    await client.post("/stripeish/stripeish-t", **_stripe({"id": "evt_m"}))
    await client.post("/stripeish/stripeish-t", **_stripe({"id": "evt_n"}, secret="whsec_bad"))
    await client.post("/stripeish/stripeish-t", **_stripe({"id": "evt_o", "pad": "x" * 5000}))
    after = {o: value(o) for o in before}
    assert {o: after[o] - before[o] for o in before} == {
        "stored": 1,
        "duplicate": 1,
        "refused": 1,
        "too_large": 1,
    }


async def test_a_client_that_never_finishes_its_body_gets_408(db: Database, app: App) -> None:
    """The body's read is bounded (read_timeout): a slow client cannot hold the server."""
    import asyncio

    never = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield b'{"id": '
        await never.wait()  # the rest never comes
        yield b"}"

    transport = httpx.ASGITransport(app=webhook_app(app, database=db, read_timeout=0.2))
    async with httpx.AsyncClient(transport=transport, base_url="http://hooks") as c:
        r = await c.post("/stripeish/stripeish-t", content=body())
    assert r.status_code == 408
    assert await _events(db) == []
