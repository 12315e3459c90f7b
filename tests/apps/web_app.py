"""An App and seeded data for the console's tests (`synckit web --app web_app:app`).

The connector needs no network: its cycle yields three pages with a short pause each
(so a cycle's progress can be watched), and ``handle`` succeeds unless the record says
``fail`` (so replays of dead letters resolve them). Every tenant's config holds
``SECRET``; a test asserts no page ever shows it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, SecretStr

from synckit import App, Connector, Page, SyncContext
from synckit.clock import utcnow
from synckit.runtime.http.pacing import defer_resource
from synckit.runtime.writes import outbox
from synckit.store.db import Database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.jobs import enqueueing

SECRET = "sk_live_seeded-SECRET-4f9a7c"
PAGE_PAUSE = float(os.environ.get("WEB_APP_PAGE_PAUSE", "0.4"))


class ShopConfig(BaseModel):
    api_key: SecretStr
    shop_key: SecretStr | None = None
    region: str = "eu"


class Shop(Connector[ShopConfig]):
    name = "shop"
    base_url = "http://127.0.0.1:9"

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        page = (checkpoint or {}).get("page", 0)
        for n in range(page + 1, page + 4):
            await asyncio.sleep(PAGE_PAUSE)
            yield Page([], checkpoint={"page": n})

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        if isinstance(record, dict) and record.get("fail"):
            raise ValueError("still failing")


app = App([Shop], scheduler_every=timedelta(hours=1), dlq_replay_every=None, alerts_every=None)


async def seed(db: Database) -> dict[str, Any]:
    """Tenants in every state, jobs, dead letters in two groups, outbox messages."""
    now = utcnow()
    for name in ("acme", "globex", "initech", "umbrella"):
        await app.add_tenant(
            db, name, "shop", {"api_key": SECRET, "shop_key": SECRET, "region": "eu"}
        )
    # globex: rate limited by Retry-After, paced for ten minutes.
    await defer_resource(db, "shop:globex", now + timedelta(minutes=10), "Retry-After")
    from synckit.runtime.admin.tenants import pause_tenant

    await pause_tenant(db, "initech", "paused for the migration")
    from synckit.store.connections import mark_needs_reauth

    async with db.begin() as conn:
        await mark_needs_reauth(
            conn,
            "umbrella",
            reason=f"invalid_grant: refresh token revoked (token={SECRET})",
            now=now,
        )
    jobs = []
    for i in range(5):
        out = await enqueueing.enqueue(
            db, "send.invoice", {"n": i, "api_key": SECRET}, resource_key="shop:acme"
        )
        jobs.append(out.id)
    async with db.begin() as conn:
        failures = [
            dlq_capture.Failure(
                tenant="acme",
                connector="shop",
                kind="record:default",
                record_id=f"order-{i}",
                payload={"id": f"order-{i}", "token": SECRET},
                error_class="server_error",
                message=f"HTTP 503 Service Unavailable from /orders/{i} (Bearer {SECRET})",
                traceback="Traceback (most recent call last):\n  ValueError: boom",
                resource_key="shop:acme",
            )
            for i in range(3)
        ] + [
            dlq_capture.Failure(
                tenant="globex",
                connector="shop",
                kind="record:default",
                record_id=f"sku-{i}",
                payload={"id": f"sku-{i}", "fail": True},
                error_class="validation",
                message="422 Unprocessable Entity: price must be positive",
                resource_key="shop:globex",
            )
            for i in range(2)
        ]
        captured = await dlq_capture.capture_many(conn, failures, now=now)
        await outbox.add(conn, "orders.synced", {"order": 1, "secret": SECRET}, key="acme")
    return {"jobs": jobs, "dead_letters": [c.id for c in captured]}
