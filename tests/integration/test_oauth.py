"""OAuth2Auth against a real OAuth2 provider on loopback, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from click.testing import CliRunner
from cryptography.fernet import Fernet
from sqlalchemy import insert, select

from synckit.cli.oauth import reauth_command
from synckit.errors.exceptions import (
    ConfigurationError,
    ConnectionNotFound,
    InsecureTokenStorageWarning,
    NeedsReauth,
    RetryableError,
    TokenEndpointUnavailable,
)
from synckit.runtime.credentials.oauth import OAuth2Auth, OAuth2Config, reauth
from synckit.runtime.credentials.secrets import (
    FERNET_MARKER,
    MAX_TOKEN_LIFETIME,
    PLAINTEXT_MARKER,
    TokenCipher,
    TokenSet,
    save_refreshed_token_set,
)
from synckit.runtime.http.transports import tls_context
from synckit.store.db import Database, open_database
from synckit.store.tables import connections
from synckit.testing.oauth_server import OAuthTestServer


@pytest.fixture(autouse=True)
def secret_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = Fernet.generate_key().decode()
    monkeypatch.setenv("SYNCKIT_SECRET_KEY", key)
    monkeypatch.delenv("SYNCKIT_INSECURE_DEV_TOKENS", raising=False)
    return key


@pytest.fixture
def server() -> Iterator[OAuthTestServer]:
    with OAuthTestServer() as s:
        yield s


def now() -> datetime:
    return datetime.now(UTC)


async def add_connection(
    db: Database,
    tenant: str,
    tokens: dict[str, Any] | None = None,
    *,
    issued_ago: timedelta = timedelta(0),
) -> None:
    """A connection row for ``tenant`` (connector demo), holding ``tokens`` if given,
    as if they had been issued ``issued_ago``."""
    t = now()
    async with db.begin() as conn:
        await conn.execute(
            insert(connections).values(
                tenant=tenant,
                connector="demo",
                resource_key=f"demo:{tenant}",
                created_at=t,
                updated_at=t,
            )
        )
    if tokens is not None:
        await reauth(db, tenant, TokenSet.from_token_response(tokens, now=t - issued_ago))


async def connection_row(db: Database, tenant: str) -> Any:
    async with db.begin() as conn:
        return (await conn.execute(select(connections).where(connections.c.tenant == tenant))).one()


async def stored_tokens(db: Database, tenant: str) -> TokenSet:
    return TokenCipher.from_env().open((await connection_row(db, tenant)).token_set)


def config(server: OAuthTestServer, **kw: Any) -> OAuth2Config:
    return OAuth2Config(server.token_url, server.client_id, server.client_secret, **kw)


async def call(auth: OAuth2Auth, url: str) -> httpx.Response:
    async with httpx.AsyncClient(auth=auth, timeout=10, verify=tls_context()) as client:
        return await client.get(url)


async def test_an_expiring_token_is_refreshed_ahead_and_the_rotation_is_stored(
    db: Database, server: OAuthTestServer
) -> None:
    """Within the refresh margin: one refresh before the call, the rotated tokens stored."""
    # A 60 s token 50 s into its life: inside its margin (a quarter of its lifetime).
    tokens = server.issue_tokens("alice", expires_in=60)
    await add_connection(db, "t1", tokens, issued_ago=timedelta(seconds=50))
    before = await stored_tokens(db, "t1")
    response = await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)
    assert response.status_code == 200 and response.json()["user"] == "alice"
    assert server.stats.token_requests == 1
    assert server.stats.resource_unauthorized == 0  # refreshed before, not after, a 401
    after = await stored_tokens(db, "t1")
    assert after.refresh_token != before.refresh_token  # the rotated one was saved
    assert after.expires_at is not None and after.expires_at > now() + timedelta(minutes=50)
    assert (await connection_row(db, "t1")).token_expires_at == after.expires_at


async def test_a_401_refreshes_once_and_retries_the_request_once(
    db: Database, server: OAuthTestServer
) -> None:
    """A token the API refuses though not expired by our clock: refresh, retry, success."""
    tokens = server.issue_tokens("alice")
    await add_connection(db, "t1", tokens)
    server.expire_access_token(tokens["access_token"])
    response = await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)
    assert response.status_code == 200
    assert server.stats.token_requests == 1
    assert server.stats.resource_requests == 2  # the refused request and its one retry


async def test_a_post_refused_with_401_is_sent_again_with_its_body(
    db: Database, server: OAuthTestServer
) -> None:
    """The retry after a refresh replays the request body (requires_request_body)."""
    tokens = server.issue_tokens("alice")
    await add_connection(db, "t1", tokens)
    server.expire_access_token(tokens["access_token"])
    seen: list[tuple[str | None, bytes]] = []

    def api(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers.get("Authorization"), request.content))
        return httpx.Response(401 if len(seen) == 1 else 201)

    auth = OAuth2Auth(db, "t1", config(server))
    async with httpx.AsyncClient(auth=auth, transport=httpx.MockTransport(api)) as client:
        response = await client.post("https://api.example/items", json={"n": 1})
    assert response.status_code == 201
    assert [body for _, body in seen] == [b'{"n":1}', b'{"n":1}']
    assert seen[0][0] != seen[1][0]  # the retry carries the new token


async def test_a_401_on_a_token_minted_for_the_request_needs_reauth(
    db: Database, server: OAuthTestServer
) -> None:
    """Cached token refused, refreshed, the new one refused too: needs_reauth, one refresh."""
    tokens = server.issue_tokens("alice")
    await add_connection(db, "t1", tokens)
    server.deny_user("alice")
    with structlog.testing.capture_logs() as logs, pytest.raises(NeedsReauth) as info:
        await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)
    cause = "the API answered 401 to an access token minted for this request, inside its"
    assert str(info.value).startswith(cause)
    assert server.stats.token_requests == 1 and server.stats.resource_requests == 2
    row = await connection_row(db, "t1")
    assert row.status == "needs_reauth" and row.status_reason.startswith(cause)
    alerts = [e for e in logs if e["event"] == "connection.needs_reauth"]
    assert len(alerts) == 1 and alerts[0]["alert"] is True and alerts[0]["tenant"] == "t1"
    verdicts = [e["verdict"] for e in logs if e["event"] == "oauth.unauthorized"]
    assert verdicts == ["refresh", "refuse"]  # each 401 logged with what it meant


async def test_a_401_on_re_read_tokens_is_retried_a_bounded_number_of_times_then_retryable(
    db: Database, server: OAuthTestServer
) -> None:
    """401s on tokens someone else minted prove nothing: bounded retries, no needs_reauth."""
    tokens = server.issue_tokens("alice")
    await add_connection(db, "t1", tokens)
    minted: list[str] = []

    def api(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401)

    auth = OAuth2Auth(db, "t1", config(server))

    async def someone_else_refreshed(*args: Any) -> Any:
        raise AssertionError("the provider must not be called")

    # Before each refresh another worker stores a new token: every refresh re-reads.
    real_refresh = auth.refresh

    async def refresh(*, failed: TokenSet | None = None) -> Any:
        fresh = server.issue_tokens("alice")
        minted.append(fresh["access_token"])
        await reauth(db, "t1", TokenSet.from_token_response(fresh, now=now()))
        return await real_refresh(failed=failed)

    auth.refresh = refresh  # type: ignore[method-assign]
    auth._refresh_holding_lease = someone_else_refreshed  # type: ignore[method-assign]
    with structlog.testing.capture_logs() as logs:
        async with httpx.AsyncClient(auth=auth, transport=httpx.MockTransport(api)) as client:
            with pytest.raises(RetryableError, match="never to a token minted"):
                await client.get("https://api.example/x")
    assert (await connection_row(db, "t1")).status == "active"
    verdicts = [e["verdict"] for e in logs if e["event"] == "oauth.unauthorized"]
    assert verdicts == ["refresh", "refresh", "give_up"]
    assert len(minted) == 2 and server.stats.token_requests == 0


async def test_a_revoked_refresh_token_needs_reauth_with_the_reason_and_an_alert(
    db: Database, server: OAuthTestServer
) -> None:
    """invalid_grant: connection needs_reauth (reason names it), alert event, NeedsReauth."""
    tokens = server.issue_tokens("alice", expires_in=0)
    await add_connection(db, "t1", tokens)
    server.revoke_refresh_token(tokens["refresh_token"])
    with structlog.testing.capture_logs() as logs, pytest.raises(NeedsReauth) as info:
        await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)
    assert "invalid_grant" in str(info.value) and "synckit tenants reauth t1" in str(info.value)
    row = await connection_row(db, "t1")
    assert row.status == "needs_reauth" and "invalid_grant" in row.status_reason
    assert [e["event"] for e in logs if e.get("alert")] == ["connection.needs_reauth"]
    assert server.stats.invalid_grants == 1


async def test_a_connection_needing_reauth_never_calls_the_provider(
    db: Database, server: OAuthTestServer
) -> None:
    """Once needs_reauth, requests fail fast with NeedsReauth: no refresh, no API call."""
    tokens = server.issue_tokens("alice", expires_in=0)
    await add_connection(db, "t1", tokens)
    server.revoke_refresh_token(tokens["refresh_token"])
    with pytest.raises(NeedsReauth):
        await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)
    server.reset_stats()
    for _ in range(3):
        with pytest.raises(NeedsReauth):
            await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)
    assert server.stats.token_requests == 0 and server.stats.resource_requests == 0


async def test_another_workers_refresh_is_used_without_calling_the_provider(
    db: Database, server: OAuthTestServer
) -> None:
    """A 401 after another worker refreshed: the stored fresh token is used as it is."""
    tokens = server.issue_tokens("alice")
    await add_connection(db, "t1", tokens)
    slow = OAuth2Auth(db, "t1", config(server))
    assert (await call(slow, server.resource_url)).status_code == 200  # caches the token
    server.expire_access_token(tokens["access_token"])
    fast = OAuth2Auth(db, "t1", config(server))
    assert (await call(fast, server.resource_url)).status_code == 200  # refreshes
    assert server.stats.token_requests == 1
    assert (await call(slow, server.resource_url)).status_code == 200  # 401, then re-read
    assert server.stats.token_requests == 1
    assert server.stats.invalid_grants == 0


async def test_a_lease_taken_while_the_read_waited_for_the_lock_is_waited_for(
    db: Database, server: OAuthTestServer
) -> None:
    """Another worker took the refresh lease 0.5 s after this one read its clock (its
    read waited for the lock: a busy machine). That is a refresh in progress, not the
    endpoint's wait: this one waits for it and uses the stored token, without calling
    the provider. (Measured from the clock read before the read, the lease looked longer
    than ``lease_time``, and the job gave up with TokenEndpointUnavailable.)"""
    tokens = server.issue_tokens("alice")
    await add_connection(db, "t1", tokens, issued_ago=timedelta(days=2))  # expired
    cfg = config(server)
    t0, taken_after = now(), timedelta(seconds=0.5)
    async with db.begin() as conn:
        await conn.execute(
            connections.update()
            .where(connections.c.tenant == "t1")
            .values(
                refresh_owner="other", refresh_until=t0 + timedelta(seconds=0.5) + cfg.lease_time
            )
        )
    readings: list[datetime] = []
    read_again = asyncio.Event()

    def clock() -> datetime:
        # The deadline's reading and the loop's first come before the read; later ones
        # after the lock was had. A fourth: it decided to wait, and reads again.
        readings.append(t0 if len(readings) < 2 else t0 + taken_after)
        if len(readings) >= 4:
            read_again.set()
        return readings[-1]

    auth = OAuth2Auth(db, "t1", cfg, clock=clock)
    waiting = asyncio.create_task(auth.refresh())
    done, _ = await asyncio.wait(
        [waiting, asyncio.create_task(read_again.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    if waiting in done:
        waiting.result()  # gave up: raises what it raised
    fresh = TokenSet.from_token_response(server.issue_tokens("alice"), now=t0)
    async with db.begin() as conn:  # the other worker's refresh lands
        assert await save_refreshed_token_set(
            conn, "t1", fresh, owner="other", cipher=TokenCipher.from_env(), now=t0
        )
    result = await waiting
    assert result.token.access_token == fresh.access_token
    assert server.stats.token_requests == 0


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post"])
async def test_client_credentials_grant_with_the_method_the_provider_requires(
    db: Database, server: OAuthTestServer, method: str
) -> None:
    """A client registered for one auth method only gets tokens with exactly that method."""
    server.add_client("strict", "strict-secret", auth_methods=[method])
    await add_connection(db, "svc")
    cfg = OAuth2Config(
        server.token_url, "strict", "strict-secret", grant="client_credentials", auth_method=method
    )
    response = await call(OAuth2Auth(db, "svc", cfg), server.resource_url)
    assert response.status_code == 200 and response.json()["client_id"] == "strict"
    assert server.stats.token_requests_by_grant == {"client_credentials": 1}
    assert (await stored_tokens(db, "svc")).refresh_token is None


async def test_the_wrong_client_auth_method_is_refused_as_needs_reauth(
    db: Database, server: OAuthTestServer
) -> None:
    """A provider refusing the client (invalid_client) needs a human: needs_reauth."""
    server.add_client("post-only", "pw", auth_methods=["client_secret_post"])
    await add_connection(db, "svc")
    cfg = OAuth2Config(server.token_url, "post-only", "pw", grant="client_credentials")
    with pytest.raises(NeedsReauth, match="invalid_client"):
        await call(OAuth2Auth(db, "svc", cfg), server.resource_url)
    assert (await connection_row(db, "svc")).status == "needs_reauth"


async def test_an_unreachable_token_endpoint_is_retryable_and_keeps_the_connection(
    db: Database, server: OAuthTestServer
) -> None:
    """Provider down: a RetryableError; the connection stays active with its tokens."""
    await add_connection(db, "t1", server.issue_tokens("alice", expires_in=0))
    before = await stored_tokens(db, "t1")
    cfg = OAuth2Config("http://127.0.0.1:9/token", server.client_id, server.client_secret)
    with pytest.raises(TokenEndpointUnavailable) as info:
        await call(OAuth2Auth(db, "t1", cfg), server.resource_url)
    assert isinstance(info.value, RetryableError)
    assert (await connection_row(db, "t1")).status == "active"
    assert await stored_tokens(db, "t1") == before


async def test_a_provider_outage_does_not_fail_requests_while_the_token_still_works(
    db: Database, server: OAuthTestServer
) -> None:
    """Refresh-ahead that fails (provider down) falls back to the not-yet-expired token."""
    tokens = server.issue_tokens("alice", expires_in=60)
    await add_connection(db, "t1", tokens, issued_ago=timedelta(seconds=50))  # in its margin
    cfg = OAuth2Config("http://127.0.0.1:9/token", server.client_id, server.client_secret)
    with structlog.testing.capture_logs() as logs:
        response = await call(OAuth2Auth(db, "t1", cfg), server.resource_url)
    assert response.status_code == 200
    assert "oauth.refresh_deferred" in [e["event"] for e in logs]


async def test_a_token_endpoint_error_page_is_retryable(db: Database) -> None:
    """A 503 (or an HTML page) from the token endpoint is transient, not a refusal."""

    def idp(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="<html>maintenance</html>")

    await add_connection(db, "t1")
    await reauth(db, "t1", TokenSet("a", "r", expires_at=now()))
    cfg = OAuth2Config("https://idp.example/token", "c", "s")
    auth = OAuth2Auth(db, "t1", cfg, transport=httpx.MockTransport(idp))
    with pytest.raises(TokenEndpointUnavailable, match="503"):
        await call(auth, "https://api.example/x")
    assert (await connection_row(db, "t1")).status == "active"


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (429, {"error": "slow_down"}),
        (400, {"error": "temporarily_unavailable"}),
        (503, {"error": "invalid_grant"}),
    ],
)
async def test_a_throttled_token_endpoint_is_retryable_after_its_retry_after(
    db: Database, status: int, body: dict[str, str]
) -> None:
    """'Not now' from the token endpoint (429, 503, transient codes) is no refusal."""

    def idp(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body, headers={"Retry-After": "7"})

    await add_connection(db, "t1")
    await reauth(db, "t1", TokenSet("a", "r", expires_at=now()))
    cfg = OAuth2Config("https://idp.example/token", "c", "s")
    auth = OAuth2Auth(db, "t1", cfg, transport=httpx.MockTransport(idp))
    with pytest.raises(TokenEndpointUnavailable) as info:
        await call(auth, "https://api.example/x")
    assert info.value.retry_after == timedelta(seconds=7)
    assert (await connection_row(db, "t1")).status == "active"


async def test_reauth_resumes_a_connection_and_refuses_an_unknown_tenant(
    db: Database, server: OAuthTestServer
) -> None:
    """reauth() stores the new tokens and sets the connection active again."""
    tokens = server.issue_tokens("alice", expires_in=0)
    await add_connection(db, "t1", tokens)
    server.revoke_refresh_token(tokens["refresh_token"])
    with pytest.raises(NeedsReauth):
        await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)
    fresh = TokenSet.from_token_response(server.issue_tokens("alice"), now=now())
    result = await reauth(db, "t1", fresh)
    assert result.previous_status == "needs_reauth" and result.resource_key == "demo:t1"
    row = await connection_row(db, "t1")
    assert row.status == "active" and row.status_reason is None
    assert (await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)).is_success
    with pytest.raises(ConnectionNotFound):
        await reauth(db, "nobody", fresh)


async def test_stored_token_bytes_are_encrypted(db: Database, server: OAuthTestServer) -> None:
    """The token_set column holds Fernet ciphertext containing neither token."""
    tokens = server.issue_tokens("alice")
    await add_connection(db, "t1", tokens)
    raw = bytes((await connection_row(db, "t1")).token_set)
    assert raw.startswith(FERNET_MARKER)
    assert tokens["access_token"].encode() not in raw
    assert tokens["refresh_token"].encode() not in raw


async def test_without_a_key_tokens_are_not_stored(
    db: Database, server: OAuthTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No SYNCKIT_SECRET_KEY: reauth is refused with the clear message; nothing stored."""
    await add_connection(db, "t1")
    monkeypatch.delenv("SYNCKIT_SECRET_KEY")
    with pytest.raises(ConfigurationError, match="refusing to store OAuth tokens unencrypted"):
        await reauth(db, "t1", TokenSet.from_token_response(server.issue_tokens("a"), now=now()))
    assert (await connection_row(db, "t1")).token_set is None


async def test_with_the_dev_flag_tokens_are_stored_in_plaintext_with_a_warning(
    db: Database, server: OAuthTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SYNCKIT_INSECURE_DEV_TOKENS=1: a warning, the marker, and the flow still works."""
    await add_connection(db, "t1")
    monkeypatch.delenv("SYNCKIT_SECRET_KEY")
    monkeypatch.setenv("SYNCKIT_INSECURE_DEV_TOKENS", "1")
    tokens = server.issue_tokens("alice", expires_in=0)
    with (
        pytest.warns(InsecureTokenStorageWarning),
        structlog.testing.capture_logs() as logs,
    ):
        await reauth(db, "t1", TokenSet.from_token_response(tokens, now=now()))
    assert "secrets.insecure_dev_tokens" in [e["event"] for e in logs]
    assert bytes((await connection_row(db, "t1")).token_set).startswith(PLAINTEXT_MARKER)
    with pytest.warns(InsecureTokenStorageWarning):  # the refresh stores tokens again
        assert (await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)).is_success


def test_a_sync_client_is_refused(server: OAuthTestServer, tmp_path: Path) -> None:
    """OAuth2Auth refreshes through the async database: a sync client gets a clear error."""
    db = open_database(f"sqlite:///{tmp_path / 'unused.db'}")  # never connected
    with (
        httpx.Client(auth=OAuth2Auth(db, "t1", config(server))) as client,
        pytest.raises(RuntimeError, match="AsyncClient"),
    ):
        client.get(server.resource_url)
    assert server.stats.resource_requests == 0


def test_reauth_cli_stores_the_tokens_and_never_prints_them(
    migrated_url: str, secret_key: str
) -> None:
    """`tenants reauth` (the command object): tokens stored, connection active, not echoed."""

    async def setup() -> None:
        d = open_database(migrated_url)
        try:
            await add_connection(d, "t1")
            async with d.begin() as conn:
                await conn.execute(
                    connections.update().values(status="needs_reauth", status_reason="revoked")
                )
        finally:
            await d.dispose()

    asyncio.run(setup())
    runner = CliRunner()
    access, refresh = "at-CLI-secret-value", "rt-CLI-secret-value"
    result = runner.invoke(
        reauth_command,
        ["t1", "--refresh-token", refresh, "--expires-in", "3600", "--database-url", migrated_url],
        env={"SYNCKIT_REAUTH_ACCESS_TOKEN": access},  # kept out of the command line
    )
    assert result.exit_code == 0, result.output
    assert "re-authorised" in result.output and "was needs_reauth" in result.output
    assert access not in result.output and refresh not in result.output

    async def check() -> tuple[Any, TokenSet]:
        d = open_database(migrated_url)
        try:
            return await connection_row(d, "t1"), await stored_tokens(d, "t1")
        finally:
            await d.dispose()

    row, tokens = asyncio.run(check())
    assert row.status == "active"
    assert (tokens.access_token, tokens.refresh_token) == (access, refresh)
    assert tokens.expires_at is not None

    # A refresh token alone, from the hidden prompt: stored; the first request refreshes.
    alone = runner.invoke(
        reauth_command, ["t1", "--database-url", migrated_url], input="rt-only-secret\n"
    )
    assert alone.exit_code == 0, alone.output
    assert "the first request refreshes" in alone.output and "rt-only-secret" not in alone.output
    _, only = asyncio.run(check())
    assert (only.access_token, only.refresh_token) == (None, "rt-only-secret")
    empty = runner.invoke(reauth_command, ["t1", "--database-url", migrated_url], input="\n\n")
    assert empty.exit_code == 2 and "give --refresh-token or --access-token" in empty.output

    missing = runner.invoke(
        reauth_command, ["ghost", "--access-token", access, "--database-url", migrated_url]
    )
    assert missing.exit_code == 2
    assert "no connection for tenant 'ghost'" in missing.output
    assert access not in missing.output


# --- no secret anywhere -----------------------------------------------------------------

# The test provider's own grant classes log issued tokens at debug level; they are the
# provider's logs, not ours.
_PROVIDER_LOGGERS = ("authlib.oauth2.rfc6749",)


async def test_no_token_or_client_secret_in_logs_errors_or_output(
    db: Database,
    server: OAuthTestServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every path (refresh, 401 retry, refusals, outages, dev mode): no secret leaks."""
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []

    def keep(exc: BaseException) -> None:
        texts.extend([str(exc), repr(exc), "".join(traceback.format_exception(exc))])

    with structlog.testing.capture_logs() as logs:
        # refresh ahead of expiry, and a 401 retry
        await add_connection(db, "ok", server.issue_tokens("alice", expires_in=0))
        assert (await call(OAuth2Auth(db, "ok", config(server)), server.resource_url)).is_success
        t = server.issue_tokens("bob")
        await add_connection(db, "retry", t)
        server.expire_access_token(t["access_token"])
        auth = OAuth2Auth(db, "retry", config(server, auth_method="client_secret_post"))
        assert (await call(auth, server.resource_url)).is_success
        texts.append(repr(auth))
        # invalid_grant
        t = server.issue_tokens("carol", expires_in=0)
        await add_connection(db, "revoked", t)
        server.revoke_refresh_token(t["refresh_token"])
        with pytest.raises(NeedsReauth) as e1:
            await call(OAuth2Auth(db, "revoked", config(server)), server.resource_url)
        keep(e1.value)
        # 401 on a token minted for the request
        await add_connection(db, "denied", server.issue_tokens("dave"))
        server.deny_user("dave")
        with pytest.raises(NeedsReauth) as e2:
            await call(OAuth2Auth(db, "denied", config(server)), server.resource_url)
        keep(e2.value)
        # wrong client secret, and an unreachable provider
        await add_connection(db, "badclient", server.issue_tokens("erin", expires_in=0))
        bad = OAuth2Config(server.token_url, server.client_id, "wrong-" + server.client_secret)
        with pytest.raises(NeedsReauth) as e3:
            await call(OAuth2Auth(db, "badclient", bad), server.resource_url)
        keep(e3.value)
        await add_connection(db, "down", server.issue_tokens("frank", expires_in=0))
        down = OAuth2Config("http://127.0.0.1:9/token", server.client_id, server.client_secret)
        with pytest.raises(TokenEndpointUnavailable) as e4:
            await call(OAuth2Auth(db, "down", down), server.resource_url)
        keep(e4.value)
        # dev mode
        monkeypatch.delenv("SYNCKIT_SECRET_KEY")
        monkeypatch.setenv("SYNCKIT_INSECURE_DEV_TOKENS", "1")
        await add_connection(db, "dev")
        with pytest.warns(InsecureTokenStorageWarning) as warned:
            await reauth(
                db, "dev", TokenSet.from_token_response(server.issue_tokens("gina"), now=now())
            )
        texts.extend(str(w.message) for w in warned)
        texts.append(repr(await stored_tokens(db, "dev")))

    texts.extend(repr(e) for e in logs)
    texts.extend(
        r.getMessage() + repr(r.args)
        for r in caplog.records
        if not r.name.startswith(_PROVIDER_LOGGERS)
    )
    assert len(logs) >= 8 and caplog.records  # the capture did capture
    async with db.begin() as conn:
        reasons = [r[0] or "" for r in await conn.execute(select(connections.c.status_reason))]
    texts.extend(reasons)
    blob = "\n".join(texts)
    secrets = server.secrets_issued() | {"wrong-" + server.client_secret}
    assert len(secrets) > 10
    leaked = sorted(s for s in secrets if s in blob)
    assert leaked == []


# --- the refresh lease, client authentication, reasons ----------------------------------


async def set_lease(db: Database, tenant: str, owner: str, until: datetime) -> None:
    async with db.begin() as conn:
        await conn.execute(
            connections.update()
            .where(connections.c.tenant == tenant)
            .values(refresh_owner=owner, refresh_until=until)
        )


async def test_a_crashed_refreshers_lease_expires_and_the_next_one_refreshes(
    db: Database, server: OAuthTestServer
) -> None:
    """A lease left by a dead process is waited out (until its expiry), then taken."""
    await add_connection(db, "t1", server.issue_tokens("alice", expires_in=0))
    await set_lease(db, "t1", "crashed-worker", now() + timedelta(seconds=0.6))
    started = asyncio.get_running_loop().time()
    response = await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)
    assert response.status_code == 200
    assert asyncio.get_running_loop().time() - started >= 0.5
    assert server.stats.token_requests == 1
    row = await connection_row(db, "t1")
    assert row.refresh_owner is None and row.refresh_until is None  # given back


async def test_while_another_worker_refreshes_a_still_valid_token_is_used_without_waiting(
    db: Database, server: OAuthTestServer
) -> None:
    """Refresh-ahead finds the lease taken: the token in hand still works, so it is sent."""
    tokens = server.issue_tokens("alice", expires_in=60)
    await add_connection(db, "t1", tokens, issued_ago=timedelta(seconds=50))
    await set_lease(db, "t1", "busy-worker", now() + timedelta(seconds=30))
    started = asyncio.get_running_loop().time()
    response = await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)
    assert response.status_code == 200 and server.stats.token_requests == 0
    assert asyncio.get_running_loop().time() - started < 1


async def test_a_throttled_token_endpoint_paces_the_tenant_and_is_not_called_again_at_once(
    db: Database, server: OAuthTestServer
) -> None:
    """429 + Retry-After from the token endpoint: the tenant deferred, one token request."""
    from synckit.store.tables import resources

    await add_connection(db, "t1", server.issue_tokens("alice", expires_in=0))
    server.throttle_tokens(1, 30)
    for _ in range(3):
        with pytest.raises(TokenEndpointUnavailable) as info:
            await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)
        assert info.value.retry_after is not None
        assert info.value.retry_after > timedelta(seconds=25)
    assert server.stats.token_requests == 1 and server.stats.resource_requests == 0
    async with db.begin() as conn:
        paced = (
            await conn.execute(
                select(resources.c.next_available_at).where(resources.c.resource_key == "demo:t1")
            )
        ).scalar_one()
    assert paced > now() + timedelta(seconds=25)
    row = await connection_row(db, "t1")
    # The refresher the endpoint answered keeps the lease through the wait it asked for.
    assert row.status == "active" and row.refresh_owner is not None
    assert row.refresh_until > now() + timedelta(seconds=25)


async def test_a_public_client_authenticates_with_none_and_sends_no_secret(
    db: Database, server: OAuthTestServer
) -> None:
    """auth_method none: the refresh works for a public client; no Basic header at all."""
    server.add_client("public", "", auth_methods=["none"])
    tokens = server.issue_tokens("alice", client_id="public", expires_in=0)
    await add_connection(db, "t1", tokens)
    seen: list[httpx.Request] = []

    class Spy(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(request)
            async with httpx.AsyncClient() as real:
                return await real.send(request)

    cfg = OAuth2Config(server.token_url, "public", auth_method="none")
    auth = OAuth2Auth(db, "t1", cfg, transport=Spy())
    assert (await call(auth, server.resource_url)).status_code == 200
    assert len(seen) == 1 and "authorization" not in seen[0].headers
    assert b"client_secret" not in seen[0].content and b"client_id=public" in seen[0].content


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"auth_method": "client_secret_basic"}, "needs a client_secret"),
        ({"auth_method": "client_secret_post"}, "needs a client_secret"),
        ({"auth_method": "none", "client_secret": "s"}, "give no client_secret"),
        ({"auth_method": "none", "grant": "client_credentials"}, "needs client authentication"),
        ({"auth_method": "private_key_jwt", "client_secret": "s"}, "unsupported client auth"),
    ],
)
def test_client_authentication_is_explicit_never_inferred(
    kwargs: dict[str, Any], message: str
) -> None:
    """A config whose method and secret disagree is a clear ConfigurationError."""
    with pytest.raises(ConfigurationError, match=message):
        OAuth2Config("https://idp/token", "cid", **kwargs)


async def test_a_refresh_token_alone_is_enough(db: Database, server: OAuthTestServer) -> None:
    """reauth with only a refresh token: the first request refreshes, then succeeds."""
    tokens = server.issue_tokens("alice")
    await add_connection(db, "t1")
    await reauth(db, "t1", TokenSet(access_token=None, refresh_token=tokens["refresh_token"]))
    assert (await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)).is_success
    assert server.stats.token_requests == 1 and server.stats.resource_unauthorized == 0


async def test_the_stored_reason_is_the_cause_once_however_often_it_is_raised_and_stored(
    db: Database, server: OAuthTestServer
) -> None:
    """Raised again from storage, and stored again by the worker: never nested."""
    tokens = server.issue_tokens("alice", expires_in=0)
    await add_connection(db, "t1", tokens)
    server.revoke_refresh_token(tokens["refresh_token"])
    with pytest.raises(NeedsReauth) as first:
        await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)
    for _ in range(5):
        with pytest.raises(NeedsReauth) as again:
            await call(OAuth2Auth(db, "t1", config(server)), server.resource_url)
        # What the worker does with a NeedsReauth: store str(exc) as the reason.
        async with db.begin() as conn:
            await conn.execute(connections.update().values(status_reason=str(again.value)))
    reason = (await connection_row(db, "t1")).status_reason
    assert reason == str(first.value)
    assert reason.startswith("the token endpoint refused the refresh_token grant: invalid_grant")
    assert reason.count("needs re-authorisation") == 1 and len(reason) <= 500


@pytest.mark.parametrize(
    ("expires_in", "lives"),
    [
        ("3600.5", timedelta(seconds=3600)),
        ("inf", None),
        ("never", None),
        (1e300, MAX_TOKEN_LIFETIME),
        (10**30, MAX_TOKEN_LIFETIME),
        (-5, timedelta(0)),
    ],
)
async def test_a_refresh_whatever_its_expiry_says_keeps_the_rotated_tokens(
    db: Database, expires_in: Any, lives: timedelta | None
) -> None:
    """The token endpoint answers a refresh with a new access token, a rotated refresh
    token and an odd expires_in: the refresh is kept (the old refresh token may be dead
    now) and the expiry read within [0, a year], or as unknown. Before, authlib's int()
    of "3600.5" or "inf" and synckit's own arithmetic on 1e300 raised, losing the
    rotated refresh token."""

    def idp(request: httpx.Request) -> httpx.Response:
        body = {"access_token": "new", "refresh_token": "r2", "token_type": "Bearer"}
        return httpx.Response(200, json={**body, "expires_in": expires_in})

    def api(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"auth": request.headers["authorization"]})

    await add_connection(db, "t1")
    await reauth(db, "t1", TokenSet("old", "r1", expires_at=now()))
    cfg = OAuth2Config("https://idp.example/token", "c", "s")
    auth = OAuth2Auth(db, "t1", cfg, transport=httpx.MockTransport(idp))
    before = now()
    async with httpx.AsyncClient(auth=auth, transport=httpx.MockTransport(api)) as client:
        response = await client.get("https://api.example/x")
    assert response.json() == {"auth": "Bearer new"}
    stored = await stored_tokens(db, "t1")
    assert (stored.access_token, stored.refresh_token) == ("new", "r2")
    if lives is None:
        assert stored.expires_at is None
    else:
        assert stored.expires_at is not None
        assert before + lives - timedelta(seconds=5) <= stored.expires_at <= now() + lives
