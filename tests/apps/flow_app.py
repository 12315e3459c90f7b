"""An App polling the hostile API (synckit.testing.hostile), for flow-control tests and
``bench.sync``: ``synckit worker --app flow_app:app``.

The worker's App is built from the environment; a test or the bench builds the same one
in-process with :func:`make_app` (to add tenants, whose resource stores the declared
limit):

* ``FLOW_API_URL``: the hostile API's base URL;
* ``FLOW_RATE_LIMIT`` / ``FLOW_RATE_BURST``: a declared per-tenant limit (none if unset);
* ``FLOW_TOKEN_URL``: tenants authenticate with OAuth2 client credentials there (the
  worker then needs ``SYNCKIT_SECRET_KEY`` to store the tokens).

A tenant's config ``{"sink": true}`` makes ``handle()`` post every record to the API, so
that requests of one tenant are in flight together (the connector's record concurrency).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, ClassVar

import httpx
from pydantic import BaseModel

from synckit import App, Connector, Page, RateLimit, SyncContext
from synckit.runtime.credentials.oauth import OAuth2Auth, OAuth2Config

CONNECTOR = "flow"
CLIENT_ID = "flow-client"
CLIENT_SECRET = "flow-secret"  # the fake token endpoint's


class FlowConfig(BaseModel):
    sink: bool = False


class FlowBase(Connector[FlowConfig]):
    """Pages ``GET /t/<tenant>/items?page=N``; the checkpoint is the next page."""

    token_url: ClassVar[str | None] = None

    def build_auth(self, ctx: SyncContext) -> httpx.Auth | None:
        if self.token_url is None:
            return None
        config = OAuth2Config(self.token_url, CLIENT_ID, CLIENT_SECRET, grant="client_credentials")
        return OAuth2Auth(ctx.db, self.tenant, config)

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        page = (checkpoint or {}).get("next", 1)
        while page is not None:
            body = (await ctx.http.get(f"/t/{self.tenant}/items", params={"page": page})).json()
            page = body["next"]
            yield Page(body["items"], checkpoint={"next": page})

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        if self.config.sink:
            await ctx.http.post(f"/t/{self.tenant}/sink", json={"id": record["id"]})


def make_app(
    api_url: str,
    *,
    rate_limit: float | None = None,
    burst: int = 1,
    token_url: str | None = None,
) -> App:
    """The App with one connector, ``flow``, configured as given."""
    attrs: dict[str, Any] = {
        "name": CONNECTOR,
        "base_url": api_url,
        "rate_limit": RateLimit(per_second=rate_limit, burst=burst) if rate_limit else None,
        "token_url": token_url,
        # A poll waits for its tenant and takes every page; the deadline is the test's.
        "timeout": httpx.Timeout(30.0, connect=5.0),
    }
    connector = type("Flow", (FlowBase,), attrs)
    # The scheduler starts each tenant's one cycle (its schedule is a day); the runs
    # must not depend on when it next looks, so the tests and the bench call
    # App.schedule() themselves, and the recurring one rarely runs.
    return App(
        [connector],
        scheduler_every=timedelta(hours=1),
        dlq_replay_every=None,
        alerts_every=None,
    )


def app_from_env() -> App:
    rate = os.environ.get("FLOW_RATE_LIMIT")
    return make_app(
        os.environ.get("FLOW_API_URL", "http://127.0.0.1:9"),
        rate_limit=float(rate) if rate else None,
        burst=int(os.environ.get("FLOW_RATE_BURST", "1")),
        token_url=os.environ.get("FLOW_TOKEN_URL") or None,
    )


app = app_from_env()

if os.environ.get("FLOW_TRACING") == "memory":
    # bench.sync --tracing memory: every span made and exported, kept in memory.
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    _provider = TracerProvider()
    _provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(_provider)


def env_for(
    api_url: str,
    *,
    rate_limit: float | None = None,
    burst: int = 1,
    token_url: str | None = None,
) -> dict[str, str]:
    """The environment that makes a worker's ``flow_app:app`` equal ``make_app(...)``."""
    env = {"FLOW_API_URL": api_url, "FLOW_RATE_BURST": str(burst)}
    env["FLOW_RATE_LIMIT"] = "" if rate_limit is None else repr(rate_limit)
    env["FLOW_TOKEN_URL"] = token_url or ""
    return env
