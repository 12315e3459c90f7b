"""A per-tenant base URL through the runtime's client (both engines)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from synckit import Connector, NextUrlPaginator, Page
from synckit.errors.exceptions import ConfigurationError, PermanentError
from synckit.runtime.sync.context import open_context
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


async def test_adding_a_tenant_whose_config_makes_no_base_url_is_refused(db: Database) -> None:
    """The check runs when a tenant is added: one line naming the field; nothing stored."""
    from synckit import App, list_tenants

    class Polling(Shop):
        name = "shop_polling"

        async def poll(self, ctx: Any, checkpoint: Any) -> AsyncIterator[Any]:
            yield Page([])

        async def handle(self, ctx: Any, record: Any) -> None:
            pass

    app = App([Polling])
    with pytest.raises(ConfigurationError, match=r"^invalid config .*shop: 'a/b' cannot be"):
        await app.add_tenant(db, "acme", "shop_polling", {"shop": "a/b"})
    assert await list_tenants(db) == []
    await app.add_tenant(db, "acme", "shop_polling", {"shop": "acme"})
    assert [t.tenant for t in await list_tenants(db)] == ["acme"]
