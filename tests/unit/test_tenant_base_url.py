"""Per-tenant base URLs: ``base_url`` naming config fields, filled and checked per tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel

from synckit import Connector, Page, SyncContext
from synckit.errors.exceptions import ConfigurationError


class ShopConfig(BaseModel):
    shop: str
    api_version: str = "2024-01"


class Shop(Connector[ShopConfig]):
    name = "shop"
    base_url = "https://{shop}.myshopify.test/admin/api/{api_version}"

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        yield Page([])

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        pass


class InstanceConfig(BaseModel):
    instance_url: str


class Instance(Connector[InstanceConfig]):
    name = "instance"
    base_url = "{instance_url}/services/data/v59.0"


def test_a_tenant_gets_its_own_base_url_from_its_config() -> None:
    assert Shop("a", {"shop": "acme"}).tenant_base_url == (
        "https://acme.myshopify.test/admin/api/2024-01"
    )
    assert Instance("b", {"instance_url": "https://eu12.sf.test/"}).tenant_base_url == (
        "https://eu12.sf.test/services/data/v59.0"
    )


def test_a_plain_base_url_is_every_tenants() -> None:
    class Plain(Connector):
        name = "plain"
        base_url = "https://api.test/v1"

    assert Plain("a").tenant_base_url == "https://api.test/v1"


@pytest.mark.parametrize(
    ("connector", "config", "message"),
    [
        (Shop, {"shop": "evil.test/x?"}, r"shop: 'evil\.test/x\?' cannot be placed in base_url"),
        (Shop, {"shop": "a@b"}, "shop: 'a@b' cannot be placed"),
        (Shop, {"shop": ".."}, "shop: '..' cannot be placed"),
        (Shop, {"shop": "acme", "api_version": "v1#x"}, "api_version: 'v1#x' cannot be placed"),
        (Instance, {"instance_url": "eu12.sf.test"}, "instance_url: not an absolute http"),
        (Instance, {"instance_url": "ftp://eu12.sf.test"}, "instance_url: not an absolute http"),
        (
            Instance,
            {"instance_url": "https://u:p@eu12.sf.test"},
            "instance_url: a base URL has no user",
        ),
    ],
)
def test_a_config_that_makes_no_base_url_is_refused_naming_the_field(
    connector: type[Connector[Any]], config: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        connector.validate_config(config, tenant="t1")
    text = str(caught.value)
    assert "\n" not in text and text.startswith("invalid config for tenant 't1'")


def test_a_base_url_naming_no_config_field_is_refused_at_class_definition() -> None:
    with pytest.raises(ConfigurationError, match="base_url names subdomain, which"):

        class Zendesk(Connector[ShopConfig]):
            name = "zd"
            base_url = "https://{subdomain}.zendesk.test"

    with pytest.raises(ConfigurationError, match="a placeholder is a config field's name"):

        class Spec(Connector[ShopConfig]):
            name = "spec"
            base_url = "https://{shop:>10}.test"
