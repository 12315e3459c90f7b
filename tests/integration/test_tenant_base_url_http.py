"""A per-tenant base URL through the runtime's client (both engines)."""

from __future__ import annotations

import httpx
import pytest
from pydantic import BaseModel

from synckit import Connector, NextUrlPaginator
from synckit.errors import PermanentError
from synckit.runtime.context import open_context
from synckit.store.db import Database


class ShopConfig(BaseModel):
    shop: str


class Shop(Connector[ShopConfig]):
    name = "shop"
    base_url = "https://{shop}.myshopify.test/admin/api/2024-01"


async def test_ctx_http_uses_the_tenants_base_and_a_next_link_stays_on_its_origin(
    db: Database,
) -> None:
    """Through the runtime's client: relative URLs go to the tenant's host; a next link to
    another tenant's host is refused, and no request goes there."""
    hosts: list[str] = []

    def api(request: httpx.Request) -> httpx.Response:
        hosts.append(f"{request.url.host}{request.url.path}")
        return httpx.Response(
            200,
            json={"items": [{"id": 1}], "next": "https://other.myshopify.test/admin/x?page=2"},
        )

    connector = Shop("acme", {"shop": "acme"})
    async with open_context(
        db, connector, resource_key="shop:acme", transport=httpx.MockTransport(api)
    ) as ctx:
        with pytest.raises(PermanentError, match=r"other\.myshopify\.test.*not followed"):
            async for _ in NextUrlPaginator(records="items").pages(ctx.http, "/orders.json"):
                pass
    assert hosts == ["acme.myshopify.test/admin/api/2024-01/orders.json"]
