"""The connect flow (authorization code + PKCE + state) against authlib's server on loopback.

Library API on both engines, and `synckit tenants connect` as a subprocess.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select
from waits import PROCESS_TIMEOUT, wait_until  # tests/

from synckit.errors.exceptions import AuthorizationRefused
from synckit.runtime.credentials.authorize import begin_authorization, complete_authorization
from synckit.runtime.credentials.oauth import OAuth2Config
from synckit.runtime.credentials.secrets import TokenCipher
from synckit.store.checkpoints import load_checkpoint
from synckit.store.db import Database, open_database
from synckit.store.tables import connections, pending_authorizations
from synckit.testing.oauth_server import OAuthTestServer

APPS = Path(__file__).parent.parent / "apps"
PUBLIC = "synckit-public-cli"


@pytest.fixture(autouse=True)
def secret_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = Fernet.generate_key().decode()
    monkeypatch.setenv("SYNCKIT_SECRET_KEY", key)
    return key


@pytest.fixture
def server() -> Iterator[OAuthTestServer]:
    with OAuthTestServer() as s:
        s.add_client(PUBLIC, "", auth_methods=["none"])  # a public client: PKCE, no secret
        s.consenting_user = "alice"
        yield s


def public_config(server: OAuthTestServer) -> OAuth2Config:
    return OAuth2Config(
        server.token_url,
        PUBLIC,
        auth_method="none",
        authorize_url=server.authorize_url,
        scope="read",
    )


def consent(url: str) -> str:
    """The user approves on the provider's page: the URL it redirects the browser to."""
    response = httpx.get(url, follow_redirects=False)
    assert response.status_code == 302, response.text
    return response.headers["Location"]


def with_state(callback: str, state: str) -> str:
    parts = urlsplit(callback)
    query = dict(parse_qsl(parts.query))
    query["state"] = state
    return parts._replace(query=urlencode(query)).geturl()


def oauth_app_env(server: OAuthTestServer, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
        "OAUTH_APP_TOKEN_URL": server.token_url,
        "OAUTH_APP_AUTHORIZE_URL": server.authorize_url,
        "OAUTH_APP_CLIENT_ID": PUBLIC,
        "OAUTH_APP_CLIENT_SECRET": "",
        "OAUTH_APP_RESOURCE_URL": server.resource_url,
        **extra,
    }


async def test_connect_flow_stores_tokens_refuses_wrong_state_and_replays_then_syncs(
    db: Database, server: OAuthTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """consent URL -> scripted consent -> callback -> sealed tokens, active -> first sync."""
    monkeypatch.setenv("OAUTH_APP_RESOURCE_URL", server.resource_url)
    sys.path.insert(0, str(APPS))
    try:
        import oauth_worker_app
    finally:
        sys.path.remove(str(APPS))
    app = oauth_worker_app.app
    monkeypatch.setattr(oauth_worker_app, "RESOURCE", server.resource_url)
    await app.add_tenant(db, "acme", "me")
    cfg = public_config(server)

    url = await begin_authorization(db, "acme", cfg, redirect_uri="http://127.0.0.1:5799/cb")
    query = dict(parse_qsl(urlsplit(url).query))
    assert query["code_challenge_method"] == "S256" and query["client_id"] == PUBLIC
    assert "code_verifier" not in url  # the verifier never leaves us
    callback = consent(url)
    assert callback.startswith("http://127.0.0.1:5799/cb?")

    # A forged or mistaken state is refused, and does not spend the real one.
    with pytest.raises(AuthorizationRefused, match="state is unknown"):
        await complete_authorization(db, "acme", cfg, with_state(callback, "forged"))
    assert server.stats.codes_exchanged == 0

    result = await complete_authorization(db, "acme", cfg, callback)
    assert result.tenant == "acme" and result.connector == "me"
    async with db.begin() as conn:
        row = (await conn.execute(select(connections))).one()
        used = (await conn.execute(select(pending_authorizations.c.used_at))).scalar_one()
    assert row.status == "active" and used is not None
    tokens = TokenCipher.from_env().open(row.token_set)
    assert tokens.access_token and tokens.refresh_token and tokens.issued_at is not None

    # The same callback again: refused by us before the provider sees it.
    with pytest.raises(AuthorizationRefused, match="used already"):
        await complete_authorization(db, "acme", cfg, callback)
    # The same code under a fresh state: the provider refuses the replayed code.
    second = await begin_authorization(db, "acme", cfg, redirect_uri="http://127.0.0.1:5799/cb")
    fresh_state = dict(parse_qsl(urlsplit(second).query))["state"]
    with pytest.raises(AuthorizationRefused, match="invalid_grant") as replay:
        await complete_authorization(db, "acme", cfg, with_state(callback, fresh_state))
    assert replay.value.final
    assert server.stats.codes_exchanged == 1 and server.stats.invalid_grants == 1

    # First sync with the stored tokens.
    cycle = await app.poll(db, "acme")
    assert cycle is not None
    assert await load_checkpoint(db, "acme", "me", "default") == {"user": "alice"}


async def test_a_refused_consent_and_another_tenants_state_are_refused(
    db: Database, server: OAuthTestServer
) -> None:
    """access_denied ends the flow (final); a state issued for another tenant is refused."""
    for tenant in ("acme", "globex"):
        async with db.begin() as conn:
            await conn.execute(
                connections.insert().values(
                    tenant=tenant,
                    connector="me",
                    resource_key=f"me:{tenant}",
                    created_at=_now(),
                    updated_at=_now(),
                )
            )
    cfg = public_config(server)
    url = await begin_authorization(db, "acme", cfg, redirect_uri="http://127.0.0.1:5799/cb")
    with pytest.raises(AuthorizationRefused, match="another tenant"):
        await complete_authorization(db, "globex", cfg, consent(url))
    server.consenting_user = None
    url = await begin_authorization(db, "acme", cfg, redirect_uri="http://127.0.0.1:5799/cb")
    with pytest.raises(AuthorizationRefused, match="access_denied") as denied:
        await complete_authorization(db, "acme", cfg, consent(url))
    assert denied.value.final


def test_begin_without_an_authorize_url_is_a_configuration_error() -> None:
    """The connect flow needs the provider's consent page."""
    from synckit.errors.exceptions import ConfigurationError

    cfg = OAuth2Config("https://idp/token", "public", auth_method="none")
    db = open_database("sqlite:///unused.db")
    with pytest.raises(ConfigurationError, match="authorize_url"):
        asyncio.run(begin_authorization(db, "t", cfg, redirect_uri="http://127.0.0.1/cb"))


def _now() -> Any:
    from synckit.clock import utcnow

    return utcnow()


def test_tenants_connect_cli_over_a_loopback_listener(
    migrated_url: str, server: OAuthTestServer, tmp_path: Path
) -> None:
    """`synckit tenants connect` prints the URL, refuses a wrong state, stores the tokens."""
    env = oauth_app_env(server)
    cli = [sys.executable, "-m", "synckit.cli", "tenants"]
    add = subprocess.run(
        [
            *cli,
            "add",
            "acme",
            "me",
            "--app",
            "oauth_worker_app:app",
            "--database-url",
            migrated_url,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
    )
    assert add.returncode == 0, add.stderr
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(
            [
                *cli,
                "connect",
                "acme",
                "--app",
                "oauth_worker_app:app",
                "--wait",
                "60",
                "--database-url",
                migrated_url,
            ],
            env=env,
            stdout=o,
            stderr=e,
        )
    try:

        def printed() -> list[str]:
            assert proc.poll() is None, err.read_text()
            return [u for u in out.read_text().splitlines() if u.startswith("http")]

        url = wait_until(printed, lambda: err.read_text(), interval=0.05)[0]
        callback = consent(url)
        assert urlsplit(callback).hostname == "127.0.0.1"
        wrong = httpx.get(with_state(callback, "not-the-state"))
        assert wrong.status_code == 400 and "state is unknown" in wrong.text
        assert proc.poll() is None  # still waiting for the real callback
        right = httpx.get(callback)
        assert right.status_code == 200 and "connected" in right.text
        assert proc.wait(PROCESS_TIMEOUT) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "connected: connection active" in out.read_text()
    issued = server.secrets_issued()
    printed = out.read_text() + err.read_text()
    assert not [s for s in issued if s and s in printed]

    async def stored() -> Any:
        d = open_database(migrated_url)
        try:
            async with d.begin() as conn:
                return (await conn.execute(select(connections))).one()
        finally:
            await d.dispose()

    row = asyncio.run(stored())
    assert row.status == "active" and row.token_set is not None


async def test_a_code_exchange_with_an_odd_expires_in_stores_the_tokens(db: Database) -> None:
    """A provider answering the code exchange with expires_in "3600.5" (a string authlib
    cannot int()): the tokens are stored, the lifetime read as 3,600 s. Before, authlib
    raised after the one-use code was spent, so the connect flow could never succeed."""
    sys.path.insert(0, str(APPS))
    try:
        import oauth_worker_app
    finally:
        sys.path.remove(str(APPS))
    with OAuthTestServer(expires_in="3600.5") as server:  # type: ignore[arg-type]
        server.add_client(PUBLIC, "", auth_methods=["none"])
        server.consenting_user = "alice"
        await oauth_worker_app.app.add_tenant(db, "acme", "me")
        cfg = public_config(server)
        url = await begin_authorization(db, "acme", cfg, redirect_uri="http://127.0.0.1:5799/cb")
        before = time.time()
        await complete_authorization(db, "acme", cfg, consent(url))
    async with db.begin() as conn:
        row = (await conn.execute(select(connections))).one()
    tokens = TokenCipher.from_env().open(row.token_set)
    assert row.status == "active" and tokens.access_token and tokens.expires_at is not None
    assert before + 3590 <= tokens.expires_at.timestamp() <= time.time() + 3600
