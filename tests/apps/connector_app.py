"""An App with one connector, for `synckit tenants ...` and `synckit worker` subprocesses.

The API's base URL comes from ``$CONNECTOR_APP_URL`` (a loopback server in the tests).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, SecretStr

from synckit import App, BearerToken, Connector, Page, SyncContext


class DemoConfig(BaseModel):
    api_token: SecretStr
    page_size: int = 50


class Demo(Connector[DemoConfig]):
    """Pages ``GET /items?page=N`` and posts every record to ``/sink``."""

    name = "demo"
    base_url = os.environ.get("CONNECTOR_APP_URL", "http://127.0.0.1:9")
    auth = BearerToken("api_token")

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        page = (checkpoint or {}).get("page", 0) + 1
        while True:
            body = (await ctx.http.get("/items", params={"page": page})).json()
            yield Page(body["items"], checkpoint={"page": page})
            if body["next"] is None:
                return
            page = body["next"]

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        await ctx.http.post("/sink", json=record)


app = App([Demo])
