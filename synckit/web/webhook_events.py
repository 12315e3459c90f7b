"""The console's webhook page (``/webhook-events``: ``/webhooks/`` is the receiver's,
ahead of the console's guards): the inbox counted per connector and tenant (received,
duplicates, refused, orphaned, pending, processed, failed) and its newest events,
filtered by connector, tenant and status; a stored event can be replayed (put back to
pending with its processing job, as ``synckit webhooks replay`` does). The webhook
subscriptions synckit keeps (created, renewed, lapsed, failed) are listed too. Read-only
otherwise; the replay is refused in ``--read-only`` mode by the console's guard.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from synckit.clock import utcnow
from synckit.runtime.sync.webhooks import process_job_spec
from synckit.store import subscriptions as subscription_store
from synckit.store import webhooks as inbox
from synckit.store.db import SyncConn
from synckit.web.base import act, ids_of, render, state_of

__all__ = ["routes"]

LIMIT = 100


def _filter(request: Request, name: str, allowed: tuple[str, ...] | None = None) -> str | None:
    value = request.query_params.get(name) or None
    if value is not None and allowed is not None and value not in allowed:
        return None
    return value[:200] if value is not None else None


async def webhooks_page(request: Request) -> Response:
    db = state_of(request).database
    filters = {
        "connector": _filter(request, "connector"),
        "tenant": _filter(request, "tenant"),
        "status": _filter(request, "status", inbox.STATUSES),
    }

    def read(conn: SyncConn) -> tuple[list[inbox.WebhookCounts], list[Any], list[Any]]:
        counts = inbox.webhook_counts(conn)
        events = inbox.recent_events(conn, limit=LIMIT, **filters)
        tenant = filters["tenant"]
        subs = subscription_store.list_subscriptions(
            conn, tenants=[tenant] if tenant else None, limit=LIMIT
        )
        return counts, events, subs

    counts, events, subs = await db.run_read(read)
    return render(
        request,
        "webhooks.html",
        counts=counts,
        events=events,
        subscriptions=subs,
        statuses=inbox.STATUSES,
        filters={k: v or "" for k, v in filters.items()},
        here=str(request.url.path) + (f"?{request.url.query}" if request.url.query else ""),
    )


async def webhooks_replay(request: Request) -> Response:
    db = state_of(request).database
    form = await request.form()
    ids = ids_of(form)

    async def work() -> str:
        if not ids:
            raise ValueError("no event selected")
        now = utcnow()

        def tx(conn: SyncConn) -> int:
            n = 0
            for event in ids:
                row = inbox.event_row(conn, event)
                if row is not None and row.tenant:
                    job = process_job_spec(row.connector, row.tenant)
                    n += inbox.requeue(conn, event, job, now)
            return n

        n = await db.write(tx)
        return f"{n} webhook event(s) back to pending"

    target = ",".join(map(str, ids[:20]))
    return await act(request, "webhooks.replay", target, work, default="/webhook-events")


def routes() -> list[Route]:
    """The page's routes, for the console's route list."""
    return [
        Route("/webhook-events", webhooks_page),
        Route("/webhook-events/replay", webhooks_replay, methods=["POST"]),
    ]
