"""A connector that polls nothing: one empty page, no requests (the tenant, paging and
read-path tests need tenants, not traffic)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from synckit import Connector, Page, SyncContext


class Cfg(BaseModel):
    token: str = "x"


class Quiet(Connector[Cfg]):
    name = "quiet"
    base_url = "http://127.0.0.1:9"
    config_model = Cfg

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        yield Page([], checkpoint)

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        return None
