"""A real OAuth2 provider on loopback, for tests and demos of connectors.

:class:`OAuthTestServer` is built from authlib's own authorization-server components
(``AuthorizationServer`` with ``RefreshTokenGrant`` and ``ClientCredentialsGrant``) and
served over HTTP by the standard library's WSGI server in a background thread, on
``127.0.0.1`` and a free port. It behaves like the strict providers connectors meet:

* refresh tokens rotate: every refresh issues a new one and revokes the old one, so a
  refresh token used twice gets ``invalid_grant`` (and, with
  ``revoke_family_on_reuse=True``, the reuse also revokes every token descended from the
  same authorisation, as OAuth 2.1 recommends);
* clients authenticate with ``client_secret_basic`` or ``client_secret_post``, as each
  client is registered to;
* ``GET /me`` is a protected resource: 401 for an unknown, expired or revoked access token.

It counts what it served (:attr:`OAuthTestServer.stats`) so tests can assert, say, that
sixteen workers caused exactly one token request. It has no test-framework dependency::

    with OAuthTestServer() as server:
        tokens = server.issue_tokens("alice")     # as if alice had just authorised
        ...  # point the connector at server.token_url and server.resource_url

The connect flow is served too: ``GET /authorize`` is the consent page of an
authorization-code grant with PKCE (``S256``, required of public clients). Consent is
scripted: the server approves as :attr:`OAuthTestServer.consenting_user` (or refuses,
``access_denied``, when it is ``None``) and redirects to the client's redirect URI; loopback
redirect URIs (``http://127.0.0.1:<any port>/...``) are accepted as RFC 8252 asks. A code
is single-use: a replayed code gets ``invalid_grant``. Public clients (``add_client(...,
auth_methods=["none"])``) authenticate with their ``client_id`` alone.

For runs under pressure it can throttle: :meth:`OAuthTestServer.throttle_resource` makes
every n-th ``GET /me`` a 429 with ``Retry-After``, :meth:`OAuthTestServer.throttle_tokens`
the next token requests. Lifetimes (``expires_in``) may be fractional seconds.

``python -m synckit.testing.oauth_server`` runs one in the foreground for a demo.
"""

from __future__ import annotations

import collections
import contextlib
import json
import secrets
import socketserver
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlsplit
from wsgiref.headers import Headers
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from authlib.oauth2.rfc6749 import (
    AuthorizationCodeMixin,
    AuthorizationServer,
    ClientMixin,
    OAuth2Error,
    OAuth2Request,
    TokenMixin,
)
from authlib.oauth2.rfc6749 import grants as rfc6749_grants
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc6750 import BearerTokenGenerator
from authlib.oauth2.rfc7636 import CodeChallenge

WSGIEnviron = dict[str, Any]
StartResponse = Callable[..., Any]
_AUTH_METHODS = ("client_secret_basic", "client_secret_post")
_ALL_AUTH_METHODS = [*_AUTH_METHODS, "none"]
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


@dataclass
class ServerStats:
    """What the server has served so far."""

    #: Token endpoint requests, whatever their outcome.
    token_requests: int = 0
    token_requests_by_grant: collections.Counter[str] = field(default_factory=collections.Counter)
    #: Token endpoint errors by OAuth error code (``invalid_grant``, ``invalid_client``...).
    token_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    resource_requests: int = 0
    resource_unauthorized: int = 0
    #: 429s served by the resource (``throttle_resource``) and the token endpoint.
    resource_throttled: int = 0
    token_throttled: int = 0
    #: Refresh tokens presented again after they had been rotated away (reuse).
    refresh_reuses: int = 0
    #: Consents given at ``/authorize`` and codes exchanged at the token endpoint.
    codes_issued: int = 0
    codes_exchanged: int = 0

    @property
    def invalid_grants(self) -> int:
        return self.token_errors["invalid_grant"]


@dataclass
class _Client(ClientMixin):  # type: ignore[misc]  # authlib ships no type information
    client_id: str
    client_secret: str
    auth_methods: frozenset[str]
    grant_types: frozenset[str]
    scope: str
    redirect_uris: tuple[str, ...] = ()

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        return self.redirect_uris[0] if self.redirect_uris else None

    def get_allowed_scope(self, scope: str | None) -> str:
        if not scope:
            return self.scope
        allowed = set(self.scope.split())
        return " ".join(s for s in scope.split() if s in allowed)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        if redirect_uri in self.redirect_uris:
            return True
        # RFC 8252 7.3: a native app's loopback redirect may use any port.
        parts = urlsplit(redirect_uri)
        return parts.scheme == "http" and parts.hostname in _LOOPBACK and not parts.fragment

    def check_client_secret(self, client_secret: str) -> bool:
        return bool(self.client_secret) and secrets.compare_digest(
            self.client_secret, client_secret
        )

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method in self.auth_methods

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code" and "authorization_code" in self.grant_types

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in self.grant_types


class IssuedToken(TokenMixin):  # type: ignore[misc]
    """What authlib asks of a token an authorization server issued (made a dataclass
    holding these fields): its client, scope and lifetime (served here, and by the Graph
    simulator's token endpoint)."""

    client_id: str
    scope: str
    expires_in: float

    def check_client(self, client: ClientMixin) -> bool:
        return bool(client.client_id == self.client_id)

    def get_scope(self) -> str:
        return self.scope

    def get_expires_in(self) -> float:
        return self.expires_in


@dataclass
class _Token(IssuedToken):
    access_token: str
    refresh_token: str | None
    client_id: str
    user: str
    scope: str
    issued_at: float
    expires_in: float
    family: str
    access_revoked: bool = False
    refresh_revoked: bool = False

    def __repr__(self) -> str:  # authlib logs token objects at debug level
        return f"_Token(user={self.user!r}, client_id={self.client_id!r})"

    def is_expired(self) -> bool:
        return time.time() >= self.issued_at + self.expires_in

    def is_revoked(self) -> bool:
        return self.access_revoked

    def get_user(self) -> str:
        return self.user

    def get_client(self) -> str:
        return self.client_id


@dataclass
class _AuthCode(AuthorizationCodeMixin):  # type: ignore[misc]
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    user: str
    code_challenge: str | None
    code_challenge_method: str | None

    def __repr__(self) -> str:
        return f"_AuthCode(user={self.user!r}, client_id={self.client_id!r})"

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope


class FormRequest(OAuth2Request):  # type: ignore[misc]
    """A request to an authlib authorization server as its endpoint read it: the form
    and the query arguments (served here, and by the Graph simulator's token endpoint)."""

    def __init__(
        self, method: str, uri: str, headers: Any, form: dict[str, str], args: dict[str, str]
    ) -> None:
        super().__init__(method, uri, headers=headers)
        self._form = form
        self._args = args
        self.payload = BasicOAuth2Payload({**args, **form})

    @property
    def args(self) -> dict[str, str]:
        return self._args

    @property
    def form(self) -> dict[str, str]:
        return self._form


class _RefreshTokenGrant(rfc6749_grants.RefreshTokenGrant):  # type: ignore[misc]
    INCLUDE_NEW_REFRESH_TOKEN = True  # rotation
    provider: OAuthTestServer  # set on the subclass made per server

    TOKEN_ENDPOINT_AUTH_METHODS = _ALL_AUTH_METHODS

    def authenticate_refresh_token(self, refresh_token: str) -> _Token | None:
        return self.provider._refresh_token_in_use(refresh_token)

    def authenticate_user(self, refresh_token: _Token) -> str:
        return refresh_token.user

    def revoke_old_credential(self, refresh_token: _Token) -> None:
        refresh_token.refresh_revoked = True


class _ClientCredentialsGrant(rfc6749_grants.ClientCredentialsGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = list(_AUTH_METHODS)


class _AuthorizationCodeGrant(rfc6749_grants.AuthorizationCodeGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = _ALL_AUTH_METHODS
    provider: OAuthTestServer  # set on the subclass made per server

    def save_authorization_code(self, code: str, request: FormRequest) -> None:
        data = request.payload.data
        with self.provider._lock:
            self.provider._codes[code] = _AuthCode(
                code=code,
                client_id=request.client.client_id,
                redirect_uri=request.payload.redirect_uri or "",
                scope=request.scope or "",
                user=request.user,
                code_challenge=data.get("code_challenge"),
                code_challenge_method=data.get("code_challenge_method"),
            )
            self.provider.stats.codes_issued += 1

    def query_authorization_code(self, code: str, client: _Client) -> _AuthCode | None:
        found = self.provider._codes.get(code)
        return found if found is not None and found.client_id == client.client_id else None

    def delete_authorization_code(self, authorization_code: _AuthCode) -> None:
        # Single use: the code is gone once exchanged, so a replay is invalid_grant.
        self.provider._codes.pop(authorization_code.code, None)
        self.provider.stats.codes_exchanged += 1

    def authenticate_user(self, authorization_code: _AuthCode) -> str:
        return authorization_code.user


class FormAuthorizationServer(AuthorizationServer):  # type: ignore[misc]
    """An authlib authorization server of the ``clients`` by id, that stores each token it
    issues by ``save``, is handed its requests ready-made (:class:`FormRequest`, no JSON
    endpoints), gives back ``(status, body, headers)`` as authlib makes them and sends
    no signals."""

    def __init__(
        self,
        clients: Mapping[str, ClientMixin],
        save: Callable[[dict[str, Any], FormRequest], None],
    ) -> None:
        super().__init__()
        self._clients = clients
        self._save = save

    def query_client(self, client_id: str) -> ClientMixin | None:
        return self._clients.get(client_id)

    def save_token(self, token: dict[str, Any], request: FormRequest) -> None:
        self._save(token, request)

    def create_oauth2_request(self, request: FormRequest) -> FormRequest:
        return request

    def create_json_request(self, request: Any) -> Any:
        raise NotImplementedError("form endpoints only")

    def handle_response(
        self, status: int, body: Any, headers: list[tuple[str, str]]
    ) -> tuple[int, Any, list[tuple[str, str]]]:
        return status, body, headers

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class OAuthTestServer:
    """An OAuth2 provider with a protected resource, on ``127.0.0.1:<free port>``.

    A default client is registered (:attr:`client_id`, :attr:`client_secret`) that may
    use either client authentication method and both grants. Thread-safe; every method
    may be called while requests are being served.
    """

    def __init__(
        self,
        *,
        expires_in: float = 3600,
        revoke_family_on_reuse: bool = False,
        token_latency: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.expires_in = expires_in
        self.revoke_family_on_reuse = revoke_family_on_reuse
        #: Seconds each token request takes (widens race windows in tests).
        self.token_latency = token_latency
        self.stats = ServerStats()
        self._host = host
        self._port = port
        self._lock = threading.RLock()
        self._clients: dict[str, _Client] = {}
        self._by_access: dict[str, _Token] = {}
        self._by_refresh: dict[str, _Token] = {}
        self._denied_users: set[str] = set()
        self._codes: dict[str, _AuthCode] = {}
        self._resource_throttle: tuple[int, float] | None = None
        self._token_throttle: tuple[int, float] = (0, 0.0)
        #: Who consents at ``/authorize`` (``None``: the user refuses, access_denied).
        self.consenting_user: str | None = "user"
        self._httpd: _ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.client_id = "synckit-test-client"
        self.client_secret = secrets.token_urlsafe(24)
        self.add_client(self.client_id, self.client_secret)
        self._authz = FormAuthorizationServer(self._clients, self._save_token)
        self._authz.register_token_generator(
            "default",
            BearerTokenGenerator(
                access_token_generator=lambda **_kw: "at-" + secrets.token_urlsafe(24),
                refresh_token_generator=lambda **_kw: "rt-" + secrets.token_urlsafe(24),
                expires_generator=lambda _client, _grant: self.expires_in,
            ),
        )
        refresh_grant = type("RefreshTokenGrant", (_RefreshTokenGrant,), {"provider": self})
        self._authz.register_grant(refresh_grant)
        self._authz.register_grant(_ClientCredentialsGrant)
        code_grant = type("AuthorizationCodeGrant", (_AuthorizationCodeGrant,), {"provider": self})
        self._authz.register_grant(code_grant, [CodeChallenge(required=True)])

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> OAuthTestServer:
        if self._httpd is not None:
            return self
        self._httpd = make_server(
            self._host,
            self._port,
            self._wsgi,
            server_class=_ThreadingWSGIServer,
            handler_class=_QuietHandler,
        )
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="synckit-oauth-test-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> OAuthTestServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the server is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def token_url(self) -> str:
        return f"{self.url}/token"

    @property
    def authorize_url(self) -> str:
        """The consent page of the authorization-code grant (scripted consent)."""
        return f"{self.url}/authorize"

    @property
    def resource_url(self) -> str:
        """The protected resource: ``GET`` answers who the token belongs to, or 401."""
        return f"{self.url}/me"

    # --- state ----------------------------------------------------------------------------

    def add_client(
        self,
        client_id: str,
        client_secret: str,
        *,
        auth_methods: Iterable[str] = _AUTH_METHODS,
        grant_types: Iterable[str] = ("refresh_token", "client_credentials", "authorization_code"),
        scope: str = "read write",
        redirect_uris: Iterable[str] = (),
    ) -> None:
        """Register a client, allowed only the given client authentication methods.

        A public client has ``auth_methods=["none"]`` and an empty ``client_secret``.
        """
        with self._lock:
            self._clients[client_id] = _Client(
                client_id,
                client_secret,
                frozenset(auth_methods),
                frozenset(grant_types),
                scope,
                tuple(redirect_uris),
            )

    def throttle_resource(self, every: int, retry_after: float) -> None:
        """Answer every ``every``-th ``GET /me`` with 429 and ``Retry-After`` (0: stop)."""
        with self._lock:
            self._resource_throttle = (every, retry_after) if every > 0 else None

    def throttle_tokens(self, times: int, retry_after: float) -> None:
        """Answer the next ``times`` token requests with 429 and ``Retry-After``."""
        with self._lock:
            self._token_throttle = (times, retry_after)

    def issue_tokens(
        self,
        user: str,
        *,
        client_id: str | None = None,
        expires_in: float | None = None,
        scope: str = "read write",
    ) -> dict[str, Any]:
        """Issue tokens to ``user`` as an authorization-code exchange would; the response."""
        with self._lock:
            token = {
                "token_type": "Bearer",
                "access_token": "at-" + secrets.token_urlsafe(24),
                "refresh_token": "rt-" + secrets.token_urlsafe(24),
                "expires_in": self.expires_in if expires_in is None else expires_in,
                "scope": scope,
            }
            self._store(token, client_id or self.client_id, user, family=secrets.token_hex(8))
            return token

    def expire_access_token(self, access_token: str) -> None:
        """Make the access token expired now (the API will answer 401 to it)."""
        with self._lock:
            t = self._by_access[access_token]
            t.issued_at = time.time() - t.expires_in - 1

    def revoke_refresh_token(self, refresh_token: str) -> None:
        """Revoke a refresh token, as a user removing the app's access would."""
        with self._lock:
            self._by_refresh[refresh_token].refresh_revoked = True

    def revoke_user(self, user: str) -> None:
        """Revoke every access and refresh token of ``user``."""
        with self._lock:
            for t in self._by_access.values():
                if t.user == user:
                    t.access_revoked = t.refresh_revoked = True

    def deny_user(self, user: str, denied: bool = True) -> None:
        """Make the resource refuse ``user`` (401) even with valid, fresh tokens."""
        with self._lock:
            (self._denied_users.add if denied else self._denied_users.discard)(user)

    def secrets_issued(self) -> set[str]:
        """Every access token, refresh token and client secret this server has known.

        For leak tests: none of these strings should appear in logs, errors or output.
        """
        with self._lock:
            found = set(self._by_access) | set(self._by_refresh)
            found |= {c.client_secret for c in self._clients.values()}
            return found

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = ServerStats()

    def _store(self, token: dict[str, Any], client_id: str, user: str, *, family: str) -> None:
        t = _Token(
            access_token=token["access_token"],
            refresh_token=token.get("refresh_token"),
            client_id=client_id,
            user=user,
            scope=str(token.get("scope") or ""),
            issued_at=time.time(),
            expires_in=float(token.get("expires_in") or self.expires_in),
            family=family,
        )
        self._by_access[t.access_token] = t
        if t.refresh_token:
            self._by_refresh[t.refresh_token] = t

    def _save_token(self, token: dict[str, Any], request: FormRequest) -> None:
        old: _Token | None = request.refresh_token
        client: _Client = request.client
        user = request.user or client.client_id
        self._store(
            token,
            client.client_id,
            user,
            family=old.family if old is not None else secrets.token_hex(8),
        )

    def _refresh_token_in_use(self, refresh_token: str) -> _Token | None:
        t = self._by_refresh.get(refresh_token)
        if t is None:
            return None
        if t.refresh_revoked:
            self.stats.refresh_reuses += 1
            if self.revoke_family_on_reuse:
                for other in self._by_access.values():
                    if other.family == t.family:
                        other.access_revoked = other.refresh_revoked = True
            return None
        return t

    # --- HTTP --------------------------------------------------------------------------------

    def _wsgi(self, environ: WSGIEnviron, start_response: StartResponse) -> Iterator[bytes]:
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "")
        headers = Headers(
            [
                (k[5:].replace("_", "-").title(), v)
                for k, v in environ.items()
                if k.startswith("HTTP_")
            ]
        )
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = environ["CONTENT_TYPE"]
        if path == "/token" and method == "POST":
            status, body, extra = self._token_endpoint(environ, headers)
        elif path == "/authorize" and method == "GET":
            status, body, extra = self._authorize(environ, headers)
        elif path == "/me" and method == "GET":
            status, body, extra = self._resource(headers)
        else:
            status, body, extra = 404, {"error": "not_found"}, []
        payload = json.dumps(body).encode() if body != "" else b""
        out = [(k, v) for k, v in extra if k.lower() not in ("content-type", "content-length")]
        out += [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
        start_response(f"{status} {HTTPStatus(status).phrase}", out)
        return iter([payload])

    def _token_endpoint(
        self, environ: WSGIEnviron, headers: Headers
    ) -> tuple[int, Any, list[tuple[str, str]]]:
        if self.token_latency:
            time.sleep(self.token_latency)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length).decode() if length else ""
        form = dict(parse_qsl(raw, keep_blank_values=True))
        args = dict(parse_qsl(environ.get("QUERY_STRING", "")))
        uri = f"{self.url}/token"
        request = FormRequest("POST", uri, headers, form, args)
        # One token request at a time: rotation (check, issue, revoke) is atomic.
        with self._lock:
            self.stats.token_requests += 1
            self.stats.token_requests_by_grant[form.get("grant_type", "")] += 1
            times, wait = self._token_throttle
            if times > 0:
                self._token_throttle = (times - 1, wait)
                self.stats.token_throttled += 1
                return 429, {"error": "slow_down"}, [("Retry-After", f"{wait:g}")]
            status, body, extra = self._authz.create_token_response(request)
            if status >= 400 and isinstance(body, dict):
                self.stats.token_errors[str(body.get("error"))] += 1
        return status, body, list(extra)

    def _authorize(
        self, environ: WSGIEnviron, headers: Headers
    ) -> tuple[int, Any, list[tuple[str, str]]]:
        query = environ.get("QUERY_STRING", "")
        args = dict(parse_qsl(query))
        request = FormRequest("GET", f"{self.url}/authorize?{query}", headers, {}, args)
        with self._lock:
            try:
                grant = self._authz.get_consent_grant(request)
            except OAuth2Error as error:
                # An invalid client or redirect URI is shown to the user, never redirected.
                return error.status_code, dict(error.get_body()), []
            status, body, extra = self._authz.create_authorization_response(
                request, grant_user=self.consenting_user, grant=grant
            )
        return status, body, list(extra)

    def _resource(self, headers: Headers) -> tuple[int, Any, list[tuple[str, str]]]:
        auth = headers.get("Authorization") or ""
        kind, _, value = auth.partition(" ")
        with self._lock:
            self.stats.resource_requests += 1
            throttle = self._resource_throttle
            if throttle is not None and self.stats.resource_requests % throttle[0] == 0:
                self.stats.resource_throttled += 1
                return 429, {"error": "rate_limited"}, [("Retry-After", f"{throttle[1]:g}")]
            t = self._by_access.get(value.strip()) if kind.lower() == "bearer" else None
            if t is None or t.is_expired() or t.is_revoked() or t.user in self._denied_users:
                self.stats.resource_unauthorized += 1
                challenge = 'Bearer error="invalid_token"'
                return 401, {"error": "invalid_token"}, [("WWW-Authenticate", challenge)]
            return 200, {"user": t.user, "client_id": t.client_id, "scope": t.scope}, []


def main() -> None:  # pragma: no cover - a demo helper
    """Serve until interrupted; print the endpoints, the client and a user's tokens."""
    with OAuthTestServer(port=0) as server:
        print(
            json.dumps(
                {
                    "token_url": server.token_url,
                    "resource_url": server.resource_url,
                    "client_id": server.client_id,
                    "client_secret": server.client_secret,
                    "tokens": server.issue_tokens("demo-user"),
                },
                indent=2,
            ),
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":  # pragma: no cover
    main()


__all__ = [
    "FormAuthorizationServer",
    "FormRequest",
    "IssuedToken",
    "OAuthTestServer",
    "ServerStats",
]
