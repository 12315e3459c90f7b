"""Tenant configs' secrets at rest, on both engines: sealed in the stored JSON (the
database's own bytes hold none), opened for the connector, old plaintext rows still
read, and `rotate_secrets` moving every sealed row to a new key."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from secrets_app import Vault, app
from sqlalchemy import select, text, update

from synckit.clock import utcnow
from synckit.errors.exceptions import ConfigurationError
from synckit.runtime.admin.bulk import add_tenants
from synckit.runtime.admin.tenants import add_tenant, get_tenant, list_tenants, set_config
from synckit.runtime.credentials.authorize import _open_verifier, begin_authorization
from synckit.runtime.credentials.keys import find_unopenable, models_of, rotate_secrets
from synckit.runtime.credentials.oauth import OAuth2Config
from synckit.runtime.credentials.secrets import TokenCipher, TokenSet, key_id, write_token_set
from synckit.store.db import Database
from synckit.store.tables import connections, pending_authorizations

K1, K2 = Fernet.generate_key().decode(), Fernet.generate_key().decode()
SECRETS = {
    "api_key": "TOP-api-key-7f3a9c",
    "pat": "NESTED-pat-b81d22",
    "webhook_url": "https://hooks.example/T000/B000/XXSECRETXX",
    "repo_pat": "LIST-pat-5e6f70",
    "hook": "DICT-hook-a1b2c3",
}
CONFIG: dict[str, Any] = {
    "api_key": SECRETS["api_key"],
    "auth": {"user": "ann", "pat": SECRETS["pat"], "webhook_url": SECRETS["webhook_url"]},
    "repos": [{"name": "core", "pat": SECRETS["repo_pat"]}],
    "hooks": {"deploy": SECRETS["hook"]},
}


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNCKIT_SECRET_KEY", K1)
    monkeypatch.delenv("SYNCKIT_INSECURE_DEV_TOKENS", raising=False)


async def raw_bytes(db: Database, db_url: str) -> bytes:
    """What the database holds: SQLite's files (main and WAL) byte for byte; PostgreSQL's
    rows as the server returns them in raw SQL."""
    if db.is_postgres:
        async with db.begin() as conn:
            rows = (
                await conn.execute(text("SELECT tenant, config::text, token_set FROM connections"))
            ).all()
        return b"".join(r[0].encode() + (r[1] or "").encode() + bytes(r[2] or b"") for r in rows)
    path = Path(db_url.removeprefix("sqlite:///"))
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


def assert_no_secret(data: bytes) -> None:
    leaked = [name for name, value in SECRETS.items() if value.encode() in data]
    assert not leaked, f"in the database: {leaked}"


async def test_secret_fields_never_reach_the_database_and_the_connector_gets_them(
    db: Database, db_url: str
) -> None:
    """add_tenant, set_config and bulk add_tenants: no SecretStr (top level, nested,
    `pat`, `webhook_url`, in lists and dicts) in the database bytes; reading opens them."""
    await add_tenant(db, "acme", Vault, CONFIG)
    await set_config(db, "acme", {"region": "us"}, connector=Vault)
    result = await add_tenants(
        db, [{"tenant": "bulk", "connector": "vault", "config": CONFIG}], app=app
    )
    assert result.added == 1, result.errors
    assert b"sealed" in await raw_bytes(db, db_url)
    assert_no_secret(await raw_bytes(db, db_url))
    for name in ("acme", "bulk"):
        t = await get_tenant(db, name)
        connector = app.instance(t)
        cfg = connector.config
        assert cfg.api_key.get_secret_value() == SECRETS["api_key"]
        assert cfg.auth.pat.get_secret_value() == SECRETS["pat"]
        assert cfg.auth.webhook_url is not None
        assert cfg.auth.webhook_url.get_secret_value() == SECRETS["webhook_url"]
        assert cfg.repos[0].pat.get_secret_value() == SECRETS["repo_pat"]
        assert cfg.hooks["deploy"].get_secret_value() == SECRETS["hook"]
        assert ("auth", "pat") in t.secret_paths
    masked = (await list_tenants(db, reveal=False))[0]
    assert masked.config["auth"]["pat"] == "***" and masked.config["region"] == "us"


async def test_without_a_key_a_config_with_secrets_is_refused_and_nothing_stored(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SYNCKIT_SECRET_KEY")
    with pytest.raises(ConfigurationError, match="refusing to store secret config fields"):
        await add_tenant(db, "acme", Vault, CONFIG)
    assert await list_tenants(db) == []


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"config": {**CONFIG, "region": "e\u0000u"}}, "region holds a NUL character"),
        (
            {"config": {**CONFIG, "repos": [{"name": "c\u0000", "pat": "p"}]}},
            r"repos\[0\].name holds a NUL",
        ),
        ({"config": {**CONFIG, "hooks": {"a\u0000": "h"}}}, "a key of hooks holds a NUL"),
        ({"resource_key": "vault:\u0000"}, "resource key .* holds a control character"),
        ({"parent_key": "api\n"}, "parent key .* holds a control character"),
        ({"resource_key": "r" * 201}, "resource key is longer than 200 characters"),
    ],
    ids=["config", "list", "key", "resource-key", "parent-key", "long-key"],
)
async def test_what_a_database_cannot_store_is_refused_by_name_on_both_paths(
    db: Database, change: dict[str, Any], says: str
) -> None:
    """A NUL in a config (PostgreSQL's jsonb cannot hold one; SQLite could) or a control
    character in a resource key: add_tenant and each bulk row refuse it by name, nothing
    stored, and a bulk import keeps its other rows."""
    given = {"config": CONFIG, **change}
    with pytest.raises(ConfigurationError, match=says):
        await add_tenant(db, "acme", Vault, **given)
    rows = [{"tenant": "bad", "connector": "vault", **given}]
    rows.append({"tenant": "good", "connector": "vault", "config": CONFIG})
    result = await add_tenants(db, rows, app=app, skip_invalid=True)
    assert result.added == 1 and len(result.errors) == 1, result
    assert result.errors[0].line == 1 and re.search(says, result.errors[0].message)
    assert [t.tenant for t in await list_tenants(db)] == ["good"]


async def test_plaintext_rows_still_read_and_are_sealed_by_the_next_write(
    db: Database, db_url: str
) -> None:
    """A row from before sealing reads as it is; set_config stores it sealed."""
    await add_tenant(
        db,
        "acme",
        Vault,
        {"api_key": "x-placeholder", "auth": {"user": "u", "pat": "p-placeholder"}},
    )
    async with db.begin() as conn:
        await conn.execute(update(connections).values(config=CONFIG))
    assert (
        app.instance(await get_tenant(db, "acme")).config.auth.pat.get_secret_value()
        == SECRETS["pat"]
    )
    await set_config(db, "acme", {"region": "us"}, connector=Vault)
    async with db.begin() as conn:
        stored = (await conn.execute(select(connections.c.config))).scalar_one()
    assert SECRETS["pat"] not in json.dumps(stored)
    assert (await get_tenant(db, "acme")).config["auth"]["pat"] == SECRETS["pat"]


async def test_rotate_reseals_every_row_once_and_the_old_key_can_go(
    db: Database, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sealed under k1 (a config, a token set, a pending verifier, a legacy plaintext
    config); rotate under "k2,k1" re-seals all 4, a second run 0; then k2 alone opens
    everything and the database holds no secret."""
    k1 = TokenCipher([K1])
    await add_tenant(db, "acme", Vault, CONFIG)
    await add_tenant(
        db,
        "old",
        Vault,
        {"api_key": "x-placeholder", "auth": {"user": "u", "pat": "p-placeholder"}},
    )
    async with db.begin() as conn:
        await conn.execute(
            update(connections).where(connections.c.tenant == "old").values(config=CONFIG)
        )
        await write_token_set(
            conn, "acme", TokenSet(access_token="ACCESS-9f8e7d", refresh_token="REFRESH-1a2b3c"),
            cipher=k1, now=utcnow(),
        )  # fmt: skip
    oauth = OAuth2Config(
        token_url="https://id.example/token",
        client_id="c",
        auth_method="none",
        authorize_url="https://id.example/auth",
    )
    await begin_authorization(
        db, "acme", oauth, redirect_uri="http://127.0.0.1:1/cb", cipher=k1, ttl=timedelta(minutes=5)
    )

    rotating = TokenCipher([K2, K1])
    first = await rotate_secrets(db, rotating, models=models_of(app.connectors))
    assert (first.token_sets, first.configs, first.verifiers) == (1, 2, 1), first
    assert first.unreadable == () and first.key_id == key_id(K2)
    again = await rotate_secrets(db, rotating, models=models_of(app.connectors))
    assert again.total == 0

    monkeypatch.setenv("SYNCKIT_SECRET_KEY", K2)
    k2 = TokenCipher([K2])
    assert await find_unopenable(db, k2) == []
    for name in ("acme", "old"):
        assert (await get_tenant(db, name)).config["auth"]["pat"] == SECRETS["pat"]
    async with db.begin() as conn:
        row = (
            await conn.execute(
                select(connections.c.token_set).where(connections.c.tenant == "acme")
            )
        ).one()
        verifier = (await conn.execute(select(pending_authorizations.c.verifier))).scalar_one()
    assert k2.open(row.token_set).access_token == "ACCESS-9f8e7d"
    assert len(_open_verifier(k2, verifier)) > 40
    data = await raw_bytes(db, db_url)
    assert_no_secret(data)  # SQLite's freed pages too: rotate compacts the file
    assert b"ACCESS-9f8e7d" not in data and b"REFRESH-1a2b3c" not in data
    with pytest.raises(ConfigurationError, match=key_id(K2)):
        await get_tenant(db, "acme", cipher=k1)


async def test_the_start_check_names_tenants_whose_secrets_do_not_open(db: Database) -> None:
    """Only active tenants count; a paused one with an unknown key does not stop a worker."""
    await add_tenant(db, "acme", Vault, CONFIG)
    await add_tenant(db, "zed", Vault, CONFIG)
    async with db.begin() as conn:
        await conn.execute(
            update(connections).where(connections.c.tenant == "zed").values(status="paused")
        )
    found = await find_unopenable(db, TokenCipher([K2]))
    assert [(p.tenant, p.what, p.key_id) for p in found] == [("acme", "config", key_id(K1))]
    assert await find_unopenable(db, TokenCipher([K2, K1])) == []
