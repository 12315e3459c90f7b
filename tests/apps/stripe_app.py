"""A Stripe-like payments API's connector, for `synckit worker --app stripe_app:app`.

Each tenant's host is its own (``base_url`` names the config's ``api_url``). Two streams,
both newest first and paged by object id: ``customers`` through :class:`Incremental`
(walked down to the old watermark each cycle) and ``events`` through
:class:`NewestFirstFeed` (walked down once, then caught up oldest first). ``handle()``
posts every record to the API's ``/sink``, so the test counts what was handled across
worker processes where the server sees it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from synckit import (
    App,
    Connector,
    IdCursorPaginator,
    Incremental,
    NewestFirstFeed,
    Page,
    Stream,
    SyncContext,
)

CONNECTOR = "stripe_like"


class StripeConfig(BaseModel):
    api_url: str


class StripeLike(Connector[StripeConfig]):
    name = CONNECTOR
    base_url = "{api_url}/v1"
    # Events are handled one at a time, in the order the feed hands them on.
    streams = (Stream("customers"), Stream("events", concurrency=1))
    paginator = IdCursorPaginator()
    customers = Incremental(updated_at="created", since_param=None)
    events = NewestFirstFeed(limit=100)

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        if ctx.stream == "customers":
            async for page in self.customers.pages(
                ctx, "/customers", self.paginator, checkpoint, params={"limit": 100}
            ):
                yield page
        else:
            async for page in self.events.pages(ctx, "/events", checkpoint):
                yield page

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        await ctx.http.post("/sink", json={"stream": ctx.stream, "id": record["id"]})


app = App(
    [StripeLike],
    scheduler_every=timedelta(hours=1),
    dlq_replay_every=None,
    alerts_every=None,
)
