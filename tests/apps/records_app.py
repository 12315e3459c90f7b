"""An App whose stream declares records: orders (and their lines) land in tables.

The API (``$RECORDS_APP_URL``, a loopback server in the tests, :class:`OrdersApi`) pages
``GET /orders?page=N`` (``$RECORDS_APP_PAGE`` records a page). Every cycle is a full
sync: its id (the page-1 time) rides in the checkpoint, and the last page sweeps.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import BaseModel, Field

from synckit import App, Connector, Page, Records, Stream, SyncContext


class Line(BaseModel):
    order_id: str
    n: int
    sku: str
    qty: int


class Order(BaseModel):
    id: str
    customer: str
    total: float
    status: str = "open"
    placed_at: datetime = Field(alias="placedAt")
    tags: list[str] = []
    note: str | None = None
    points: int | None = None


# Later versions of the model, for `db upgrade` tests ($RECORDS_APP_VARIANT).
_VARIANT = os.environ.get("RECORDS_APP_VARIANT", "")
if _VARIANT == "optional":

    class Order(Order):  # type: ignore[no-redef]
        gift: bool | None = None

elif _VARIANT == "type":

    class Order(Order):  # type: ignore[no-redef]
        total: str  # type: ignore[assignment]

elif _VARIANT == "required":

    class Order(Order):  # type: ignore[no-redef]
        region: str


def _lines(order: Any) -> list[dict[str, Any]]:
    return [
        {"order_id": order["id"], "n": i, **line} for i, line in enumerate(order.get("lines", []))
    ]


def fix(raw: Any) -> Any:
    """The mapping's repair step (a test replaces it to "fix the data")."""
    return raw


ORDERS = Records(
    Order,
    table="orders",
    key="id",
    map=lambda raw: fix(raw),
    sweep=True,
    deleted=lambda r: bool(r.get("@removed")),
    children=(Records(Line, table="order_lines", key=("order_id", "n"), rows=_lines),),
)


class Shop(Connector):
    name = "shop"
    base_url = os.environ.get("RECORDS_APP_URL", "http://127.0.0.1:9")
    streams = (Stream("orders", records=ORDERS),)

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        state = checkpoint if isinstance(checkpoint, dict) and "page" in checkpoint else None
        page = state["page"] if state else 1
        sync = state["sync"] if state else datetime.now(UTC).isoformat()
        while True:
            body = (
                await ctx.http.get("/orders", params={"page": page, "tenant": self.tenant})
            ).json()
            nxt = body["next"]
            cp = {"page": nxt, "sync": sync} if nxt else {"done": sync}
            yield Page(body["items"], checkpoint=cp, full_sync=sync, sweep=nxt is None)
            if nxt is None:
                return
            page = nxt


app = App([Shop], scheduler_every=__import__("datetime").timedelta(seconds=1))


# --- the API, for the tests ---------------------------------------------------------------


def order(i: int, *, version: int = 0, lines: int = 1) -> dict[str, Any]:
    return {
        "id": f"o{i:06d}",
        "customer": f"c{i % 17}",
        "total": round(i * 1.5 + version, 2),
        "placedAt": "2026-11-01T10:00:00+00:00",
        "tags": ["a", f"v{version}"],
        "lines": [{"sku": f"s{i}-{n}", "qty": n + 1 + version} for n in range(lines)],
    }


class OrdersApi:
    """A paged orders API per tenant on loopback (a thread), editable while it serves."""

    def __init__(self, per_page: int = 100) -> None:
        self.per_page = per_page
        self.data: dict[str, list[dict[str, Any]]] = {}
        self.fail_page: dict[str, int] = {}
        self.gets = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(url.query))
                status, body = owner.respond(q.get("tenant", ""), int(q.get("page", "1")))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def respond(self, tenant: str, page: int) -> tuple[int, Any]:
        self.gets += 1
        if self.fail_page.get(tenant) == page:
            return 400, {"error": "page refused"}
        items = self.data.get(tenant, [])
        chunk = items[(page - 1) * self.per_page : page * self.per_page]
        more = page * self.per_page < len(items)
        return 200, {"items": chunk, "next": page + 1 if more else None}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def wait_for(predicate: Any, budget: float = 120.0) -> None:
    deadline = time.monotonic() + budget
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached within the budget")
        time.sleep(0.05)


def far_app(url: str) -> App:
    """The shop, its orders and lines in another database (``Records(database=url)``)."""
    import dataclasses

    class FarShop(Shop):
        streams = (Stream("orders", records=dataclasses.replace(ORDERS, database=url)),)

    return App([FarShop])
