"""The runtime fulfils a connector's auth declaration: RuntimeContext.auth_for."""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator
from typing import Any

import pytest
from cryptography.fernet import Fernet
from pydantic import BaseModel

from synckit import Connector, OAuth2, OAuth2Config, Page, SyncContext
from synckit.runtime.credentials.oauth import OAuth2Auth
from synckit.runtime.sync.context import RuntimeContext


class IdpConfig(BaseModel):
    idp: str


class Api(Connector[IdpConfig]):
    name = "api"
    auth = OAuth2(
        lambda c: OAuth2Config(
            token_url=f"https://{c.config.idp}/token", client_id=c.tenant, auth_method="none"
        )
    )

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        yield Page([], checkpoint=None)

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        return None


def test_an_oauth2_declaration_becomes_the_tenants_oauth2auth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """build_auth on a runtime context gives an OAuth2Auth bound to the context's database
    and tenant, with the OAuth2Config the declaration builds for that tenant."""
    monkeypatch.setenv("SYNCKIT_SECRET_KEY", Fernet.generate_key().decode())
    db: Any = object()
    connector = Api("acme", {"idp": "idp.example"})
    ctx = RuntimeContext(
        db=db,
        connector=connector,
        tenant="acme",
        stream="default",
        resource_key="api:acme",
        trace_id="t",
        log=None,
        http=typing.cast(Any, None),
    )
    auth = connector.build_auth(ctx)
    assert isinstance(auth, OAuth2Auth)
    assert (auth.db, auth.tenant) == (db, "acme")
    assert auth.config == OAuth2Config(
        token_url="https://idp.example/token", client_id="acme", auth_method="none"
    )
    assert isinstance(ctx, SyncContext)
