"""OAuth2 for a tenant's connection: bearer auth that refreshes itself, once, everywhere.

:class:`OAuth2Auth` is an ``httpx.Auth`` for ``httpx.AsyncClient``. The bearer token is
attached at *send time*: in ``ctx.http`` by the transport's ``before_send`` hook, after
any pacing wait, just before the request leaves (with a plain client, at the last moment
the auth flow has). There the token is checked: one within its refresh margin (a quarter
of its lifetime, at most ``leeway``: :func:`refresh_margin`) is refreshed first; should
the provider be down then, the still-valid token is used.

Single flight across every process, without a database lock across the provider call
----------------------------------------------------------------------------------
A refresh takes the connection row's *lease* (``refresh_owner``, ``refresh_until``: the
one lease of :mod:`synckit.store.leases` on the row's own columns) in a short
transaction, calls the provider with no transaction open, then saves the new token set,
with the provider's rotated refresh token, fenced by the lease (only if it still holds
it), before any request uses the new access token. Others wait for the lease (or keep
using their still-valid token) and then use the stored one; a crashed refresher's lease
expires (``2 x timeout + 5 s``). Within one process an asyncio lock per tenant keeps
coroutines from polling the row together. What to do at each look at the row is the pure
:func:`refresh_step`.

A token endpoint that answers 429/503 with a wait is not called again before it: the
lease is held in the endpoint's name until then, and when no usable token is left the
tenant's resource is deferred (:func:`synckit.runtime.http.pacing.defer_resource`).

``needs_reauth`` only on evidence
---------------------------------
A connection is marked ``needs_reauth`` only when the provider refuses the grant
(``invalid_grant``, ``invalid_client``, a revoked grant) for the refresh token that is
still stored, or when the API answers 401 to an access token minted for this very
request, within its lifetime (:func:`unauthorized_verdict`). A 401 on a token
that was re-read (another worker's, or cached) refreshes and retries, at most
``MAX_401_RETRIES`` times, each logged; past that the request fails as retryable. The
stored reason is the cause first, once (:func:`reauth_reason`).

A token endpoint that fails (unreachable, 5xx, 429, ``temporarily_unavailable``, an
unreadable body) is a :class:`TokenEndpointUnavailable`, retried like any transient
failure; the connection keeps its status and tokens.

Client authentication is explicit (``client_secret_basic``, ``client_secret_post``, or
``none`` for public clients using PKCE), never inferred from a missing secret.

Tokens and client secrets appear in no log event and no exception message.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
import warnings
import weakref
from collections.abc import AsyncGenerator, Callable, Generator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import httpx
import structlog
from authlib.deprecate import AuthlibDeprecationWarning

from synckit import tracing
from synckit.clock import utcnow
from synckit.connectors.auth import ClientAuthMethod, GrantType, OAuth2Config
from synckit.errors.exceptions import (
    NeedsReauth,
    TokenEndpointUnavailable,
    UnprovenUnauthorized,
)
from synckit.errors.headers import server_wait
from synckit.redaction import redact_text
from synckit.runtime.credentials.secrets import (
    TokenCipher,
    TokenSet,
    save_refreshed_token_set,
    token_lifetime,
    write_token_set,
)
from synckit.runtime.http import pacing
from synckit.runtime.http.network import Network
from synckit.runtime.http.transports import DEFAULT_NETWORK, tls_context
from synckit.runtime.loop_state import PerLoop, per_loop
from synckit.store.connections import (
    REASON_CHARS,
    hand_back_refresh_lease,
    mark_needs_reauth,
    notify_workers,
    read_connection,
    take_refresh_lease,
)
from synckit.store.db import Database
from synckit.store.jobs import enqueueing

if TYPE_CHECKING:
    from authlib.integrations.base_client import OAuthError
    from authlib.integrations.httpx_client import AsyncOAuth2Client


@functools.cache
def authlib_client() -> tuple[type[AsyncOAuth2Client], type[OAuthError]]:
    """authlib's token client and its error class, imported when first needed: the
    import costs ~90 ms of CPU, which every CLI command and every worker without an
    OAuth tenant would otherwise pay at start."""
    with warnings.catch_warnings():
        # authlib prefers the httpx2 fork and warns when it falls back to httpx; httpx is
        # synckit's HTTP client, so the warning is noise for every synckit user.
        # (authlib's own "always" filter is installed by the module-level import of
        # authlib.deprecate, outside this block, so that leaving it does not undo it.)
        warnings.filterwarnings("ignore", "The httpx module", AuthlibDeprecationWarning)
        from authlib.integrations.base_client import OAuthError
        from authlib.integrations.httpx_client import AsyncOAuth2Client
    return AsyncOAuth2Client, OAuthError


log = structlog.get_logger("synckit.oauth")


#: OAuth error codes that say "not now" rather than "no": retried, not a refusal.
_TRANSIENT_ERRORS = frozenset({"temporarily_unavailable", "server_error", "slow_down"})

#: A request refused with 401 is sent again at most this many times, each after a
#: refresh, unless a refusal is proven first.
MAX_401_RETRIES = 2

#: How often a coroutine waiting for another process's refresh looks at the row.
_LEASE_POLL = 0.03

#: The longest part of the cause kept in a stored reason (the hint follows it).
_CAUSE_CHARS = 300


# --- decisions (pure) ---------------------------------------------------------------------


def refresh_margin(token: TokenSet, leeway: timedelta) -> timedelta:
    """How long before its expiry ``token`` is refreshed.

    A quarter of its lifetime, at most ``leeway``: a 24 h token is refreshed ``leeway``
    ahead, a 2 s token 0.5 s ahead, so each token serves three quarters of its life or
    more and tokens of any length cost one refresh per lifetime. A token whose issue time
    is unknown is refreshed ``leeway`` ahead.
    """
    if token.expires_at is None:
        return timedelta(0)
    if token.issued_at is None:
        return max(leeway, timedelta(0))
    lifetime = max(token.expires_at - token.issued_at, timedelta(0))
    return max(timedelta(0), min(leeway, lifetime / 4))


def refresh_due(token: TokenSet | None, now: datetime, leeway: timedelta) -> bool:
    """Whether ``token`` must be refreshed before it is sent at ``now``."""
    if token is None or not token.usable:
        return True
    if token.expires_at is None:
        return False  # unknown expiry: a 401 will tell
    return now >= token.expires_at - refresh_margin(token, leeway)


def still_valid(token: TokenSet | None, now: datetime) -> bool:
    """Whether ``token`` can still be sent at ``now`` (margin or not)."""
    return (
        token is not None and token.usable and (token.expires_at is None or now < token.expires_at)
    )


RefreshStep = Literal["use_stored", "use_own", "wait", "take"]


def refresh_step(
    *,
    stored: TokenSet | None,
    own: TokenSet | None,
    failed: TokenSet | None,
    lease_owner: str | None,
    lease_until: datetime | None,
    now: datetime,
    leeway: timedelta,
) -> RefreshStep:
    """What a refresher does on reading the row.

    ``stored`` is the row's token set, ``own`` the token this caller holds, ``failed`` the
    token the API refused (None when refreshing ahead of expiry). ``use_stored``: the
    stored token is fresh and not the refused one (another worker refreshed). ``use_own``:
    someone else holds the lease and this caller's token still works, so it goes on using
    it rather than wait. ``wait``: someone else holds the lease and there is nothing to
    send. ``take``: the lease is free (or expired): refresh.
    """
    if (
        stored is not None
        and not refresh_due(stored, now, leeway)
        and (failed is None or stored.access_token != failed.access_token)
    ):
        return "use_stored"
    held = lease_owner is not None and lease_until is not None and lease_until > now
    if not held:
        return "take"
    if failed is None and still_valid(own, now):
        return "use_own"
    return "wait"


UnauthorizedVerdict = Literal["refuse", "refresh", "give_up"]


def unauthorized_verdict(
    *,
    minted: bool,
    answered_at: datetime,
    expires_at: datetime | None,
    retries: int,
    max_retries: int = MAX_401_RETRIES,
) -> UnauthorizedVerdict:
    """What a 401 means for the request that got it.

    ``refuse`` (needs re-authorisation) only on evidence: the token was minted by the
    provider for this very request and it was inside its lifetime for the whole round
    trip (the 401 came back before ``expires_at``, which is counted from before the token
    request, so the API checked a token that was certainly alive). Otherwise refresh and
    send again, at most ``max_retries`` times, then ``give_up`` (a retryable failure).
    """
    if minted and (expires_at is None or answered_at < expires_at):
        return "refuse"
    if retries >= max_retries:
        return "give_up"
    return "refresh"


def reauth_reason(cause: str, tenant: str) -> str:
    """The stored reason: the cause first (redacted, bounded), then what a human does, once.

    The provider's words are untrusted text (an ``error_description`` may quote a token
    or the client secret), so they pass the redaction step before anything stores them.
    A ``;`` ends the cause: a masked value never runs into the hint.
    """
    cause = redact_text(" ".join(cause.split()))[:_CAUSE_CHARS] or "credentials refused"
    hint = (
        f"; tenant {tenant!r} needs re-authorisation: run `synckit tenants connect {tenant}` "
        f"or `synckit tenants reauth {tenant}`"
    )
    return (cause + hint)[:REASON_CHARS]


def _scrub(text: str, *secrets: str | None) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


# --- the auth ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RefreshResult:
    """A token to send, and whether the provider minted it for this caller just now
    (``False``: it was re-read, another worker's or this process's)."""

    token: TokenSet
    minted: bool


@dataclass(frozen=True)
class _Sent:
    token: TokenSet
    minted: bool
    sent_at: datetime


# One lock per (event loop, database as given, tenant): this process's refreshers of a
# tenant queue in order instead of all polling its row.
_refresh_locks: PerLoop[tuple[str, str], asyncio.Lock] = weakref.WeakKeyDictionary()


def _refresh_lock(db: Database, tenant: str) -> asyncio.Lock:
    return per_loop(_refresh_locks, (db.given_url, tenant), asyncio.Lock)


class OAuth2Auth(httpx.Auth):
    """Bearer auth for one tenant, refreshed single-flight through the database.

    One instance may serve many concurrent requests; it keeps the last token it saw in
    memory and goes to the database when that token is due or refused. Use it with
    ``httpx.AsyncClient`` only. ``ctx.http`` wires :meth:`before_send` into its transport
    so the token is attached after the pacing wait; with any other client the auth flow
    attaches it.

    ``network``: the App's proxy and CAs (``App(proxy=..., ca_bundle=...)``), which the
    token endpoint is reached through as the API is (``ctx.http`` passes its own).
    ``transport`` replaces them for the client that calls the token endpoint (tests).
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
        network: Network = DEFAULT_NETWORK,
    ) -> None:
        self.db = db
        self.tenant = tenant
        self.config = config
        self.cipher = cipher or TokenCipher.from_env()
        self.clock = clock
        self.transport = transport
        self.network = network
        #: Set by ``open_context`` when its transport calls :meth:`before_send`.
        self.attached_by_transport = False
        self._token: TokenSet | None = None
        self._owner = f"{uuid.uuid4().hex[:16]}:{tenant}"[:100]
        self._sent: weakref.WeakKeyDictionary[httpx.Request, _Sent] = weakref.WeakKeyDictionary()
        self._failed: weakref.WeakKeyDictionary[httpx.Request, TokenSet] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"OAuth2Auth(tenant={self.tenant!r}, token_url={self.config.token_url!r})"

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response]:
        raise RuntimeError("OAuth2Auth refreshes through the database: use httpx.AsyncClient")

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        retries = 0
        while True:
            if not self.attached_by_transport:
                await self.before_send(request)
            response = yield request
            if response.status_code != 401:
                return
            answered_at = self.clock()
            sent = self._sent.pop(request, None)
            if sent is None:  # the transport never attached a token (not ours to judge)
                return
            verdict = unauthorized_verdict(
                minted=sent.minted,
                answered_at=answered_at,
                expires_at=sent.token.expires_at,
                retries=retries,
            )
            log.info(
                "oauth.unauthorized",
                tenant=self.tenant,
                minted_for_request=sent.minted,
                sent_at=sent.sent_at,
                answered_at=answered_at,
                expires_at=sent.token.expires_at,
                retries=retries,
                verdict=verdict,
            )
            if verdict == "refuse":
                await self._refused(
                    "the API answered 401 to an access token minted for this request, "
                    "inside its lifetime"
                )
            if verdict == "give_up":
                raise UnprovenUnauthorized(
                    f"the API answered 401 {retries + 1} times for tenant {self.tenant!r}, "
                    "never to a token minted for the request: retrying later"
                )
            retries += 1
            self._failed[request] = sent.token

    async def before_send(self, request: httpx.Request) -> None:
        """Attach a token that is good to send now (refreshing first if it is due)."""
        failed = self._failed.pop(request, None)
        result = await self._token_for_send(failed)
        request.headers["Authorization"] = result.token.authorization
        self._sent[request] = _Sent(result.token, result.minted, self.clock())

    # --- tokens ---------------------------------------------------------------------

    async def _token_for_send(self, failed: TokenSet | None) -> RefreshResult:
        token = self._token
        if token is None:
            token = await self._load()
        now = self.clock()
        if not refresh_due(token, now, self.config.leeway) and (
            failed is None or token is None or token.access_token != failed.access_token
        ):
            assert token is not None
            return RefreshResult(token, False)
        try:
            return await self.refresh(failed=failed)
        except TokenEndpointUnavailable as exc:
            if failed is not None or not still_valid(token, self.clock()):
                raise
            # Refreshing ahead is a courtesy: while the token still works, a provider
            # outage must not fail the request. The next request tries again.
            log.warning("oauth.refresh_deferred", tenant=self.tenant, reason=str(exc))
            assert token is not None
            return RefreshResult(token, False)

    async def _load(self) -> TokenSet | None:
        async with self.db.read() as conn:
            row = await read_connection(conn, self.tenant)
        if row.status == "needs_reauth":
            raise NeedsReauth(self._stored_reason(row.status_reason))
        self._token = self.cipher.open(row.token_set) if row.token_set is not None else None
        return self._token

    async def refresh(self, *, failed: TokenSet | None = None) -> RefreshResult:
        """A token to send: another worker's if it refreshed meanwhile, else the provider's.

        ``failed`` is the token the API refused (``None`` when refreshing ahead of
        expiry). :attr:`RefreshResult.minted` says which it was: only a token this call
        obtained from the provider counts as minted.
        """
        with tracing.span(
            "synckit.oauth.refresh",
            synckit__tenant=self.tenant,
            synckit__oauth__reason="refused" if failed is not None else "expiry",
        ) as span:
            async with _refresh_lock(self.db, self.tenant):
                result = await self._refresh(failed)
            tracing.set_attributes(span, synckit__oauth__minted=result.minted)
            return result

    async def _refresh(self, failed: TokenSet | None) -> RefreshResult:
        cfg = self.config
        deadline = self.clock() + 2 * cfg.lease_time
        while True:
            now = self.clock()
            async with self.db.begin() as conn:
                row = await read_connection(conn, self.tenant, lock=True)
                if row.status == "needs_reauth":
                    self._token = None
                    raise NeedsReauth(self._stored_reason(row.status_reason))
                stored = self.cipher.open(row.token_set) if row.token_set is not None else None
                step = refresh_step(
                    stored=stored,
                    own=self._token,
                    failed=failed,
                    lease_owner=row.refresh_owner,
                    lease_until=row.refresh_until,
                    now=now,
                    leeway=cfg.leeway,
                )
                taken = step == "take" and await take_refresh_lease(
                    conn, self.tenant, owner=self._owner, until=now + cfg.lease_time, now=now
                )
            if step == "use_stored":
                assert stored is not None
                self._token = stored
                log.debug("oauth.token_reread", tenant=self.tenant)
                return RefreshResult(stored, False)
            if step == "use_own":
                assert self._token is not None
                return RefreshResult(self._token, False)
            if taken:
                return await self._refresh_holding_lease(row.connector, row.resource_key, stored)
            # Another process refreshes (or the endpoint asked for a wait): wait for it,
            # inline only while that is short. A refresh holds the lease for lease_time
            # at most, so a lease that ends later than that is the endpoint's wait, held
            # by the refresher it answered: the job is retried after it. Measured from
            # now, after the read: a read that waited for the lock (the refresher's
            # write, a busy machine) would otherwise see a fresh refresh lease as longer
            # than lease_time, and give up on a refresh that is about to succeed.
            now = self.clock()
            until = row.refresh_until or now
            endpoint_wait = until - now > cfg.lease_time
            if until > deadline or endpoint_wait:
                raise TokenEndpointUnavailable(
                    f"the token endpoint of tenant {self.tenant!r} is not to be called before "
                    f"{until.isoformat(timespec='seconds')}",
                    retry_after=until - now,
                )
            if now >= deadline:
                raise TokenEndpointUnavailable(
                    f"another worker's token refresh for tenant {self.tenant!r} is taking long"
                )
            await asyncio.sleep(_LEASE_POLL)

    async def _refresh_holding_lease(
        self, connector: str, resource_key: str, stored: TokenSet | None
    ) -> RefreshResult:
        cfg = self.config
        now = self.clock()
        used_refresh = stored.refresh_token if stored is not None else None
        try:
            async with asyncio.timeout(cfg.timeout):
                new = await self._request_token(stored, now)
        except _Refused as r:
            return await self._refusal_holding_lease(connector, used_refresh, r.reason)
        except TimeoutError:
            await self._hand_back()
            raise TokenEndpointUnavailable(
                f"token endpoint did not answer within {cfg.timeout:g}s"
            ) from None
        except TokenEndpointUnavailable as exc:
            await self._endpoint_wait(exc, resource_key, stored)
            raise
        except BaseException:
            await self._hand_back()
            raise
        async with self.db.begin() as conn:
            # Committed when this block exits, before any request uses the new token: a
            # rotated refresh token is never only in memory.
            saved = await save_refreshed_token_set(
                conn, self.tenant, new, owner=self._owner, cipher=self.cipher, now=self.clock()
            )
        if not saved:
            # The lease expired under us and someone else took it: our tokens cannot be
            # stored without overwriting theirs. Nothing is lost that a retry cannot fix
            # unless the provider rotated; then the next refresh says invalid_grant.
            log.warning("oauth.refresh_lease_lost", tenant=self.tenant, connector=connector)
            raise TokenEndpointUnavailable(
                f"the token refresh of tenant {self.tenant!r} outlived its lease"
            )
        self._token = new
        log.info(
            "oauth.token_refreshed",
            tenant=self.tenant,
            connector=connector,
            grant=cfg.grant,
            expires_at=new.expires_at,
            rotated=stored is not None and new.refresh_token != stored.refresh_token,
        )
        return RefreshResult(new, True)

    async def _refusal_holding_lease(
        self, connector: str, used_refresh: str | None, cause: str
    ) -> NoReturn:
        now = self.clock()
        reason = reauth_reason(cause, self.tenant)
        async with self.db.begin() as conn:
            row = await read_connection(conn, self.tenant, lock=True)
            current = self.cipher.open(row.token_set) if row.token_set is not None else None
            current_refresh = current.refresh_token if current is not None else None
            # Evidence is about the grant still stored: a refusal of a refresh token that
            # a human has replaced meanwhile (reauth) proves nothing about the new one.
            proven = row.status != "needs_reauth" and current_refresh == used_refresh
            if proven:
                await mark_needs_reauth(conn, self.tenant, reason=reason, now=now)
            else:
                await hand_back_refresh_lease(conn, self.tenant, owner=self._owner)
        self._token = None
        if proven:
            self._alert(connector, cause)
            raise NeedsReauth(reason)
        raise TokenEndpointUnavailable(
            f"the token refresh of tenant {self.tenant!r} raced new credentials; retrying"
        )

    async def _hand_back(self) -> None:
        try:
            async with self.db.begin() as conn:
                await hand_back_refresh_lease(conn, self.tenant, owner=self._owner)
        except Exception as exc:  # the lease expires by itself; the original error matters
            log.warning("oauth.lease_not_returned", tenant=self.tenant, error=str(exc)[:200])

    async def _endpoint_wait(
        self, exc: TokenEndpointUnavailable, resource_key: str, stored: TokenSet | None
    ) -> None:
        """Give the lease back; if the endpoint asked for a wait, honour it everywhere."""
        now = self.clock()
        until = now + exc.retry_after if exc.retry_after else None
        async with self.db.begin() as conn:
            await hand_back_refresh_lease(conn, self.tenant, owner=self._owner, until=until)
        if until is not None and not still_valid(self._token or stored, now):
            # Nothing left to send: no request of the tenant before the endpoint's wait.
            await pacing.defer_resource(
                self.db, resource_key, until, f"token endpoint: {exc}", now=now
            )

    async def _request_token(self, stored: TokenSet | None, now: datetime) -> TokenSet:
        cfg = self.config
        previous_refresh = stored.refresh_token if stored is not None else None
        if cfg.grant == "refresh_token" and not previous_refresh:
            raise _Refused("no refresh token is stored for the connection")
        secrets = (previous_refresh, cfg.client_secret)
        answered: list[httpx.Response] = []

        def keep(response: httpx.Response) -> httpx.Response:
            answered.append(response)
            return readable_expiry(response, now)

        try:
            async with token_client(cfg, transport=self.transport, network=self.network) as client:
                client.register_compliance_hook("refresh_token_response", keep)
                client.register_compliance_hook("access_token_response", keep)
                if cfg.grant == "refresh_token":
                    raw = await client.refresh_token(cfg.token_url, refresh_token=previous_refresh)
                else:
                    raw = await client.fetch_token(cfg.token_url, grant_type="client_credentials")
            return TokenSet.from_token_response(
                raw, now=now, previous_refresh_token=previous_refresh
            )
        except authlib_client()[1] as exc:
            raise token_endpoint_error(
                exc, answered[-1] if answered else None, cfg.grant, now, secrets
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

    async def _refused(self, cause: str) -> NoReturn:
        now = self.clock()
        reason = reauth_reason(cause, self.tenant)
        async with self.db.begin() as conn:
            row = await read_connection(conn, self.tenant, lock=True)
            await mark_needs_reauth(conn, self.tenant, reason=reason, now=now)
        self._token = None
        self._alert(row.connector, cause)
        raise NeedsReauth(reason)

    def _alert(self, connector: str, reason: str) -> None:
        log.error(
            "connection.needs_reauth",
            alert=True,
            tenant=self.tenant,
            connector=connector,
            reason=reason,
        )

    def _stored_reason(self, stored: str | None) -> str:
        # The stored reason is already cause-first with its hint: raised as it is, so
        # that the worker storing str(exc) again does not nest it.
        return stored or reauth_reason("credentials refused", self.tenant)


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def readable_expiry(response: httpx.Response, now: datetime) -> httpx.Response:
    """The token endpoint's answer with its expiry as whole seconds authlib can read
    (``secrets.token_lifetime``), or with none.

    authlib runs ``int()`` on ``expires_in`` before synckit sees the tokens: ``"3600.5"``,
    ``"inf"`` or ``"never"`` raised inside it, and the refresh the server had made (with
    the refresh token it may have rotated) was lost, the tenant left to retry with a
    refresh token that may no longer work. A compliance hook, as authlib intends for
    providers that bend the RFC.
    """
    try:
        body = response.json()
    except ValueError:
        return response
    if not isinstance(body, dict) or not ({"expires_in", "expires_at"} & body.keys()):
        return response
    lifetime = token_lifetime(body.get("expires_in"), body.get("expires_at"), now)
    fixed = {k: v for k, v in body.items() if k not in ("expires_in", "expires_at")}
    if lifetime is not None:
        fixed["expires_in"] = int(lifetime.total_seconds())
    if fixed != body:
        response._content = json.dumps(fixed).encode()
    return response


def token_client(
    cfg: OAuth2Config,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    network: Network = DEFAULT_NETWORK,
    **kwargs: Any,
) -> AsyncOAuth2Client:
    """authlib's client for ``cfg``'s token endpoint, authenticating as ``cfg`` says,
    through ``network`` (the App's proxy, else the environment's, and the App's CAs) or,
    where given, ``transport``."""
    if transport is not None:
        kwargs["transport"] = transport
    else:
        # The process's TLS context for these CAs: a client of its own loaded the CA
        # bundle again for every token refresh (~20-50 ms of CPU each), and trusted only
        # the default CAs whatever App(ca_bundle=...) said.
        kwargs["verify"] = tls_context(network.ca_bundle)
        if network.proxy is not None:
            kwargs["proxy"] = network.proxy
    client_class, _ = authlib_client()
    return client_class(
        client_id=cfg.client_id,
        client_secret=cfg.client_secret,
        token_endpoint_auth_method=cfg.auth_method,
        scope=cfg.scope,
        timeout=cfg.timeout,
        **kwargs,
    )


def token_endpoint_error(
    exc: OAuthError,
    response: httpx.Response | None,
    grant: str,
    now: datetime,
    secrets: tuple[str | None, ...],
) -> Exception:
    """What an OAuth error from the token endpoint means: "not now" or "no"."""
    code = str(exc.error or "oauth_error")
    if code in _TRANSIENT_ERRORS or (response is not None and response.status_code in (429, 503)):
        return TokenEndpointUnavailable(
            f"token endpoint is unavailable ({code})",
            retry_after=server_wait(response.headers, now) if response is not None else None,
        )
    # The provider refused: only a new authorisation helps. Its code and description are
    # server text, scrubbed of our secrets, redacted (it may quote any token) and not
    # chained.
    description = _scrub(str(exc.description or ""), *secrets)[:200]
    return _Refused(
        redact_text(
            f"the token endpoint refused the {grant} grant: {_scrub(code, *secrets)[:100]}"
            + (f" ({description})" if description else "")
        )
    )


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

    A token set with only a refresh token is refreshed by the first request. The
    tenant's waiting jobs are claimed again from now on (workers are woken). Raises
    :class:`~synckit.errors.exceptions.ConnectionNotFound` for an unknown tenant and
    :class:`~synckit.errors.exceptions.ConfigurationError` when tokens cannot be stored securely.
    """
    cipher = cipher or TokenCipher.from_env()
    now = now or utcnow()
    async with db.begin() as conn:
        row = await read_connection(conn, tenant, lock=True)
        await write_token_set(conn, tenant, token_set, cipher=cipher, now=now, activate=True)
        await notify_workers(conn)
    enqueueing.target_wake(db)
    log.info(
        "connection.reauthorised",
        tenant=tenant,
        connector=row.connector,
        previous_status=row.status,
        expires_at=token_set.expires_at,
    )
    return ReauthResult(tenant, row.connector, row.resource_key, row.status)


__all__ = [
    "MAX_401_RETRIES",
    "ClientAuthMethod",
    "GrantType",
    "OAuth2Auth",
    "OAuth2Config",
    "ReauthResult",
    "RefreshResult",
    "reauth",
    "reauth_reason",
    "refresh_due",
    "refresh_margin",
    "refresh_step",
    "token_client",
    "unauthorized_verdict",
]
