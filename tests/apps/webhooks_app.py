"""A connector taking webhooks whose ``on_webhook`` appends each event id to
``$WEBHOOKS_APP_LOG``, and a script entry that processes one tenant's events.

``python webhooks_app.py URL TENANT``: process the tenant's pending events in this
process (several run at once in tests/integration/test_webhooks_procs.py).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import BaseModel, SecretStr

from synckit import App, Connector, Page, Stream, StripeSignature, SyncContext, Webhooks
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


app = App(connectors=[Logged])


async def _main(url: str, tenant: str) -> None:
    from synckit.runtime.webhooks import BATCH, process_events
    from synckit.store.db import open_database

    assert BATCH > 0
    db = open_database(url)
    try:
        await process_events(db, app, "logged", tenant)
    finally:
        await db.dispose()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2]))
