"""Hostile bodies at the API edge and dead poll cycles in the DLQ, on both engines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from synckit import Connector
from synckit.errors import ClassifyRules, ErrorClass, classify
from synckit.runtime.http.client import ERROR_BODY_LIMIT
from synckit.runtime.sync.context import open_context
from synckit.store.db import Database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import replay as dlq_replay

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KEY = "SeCrEtKeY0123456789"


class Api(Connector):
    name = "api"
    base_url = "http://api.test"


class JsonApi(Api):
    classify_rules = ClassifyRules(expect_json=True)


def streamed(status: int, total: int, pulled: list[int], **headers: str) -> httpx.MockTransport:
    """An API answering ``total`` bytes, counting how many the client pulled."""

    async def body() -> AsyncIterator[bytes]:
        chunk = b"<html>" + b"x" * (16 * 1024 - 6)
        sent = 0
        while sent < total:
            pulled.append(len(chunk))
            sent += len(chunk)
            yield chunk

    return httpx.MockTransport(lambda r: httpx.Response(status, headers=headers, content=body()))


async def test_a_32_mib_error_body_is_read_up_to_64_kib(db: Database) -> None:
    """A 500 with a 32 MiB body fails as a server error having pulled about 64 KiB."""
    pulled: list[int] = []
    api = Api("acme", {})
    transport = streamed(500, 32 * 1024 * 1024, pulled)
    async with open_context(db, api, resource_key="api:acme", transport=transport) as ctx:
        with pytest.raises(Exception) as raised:
            await ctx.http.get("/items")
    assert classify(exc=raised.value, now=NOW).error_class is ErrorClass.SERVER_ERROR
    assert sum(pulled) <= ERROR_BODY_LIMIT + 16 * 1024


async def test_a_2xx_maintenance_page_is_a_server_error_counted_by_the_breaker(
    db: Database,
) -> None:
    """A 200 HTML page where JSON is expected is the server's failure (retried, breaker
    counted), not a per-record validation error; a JSON 200 still passes."""
    html = httpx.MockTransport(
        lambda r: httpx.Response(200, content=b"<html>Down for maintenance</html>")
    )
    async with open_context(
        db, JsonApi("acme", {}), resource_key="api:acme", transport=html
    ) as ctx:
        with pytest.raises(Exception) as raised:
            await ctx.http.get("/items")
    verdict = classify(exc=raised.value, now=NOW)
    assert verdict.error_class is ErrorClass.SERVER_ERROR
    assert verdict.counts_for_breaker and verdict.retryable
    good = httpx.MockTransport(lambda r: httpx.Response(200, json={"items": []}))
    async with open_context(
        db, JsonApi("acme", {}), resource_key="api:acme", transport=good
    ) as ctx:
        assert (await ctx.http.get("/items")).json() == {"items": []}


async def test_a_json_decode_error_in_a_handler_is_a_server_error() -> None:
    """response.json() on a maintenance page raises JSONDecodeError: server-side."""
    with pytest.raises(ValueError) as raised:
        httpx.Response(200, content=b"<html>").json()
    assert classify(exc=raised.value, now=NOW).error_class is ErrorClass.SERVER_ERROR


async def capture_dead_cycle(db: Database, job_id: int, stream: str, at: datetime) -> Any:
    async with db.begin() as conn:
        return await dlq_capture.capture(
            conn,
            tenant="acme",
            connector="graph",
            kind="synckit.poll",
            record_id=f"job:{job_id}",
            payload={"tenant": "acme", "connector": "graph", "stream": stream},
            error_class="server_error",
            message=f"GET https://api.test/items?api_key={KEY}: HTTP 200: body is not JSON",
            traceback=f"Traceback\nValueError: X-Api-Key: {KEY}",
            job_id=job_id,
            now=at,
        )


async def test_dead_poll_cycles_of_a_stream_are_one_dead_letter(db: Database) -> None:
    """Every tick of a failing tenant/stream dies into the same row (counted), another
    stream has its own, and an ordinary dead job keeps its job:<id> key."""
    got = [
        await capture_dead_cycle(db, 100 + n, "users", NOW + timedelta(minutes=n)) for n in range(5)
    ]
    other = await capture_dead_cycle(db, 200, "groups", NOW)
    assert len({g.id for g in got}) == 1 and got[0].created and not got[-1].created
    assert other.id != got[0].id
    row = await dlq_reads.get(db, got[0].id)
    assert row.record_id == "job:poll:users" and row.is_job and row.job_id == 104
    assert row.attempt_count == 5 and len(row.history) == 5
    assert KEY not in repr((row.error_message, row.history, row.traceback))
    async with db.begin() as conn:
        plain = await dlq_capture.capture(
            conn,
            tenant="acme",
            connector="graph",
            kind="sync.things",
            record_id="job:7",
            payload={"stream": "users"},
            error_class="unknown",
            message="boom",
            job_id=7,
            now=NOW,
        )
    assert (await dlq_reads.get(db, plain.id)).record_id == "job:7"
    assert dlq_capture.dead_job_record_id("synckit.poll", {"stream": ""}, 9) == "job:9"


async def test_dead_cycles_in_a_row_pause_the_tenant_with_an_alert(db: Database) -> None:
    """DEAD_CYCLES_TO_PAUSE dead cycles in a row pause the tenant's connection (not
    before), and the dead_cycles rule alerts about it; a resolved row starts over."""
    from sqlalchemy import insert, select

    from synckit.errors.dlq_policy import DEAD_CYCLES_TO_PAUSE
    from synckit.runtime.observe.alert_delivery import AlertRouter
    from synckit.runtime.observe.alert_rules import RuleSet
    from synckit.runtime.observe.alerts import AlertEvaluator
    from synckit.store.tables import connections

    async with db.begin() as conn:
        await conn.execute(
            insert(connections).values(
                tenant="acme",
                connector="graph",
                resource_key="graph:acme",
                status="active",
                created_at=NOW,
                updated_at=NOW,
            )
        )

    async def status() -> tuple[str, str | None]:
        async with db.begin() as conn:
            r = (
                await conn.execute(select(connections.c.status, connections.c.status_reason))
            ).one()
        return r.status, r.status_reason

    async def die(n: int) -> Any:
        async with db.begin() as conn:
            return await dlq_capture.capture(
                conn,
                tenant="acme",
                connector="graph",
                kind="synckit.poll",
                record_id=f"job:{n}",
                payload={"tenant": "acme", "connector": "graph", "stream": "users"},
                error_class="server_error",
                message=f"HTTP 200: body is not JSON api_key={KEY}",
                job_id=n,
                resource_key="graph:acme",
                now=NOW + timedelta(minutes=n),
            )

    for n in range(DEAD_CYCLES_TO_PAUSE - 1):
        got = await die(n)
    assert (await status())[0] == "active"
    async with db.begin() as conn:
        await dlq_replay.mark_resolved(conn, [got.id], now=NOW)  # a cycle went through
    for n in range(10, 10 + DEAD_CYCLES_TO_PAUSE - 1):
        await die(n)
    assert (await status())[0] == "active"
    await die(99)
    state, reason = await status()
    assert state == "paused" and reason is not None and "users" in reason
    assert KEY not in reason
    rules = RuleSet(
        server_errors=None,
        tenant_outlier=None,
        deploy_regression=None,
        dlq_growth=None,
        poll_lag=None,
        needs_reauth=None,
        error_budget=None,
        dlq_review=None,
    )
    fired = await AlertEvaluator(db, rules=rules, router=AlertRouter(db=db)).evaluate(
        NOW + timedelta(hours=2)
    )
    assert [(a.rule, a.subject) for a in fired] == [("dead_cycles", "acme")]


async def test_a_next_link_to_another_host_never_carries_the_tenants_token(db: Database) -> None:
    """An API whose next-page link names another host, through ctx.http with a bearer
    token: the listing stops with a PermanentError and no request, so no token, goes to
    that host."""
    from pydantic import BaseModel

    from synckit import BearerToken, NextUrlPaginator
    from synckit.errors.exceptions import PermanentError

    class Cfg(BaseModel):
        api_token: str

    class Tokened(Connector[Cfg]):
        name = "tokened"
        base_url = "https://api.test"
        auth = BearerToken("api_token")

    seen: list[tuple[str, str | None]] = []

    def api(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers.get("authorization")))
        return httpx.Response(
            200, json={"items": [{"id": 1}], "next": "https://collector.example/steal?page=2"}
        )

    connector = Tokened("acme", {"api_token": KEY})
    async with open_context(
        db, connector, resource_key="tokened:acme", transport=httpx.MockTransport(api)
    ) as ctx:
        with pytest.raises(PermanentError, match=r"collector\.example.*not followed"):
            async for _ in NextUrlPaginator(records="items").pages(ctx.http, "/items"):
                pass
    assert seen == [("api.test", f"Bearer {KEY}")]
