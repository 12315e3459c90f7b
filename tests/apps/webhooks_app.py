"""Connectors taking webhooks, and script entries for the tests that run processes.

``logged``: ``on_webhook`` appends each event id to ``$WEBHOOKS_APP_LOG`` (also the
connector of ``bench.webhooks``). ``landed``: each event's ``data`` lands in the
``wh_items`` records table (``Webhooks(records=...)``), under a short lease so that a
killed worker's events come back quickly.

``python webhooks_app.py URL TENANT``: process the tenant's pending events in this
process (several run at once in tests/integration/test_webhooks_procs.py).
``python webhooks_app.py --serve URL PORT``: the receiver alone (uvicorn, one process).
Workers run with ``synckit worker --app webhooks_app:app`` from this directory.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, SecretStr

from synckit import App, Connector, Page, Records, Stream, StripeSignature, SyncContext, Webhooks
from synckit.connectors.webhooks import WebhookEvent


class HookConfig(BaseModel):
    webhook_secret: SecretStr


class Logged(Connector[HookConfig]):
    name = "logged"
    base_url = "http://127.0.0.1:9/"
    streams = [Stream("items")]
    webhooks = Webhooks(verify=StripeSignature(secret_field="webhook_secret"))

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        if False:  # pragma: no cover
            yield Page([])

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        return None

    async def on_webhook(self, ctx: SyncContext, events: Sequence[WebhookEvent]) -> None:
        await asyncio.sleep(0.01)  # a little work, so that processes overlap
        _log(events)


def _log(events: Sequence[WebhookEvent]) -> None:
    # One write of whole lines to a file opened for appending: lines never interleave.
    with open(os.environ["WEBHOOKS_APP_LOG"], "a") as f:
        f.write("".join(f"{os.getpid()} {e.event_id}\n" for e in events))


class Item(BaseModel):
    id: str
    n: int


class Landed(Connector[HookConfig]):
    name = "landed"
    base_url = "http://127.0.0.1:9/"
    streams = [Stream("items", records=Records(Item, table="wh_items", map=lambda e: e["data"]))]
    webhooks = Webhooks(
        verify=StripeSignature(secret_field="webhook_secret"),
        records="items",
        lease=timedelta(seconds=3),
    )

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        if False:  # pragma: no cover
            yield Page([])

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        return None


app = App(connectors=[Logged, Landed])


def _serve(url: str, port: int) -> None:
    import uvicorn

    from synckit.web.webhooks import webhook_app

    app.use_database_url(url)
    # As `synckit web` runs it (no access log; httptools and uvloop when installed).
    uvicorn.run(
        webhook_app(app), host="127.0.0.1", port=port, log_level="warning", access_log=False
    )


async def _main(url: str, tenant: str) -> None:
    from synckit.runtime.sync.webhooks import BATCH, process_events
    from synckit.store.db import open_database

    assert BATCH > 0
    db = open_database(url)
    try:
        await process_events(db, app, "logged", tenant)
    finally:
        await db.dispose()


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        _serve(sys.argv[2], int(sys.argv[3]))
    else:
        asyncio.run(_main(sys.argv[1], sys.argv[2]))
