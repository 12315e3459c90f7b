"""The webhook receiver as an ASGI application (Starlette).

Mount it in your own Starlette or FastAPI app::

    from starlette.routing import Mount
    routes = [Mount("/webhooks", app=webhook_app(app))]

or let ``synckit web --app ...`` serve it at ``/webhooks/``. It answers
``POST /<connector>/<tenant>`` (the tenant in the URL, :class:`TenantFromPath`) and
``POST /<connector>`` (the tenant from the body, :class:`TenantFromBody`); the work is
:func:`synckit.runtime.webhooks.receive`'s. The body is read raw, up to the connector's
``max_body`` (larger: 413, without reading further), within ``read_timeout`` seconds (a
slow client gets 408 rather than holding the server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from synckit.runtime.instruments import record_webhook
from synckit.runtime.webhooks import Answer, receive, webhooks_of

if TYPE_CHECKING:
    from synckit.app import App
    from synckit.store.db import Database

__all__ = ["WebhookRouter", "webhook_app"]

log = structlog.get_logger("synckit.webhooks")


class _TooLarge(Exception):
    pass


async def _body(request: Request, cap: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def webhook_app(
    app: App,
    *,
    database: Database | Callable[[], Database | None] | None = None,
    read_timeout: float = 10.0,
) -> Starlette:
    """The receiver for ``app``'s connectors. ``database``: the one to store into (or a
    function returning it, as the console's, opened at its start); default: the App's
    (:meth:`App.database`)."""

    async def db_of() -> Database | None:
        if database is None:
            return await app.database()
        if callable(database):
            return database()
        return database

    async def endpoint(request: Request) -> Response:
        connector = request.path_params["connector"]
        decl = webhooks_of(app, connector)
        if decl is None:
            return Response("no webhooks for this connector\n", 404, media_type="text/plain")
        try:
            body = await asyncio.wait_for(_body(request, decl.max_body), read_timeout)
        except _TooLarge:
            log.warning("webhook.too_large", connector=connector, cap=decl.max_body)
            record_webhook(connector, "too_large")
            return Response("body too large\n", 413, media_type="text/plain")
        except TimeoutError:
            return Response("body not received in time\n", 408, media_type="text/plain")
        except ClientDisconnect:
            return Response(status_code=400)
        db = await db_of()
        if db is None:
            return Response("not ready\n", 503, media_type="text/plain")
        headers = {k.lower(): v for k, v in request.headers.items()}
        answer: Answer = await receive(
            db,
            app,
            connector,
            path_tenant=request.path_params.get("tenant"),
            headers=headers,
            query=dict(request.query_params),
            body=body,
            now=app.clock(),
            log=log,
        )
        return Response(answer.text, answer.status, media_type=answer.content_type)

    return Starlette(
        routes=[
            Route("/{connector}", endpoint, methods=["POST"]),
            Route("/{connector}/{tenant}", endpoint, methods=["POST"]),
        ]
    )


class WebhookRouter:
    """Pure ASGI middleware: requests under ``prefix`` go to the webhook receiver, before
    any of the console's guards (a provider signs its deliveries; it has no console
    token, cookie or CSRF value); everything else passes through."""

    def __init__(self, inner: Any, *, webhooks: Any, prefix: str = "/webhooks") -> None:
        self.app = inner
        self.webhooks = webhooks
        self.prefix = prefix

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith(self.prefix + "/"):
            child = dict(scope)
            child["root_path"] = scope.get("root_path", "") + self.prefix
            child["path"] = path
            await self.webhooks(child, receive, send)
            return
        await self.app(scope, receive, send)
