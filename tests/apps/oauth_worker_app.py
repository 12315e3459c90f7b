"""An App whose connector authenticates with OAuth2Auth against the loopback test server.

For `synckit worker` / `synckit tenants connect` subprocesses (tests/integration/
test_oauth_lifecycle.py, test_oauth_connect.py). The provider comes from the environment:
``OAUTH_APP_TOKEN_URL``, ``OAUTH_APP_AUTHORIZE_URL``, ``OAUTH_APP_CLIENT_ID``,
``OAUTH_APP_CLIENT_SECRET`` (empty: a public client, auth_method ``none``) and
``OAUTH_APP_RESOURCE_URL``.

Besides the poll stream (one ``GET /me`` per cycle), the job kind ``oauth_call`` makes
``payload["calls"]`` requests through the tenant's ``ctx.http`` (paced, with the token
attached at send time) and appends, per request, ``<elapsed seconds> <status>`` to
``$OAUTH_APP_LOG``.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
from pydantic import BaseModel

from synckit import App, Connector, Page, SyncContext
from synckit.connectors.base import RateLimit
from synckit.runtime.credentials.oauth import OAuth2Auth, OAuth2Config
from synckit.runtime.jobs.handlers import JobContext

RESOURCE = os.environ.get("OAUTH_APP_RESOURCE_URL", "http://127.0.0.1:9/me")


class MeConfig(BaseModel):
    user_hint: str = ""


def oauth_config() -> OAuth2Config:
    secret = os.environ.get("OAUTH_APP_CLIENT_SECRET") or None
    return OAuth2Config(
        token_url=os.environ.get("OAUTH_APP_TOKEN_URL", "http://127.0.0.1:9/token"),
        client_id=os.environ.get("OAUTH_APP_CLIENT_ID", "synckit-test-client"),
        client_secret=secret,
        auth_method="client_secret_basic" if secret else "none",
        authorize_url=os.environ.get("OAUTH_APP_AUTHORIZE_URL"),
        scope="read",
        # A test where the token endpoint's answer is not what is timed raises it: a
        # busy machine's event loop may take longer than 5 s to get to it.
        timeout=float(os.environ.get("OAUTH_APP_TOKEN_TIMEOUT", "5")),
    )


class Me(Connector[MeConfig]):
    """Reads who the token belongs to; throttled like a strict API."""

    name = "me"
    rate_limit = RateLimit(per_second=float(os.environ.get("OAUTH_APP_RATE", "20")), burst=5)
    # Waits for the API's Retry-After happen inline, longer than a 2 s token lives.
    max_inline_wait = timedelta(seconds=10)

    def build_auth(self, ctx: SyncContext) -> httpx.Auth:
        return OAuth2Auth(ctx.db, self.tenant, oauth_config())

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        me = (await ctx.http.get(RESOURCE)).json()
        yield Page([{"id": me["user"], **me}], checkpoint={"user": me["user"]})

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        pass


app = App([Me], alerts_every=None, dlq_replay_every=None)


@app.registry.handler("oauth_call", max_attempts=20)
async def oauth_call(jctx: JobContext) -> None:
    db = await app.database()
    path = os.environ.get("OAUTH_APP_LOG")
    async with app.context(db, jctx.payload["tenant"]) as ctx:
        for _ in range(int(jctx.payload.get("calls", 1))):
            started = time.monotonic()
            response = await ctx.http.get(RESOURCE)
            if path:
                line = f"{time.monotonic() - started:.3f} {response.status_code}\n"
                with open(path, "a") as f:  # noqa: ASYNC230 - a test log, one short line
                    f.write(line)
