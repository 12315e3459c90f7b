"""The simulated Azure AD token endpoint of the Graph simulator: authlib's
``AuthorizationServer`` with a rotating ``RefreshTokenGrant`` (client authentication by
``client_secret_post`` or ``client_secret_basic``; scopes are not enforced), the grants
it issued (:class:`Tokens`), and Azure AD's refusals."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
from authlib.oauth2.rfc6749 import ClientMixin
from authlib.oauth2.rfc6749 import grants as rfc6749_grants
from authlib.oauth2.rfc6750 import BearerTokenGenerator

from synckit.examples.graph_mail.graph_shapes import iso
from synckit.testing.oauth_server import FormAuthorizationServer, FormRequest, IssuedToken
from synckit.testing.replies import RecordedRequest, Reply

if TYPE_CHECKING:
    from synckit.examples.graph_mail.simulator import GraphSimulator

__all__ = ["GRAPH_SCOPE", "Tokens"]

GRAPH_SCOPE = "https://graph.microsoft.com/.default offline_access"


@dataclass
class _Client(ClientMixin):  # type: ignore[misc]  # authlib ships no type information
    client_id: str
    client_secret: str

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        return None

    def get_allowed_scope(self, scope: str | None) -> str:
        return scope or GRAPH_SCOPE

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return False

    def check_client_secret(self, client_secret: str) -> bool:
        return client_secret == self.client_secret

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method in ("client_secret_post", "client_secret_basic")

    def check_response_type(self, response_type: str) -> bool:
        return False

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == "refresh_token"


@dataclass
class _Grant(IssuedToken):
    access_token: str
    refresh_token: str
    client_id: str
    tenant: str
    scope: str
    expires_in: int
    refresh_revoked: bool = False

    def __repr__(self) -> str:  # authlib logs token objects at debug level: no secrets
        return f"_Grant(tenant={self.tenant!r})"

    def is_expired(self) -> bool:
        return False  # refresh tokens live until revoked or used (rotation)

    def is_revoked(self) -> bool:
        return self.refresh_revoked


class _TokenRequest(FormRequest):
    def __init__(
        self, tenant: str, headers: httpx.Headers, form: dict[str, str], args: dict[str, str]
    ) -> None:
        # authlib refuses plain-http URIs outside loopback; the real endpoint is https.
        uri = f"https://login.microsoftonline.com/{tenant}/oauth2/v2.0/token"
        super().__init__("POST", uri, headers, form, args)
        self.tenant = tenant


class _RefreshTokenGrant(rfc6749_grants.RefreshTokenGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_post", "client_secret_basic"]
    INCLUDE_NEW_REFRESH_TOKEN = True  # rotation: every refresh returns a new refresh token
    tokens: Tokens  # set on the subclass made per Tokens

    def authenticate_refresh_token(self, refresh_token: str) -> _Grant | None:
        grant = self.tokens.grants_by_refresh.get(refresh_token)
        if grant is None or grant.refresh_revoked or grant.tenant != self.request.tenant:
            return None
        return grant

    def authenticate_user(self, refresh_token: _Grant) -> str:
        return refresh_token.tenant

    def revoke_old_credential(self, refresh_token: _Grant) -> None:
        refresh_token.refresh_revoked = True


# Azure AD's codes for the refusals a connector meets.
AADSTS = {
    "invalid_grant": (
        50173,
        "The provided grant has expired due to it being revoked, "
        "or it was already used (refresh tokens are single use).",
    ),
    "invalid_client": (7000215, "Invalid client secret provided."),
    "unauthorized_client": (700016, "The application is not allowed this grant."),
    "unsupported_grant_type": (70003, "The app requested an unsupported grant type."),
    "invalid_request": (900144, "The request body is missing or malformed."),
}


class Tokens:
    """The tenants' grants and the token endpoint that refreshes them (state shared with
    the simulator under its FakeAPI's lock)."""

    def __init__(self, sim: GraphSimulator) -> None:
        self.sim = sim
        self.clients = {sim.client_id: _Client(sim.client_id, sim.client_secret)}
        self.grants_by_refresh: dict[str, _Grant] = {}
        self.authz = FormAuthorizationServer(self.clients, self._save_token)
        self.authz.register_token_generator(
            "default",
            BearerTokenGenerator(
                access_token_generator=lambda **_kw: sim.opaque("at"),
                refresh_token_generator=lambda **_kw: sim.opaque("rt"),
                expires_generator=lambda _client, _grant: int(
                    sim.access_token_lifetime.total_seconds()
                ),
            ),
        )
        self.authz.register_grant(
            type("RefreshTokenGrant", (_RefreshTokenGrant,), {"tokens": self})
        )

    def issue(self, tenant: str) -> dict[str, Any]:
        """Tokens for ``tenant``, as the authorization-code exchange after consent would
        return them (the token endpoint's response shape)."""
        with self.sim.api.lock:
            if tenant not in self.sim.mailboxes:
                raise KeyError(f"no mailbox for tenant {tenant!r}")
            lifetime = int(self.sim.access_token_lifetime.total_seconds())
            token = {
                "token_type": "Bearer",
                "scope": GRAPH_SCOPE,
                "expires_in": lifetime,
                "ext_expires_in": lifetime,
                "access_token": self.sim.opaque("at"),
                "refresh_token": self.sim.opaque("rt"),
            }
            self.save_grant(token, self.sim.client_id, tenant)
            return token

    def expire_access(self, tenant: str) -> None:
        """Make every access token of ``tenant`` expired now (Graph answers 401)."""
        with self.sim.api.lock:
            for grant in self.grants_by_refresh.values():
                if grant.tenant == tenant:
                    info = self.sim.api.token_info(grant.access_token)
                    if info is not None and info.valid_at(self.sim.clock()):
                        self.sim.api.expire_token(grant.access_token)

    def revoke(self, tenant: str, *, access_tokens: bool = False) -> None:
        """Revoke ``tenant``'s refresh tokens, as an admin revoking the app's sessions: the
        next refresh gets ``invalid_grant``. Access tokens stay good until they expire, as in
        Azure AD, unless ``access_tokens`` is true."""
        with self.sim.api.lock:
            for grant in self.grants_by_refresh.values():
                if grant.tenant == tenant:
                    grant.refresh_revoked = True
                    if access_tokens:
                        self.sim.api.revoke_token(grant.access_token)

    def _save_token(self, token: dict[str, Any], request: FormRequest) -> None:
        self.save_grant(token, request.client.client_id, str(request.user))

    def save_grant(self, token: dict[str, Any], client_id: str, tenant: str) -> None:
        grant = _Grant(
            access_token=token["access_token"],
            refresh_token=token["refresh_token"],
            client_id=client_id,
            tenant=tenant,
            scope=str(token.get("scope") or GRAPH_SCOPE),
            expires_in=int(token["expires_in"]),
        )
        self.grants_by_refresh[grant.refresh_token] = grant
        self.sim.api.issue_token(grant.access_token, expires_in=grant.expires_in, subject=tenant)

    def endpoint(self, request: RecordedRequest) -> Reply:
        """``POST /{tenant}/oauth2/v2.0/token``: a refresh, or Azure AD's refusal."""
        tenant = request.params["tenant"]
        if tenant not in self.sim.mailboxes:
            return aad_error(400, "invalid_request", 90002, f"Tenant '{tenant}' not found.")
        form = request.form()
        # Azure AD accepts `.default` and other scope spellings a connector may send; the
        # simulator does not model consent, so scopes are not checked.
        form.pop("scope", None)
        oauth_request = _TokenRequest(tenant, request.headers, form, dict(request.query))
        status, body, _headers = self.authz.create_token_response(oauth_request)
        headers = {"Cache-Control": "no-store", "Pragma": "no-cache"}
        if status == 200:
            self.sim.stats.token_refreshes[tenant] += 1
            body = {**body, "ext_expires_in": body.get("expires_in")}
            return Reply.json(body, 200, headers)
        error = str(body.get("error", "invalid_request"))
        self.sim.stats.token_errors[f"{tenant}:{error}"] += 1
        code, description = AADSTS.get(error, (90000, str(body.get("error_description", ""))))
        return aad_error(status, error, code, description, headers)


def aad_error(
    status: int,
    error: str,
    code: int,
    description: str,
    headers: dict[str, str] | None = None,
) -> Reply:
    body = {
        "error": error,
        "error_description": f"AADSTS{code}: {description}",
        "error_codes": [code],
        "timestamp": iso(datetime.now(UTC)).replace("T", " ").rstrip("Z"),
        "trace_id": str(uuid.uuid4()),
        "correlation_id": str(uuid.uuid4()),
    }
    return Reply.json(body, status, headers)
