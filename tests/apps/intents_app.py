"""Handlers for the lost-responses chaos test (tests/integration/test_intents_lost_responses.py).

``synckit worker --app intents_app:registry`` runs ``synckit.write`` jobs whose create
posts an item to a fake API that sometimes commits it and then drops the response.

Environment: ``SYNCKIT_DATABASE_URL`` (the worker's database), ``INTENTS_API_URL`` (the
fake API), ``INTENTS_APP_FIND`` (``1``: the writer can find what a lost attempt created;
``0``: it cannot, and retries are blind).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import httpx

from synckit.errors import set_testing
from synckit.runtime.http.transports import tls_context
from synckit.runtime.jobs.handlers import Registry
from synckit.runtime.writes.intents import (
    WRITE_KIND,
    RemoteRecord,
    Writer,
    write_job_handler,
)
from synckit.store.db import open_database

# Retry at once (attempt limits still apply): the test is about effects, not pacing.
set_testing(True, timedelta(milliseconds=20))

API = os.environ.get("INTENTS_API_URL", "http://127.0.0.1:9")
_client: httpx.AsyncClient | None = None


def client() -> httpx.AsyncClient:
    """One client per worker process (made inside its event loop, on first use)."""
    global _client
    if _client is None:
        _client = httpx.AsyncClient(base_url=API, timeout=2, verify=tls_context())
    return _client


class ApiWriter:
    """Creates items; cannot look them up."""

    async def create(self, operation: str, request: Any, *, idempotency_key: str) -> RemoteRecord:
        response = await client().post("/items", json={"ref": request["ref"]})
        response.raise_for_status()
        return RemoteRecord(str(response.json()["id"]), {"ref": request["ref"]})


class FindingApiWriter(ApiWriter):
    """Creates items, and finds the one an earlier attempt created (by its ref)."""

    async def find(self, operation: str, request: Any) -> RemoteRecord | None:
        response = await client().get("/items", params={"ref": request["ref"]})
        response.raise_for_status()
        items = response.json()["items"]
        return RemoteRecord(str(items[0]["id"]), {"ref": request["ref"]}) if items else None


async def resolve(tenant: str, connector: str) -> Writer:
    return FindingApiWriter() if os.environ.get("INTENTS_APP_FIND") == "1" else ApiWriter()


registry = Registry()
registry.add(
    WRITE_KIND,
    write_job_handler(
        open_database(os.environ.get("SYNCKIT_DATABASE_URL")),
        resolve,
        call_timeout=2.0,
        lease_margin=timedelta(seconds=1),
    ),
    timeout=30,
)
