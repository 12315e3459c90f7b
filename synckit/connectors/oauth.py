"""OAuth2 for a tenant's connection: bearer auth that refreshes itself, once, everywhere.

:class:`OAuth2Auth` is an ``httpx.Auth`` for ``httpx.AsyncClient``. It adds the tenant's
bearer token to each request; refreshes it ahead of expiry (``leeway``; should the
provider be down then, the still-valid token is used) and on a 401 (refresh once, retry
the request once); and turns a refusal into :class:`NeedsReauth`.

Single flight across every process
----------------------------------
A refresh takes the per-connection lock in the database (``SELECT ... FOR UPDATE`` on the
``connections`` row on PostgreSQL; on SQLite the transaction is ``BEGIN IMMEDIATE``, which
holds the write lock), then re-reads the stored token. If another worker refreshed while
this one waited (the stored access token is fresh and differs from the one that failed),
it is used as it is and the provider is not called. Otherwise the provider is called
*inside* the lock, and the new token set, with the provider's rotated refresh token, is
committed in that same transaction before any request uses it. Holding the lock across
the provider call is what makes the refresh single-flight; the call is bounded by
``OAuth2Config.timeout`` so that the lock is short (on SQLite every writer waits for it,
within SQLite's busy timeout).

If the commit fails after the provider rotated the refresh token, the new refresh token
is lost and the next refresh gets ``invalid_grant``: the connection then asks for
re-authorisation, the one honest outcome (nothing can recover a lost token).

Refusals
--------
The token endpoint refusing a refresh (any OAuth error such as ``invalid_grant``: the
refresh token was revoked or expired), or a 401 straight after a refresh, means a human
must re-authorise: the connection is marked ``needs_reauth`` with the reason, the event
``connection.needs_reauth`` (``alert=True``) is logged, and :class:`NeedsReauth` is
raised; the worker then keeps the job without spending its attempt and stops claiming
the tenant's jobs. :func:`reauth` stores new tokens and makes the connection active again.
A token endpoint that fails (unreachable, 5xx, 429, ``temporarily_unavailable``, an
unreadable body) is a :class:`TokenEndpointUnavailable`, retried like any transient
failure (after the provider's ``Retry-After``, if it sent one); the connection keeps its
status and tokens.

Tokens and client secrets appear in no log event and no exception message.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncGenerator, Callable, Generator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, NoReturn

import httpx
import structlog
from authlib.deprecate import AuthlibDeprecationWarning

from synckit.connectors.secrets import (
    TokenCipher,
    TokenSet,
    mark_needs_reauth,
    read_connection,
    utcnow,
    write_token_set,
)
from synckit.errors.exceptions import NeedsReauth, RetryableError
from synckit.errors.headers import server_wait
from synckit.runtime import jobs as job_store
from synckit.runtime.db import Database

with warnings.catch_warnings():
    # authlib prefers the httpx2 fork and warns when it falls back to httpx; httpx is
    # synckit's HTTP client, so the warning is noise for every synckit user. (authlib's
    # own "always" filter is installed by the import above, outside this block, so that
    # leaving the block does not undo it.)
    warnings.filterwarnings("ignore", "The httpx module", AuthlibDeprecationWarning)
    from authlib.integrations.base_client import OAuthError
    from authlib.integrations.httpx_client import AsyncOAuth2Client

log = structlog.get_logger("synckit.oauth")

GrantType = Literal["refresh_token", "client_credentials"]
ClientAuthMethod = Literal["client_secret_basic", "client_secret_post"]


#: OAuth error codes that say "not now" rather than "no": retried, not a refusal.
_TRANSIENT_ERRORS = frozenset({"temporarily_unavailable", "server_error", "slow_down"})


class TokenEndpointUnavailable(RetryableError):
    """The token endpoint could not give an answer (unreachable, 5xx, 429, garbage)."""


@dataclass(frozen=True)
class OAuth2Config:
    """How to get tokens for one connector's API (the same for all its tenants).

    ``grant`` is ``refresh_token`` (tenants authorised once, then refreshed) or
    ``client_credentials`` (the client's own credentials, no user). ``auth_method`` is how
    the client authenticates at the token endpoint, as the provider requires.
    """

    token_url: str
    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    grant: GrantType = "refresh_token"
    auth_method: ClientAuthMethod = "client_secret_basic"
    scope: str | None = None
    #: Refresh this long before the stored expiry.
    leeway: timedelta = timedelta(seconds=60)
    #: Bound on one token request (it runs while the connection is locked).
    timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.grant not in ("refresh_token", "client_credentials"):
            raise ValueError(f"unsupported grant {self.grant!r}")
        if self.auth_method not in ("client_secret_basic", "client_secret_post"):
            raise ValueError(f"unsupported client auth method {self.auth_method!r}")


def _scrub(text: str, *secrets: str | None) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


class OAuth2Auth(httpx.Auth):
    """Bearer auth for one tenant, refreshed single-flight through the database.

    One instance may serve many concurrent requests; it keeps the last token it saw in
    memory and goes to the database when that token expires or is refused. Use it with
    ``httpx.AsyncClient`` only.

    ``transport`` is passed to the client that calls the token endpoint (for tests).
    """

    requires_request_body = True  # a request refused with 401 is sent again

    def __init__(
        self,
        db: Database,
        tenant: str,
        config: OAuth2Config,
        *,
        cipher: TokenCipher | None = None,
        clock: Callable[[], datetime] = utcnow,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.db = db
        self.tenant = tenant
        self.config = config
        self.cipher = cipher or TokenCipher.from_env()
        self.clock = clock
        self.transport = transport
        self._token: TokenSet | None = None

    def __repr__(self) -> str:
        return f"OAuth2Auth(tenant={self.tenant!r}, token_url={self.config.token_url!r})"

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response]:
        raise RuntimeError("OAuth2Auth refreshes through the database: use httpx.AsyncClient")

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        token, refreshed = await self._usable_token()
        request.headers["Authorization"] = token.authorization
        response = yield request
        if response.status_code != 401:
            return
        if refreshed:
            await self._refused("the API answered 401 straight after a token refresh")
        token = await self.refresh(failed=token)
        request.headers["Authorization"] = token.authorization
        response = yield request
        if response.status_code == 401:
            await self._refused("the API answered 401 straight after a token refresh")

    # --- tokens ---------------------------------------------------------------------

    async def _usable_token(self) -> tuple[TokenSet, bool]:
        """A token to send, and whether it comes from a refresh made just now."""
        token = self._token
        if token is None:
            token = await self._load()
        if token is None or token.expires_within(self.config.leeway, self.clock()):
            try:
                return await self.refresh(failed=None), True
            except TokenEndpointUnavailable as exc:
                if token is None or token.expires_within(timedelta(0), self.clock()):
                    raise
                # Refreshing ahead is a courtesy: while the token still works, a provider
                # outage must not fail the request. The next request tries again.
                log.warning("oauth.refresh_deferred", tenant=self.tenant, reason=str(exc))
                return token, False
        return token, False

    async def _load(self) -> TokenSet | None:
        async with self.db.begin() as conn:
            row = await read_connection(conn, self.tenant)
        if row.status == "needs_reauth":
            raise NeedsReauth(self._stopped_message(row.status_reason))
        self._token = self.cipher.open(row.token_set) if row.token_set is not None else None
        return self._token

    async def refresh(self, *, failed: TokenSet | None) -> TokenSet:
        """A fresh token: another worker's if it refreshed meanwhile, else the provider's.

        ``failed`` is the token the API refused (``None`` when refreshing ahead of expiry).
        """
        now = self.clock()
        refusal: str | None = None
        new: TokenSet | None = None
        async with self.db.begin() as conn:
            row = await read_connection(conn, self.tenant, lock=True)
            if row.status == "needs_reauth":
                raise NeedsReauth(self._stopped_message(row.status_reason))
            stored = self.cipher.open(row.token_set) if row.token_set is not None else None
            if (
                stored is not None
                and not stored.expires_within(self.config.leeway, now)
                and (failed is None or stored.access_token != failed.access_token)
            ):
                self._token = stored
                return stored
            try:
                new = await self._request_token(stored, now)
            except _Refused as r:
                refusal = r.reason
                await mark_needs_reauth(conn, self.tenant, reason=refusal, now=now)
            else:
                # Committed when this block exits, before any request uses the new token:
                # a rotated refresh token is never only in memory.
                await write_token_set(conn, self.tenant, new, cipher=self.cipher, now=now)
        if refusal is not None:
            self._alert(row.connector, refusal)
            raise NeedsReauth(self._stopped_message(refusal))
        assert new is not None
        self._token = new
        log.info(
            "oauth.token_refreshed",
            tenant=self.tenant,
            connector=row.connector,
            grant=self.config.grant,
            expires_at=new.expires_at,
            rotated=stored is not None and new.refresh_token != stored.refresh_token,
        )
        return new

    async def _request_token(self, stored: TokenSet | None, now: datetime) -> TokenSet:
        cfg = self.config
        previous_refresh = stored.refresh_token if stored is not None else None
        if cfg.grant == "refresh_token" and not previous_refresh:
            raise _Refused("no refresh token is stored for the connection")
        kwargs: dict[str, Any] = {"timeout": cfg.timeout}
        if self.transport is not None:
            kwargs["transport"] = self.transport
        secrets = (previous_refresh, cfg.client_secret)
        answered: list[httpx.Response] = []

        def keep(response: httpx.Response) -> httpx.Response:
            answered.append(response)
            return response

        try:
            async with AsyncOAuth2Client(
                client_id=cfg.client_id,
                client_secret=cfg.client_secret,
                token_endpoint_auth_method=cfg.auth_method,
                scope=cfg.scope,
                **kwargs,
            ) as client:
                client.register_compliance_hook("refresh_token_response", keep)
                client.register_compliance_hook("access_token_response", keep)
                if cfg.grant == "refresh_token":
                    raw = await client.refresh_token(cfg.token_url, refresh_token=previous_refresh)
                else:
                    raw = await client.fetch_token(cfg.token_url, grant_type="client_credentials")
            return TokenSet.from_token_response(
                raw, now=now, previous_refresh_token=previous_refresh
            )
        except OAuthError as exc:
            code = str(exc.error or "oauth_error")
            response = answered[-1] if answered else None
            if code in _TRANSIENT_ERRORS or (
                response is not None and response.status_code in (429, 503)
            ):
                raise TokenEndpointUnavailable(
                    f"token endpoint is unavailable ({code})",
                    retry_after=server_wait(response.headers, now) if response else None,
                ) from None
            # The provider refused: only a new authorisation helps. Its description is
            # server text, scrubbed of our secrets and not chained.
            description = _scrub(str(exc.description or ""), *secrets)[:200]
            raise _Refused(
                f"the token endpoint refused the {cfg.grant} grant: {code}"
                + (f" ({description})" if description else "")
            ) from None
        except httpx.HTTPStatusError as exc:
            raise TokenEndpointUnavailable(
                f"token endpoint answered HTTP {exc.response.status_code}",
                retry_after=server_wait(exc.response.headers, now),
            ) from None
        except httpx.HTTPError as exc:
            raise TokenEndpointUnavailable(
                f"token endpoint unreachable: {type(exc).__name__}: "
                + _scrub(str(exc), *secrets)[:200]
            ) from None
        except (ValueError, TypeError, KeyError) as exc:
            raise TokenEndpointUnavailable(
                f"token endpoint sent an unusable response ({type(exc).__name__})"
            ) from None

    async def _refused(self, reason: str) -> NoReturn:
        now = self.clock()
        async with self.db.begin() as conn:
            row = await read_connection(conn, self.tenant, lock=True)
            await mark_needs_reauth(conn, self.tenant, reason=reason, now=now)
        self._token = None
        self._alert(row.connector, reason)
        raise NeedsReauth(self._stopped_message(reason))

    def _alert(self, connector: str, reason: str) -> None:
        log.error(
            "connection.needs_reauth",
            alert=True,
            tenant=self.tenant,
            connector=connector,
            reason=reason,
        )

    def _stopped_message(self, reason: str | None) -> str:
        return (
            f"tenant {self.tenant!r} needs re-authorisation: {reason or 'credentials refused'}; "
            f"run `synckit tenants reauth {self.tenant}` (or synckit.connectors.oauth.reauth)"
        )


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ReauthResult:
    tenant: str
    connector: str
    resource_key: str
    previous_status: str


async def reauth(
    db: Database,
    tenant: str,
    token_set: TokenSet,
    *,
    cipher: TokenCipher | None = None,
    now: datetime | None = None,
) -> ReauthResult:
    """Store a newly authorised token set for ``tenant`` and make its connection active.

    The tenant's waiting jobs are claimed again from now on (workers are woken).
    Raises :class:`~synckit.connectors.secrets.ConnectionNotFound` for an unknown tenant
    and :class:`~synckit.errors.ConfigurationError` when tokens cannot be stored securely.
    """
    cipher = cipher or TokenCipher.from_env()
    now = now or utcnow()
    async with db.begin() as conn:
        row = await read_connection(conn, tenant, lock=True)
        await write_token_set(conn, tenant, token_set, cipher=cipher, now=now, activate=True)
        if db.is_postgres:
            await conn.exec_driver_sql(f"NOTIFY {job_store.NOTIFY_CHANNEL}")
    job_store.target_wake(db)
    log.info(
        "connection.reauthorised",
        tenant=tenant,
        connector=row.connector,
        previous_status=row.status,
        expires_at=token_set.expires_at,
    )
    return ReauthResult(tenant, row.connector, row.resource_key, row.status)


__all__ = [
    "ClientAuthMethod",
    "GrantType",
    "OAuth2Auth",
    "OAuth2Config",
    "ReauthResult",
    "TokenEndpointUnavailable",
    "reauth",
]
