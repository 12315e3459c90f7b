"""An App whose config hides secrets everywhere a model can: top level, nested models,
lists and dicts of models, unions, and names no redaction rule knows (``pat``,
``webhook_url``). Its connector polls nothing (a worker started on it only checks keys).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from pydantic import BaseModel, Field, SecretStr

from synckit import App, Connector, Page, SyncContext


class Repo(BaseModel):
    name: str
    pat: SecretStr


class Auth(BaseModel):
    user: str
    pat: SecretStr
    webhook_url: SecretStr | None = None


class VaultConfig(BaseModel):
    api_key: SecretStr
    region: str = "eu"
    auth: Auth
    repos: list[Repo] = []
    hooks: dict[str, Annotated[SecretStr, Field(min_length=1)]] = {}
    fallback: Repo | int | None = None


class Vault(Connector[VaultConfig]):
    name = "vault"
    base_url = "http://127.0.0.1:9"

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        return
        yield  # an async generator that yields nothing

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        pass


app = App([Vault])
