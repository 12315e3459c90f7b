"""Webhook subscriptions kept alive, on both engines, against the Graph simulator served
on loopback (its own thread) and synckit's receiver served on loopback too: the
simulator validates the notification URL (``validationToken``) before it answers a
create, and posts notifications carrying ``clientState``. Time is a FakeClock shared by
the App and the simulator; each step runs the App's worker until nothing is due."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import pytest
import uvicorn
from cryptography.fernet import Fernet
from inprocess import run_cli  # tests/
from prometheus_client import REGISTRY
from starlette.testclient import TestClient
from waits import await_until  # tests/

from synckit import (
    App,
    Connector,
    GraphNotifications,
    Subscription,
    Webhooks,
    pause_tenant,
    remove_tenant,
    resume_tenant,
)
from synckit.connectors.subscriptions import renew_at
from synckit.examples.graph_mail import GraphMail, GraphSimulator, connect_tenant, make_app
from synckit.runtime.admin.status import read_status
from synckit.runtime.sync.subscriptions import sweep_subscriptions
from synckit.store import subscriptions as subs
from synckit.store.db import Database
from synckit.testing import FakeClock, Reply
from synckit.testing.fixtures import run_worker_until_idle
from synckit.web import WebConfig, create_app
from synckit.web.webhooks import webhook_app

TENANT = "contoso"
CLIENT_STATE = "a-client-state-secret-of-contoso"
POLICY = GraphMail.webhooks.subscription
assert POLICY is not None


@pytest.fixture(autouse=True)
def _token_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNCKIT_SECRET_KEY", Fernet.generate_key().decode())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock) -> Iterator[tuple[GraphSimulator, str]]:
    sim = GraphSimulator(seed=5, page_size=50, clock=clock)
    sim.add_mailbox(TENANT, messages=3)
    # Its own thread: its validation call (blocking) reaches the receiver in our loop.
    with sim.serve_in_thread() as url:
        yield sim, url


@pytest.fixture
async def receiver(db: Database, clock: FakeClock) -> AsyncIterator[tuple[App, str]]:
    """An App whose webhook URL is its receiver, served by uvicorn in this event loop."""
    app = make_app(clock=clock)
    server = uvicorn.Server(
        uvicorn.Config(
            webhook_app(app, database=db),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="off",
        )
    )
    task = asyncio.create_task(server.serve())

    async def started() -> bool:
        return bool(server.started)

    await await_until(started, "the receiver to start")
    port = server.servers[0].sockets[0].getsockname()[1]
    app.webhook_url = f"http://127.0.0.1:{port}/"
    try:
        yield app, app.webhook_url.rstrip("/")
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def app(db: Database, sim: tuple[GraphSimulator, str], receiver: tuple[App, str]) -> App:
    simulator, url = sim
    app, _ = receiver
    await app.upgrade_records(db)
    config = {
        "tenant_id": TENANT,
        "client_id": simulator.client_id,
        "client_secret": simulator.client_secret,
        "graph_url": simulator.graph_url(url),
        "token_url": simulator.token_url(url, TENANT),
        "client_state": CLIENT_STATE,
    }
    await connect_tenant(app, db, TENANT, config, simulator.issue_tokens(TENANT))
    return app


async def _row(db: Database) -> subs.SubscriptionRow | None:
    return await db.run_read(lambda c: subs.get(c, TENANT, "messages"))


async def _run(app: App, db: Database) -> None:
    """Run what is due; then, a minute on, the recurring jobs (the subscription sweep
    every minute) and what they enqueue."""
    await run_worker_until_idle(app, db)
    assert isinstance(app.clock, FakeClock)
    app.clock.advance(timedelta(seconds=61))
    await run_worker_until_idle(app, db)


async def _landed(app: App, db: Database) -> set[str]:
    return {r["id"] for r in await app.records(TENANT, "messages", db=db).rows(limit=1000)}


async def _until(app: App, db: Database, clock: FakeClock, when: Any) -> None:
    """Advance the clock past ``when`` (a datetime) and the next sweep (every minute)
    after it, and run what is due once."""
    clock.advance(max(when - clock(), timedelta(0)) + timedelta(seconds=61))
    await run_worker_until_idle(app, db)


async def test_created_on_first_need_after_the_handshake_and_notifications_trigger_a_cycle(
    db: Database,
    app: App,
    sim: tuple[GraphSimulator, str],
    receiver: tuple[App, str],
    clock: FakeClock,
) -> None:
    simulator, _ = sim
    await _run(app, db)
    row = await _row(db)
    assert row is not None and row.state == "active" and row.failures == 0
    (made,) = simulator.subscriptions(TENANT)
    assert made["id"] == row.subscription_id
    assert made["clientState"] == CLIENT_STATE
    assert made["notificationUrl"] == f"{receiver[1]}/graph_mail/{TENANT}"
    assert made["resource"] == "me/mailFolders('inbox')/messages"
    assert simulator.stats.validations[TENANT] == 1
    assert row.expires_at is not None and row.renewed_at is not None
    assert row.renewed_at < row.expires_at <= clock() + POLICY.lifetime
    assert row.next_at == renew_at(row.renewed_at, row.expires_at, POLICY) < row.expires_at

    new = simulator.add_message(TENANT, subject="pushed")
    assert new["id"] not in await _landed(app, db)
    assert await simulator.send_notifications() == [200]
    await _run(app, db)  # the stored notification triggers a delta cycle now
    assert new["id"] in await _landed(app, db)


async def test_a_forged_notification_is_refused_and_stores_nothing(
    db: Database, app: App, sim: tuple[GraphSimulator, str], receiver: tuple[App, str]
) -> None:
    import httpx

    await _run(app, db)
    body = {"value": [{"id": "n1", "clientState": "guessed", "resource": "x"}]}
    async with httpx.AsyncClient() as client:
        r = await client.post(f"{receiver[1]}/graph_mail/{TENANT}", json=body)
    assert r.status_code == 401


async def test_renewed_before_expiry_and_a_404_on_renewal_recreates_it(
    db: Database, app: App, sim: tuple[GraphSimulator, str], clock: FakeClock
) -> None:
    simulator, _ = sim
    await _run(app, db)
    first = await _row(db)
    assert first is not None and first.expires_at is not None
    await _until(app, db, clock, first.next_at)
    renewed = await _row(db)
    assert renewed is not None and renewed.state == "active"
    assert renewed.subscription_id == first.subscription_id
    assert renewed.expires_at is not None and renewed.expires_at > first.expires_at
    assert first.next_at < first.expires_at  # renewed before it expired
    assert simulator.stats.subscriptions_renewed[TENANT] == 1

    simulator.forget_subscription(str(renewed.subscription_id))
    recreated = _counted("recreated")
    await _until(app, db, clock, renewed.next_at)
    again = await _row(db)
    assert again is not None and again.state == "active"
    assert again.subscription_id != renewed.subscription_id
    assert [s["id"] for s in simulator.subscriptions(TENANT)] == [again.subscription_id]
    assert simulator.stats.subscriptions_created[TENANT] == 2
    assert simulator.stats.validations[TENANT] == 2
    assert _counted("recreated") == recreated + 1


def _counted(outcome: str) -> float:
    labels = {"connector": "graph_mail", "outcome": outcome}
    return REGISTRY.get_sample_value("synckit_webhook_subscriptions_total", labels) or 0.0


async def test_repeated_renewal_failures_lapse_it_the_stream_polls_and_operators_see_it(
    db: Database,
    app: App,
    sim: tuple[GraphSimulator, str],
    clock: FakeClock,
    migrated_url: str,
) -> None:
    simulator, _ = sim
    await _run(app, db)
    row = await _row(db)
    assert row is not None
    refused = Reply.json({"error": {"code": "InvalidRequest", "message": "no renewal"}}, 400)
    simulator.api.script("PATCH", f"/v1.0/subscriptions/{row.subscription_id}", [refused] * 50)
    delta = "/v1.0/me/mailFolders/inbox/messages/delta"
    lapsed, retried = _counted("lapsed"), _counted("retry")
    for failures in range(1, POLICY.max_failures + 1):
        await _until(app, db, clock, row.next_at)
        row = await _row(db)
        assert row is not None and row.failures == failures
        if failures < POLICY.max_failures:
            assert row.state == "active" and row.next_at <= (row.expires_at or row.next_at)
    assert row.state == "lapsed" and "no renewal" in (row.last_error or "")
    assert _counted("lapsed") == lapsed + 1
    assert _counted("retry") == retried + POLICY.max_failures - 1
    polls_at_lapse = len(simulator.api.calls("GET", delta))
    added = simulator.add_message(TENANT, subject="seen by polling")
    # The lapse enqueued a cycle at once; then the schedule (every 5m) goes on.
    await _until(app, db, clock, clock() + timedelta(minutes=5))
    assert len(simulator.api.calls("GET", delta)) > polls_at_lapse
    assert added["id"] in await _landed(app, db)

    status = await read_status(db, now=clock())
    assert status.subscriptions_by_state == {"lapsed": 1}
    (down,) = status.subscriptions_down
    assert (down.tenant, down.stream, down.state) == (TENANT, "messages", "lapsed")
    shown = run_cli("status", "--json", "--database-url", migrated_url)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["subscriptions_down"][0]["state"] == "lapsed"
    text = run_cli("status", "--database-url", migrated_url)
    assert "subscription lapsed" in text.stdout and f"{TENANT}/messages" in text.stdout
    with TestClient(
        create_app(WebConfig(database_url=migrated_url, app=app)), base_url="http://127.0.0.1"
    ) as client:
        page = client.get("/webhook-events")
    assert page.status_code == 200
    assert 'id="webhook-subscriptions"' in page.text and "s-lapsed" in page.text

    # An hour on, a new subscription is made (a create, not the refused renewal).
    await _until(app, db, clock, row.next_at)
    back = await _row(db)
    assert back is not None and back.state == "active" and back.failures == 0
    assert back.subscription_id != row.subscription_id


async def test_creation_failing_repeatedly_marks_it_failed(
    db: Database, app: App, sim: tuple[GraphSimulator, str], clock: FakeClock
) -> None:
    simulator, _ = sim
    refused = Reply.json({"error": {"code": "InvalidRequest", "message": "not allowed"}}, 400)
    simulator.api.script("POST", "/v1.0/subscriptions", [refused] * POLICY.max_failures)
    await _run(app, db)
    row = await _row(db)
    assert row is not None and (row.state, row.failures) == ("pending", 1)
    while row.state == "pending":
        await _until(app, db, clock, row.next_at)
        row = await _row(db)
        assert row is not None
    assert (row.state, row.failures) == ("failed", POLICY.max_failures)
    assert simulator.subscriptions(TENANT) == []


async def test_pausing_the_tenant_deletes_it_resuming_creates_one_removing_forgets_it(
    db: Database, app: App, sim: tuple[GraphSimulator, str], clock: FakeClock
) -> None:
    simulator, _ = sim
    await _run(app, db)
    assert len(simulator.subscriptions(TENANT)) == 1
    await pause_tenant(db, TENANT)
    await _until(app, db, clock, clock() + timedelta(minutes=1))
    assert simulator.subscriptions(TENANT) == [] and await _row(db) is None
    assert simulator.stats.subscriptions_deleted[TENANT] == 1
    await resume_tenant(db, TENANT)
    await _until(app, db, clock, clock() + timedelta(minutes=1))
    row = await _row(db)
    assert row is not None and row.state == "active"
    await remove_tenant(db, TENANT)
    assert await _row(db) is None  # deleted with its tenant (Graph expires it on its own)


async def test_without_a_webhook_url_no_subscription_is_made(
    db: Database, app: App, sim: tuple[GraphSimulator, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SYNCKIT_WEBHOOK_URL", raising=False)
    app.webhook_url = None
    await _run(app, db)
    assert await _row(db) is None and sim[0].subscriptions() == []


class _Other(Connector):
    """Another App's connector with subscriptions (its hooks are never reached here)."""

    name = "other_push"
    webhooks = Webhooks(verify=GraphNotifications(secret_field="s"), subscription=Subscription())

    async def create_subscription(self, ctx: Any, request: Any) -> Any:
        raise AssertionError("not called")

    renew_subscription = delete_subscription = create_subscription


async def test_another_app_sharing_the_database_leaves_these_subscriptions_alone(
    db: Database, app: App, sim: tuple[GraphSimulator, str], clock: FakeClock
) -> None:
    await _run(app, db)
    before = await _row(db)
    assert before is not None
    other = App([_Other], clock=clock, webhook_url="http://127.0.0.1:9/webhooks")
    await pause_tenant(db, TENANT)  # its row is now both due for deletion and due...
    clock.advance(timedelta(days=3))  # ... for renewal, for an App that knows it
    assert await sweep_subscriptions(db, other) == []
    assert await _row(db) == dataclasses.replace(before, tenant_status="paused")


#: Stored timestamps no reader takes, per engine (past any time, or not a time at all).
CORRUPT = {
    "sqlite": ("'garbage'", "'9999-12-31 23:59:59'"),
    "postgresql": ("'infinity'", "'20000-01-01'::timestamptz"),
}


async def test_a_subscription_whose_timestamps_cannot_be_read_holds_only_itself_and_heals(
    db: Database,
    app: App,
    sim: tuple[GraphSimulator, str],
    clock: FakeClock,
    engine_name: str,
) -> None:
    """A corrupt ``expires_at`` and ``next_at`` read as None with the reason named; the
    row is still listed (status, the console), it is due, and the job's next write
    replaces both with readable values."""
    from sqlalchemy import text

    await _run(app, db)
    expires, next_at = CORRUPT[engine_name]
    async with db.begin() as conn:
        await conn.execute(
            text(f"UPDATE webhook_subscriptions SET expires_at = {expires}, next_at = {next_at}")
        )
    row = await _row(db)
    assert row is not None and row.expires_at is None and row.next_at is None
    assert [name for name, _ in row.unreadable] == ["expires_at", "next_at"]
    assert all("timestamp" in reason for _, reason in row.unreadable)
    listed = await db.run_read(lambda c: subs.list_subscriptions(c))
    assert [r.tenant for r in listed] == [TENANT]
    status = await read_status(db)
    assert status.subscriptions_by_state == {"active": 1}

    await _until(app, db, clock, clock())
    healed = await _row(db)
    assert healed is not None and healed.unreadable == () and healed.state == "active"
    assert healed.expires_at is not None and healed.next_at is not None
    assert healed.next_at > clock()
