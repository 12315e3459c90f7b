"""The connect flow: a tenant's first tokens through the authorization-code grant with PKCE.

For a web app::

    url = await begin_authorization(db, "acme", config, redirect_uri=CALLBACK)
    ...  # send the user's browser to url; the provider redirects back to CALLBACK
    await complete_authorization(db, "acme", config, callback_url=request.url)

:func:`begin_authorization` makes a PKCE verifier (S256) and a ``state``, stores them
(the verifier sealed like tokens) in ``pending_authorizations`` with the redirect URI and
an expiry, and returns the provider's consent URL. :func:`complete_authorization` takes
the URL the provider redirected to: it refuses a ``state`` that is unknown, expired,
another tenant's or already used (a replayed callback), marks it used in one
compare-and-set before anything else, exchanges the code (with the verifier) with no
transaction open, then stores the sealed token set and makes the connection active
(:func:`synckit.runtime.credentials.oauth.reauth`), so the tenant's jobs resume.

``synckit tenants connect TENANT`` runs the same flow from a shell with a loopback
listener as the redirect URI (:func:`receive_callback`), the way cloud CLIs log in.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import structlog
from authlib.common.security import generate_token

from synckit.clock import utcnow
from synckit.errors.exceptions import (
    AuthorizationRefused,
    ConfigurationError,
    TokenEndpointUnavailable,
)
from synckit.runtime.credentials.oauth import (
    OAuth2Config,
    ReauthResult,
    _Refused,
    authlib_client,
    readable_expiry,
    reauth,
    token_client,
    token_endpoint_error,
)
from synckit.runtime.credentials.secrets import TokenCipher, TokenSet
from synckit.runtime.http.network import Network
from synckit.runtime.http.transports import DEFAULT_NETWORK
from synckit.store import connections as connection_store
from synckit.store.connections import read_connection
from synckit.store.db import Database

log = structlog.get_logger("synckit.oauth")

#: How long a consent URL may take to come back.
DEFAULT_TTL = timedelta(minutes=10)

__all__ = [
    "DEFAULT_TTL",
    "begin_authorization",
    "complete_authorization",
    "receive_callback",
    "reseal_verifiers",
]


@dataclass(frozen=True)
class _Pending:
    state: str
    tenant: str
    verifier: str
    redirect_uri: str


def _seal_verifier(cipher: TokenCipher, verifier: str) -> bytes:
    # The verifier is a secret for as long as the code can be exchanged: sealed like
    # tokens, as a token set whose only "token" is the verifier.
    return cipher.seal(TokenSet(access_token=verifier))


def _open_verifier(cipher: TokenCipher, sealed: bytes) -> str:
    verifier = cipher.open(sealed).access_token
    if not verifier:
        raise ConfigurationError("a stored PKCE verifier is empty")
    return verifier


async def begin_authorization(
    db: Database,
    tenant: str,
    config: OAuth2Config,
    *,
    redirect_uri: str,
    scope: str | None = None,
    ttl: timedelta = DEFAULT_TTL,
    cipher: TokenCipher | None = None,
    now: datetime | None = None,
    extra_params: dict[str, str] | None = None,
) -> str:
    """The provider's consent URL for ``tenant``; its ``state`` and PKCE verifier are stored.

    Raises :class:`~synckit.errors.exceptions.ConfigurationError` when ``config`` has no
    ``authorize_url`` or tokens cannot be stored securely, and
    :class:`~synckit.errors.exceptions.ConnectionNotFound` for an unknown tenant.
    """
    if not config.authorize_url:
        raise ConfigurationError(
            "the connect flow needs OAuth2Config.authorize_url (the provider's consent page)"
        )
    cipher = cipher or TokenCipher.from_env()
    now = now or utcnow()
    verifier = generate_token(64)
    state = secrets.token_urlsafe(32)
    async with token_client(
        config, redirect_uri=redirect_uri, code_challenge_method="S256"
    ) as client:
        url, _ = client.create_authorization_url(
            config.authorize_url,
            state=state,
            code_verifier=verifier,
            scope=scope or config.scope,
            **(extra_params or {}),
        )
    async with db.begin() as conn:
        await read_connection(conn, tenant)  # an unknown tenant is refused here
        # Expired, never completed consents of any tenant are no longer worth keeping.
        await connection_store.add_pending_authorization(
            conn,
            state=state,
            tenant=tenant,
            sealed_verifier=_seal_verifier(cipher, verifier),
            redirect_uri=redirect_uri,
            expires_at=now + ttl,
            now=now,
        )
    log.info("connection.authorization_started", tenant=tenant, expires_at=now + ttl)
    return str(url)


async def reseal_verifiers(db: Database, cipher: TokenCipher) -> int:
    """Seal every stored PKCE verifier under ``cipher``'s sealing key (key rotation);
    how many were re-sealed. Expired consents are deleted instead: they can never
    complete. A verifier that cannot be opened is left as it is (its consent fails at
    the callback, and expires within minutes)."""
    resealed = 0
    async with db.begin() as conn:
        rows = await connection_store.live_verifiers(conn, now=utcnow())
        for r in rows:
            try:
                new = cipher.reseal(r.verifier)
            except ConfigurationError:
                continue
            if new is not None:
                await connection_store.replace_verifier(conn, r.state, new)
                resealed += 1
    return resealed


def _callback_params(callback_url: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(callback_url).query, keep_blank_values=True))


async def _claim_state(
    db: Database, tenant: str, state: str, now: datetime, cipher: TokenCipher
) -> _Pending:
    """Mark ``state`` used, once; or say precisely why it cannot be."""
    async with db.begin() as conn:
        row = await connection_store.claim_pending_authorization(
            conn, state=state, tenant=tenant, now=now
        )
        if row is None:
            found = await connection_store.read_pending_authorization(conn, state)
    if row is not None:
        return _Pending(
            row.state, row.tenant, _open_verifier(cipher, row.verifier), row.redirect_uri
        )
    if found is None:
        why = "its state is unknown (not issued by begin_authorization, or forged)"
    elif found.tenant != tenant:
        why = "its state was issued for another tenant"
    elif found.used_at is not None:
        why = "its state was used already (a replayed callback)"
    else:
        why = "its state expired; start again"
    raise AuthorizationRefused(f"callback for tenant {tenant!r} refused: {why}")


def _granted_code(tenant: str, params: dict[str, str]) -> str:
    """The authorization code in a callback, or :class:`AuthorizationRefused` if it has none."""
    if "error" in params:
        error = params["error"][:100]
        raise AuthorizationRefused(
            f"the provider did not authorise tenant {tenant!r}: {error}"
            + (
                f" ({params['error_description'][:200]})" if params.get("error_description") else ""
            ),
            final=True,
        )
    code = params.get("code")
    if not code:
        raise AuthorizationRefused(f"callback for tenant {tenant!r} refused: it has no code")
    return code


async def complete_authorization(
    db: Database,
    tenant: str,
    config: OAuth2Config,
    callback_url: str,
    *,
    cipher: TokenCipher | None = None,
    now: datetime | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    network: Network = DEFAULT_NETWORK,
) -> ReauthResult:
    """Finish the flow begun by :func:`begin_authorization` with the provider's redirect.

    Stores the sealed token set and makes the connection active. Raises
    :class:`AuthorizationRefused` for a wrong, expired or replayed ``state``, a refused
    consent or a refused code; :class:`~synckit.errors.exceptions.TokenEndpointUnavailable`
    when the provider could not answer (the consent must then be started again: its
    state is spent). ``network``: the App's proxy and CAs (``app.network``), which the
    token endpoint is reached through.
    """
    cipher = cipher or TokenCipher.from_env()
    now = now or utcnow()
    params = _callback_params(callback_url)
    state = params.get("state")
    if not state:
        raise AuthorizationRefused(f"callback for tenant {tenant!r} refused: it has no state")
    pending = await _claim_state(db, tenant, state, now, cipher)
    code = _granted_code(tenant, params)
    answered: list[httpx.Response] = []

    def keep(response: httpx.Response) -> httpx.Response:
        answered.append(response)
        # An odd expires_in would raise inside authlib, after the one-use code was spent.
        return readable_expiry(response, now)

    try:
        async with token_client(
            config, transport=transport, network=network, redirect_uri=pending.redirect_uri
        ) as client:
            client.register_compliance_hook("access_token_response", keep)
            raw: Any = await client.fetch_token(
                config.token_url,
                grant_type="authorization_code",
                code=code,
                code_verifier=pending.verifier,
            )
        token_set = TokenSet.from_token_response(raw, now=utcnow())
    except authlib_client()[1] as exc:
        outcome = token_endpoint_error(
            exc,
            answered[-1] if answered else None,
            "authorization_code",
            now,
            (code, pending.verifier, config.client_secret),
        )
        if isinstance(outcome, _Refused):
            raise AuthorizationRefused(outcome.reason, final=True) from None
        raise outcome from None
    except httpx.HTTPStatusError as exc:
        raise TokenEndpointUnavailable(
            f"token endpoint answered HTTP {exc.response.status_code}"
        ) from None
    except httpx.HTTPError as exc:
        raise TokenEndpointUnavailable(
            f"token endpoint unreachable: {type(exc).__name__}"
        ) from None
    except (ValueError, TypeError, KeyError) as exc:
        raise TokenEndpointUnavailable(
            f"token endpoint sent an unusable response ({type(exc).__name__})"
        ) from None
    result = await reauth(db, tenant, token_set, cipher=cipher)
    log.info("connection.connected", tenant=tenant, connector=result.connector)
    return result


_PAGE = (
    "<!doctype html><meta charset=utf-8><title>synckit</title>"
    "<p>{message}</p><p>You may close this window.</p>"
)


async def receive_callback(
    host: str,
    port: int,
    path: str,
    handle: Callable[[str], Awaitable[ReauthResult]],
    *,
    wait: float,
    ready: Callable[[int], Awaitable[None]] | None = None,
) -> ReauthResult:
    """Serve ``http://host:port/path`` until one callback completes the flow.

    ``handle(callback_url)`` is awaited for each request to ``path`` (it is
    :func:`complete_authorization` bound to the tenant): a refused callback (wrong state)
    is answered 400 and the listener goes on waiting; the first success, or a refusal by
    the provider itself, ends it. ``ready(port)`` is awaited once listening (the port is
    the bound one when ``port`` is 0). Raises ``TimeoutError`` after ``wait`` seconds.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[ReauthResult] = loop.create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        status, message = 404, "not found"
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, target, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if method == "GET" and urlsplit(target).path == path and not done.done():
                try:
                    result = await handle(f"http://{host}:{bound}{target}")
                except AuthorizationRefused as exc:
                    status, message = 400, str(exc)
                    log.warning("connection.callback_refused", reason=str(exc))
                    if exc.final and not done.done():
                        done.set_exception(exc)
                except Exception as exc:
                    status, message = 500, f"{type(exc).__name__}: {exc}"
                    if not done.done():
                        done.set_exception(exc)
                else:
                    status, message = 200, f"tenant {result.tenant!r} is connected."
                    if not done.done():
                        done.set_result(result)
        except (TimeoutError, asyncio.IncompleteReadError, ValueError, OSError):
            status, message = 400, "bad request"
        body = _PAGE.format(message=message.replace("&", "&amp;").replace("<", "&lt;")).encode()
        try:
            writer.write(
                f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
                f"Content-Type: text/html; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, host, port)
    bound = server.sockets[0].getsockname()[1]
    try:
        if ready is not None:
            await ready(bound)
        return await asyncio.wait_for(asyncio.shield(done), wait)
    finally:
        server.close()
        await server.wait_closed()
