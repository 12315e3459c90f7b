"""The webhook receiver as an ASGI application.

Mount it in your own Starlette or FastAPI app::

    from starlette.routing import Mount
    routes = [Mount("/webhooks", app=webhook_app(app))]

or let ``synckit web --app ...`` serve it at ``/webhooks/``. It answers
``POST /<connector>/<tenant>`` (the tenant in the URL, :class:`TenantFromPath`) and
``POST /<connector>`` (the tenant from the body, :class:`TenantFromBody`); the work is
:func:`synckit.runtime.sync.webhooks.receive`'s. The body is read raw, up to the connector's
``max_body`` (larger: 413, without reading further), within ``read_timeout`` seconds (a
slow client gets 408 rather than holding the server). A delivery the database could not
store is answered 503 (never a 2xx): the provider delivers it again later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import structlog

from synckit.errors.exceptions import DatabaseError
from synckit.runtime.observe.instruments import record_webhook
from synckit.runtime.sync.webhooks import Answer, receive, webhooks_of

if TYPE_CHECKING:
    from synckit.app import App
    from synckit.store.db import Database

__all__ = ["WebhookReceiver", "WebhookRouter", "webhook_app"]

log = structlog.get_logger("synckit.webhooks")


class _TooLarge(Exception):
    pass


class _Disconnected(Exception):
    pass


async def _body(receive_: Any, declared: bytes | None, cap: int) -> bytes:
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive_()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send(send: Any, answer: Answer, *extra: tuple[bytes, bytes]) -> None:
    body = answer.text.encode()
    headers = [
        (b"content-type", answer.content_type.encode("latin-1")),
        (b"content-length", str(len(body)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class WebhookReceiver:
    """The receiver as a plain ASGI application (:func:`webhook_app` makes one).

    A plain one rather than a Starlette app: a delivery is a POST to one of two paths, and
    Starlette's routing, request and response objects cost a fifth of the web process's
    CPU per delivery (bench.webhooks). Mounted (``root_path``), it routes on the path
    below its mount point."""

    def __init__(
        self,
        app: App,
        database: Database | Callable[[], Database | None] | None,
        read_timeout: float,
    ) -> None:
        self.app = app
        self.database = database
        self.read_timeout = read_timeout

    async def _db(self) -> Database | None:
        if self.database is None:
            return await self.app.database()
        if callable(self.database):
            return self.database()
        return self.database

    async def __call__(self, scope: Any, receive_: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive_()
                kind = message["type"].rsplit(".", 1)[-1]  # startup | shutdown
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        parts = path.split("/")
        if len(parts) not in (2, 3) or parts[0] or not all(parts[1:]):
            await _send(send, Answer(404, "Not Found"))
            return
        if scope["method"] != "POST":
            await _send(send, Answer(405, "Method Not Allowed"), (b"allow", b"POST"))
            return
        await _send(send, await self._deliver(scope, receive_, parts[1], parts[2:]))

    async def _deliver(
        self, scope: Any, receive_: Any, connector: str, tenant: list[str]
    ) -> Answer:
        decl = webhooks_of(self.app, connector)
        if decl is None:
            return Answer(404, "no webhooks for this connector\n")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        declared = headers.get("content-length")
        try:
            body = await asyncio.wait_for(
                _body(receive_, declared.encode() if declared else None, decl.max_body),
                self.read_timeout,
            )
        except _TooLarge:
            log.warning("webhook.too_large", connector=connector, cap=decl.max_body)
            record_webhook(connector, "too_large")
            return Answer(413, "body too large\n")
        except TimeoutError:
            return Answer(408, "body not received in time\n")
        except _Disconnected:
            return Answer(400, "")
        db = await self._db()
        if db is None:
            return Answer(503, "not ready\n")
        query = scope.get("query_string", b"")
        try:
            return await receive(
                db,
                self.app,
                connector,
                path_tenant=tenant[0] if tenant else None,
                headers=headers,
                query=dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True))
                if query
                else {},
                body=body,
                now=self.app.clock(),
                log=log,
            )
        except DatabaseError as exc:
            # Not stored, so no 2xx: the provider retries a 5xx later.
            log.error("webhook.not_stored", connector=connector, error=str(exc)[:500])
            return Answer(503, "not stored, try again later\n")


def webhook_app(
    app: App,
    *,
    database: Database | Callable[[], Database | None] | None = None,
    read_timeout: float = 10.0,
) -> WebhookReceiver:
    """The receiver for ``app``'s connectors. ``database``: the one to store into (or a
    function returning it, as the console's, opened at its start); default: the App's
    (:meth:`App.database`)."""
    return WebhookReceiver(app, database, read_timeout)


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
