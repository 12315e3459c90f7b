"""A connector author's tests of the 429 path, written with synckit's testing kit only:
pacing and retries wait on the injected FakeClock, so a Retry-After of 30 s (inline) or
10 min (the job put back and run again) costs milliseconds of wall time."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, SecretStr

from synckit import App, BearerToken, Connector, CursorPaginator, Page, RateLimit, SyncContext
from synckit.store.db import Database
from synckit.testing import FakeAPI, FakeClock, Fault, Reply
from synckit.testing.fixtures import RunUntilIdle

# --- the connector under test, as in docs/connectors.md ---------------------------------------


class HelpdeskConfig(BaseModel):
    api_token: SecretStr
    project: str


class Helpdesk(Connector[HelpdeskConfig]):
    name = "helpdesk"
    base_url = "https://api.helpdesk.example.com/v2"
    auth = BearerToken("api_token")
    rate_limit = RateLimit(per_second=5, burst=10)
    paginator = CursorPaginator(records="tickets", cursor="next_page", param="page")

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        async for page in self.paginator.pages(
            ctx.http, "/tickets", params={"project": self.config.project}, resume=checkpoint
        ):
            yield page

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        await ctx.http.post("/exports", json={"ticket": record["id"]})


# --- the author's tests --------------------------------------------------------------------


def helpdesk_api(clock: FakeClock) -> FakeAPI:
    api = FakeAPI(clock=clock)
    api.route("GET", "/v2/tickets", {"tickets": [{"id": 1}, {"id": 2}], "next_page": None})
    api.route("POST", "/v2/exports", Reply.empty(204))
    return api


async def test_a_429_with_retry_after_30_is_waited_out_on_the_fake_clock_in_under_a_second(
    synckit_db: Database, synckit_clock: FakeClock
) -> None:
    api = helpdesk_api(synckit_clock)
    api.script("GET", "/v2/tickets", [Fault.rate_limited(retry_after=30)])
    app = App([Helpdesk], transport=api.transport(), clock=synckit_clock)
    await app.add_tenant(synckit_db, "acme", "helpdesk", {"api_token": "t0k3n!", "project": "S"})
    began, wall = synckit_clock(), time.perf_counter()

    result = await app.poll(synckit_db, "acme")

    assert time.perf_counter() - wall < 10  # the 30 s are the fake clock's, not waited for
    assert (result.ok, result.failed) == (2, 0)
    first, second = api.calls("GET", "/v2/tickets")
    # The second request left when the server said it could: 30 s later, on the fake clock.
    assert second.time - first.time == timedelta(seconds=30)
    assert synckit_clock() - began >= timedelta(seconds=30)
    assert [r.json() for r in api.calls("POST", "/v2/exports")] == [{"ticket": 1}, {"ticket": 2}]


async def test_a_wait_longer_than_max_inline_wait_puts_the_cycle_back_until_the_clock_gets_there(
    synckit_db: Database, synckit_clock: FakeClock, run_until_idle: RunUntilIdle
) -> None:
    clock = synckit_clock
    api = helpdesk_api(clock)
    api.script("GET", "/v2/tickets", [Fault.rate_limited(retry_after=600)])
    app = App([Helpdesk], transport=api.transport(), clock=clock)
    await app.add_tenant(synckit_db, "acme", "helpdesk", {"api_token": "t0k3n!", "project": "S"})
    await app.schedule(synckit_db)  # the cycle is due now
    wall = time.perf_counter()

    await run_until_idle(app, clock=clock)
    assert api.calls("POST", "/v2/exports") == []  # paced: nothing due before the 10 minutes
    assert len(api.calls("GET", "/v2/tickets")) == 1

    clock.advance(timedelta(minutes=9))
    await run_until_idle(app, clock=clock)
    assert len(api.calls("GET", "/v2/tickets")) == 1  # still paced

    clock.advance(timedelta(minutes=1))
    stats = await run_until_idle(app, clock=clock)
    assert [r.json() for r in api.calls("POST", "/v2/exports")] == [{"ticket": 1}, {"ticket": 2}]
    assert (stats.dead, stats.paced) == (0, 0)
    assert time.perf_counter() - wall < 60  # the 10 minutes are the fake clock's
