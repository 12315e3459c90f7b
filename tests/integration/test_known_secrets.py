"""A tenant's own secret values are scrubbed by value wherever its work writes text: an
API that echoes a custom header's credential in a plain sentence (a shape no redaction
pattern knows) leaks it to no log line, dead letter, job or intent, on both engines."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import AsyncIterator, Generator
from datetime import datetime
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, SecretStr
from sqlalchemy import select

from synckit import App, Connector, Page, Stream, SyncContext
from synckit.errors import Classification, RetryPolicy
from synckit.runtime.observe.logging import configure_logging
from synckit.runtime.sync.context import open_context
from synckit.runtime.sync.scheduler import poll_job_spec
from synckit.runtime.writes.intents import RemoteRecord, run_intent
from synckit.store.db import Database
from synckit.store.jobs.enqueueing import enqueue_many
from synckit.store.tables import connections, dead_letters, intents, jobs

# Plain opaque values: no vendor prefix, no key=value around them in the API's answers.
KEY_A = "Pq7Lm2Xv9Rt4Kw8Zs3Nb"
KEY_B = "Hd5Jf8Gk1Vc6Ty0Ue4Wo"


class PartnerConfig(BaseModel):
    partner: str
    credential: SecretStr


class PartnerHeader(httpx.Auth):
    def __init__(self, value: str) -> None:
        self.value = value

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, Any, None]:
        request.headers["X-Partner-Credential"] = self.value
        yield request


class Partner(Connector[PartnerConfig]):
    """Reads /items, writes each record to /sink; surfaces the API's message on a 400."""

    name = "partner"
    base_url = "https://partner.test"
    streams = (Stream("items"),)

    def build_auth(self, ctx: SyncContext) -> httpx.Auth:
        return PartnerHeader(self.config.credential.get_secret_value())

    def classify(
        self, response: httpx.Response | None, exc: BaseException | None, now: datetime
    ) -> Classification:
        c = super().classify(response, exc, now)
        if response is not None and response.status_code == 400:
            return dataclasses.replace(c, reason=f"{c.reason}: {response.text}")
        return c

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        body = (await ctx.http.get("/items")).json()
        ctx.log.info("partner.page", note=f"read with {self.config.partner}")
        yield Page(body["items"], checkpoint={"read": True})

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        await ctx.http.post("/sink", json=record)


def echoing_api(request: httpx.Request) -> httpx.Response:
    """Globex's reads are refused, acme's writes; both answers quote the credential."""
    credential = request.headers.get("X-Partner-Credential", "")
    if request.url.path == "/items":
        if credential == KEY_B:
            return httpx.Response(
                400, text=f"The partner credential {credential} is not enabled for reads."
            )
        return httpx.Response(200, json={"items": [{"id": "1"}, {"id": "2"}]})
    return httpx.Response(
        400, text=f"Refused: the partner credential {credential} may not write here."
    )


async def dump(db: Database, *tables: Any) -> str:
    async with db.begin() as conn:
        rows = [dict(r._mapping) for t in tables for r in await conn.execute(select(t))]
    return json.dumps(rows, default=str)


async def test_an_echoed_credential_reaches_no_log_dead_letter_or_job(db: Database) -> None:
    """Acme's records die on a 400 quoting its key (record dead letters, in the page's
    transaction); globex's cycle dies on one quoting its own (the worker's recording:
    jobs' error columns and the cycle's dead letter). Neither key is in any row or log
    line, while the sentences around them are."""
    app = App([Partner], transport=httpx.MockTransport(echoing_api))
    await app.add_tenant(db, "acme", "partner", {"partner": "acme", "credential": KEY_A})
    await app.add_tenant(db, "globex", "partner", {"partner": "globex", "credential": KEY_B})
    await enqueue_many(
        db,
        [
            poll_job_spec("acme", "partner", "items", "partner:acme"),
            poll_job_spec("globex", "partner", "items", "partner:globex"),
        ],
    )
    out = io.StringIO()
    configure_logging(json_lines=True, stream=out)
    try:
        worker = app.worker(db, retry_policy=RetryPolicy.deterministic(), poll_interval=0.05)
        await worker.run_until_idle()
    finally:
        configure_logging(json_lines=True, stream=io.StringIO())
    async with db.begin() as conn:
        letters = (await conn.execute(select(dead_letters))).all()
        dead = (await conn.execute(select(jobs).where(jobs.c.status == "dead"))).all()
    assert sorted((d.tenant, d.record_id) for d in letters) == [
        ("acme", "1"),
        ("acme", "2"),
        ("globex", "job:poll:items"),
    ]
    assert [j.payload["tenant"] for j in dead] == ["globex"]
    stored = await dump(db, jobs, dead_letters, connections)
    logs = out.getvalue()
    # The texts did reach storage and the log, only without the keys.
    assert "may not write here" in stored and "not enabled for reads" in stored
    assert "may not write here" in logs and "not enabled for reads" in logs
    assert "credential *** may not write" in stored
    for key in (KEY_A, KEY_B):
        assert key not in stored
        assert key not in logs


async def test_an_intent_error_quoting_the_credential_is_stored_without_it(db: Database) -> None:
    """A create that fails with the key in its message (the intent's _last_error) and a
    connector log line quoting it, inside the tenant's context: the key is in neither."""
    connector = Partner("acme", {"partner": "acme", "credential": KEY_A})
    out = io.StringIO()
    configure_logging(json_lines=True, stream=out)

    async def create(idem: str) -> RemoteRecord:
        raise RuntimeError(f"partner said: credential {KEY_A} is suspended")

    try:
        with pytest.raises(RuntimeError) as raised:
            async with open_context(db, connector, resource_key="partner:acme") as ctx:
                ctx.log.warning("partner.echo", detail=f"sent {KEY_A} as asked")
                await ctx.intent("k1", create=create)
    finally:
        configure_logging(json_lines=True, stream=io.StringIO())
    stored = await dump(db, intents)
    assert "is suspended" in stored and KEY_A not in stored
    assert "sent *** as asked" in out.getvalue() and KEY_A not in out.getvalue()
    # What left the context carries no key either (the worker stores it later).
    assert KEY_A not in str(raised.value) and "credential *** is suspended" in str(raised.value)


async def test_intent_last_error_is_redacted_by_pattern(db: Database) -> None:
    """A create failing on a URL with ``?access_token=`` (no tenant context, so patterns
    only): the intent's stored ``result._last_error`` names the failure without the token,
    and a retry of the same key still finds the intent pending."""
    token = "ya29.A0ARrdaM-Secret-Access-Token-9f8e7d"

    async def create(idem: str) -> RemoteRecord:
        raise httpx.ConnectError(f"GET https://api.test/v1/items?access_token={token}&page=2")

    with pytest.raises(httpx.ConnectError):
        await run_intent(db, tenant="acme", connector="partner", key="k2", create=create)
    async with db.begin() as conn:
        row = (await conn.execute(select(intents))).one()
    assert row.status == "pending"
    error = row.result["_last_error"]
    assert error.startswith("ConnectError: GET https://api.test/v1/items?access_token=")
    assert "page=2" in error and token not in error and token not in await dump(db, intents)
