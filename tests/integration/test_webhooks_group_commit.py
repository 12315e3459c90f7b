"""Concurrent webhook deliveries committed together, on both engines: each is answered
2xx only after the commit that holds it, a commit that fails answers 5xx to every
delivery of its group (nothing stored), repeats within a group are stored once, and a
secret read before is never trusted once the tenant's config has changed."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, SecretStr
from sqlalchemy import event, select

from synckit import App, Connector, Page, Stream, SyncContext
from synckit.connectors.webhooks import StripeSignature, Webhooks, sign_stripe
from synckit.runtime.admin.tenants import set_config
from synckit.store.db import Database
from synckit.store.tables import webhook_events
from synckit.web.webhooks import webhook_app

SECRET = "whsec_group_commit"
TENANTS = ("gc-a", "gc-b", "gc-c")


class HookConfig(BaseModel):
    webhook_secret: SecretStr


class Grouped(Connector[HookConfig]):
    name = "grouped"
    base_url = "http://127.0.0.1:9/"
    streams = [Stream("items")]
    webhooks = Webhooks(verify=StripeSignature(secret_field="webhook_secret"))

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        if False:  # pragma: no cover - nothing to list
            yield Page([])

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        return None


@pytest.fixture
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    app = App(connectors=[Grouped])
    for tenant in TENANTS:
        await app.add_tenant(db, tenant, Grouped.name, {"webhook_secret": SECRET})
    transport = httpx.ASGITransport(app=webhook_app(app, database=db))
    async with httpx.AsyncClient(transport=transport, base_url="http://hooks") as c:
        # One delivery per tenant first: the process has read each secret, so what
        # follows takes the path of a running web process (the secret known).
        for tenant in TENANTS:
            assert (await _post(c, tenant, f"warm-{tenant}")).status_code == 200
        yield c


def _post(c: httpx.AsyncClient, tenant: str, event_id: str, secret: str = SECRET) -> Any:
    raw = json.dumps({"id": event_id}).encode()
    sig = sign_stripe(secret, int(time.time()), raw)
    return c.post(f"/grouped/{tenant}", content=raw, headers={"Stripe-Signature": sig})


async def _post_all(c: httpx.AsyncClient, ids: list[str]) -> list[httpx.Response]:
    return list(await asyncio.gather(*(_post(c, TENANTS[i % 3], e) for i, e in enumerate(ids))))


async def _stored(db: Database) -> dict[str, int]:
    """Event id -> duplicates counted, of every stored event but the warm-up's."""
    async with db.read() as conn:
        rows = (await conn.execute(select(webhook_events))).all()
    return {r.event_id: r.duplicates for r in rows if not r.event_id.startswith("warm-")}


async def _trap_commits(db: Database, on: bool) -> None:
    """While on, every commit that inserted an inbox row fails at COMMIT itself (a
    deferred check), after all of the group's statements succeeded."""
    async with db.begin() as conn:
        if db.is_postgres:
            if on:
                await conn.exec_driver_sql(
                    "CREATE FUNCTION refuse_commit() RETURNS trigger LANGUAGE plpgsql"
                    " AS 'BEGIN RAISE EXCEPTION ''commit refused by the test''; END'"
                )
                await conn.exec_driver_sql(
                    "CREATE CONSTRAINT TRIGGER refuse_commit AFTER INSERT ON webhook_events"
                    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
                    " EXECUTE FUNCTION refuse_commit()"
                )
            else:
                await conn.exec_driver_sql("DROP TRIGGER refuse_commit ON webhook_events")
        elif on:
            await conn.exec_driver_sql("CREATE TABLE trap_parent (id INTEGER PRIMARY KEY)")
            await conn.exec_driver_sql(
                "CREATE TABLE trap (ref INTEGER REFERENCES trap_parent (id)"
                " DEFERRABLE INITIALLY DEFERRED)"
            )
            await conn.exec_driver_sql(
                "CREATE TRIGGER trap_insert AFTER INSERT ON webhook_events"
                " BEGIN INSERT INTO trap (ref) VALUES (1); END"
            )
        else:
            await conn.exec_driver_sql("DROP TRIGGER trap_insert")


async def test_a_failed_commit_answers_5xx_to_every_delivery_and_stores_none(
    db: Database, client: httpx.AsyncClient
) -> None:
    ids = [f"evt_fail_{i}" for i in range(12)]
    await _trap_commits(db, on=True)
    answers = await _post_all(client, ids)
    assert [r.status_code for r in answers] == [503] * len(ids)
    assert await _stored(db) == {}
    await _trap_commits(db, on=False)
    # The provider's retries: now stored, once each.
    answers = await _post_all(client, ids)
    assert [r.status_code for r in answers] == [200] * len(ids)
    assert await _stored(db) == dict.fromkeys(ids, 0)


async def test_concurrent_deliveries_share_commits(db: Database, client: httpx.AsyncClient) -> None:
    commits: list[int] = []
    target = db.sync_engine if db.sync_engine is not None else db.engine.sync_engine
    listener = lambda conn: commits.append(1)  # noqa: E731
    event.listen(target, "commit", listener)
    try:
        ids = [f"evt_share_{i}" for i in range(24)]
        answers = await _post_all(client, ids)
    finally:
        event.remove(target, "commit", listener)
    assert [r.status_code for r in answers] == [200] * len(ids)
    assert await _stored(db) == dict.fromkeys(ids, 0)
    assert 0 < len(commits) < len(ids)


async def test_an_event_repeated_within_a_group_is_stored_once(
    db: Database, client: httpx.AsyncClient
) -> None:
    answers = await asyncio.gather(*(_post(client, "gc-a", "evt_twice") for _ in range(3)))
    assert [r.status_code for r in answers] == [200] * 3
    bodies = sorted((r.json()["stored"], r.json()["duplicates"]) for r in answers)
    assert bodies == [(0, 1), (0, 1), (1, 0)]
    assert await _stored(db) == {"evt_twice": 2}


async def test_a_secret_read_before_is_not_trusted_once_the_config_changed(
    db: Database, client: httpx.AsyncClient
) -> None:
    app = App(connectors=[Grouped])
    await set_config(db, "gc-a", {"webhook_secret": "whsec_rotated"}, app=app)
    old = await _post(client, "gc-a", "evt_old_secret")
    assert old.status_code == 401
    new = await _post(client, "gc-a", "evt_new_secret", secret="whsec_rotated")
    assert new.status_code == 200
    assert await _stored(db) == {"evt_new_secret": 0}
