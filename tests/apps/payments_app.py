"""A Stripe-like payments connector for worker processes: each tenant lists four
customers and invoices each; the API (``PAYMENTS_API_URL``) declines some with a 402 and
a JSON error body (tests/integration/test_api_errors_procs.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from synckit import App, Connector, ErrorBody, Page, SyncContext


class Payments(Connector):
    name = "payments"
    base_url = os.environ.get("PAYMENTS_API_URL", "http://127.0.0.1:9")
    error_body = ErrorBody(message="error.message", code=("error.type", "error.code"))

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        listing = await ctx.http.get("/v1/customers", params={"tenant": ctx.tenant})
        yield Page(listing.json()["data"], checkpoint={"done": True})

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        await ctx.http.post("/v1/invoices", json={"customer": record["id"]})


app = App([Payments])
