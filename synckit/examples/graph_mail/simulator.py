"""A simulated Microsoft Graph mail service, for developing and testing a Graph connector.

Built on :class:`synckit.testing.FakeAPI`, so it answers in-process (``sim.transport()``) or
on loopback (``async with sim.serve() as base_url``, ``with sim.serve_in_thread()``), and
behaves like Graph where a mail connector feels it:

* **Mailboxes.** One per tenant (:meth:`GraphSimulator.add_mailbox`), holding the
  well-known folders (``inbox``, ``sentitems``, ``drafts``, ``deleteditems``,
  ``archive``). ``/me`` is whoever the bearer token belongs to.
* **Delta sync.** ``GET /v1.0/me/mailFolders/{folder}/messages/delta`` returns pages of
  ``value`` with an absolute ``@odata.nextLink`` (``$skiptoken``); the last page carries
  ``@odata.deltaLink`` (``$deltatoken``). Calling the deltaLink later returns only what was
  added, changed (again in full) or deleted (``{"id": ..., "@removed": {"reason":
  "deleted"}}``) since. Page size is ``page_size`` or the client's ``Prefer:
  odata.maxpagesize=N``. An expired or unknown token answers **410 Gone** with
  ``{"error": {"code": "SyncStateNotFound"}}``: the client must start a full sync again
  (:meth:`GraphSimulator.expire_delta_tokens`, or ``delta_token_ttl``).
* **Sending.** ``POST /v1.0/me/sendMail`` answers **202 with no body and no id**, and is
  not idempotent: every call puts a message in Sent Items, carrying the client's
  ``internetMessageId``. ``GET /v1.0/me/mailFolders/sentitems/messages?$filter=
  internetMessageId eq '<id>'`` finds it (``/v1.0/me/messages`` searches every folder).
  With ``lost_send_rate`` the message is stored and then the connection is dropped
  without an answer, so a client cannot know that it was sent.
* **Throttling.** Per mailbox: 429 with ``Retry-After`` seconds at ``throttle_rate`` (a
  mailbox added with ``throttled_hard=True`` gets them at :data:`HARD_THROTTLE_RATE`), 503
  at ``server_error_rate``, and optionally a request quota per window (``request_limit``
  per ``window``, answered with 429 and the seconds until the window frees up).
* **Bad records.** ``add_mailbox(..., malformed=N)`` puts N messages in the inbox that
  break the shape a connector should insist on (see :data:`REQUIRED_FIELDS`), for the DLQ.
* **Tokens.** ``POST /{tenant}/oauth2/v2.0/token`` is an Azure-AD-shaped token endpoint
  (authlib's ``AuthorizationServer`` with a rotating ``RefreshTokenGrant``; client
  authentication by ``client_secret_post`` or ``client_secret_basic``; scopes are not
  enforced). Access tokens expire after ``access_token_lifetime`` by the simulator's
  clock; Graph then answers 401 ``InvalidAuthenticationToken`` with ``WWW-Authenticate:
  Bearer error="invalid_token"``. A refresh token works once. :meth:`GraphSimulator.revoke`
  revokes a tenant's refresh tokens, so its next refresh gets ``invalid_grant``
  (AADSTS50173).

* **Change notifications.** ``POST /v1.0/subscriptions`` (``changeType``,
  ``notificationUrl``, ``resource`` ``me/mailFolders('{folder}')/messages`` or
  ``me/messages``, ``expirationDateTime`` at most :data:`MAX_SUBSCRIPTION_LIFETIME` ahead,
  ``clientState``) first validates the URL as Graph does: it POSTs
  ``notificationUrl?validationToken=...`` and wants the token back, as ``text/plain``,
  within 10 seconds (a blocking call from the simulator's thread: serve it with
  ``serve_in_thread`` when the receiver runs in the caller's event loop), then answers 201
  with the subscription. ``PATCH /v1.0/subscriptions/{id}`` renews it,
  ``DELETE`` deletes it; an expired or forgotten one
  (:meth:`GraphSimulator.forget_subscription`) answers 404. A message added, changed or
  deleted in a subscribed folder queues a notification carrying the subscription's
  ``clientState``; :meth:`GraphSimulator.send_notifications` delivers what is queued.

All randomness is seeded (``seed``; each mailbox draws from its own generator), so the
same requests meet the same faults on every run. ``python -m synckit.examples.graph_mail.simulator
--port 0`` serves one for manual use and prints its base URL.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import math
import random
import re
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import httpx
from authlib.oauth2.rfc6749 import AuthorizationServer, ClientMixin, OAuth2Request, TokenMixin
from authlib.oauth2.rfc6749 import grants as rfc6749_grants
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc6750 import BearerTokenGenerator

from synckit.testing.fakeapi import FakeAPI, Fault, RecordedRequest, Reply

__all__ = [
    "FOLDERS",
    "HARD_THROTTLE_RATE",
    "MAX_SUBSCRIPTION_LIFETIME",
    "REQUIRED_FIELDS",
    "GraphSimulator",
    "Mailbox",
    "SimulatorStats",
    "main",
]

#: The well-known mail folders every simulated mailbox has.
FOLDERS = ("inbox", "sentitems", "drafts", "deleteditems", "archive")
#: The 429 rate of a mailbox added with ``throttled_hard=True``.
HARD_THROTTLE_RATE = 0.4
#: What every well-formed message has; each malformed one breaks exactly one of these.
REQUIRED_FIELDS = {
    "id": "a string",
    "subject": "a string",
    "receivedDateTime": "an ISO-8601 UTC timestamp string",
    "from": 'an object {"emailAddress": {"address": str, "name": str}}',
    "internetMessageId": "a string",
}
GRAPH_SCOPE = "https://graph.microsoft.com/.default offline_access"
#: The longest a subscription to messages may live (Graph's limit: 4230 minutes).
MAX_SUBSCRIPTION_LIFETIME = timedelta(minutes=4230)
_RESOURCE = re.compile(r"/?me/(?:mailFolders\('([^']+)'\)/)?messages", re.IGNORECASE)

_FILTER = re.compile(r"\s*internetMessageId\s+eq\s+'((?:[^']|'')*)'\s*", re.IGNORECASE)
_PAGE_SIZE_PREFERENCE = re.compile(r"odata\.maxpagesize\s*=\s*(\d+)", re.IGNORECASE)
_SENDERS = (
    ("Ada Lovelace", "ada@analytical.example"),
    ("Grace Hopper", "grace@cobol.example"),
    ("Alan Turing", "alan@bletchley.example"),
    ("Katherine Johnson", "katherine@nasa.example"),
    ("Edsger Dijkstra", "edsger@eindhoven.example"),
)
_TOPICS = ("Quarterly report", "Lunch?", "Invoice", "Re: build failure", "Meeting notes")


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _graph_error(status: int, code: str, message: str) -> Reply:
    return Reply.json({"error": {"code": code, "message": message}}, status)


# --- state ---------------------------------------------------------------------------------


@dataclass
class Mailbox:
    """One tenant's mailbox and how hostile Graph is to it (fields may be changed live)."""

    tenant: str
    address: str
    display_name: str
    throttle_rate: float
    retry_after: int
    server_error_rate: float
    lost_send_rate: float
    request_limit: int | None
    window: timedelta
    #: Ids of the malformed messages put in the inbox.
    malformed_ids: list[str] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random, repr=False)
    recent: deque[datetime] = field(default_factory=deque, repr=False)


@dataclass
class _Item:
    id: str
    tenant: str
    folder: str
    data: dict[str, Any]
    seq: int
    deleted: bool = False


@dataclass(frozen=True)
class _Round:
    """One pass of delta paging over a folder: the messages it reports, fixed at its start."""

    number: int
    tenant: str
    folder: str
    ids: tuple[str, ...]
    upto: int


@dataclass
class _DeltaState:
    tenant: str
    folder: str
    upto: int
    issued_at: datetime
    expired: bool = False


@dataclass
class _GraphSubscription:
    id: str
    tenant: str
    folder: str | None  # None: every folder (``me/messages``)
    resource: str
    change_types: frozenset[str]
    notification_url: str
    client_state: str | None
    expires_at: datetime


@dataclass
class SimulatorStats:
    """What the simulator did, by tenant."""

    requests: Counter[str] = field(default_factory=Counter)
    throttled: Counter[str] = field(default_factory=Counter)
    server_errors: Counter[str] = field(default_factory=Counter)
    sends: Counter[str] = field(default_factory=Counter)
    lost_sends: Counter[str] = field(default_factory=Counter)
    token_refreshes: Counter[str] = field(default_factory=Counter)
    token_errors: Counter[str] = field(default_factory=Counter)
    full_syncs: Counter[str] = field(default_factory=Counter)
    expired_delta_tokens: Counter[str] = field(default_factory=Counter)
    subscriptions_created: Counter[str] = field(default_factory=Counter)
    subscriptions_renewed: Counter[str] = field(default_factory=Counter)
    subscriptions_deleted: Counter[str] = field(default_factory=Counter)
    validations: Counter[str] = field(default_factory=Counter)
    notifications: Counter[str] = field(default_factory=Counter)


# --- the token endpoint, from authlib's components -----------------------------------------


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
class _Grant(TokenMixin):  # type: ignore[misc]
    access_token: str
    refresh_token: str
    client_id: str
    tenant: str
    scope: str
    expires_in: int
    refresh_revoked: bool = False

    def __repr__(self) -> str:  # authlib logs token objects at debug level: no secrets
        return f"_Grant(tenant={self.tenant!r})"

    def check_client(self, client: _Client) -> bool:
        return client.client_id == self.client_id

    def get_scope(self) -> str:
        return self.scope

    def get_expires_in(self) -> int:
        return self.expires_in

    def is_expired(self) -> bool:
        return False  # refresh tokens live until revoked or used (rotation)

    def is_revoked(self) -> bool:
        return self.refresh_revoked


class _TokenRequest(OAuth2Request):  # type: ignore[misc]
    def __init__(
        self, tenant: str, headers: httpx.Headers, form: dict[str, str], args: dict[str, str]
    ) -> None:
        # authlib refuses plain-http URIs outside loopback; the real endpoint is https.
        uri = f"https://login.microsoftonline.com/{tenant}/oauth2/v2.0/token"
        super().__init__("POST", uri, headers=headers)
        self.tenant = tenant
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
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_post", "client_secret_basic"]
    INCLUDE_NEW_REFRESH_TOKEN = True  # rotation: every refresh returns a new refresh token
    simulator: GraphSimulator  # set on the subclass made per simulator

    def authenticate_refresh_token(self, refresh_token: str) -> _Grant | None:
        grant = self.simulator._grants_by_refresh.get(refresh_token)
        if grant is None or grant.refresh_revoked or grant.tenant != self.request.tenant:
            return None
        return grant

    def authenticate_user(self, refresh_token: _Grant) -> str:
        return refresh_token.tenant

    def revoke_old_credential(self, refresh_token: _Grant) -> None:
        refresh_token.refresh_revoked = True


class _AuthorizationServer(AuthorizationServer):  # type: ignore[misc]
    def __init__(self, simulator: GraphSimulator) -> None:
        super().__init__()
        self.simulator = simulator

    def query_client(self, client_id: str) -> _Client | None:
        return self.simulator._clients.get(client_id)

    def save_token(self, token: dict[str, Any], request: _TokenRequest) -> None:
        self.simulator._save_grant(token, request.client.client_id, str(request.user))

    def create_oauth2_request(self, request: _TokenRequest) -> _TokenRequest:
        return request

    def create_json_request(self, request: Any) -> Any:
        raise NotImplementedError("the simulated token endpoint takes forms only")

    def handle_response(
        self, status: int, body: Any, headers: list[tuple[str, str]]
    ) -> tuple[int, Any, list[tuple[str, str]]]:
        return status, body, headers

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass


# Azure AD's codes for the refusals a connector meets.
_AADSTS = {
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


# --- the simulator -------------------------------------------------------------------------


class GraphSimulator:
    """A simulated Graph mail service for several tenants; see the module docstring.

    ``clock`` drives token expiry, delta-token age, quotas and message times (plug in a
    :class:`~synckit.testing.FakeClock`); the defaults of the fault rates apply to every
    mailbox that does not set its own.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        page_size: int = 10,
        clock: Callable[[], datetime] | None = None,
        access_token_lifetime: timedelta = timedelta(hours=1),
        delta_token_ttl: timedelta | None = None,
        throttle_rate: float = 0.0,
        retry_after: int = 2,
        server_error_rate: float = 0.0,
        lost_send_rate: float = 0.0,
        client_id: str = "00000000-simulated-graph-client",
        client_secret: str | None = None,
    ) -> None:
        self.seed = seed
        self.page_size = page_size
        self.clock: Callable[[], datetime] = clock or (lambda: datetime.now(UTC))
        self.access_token_lifetime = access_token_lifetime
        self.delta_token_ttl = delta_token_ttl
        self.defaults = {
            "throttle_rate": throttle_rate,
            "retry_after": retry_after,
            "server_error_rate": server_error_rate,
            "lost_send_rate": lost_send_rate,
        }
        self.client_id = client_id
        self.client_secret = client_secret or f"sim-secret-{self._digest('client-secret')[:24]}"
        self.stats = SimulatorStats()
        self.api = FakeAPI(
            clock=self.clock,
            seed=seed,
            require_auth=True,
            unauthorized_body={
                "error": {
                    "code": "InvalidAuthenticationToken",
                    "message": "Access token has expired or is not yet valid.",
                }
            },
        )
        self._mailboxes: dict[str, Mailbox] = {}
        self._items: dict[str, _Item] = {}
        self._seq = 0
        self._counter = 0
        self._rounds: dict[int, _Round] = {}
        self._skiptokens: dict[str, tuple[int, int]] = {}
        self._skip_by_position: dict[tuple[int, int], str] = {}
        self._delta_tokens: dict[str, _DeltaState] = {}
        self._delta_by_round: dict[int, str] = {}
        self._clients = {client_id: _Client(client_id, self.client_secret)}
        self._grants_by_refresh: dict[str, _Grant] = {}
        self._subscriptions: dict[str, _GraphSubscription] = {}
        self._queued: list[tuple[str, dict[str, Any]]] = []  # (subscription id, notification)
        self._authz = _AuthorizationServer(self)
        self._authz.register_token_generator(
            "default",
            BearerTokenGenerator(
                access_token_generator=lambda **_kw: self._opaque("at"),
                refresh_token_generator=lambda **_kw: self._opaque("rt"),
                expires_generator=lambda _client, _grant: int(
                    self.access_token_lifetime.total_seconds()
                ),
            ),
        )
        self._authz.register_grant(
            type("RefreshTokenGrant", (_RefreshTokenGrant,), {"simulator": self})
        )
        self._register_routes()

    # --- serving (delegated to the FakeAPI) ------------------------------------------------

    def transport(self) -> httpx.MockTransport:
        """Answer in-process: ``httpx.AsyncClient(transport=sim.transport(), base_url=...)``
        (any base URL, e.g. ``https://graph.microsoft.com``; links point back to it)."""
        return self.api.transport()

    @contextlib.asynccontextmanager
    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
        """Serve on loopback in this event loop; yields the base URL."""
        async with self.api.serve(host, port) as url:
            yield url

    @contextlib.contextmanager
    def serve_in_thread(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
        """Serve on loopback from a background thread; yields the base URL."""
        with self.api.serve_in_thread(host, port) as url:
            yield url

    @staticmethod
    def graph_url(base_url: str) -> str:
        """The Graph API root under ``base_url`` (``{base_url}/v1.0``)."""
        return f"{base_url.rstrip('/')}/v1.0"

    @staticmethod
    def token_url(base_url: str, tenant: str) -> str:
        """The tenant's Azure-AD-shaped token endpoint under ``base_url``."""
        return f"{base_url.rstrip('/')}/{tenant}/oauth2/v2.0/token"

    # --- mailboxes and messages ------------------------------------------------------------

    def add_mailbox(
        self,
        tenant: str,
        *,
        messages: int = 0,
        malformed: int = 0,
        address: str | None = None,
        throttled_hard: bool = False,
        throttle_rate: float | None = None,
        retry_after: int | None = None,
        server_error_rate: float | None = None,
        lost_send_rate: float | None = None,
        request_limit: int | None = None,
        window: timedelta = timedelta(seconds=10),
    ) -> Mailbox:
        """Create ``tenant``'s mailbox with ``messages`` well-formed and ``malformed`` broken
        messages in its inbox (the broken ones are spread among the others)."""
        rate = throttle_rate
        if rate is None:
            rate = HARD_THROTTLE_RATE if throttled_hard else self.defaults["throttle_rate"]
        with self.api.lock:
            if tenant in self._mailboxes:
                raise ValueError(f"tenant {tenant!r} already has a mailbox")
            mailbox = Mailbox(
                tenant=tenant,
                address=address or f"user@{tenant}.example",
                display_name=f"{tenant.title()} User",
                throttle_rate=float(rate),
                retry_after=int(retry_after or self.defaults["retry_after"]),
                server_error_rate=float(
                    self.defaults["server_error_rate"]
                    if server_error_rate is None
                    else server_error_rate
                ),
                lost_send_rate=float(
                    self.defaults["lost_send_rate"] if lost_send_rate is None else lost_send_rate
                ),
                request_limit=request_limit,
                window=window,
                rng=random.Random(f"{self.seed}:{tenant}:faults"),
            )
            self._mailboxes[tenant] = mailbox
            content = random.Random(f"{self.seed}:{tenant}:content")
            total = messages + malformed
            bad = set(content.sample(range(total), malformed)) if malformed else set()
            start = self.clock() - timedelta(minutes=total)
            variant = 0
            for i in range(total):
                data = self._new_message(mailbox, "inbox", content, start + timedelta(minutes=i))
                if i in bad:
                    _break(data, variant)
                    variant += 1
                    mailbox.malformed_ids.append(data["id"])
                self._store(tenant, "inbox", data)
            return mailbox

    def mailbox(self, tenant: str) -> Mailbox:
        return self._mailboxes[tenant]

    @property
    def tenants(self) -> list[str]:
        return sorted(self._mailboxes)

    def add_message(self, tenant: str, folder: str = "inbox", **fields: Any) -> dict[str, Any]:
        """Deliver a new well-formed message (``fields`` override any property); returns it."""
        with self.api.lock:
            mailbox = self._mailboxes[tenant]
            rng = random.Random(f"{self.seed}:{tenant}:{self._counter}")
            data = self._new_message(mailbox, folder, rng, self.clock())
            data.update(fields)
            item = self._store(tenant, folder, data)
            self._changed(item, "created")
            return dict(item.data)

    def update_message(self, tenant: str, message_id: str, **fields: Any) -> dict[str, Any]:
        """Change a message (it shows up again in the next delta round); returns it."""
        with self.api.lock:
            item = self._live(tenant, message_id)
            item.data.update(fields)
            self._touch(item)
            self._changed(item, "updated")
            return dict(item.data)

    def delete_message(self, tenant: str, message_id: str) -> None:
        """Delete a message (the next delta round reports it as ``@removed``)."""
        with self.api.lock:
            item = self._live(tenant, message_id)
            item.deleted = True
            self._touch(item)
            self._changed(item, "deleted")

    def messages(self, tenant: str, folder: str = "inbox") -> list[dict[str, Any]]:
        """Copies of the messages in a folder, oldest first."""
        with self.api.lock:
            return [dict(i.data) for i in self._folder_items(tenant, folder)]

    def sent_items(self, tenant: str) -> list[dict[str, Any]]:
        return self.messages(tenant, "sentitems")

    def find_sent(self, tenant: str, internet_message_id: str) -> list[dict[str, Any]]:
        """The Sent Items messages carrying ``internet_message_id`` (more than one when a
        send was repeated)."""
        return [
            m for m in self.sent_items(tenant) if m.get("internetMessageId") == internet_message_id
        ]

    def expire_delta_tokens(self, tenant: str | None = None, folder: str | None = None) -> int:
        """Make every delta token issued so far (for ``tenant``/``folder``, if given) answer
        410 Gone; returns how many were expired."""
        with self.api.lock:
            count = 0
            for state in self._delta_tokens.values():
                if (tenant in (None, state.tenant)) and (folder in (None, state.folder)):
                    count += not state.expired
                    state.expired = True
            return count

    # --- tokens ----------------------------------------------------------------------------

    def issue_tokens(self, tenant: str) -> dict[str, Any]:
        """Tokens for ``tenant``, as the authorization-code exchange after consent would
        return them (the token endpoint's response shape)."""
        with self.api.lock:
            if tenant not in self._mailboxes:
                raise KeyError(f"no mailbox for tenant {tenant!r}")
            lifetime = int(self.access_token_lifetime.total_seconds())
            token = {
                "token_type": "Bearer",
                "scope": GRAPH_SCOPE,
                "expires_in": lifetime,
                "ext_expires_in": lifetime,
                "access_token": self._opaque("at"),
                "refresh_token": self._opaque("rt"),
            }
            self._save_grant(token, self.client_id, tenant)
            return token

    def expire_access_tokens(self, tenant: str) -> None:
        """Make every access token of ``tenant`` expired now (Graph answers 401)."""
        with self.api.lock:
            for grant in self._grants_by_refresh.values():
                if grant.tenant == tenant:
                    info = self.api.token_info(grant.access_token)
                    if info is not None and info.valid_at(self.clock()):
                        self.api.expire_token(grant.access_token)

    def revoke(self, tenant: str, *, access_tokens: bool = False) -> None:
        """Revoke ``tenant``'s refresh tokens, as an admin revoking the app's sessions: the
        next refresh gets ``invalid_grant``. Access tokens stay good until they expire, as in
        Azure AD, unless ``access_tokens`` is true."""
        with self.api.lock:
            for grant in self._grants_by_refresh.values():
                if grant.tenant == tenant:
                    grant.refresh_revoked = True
                    if access_tokens:
                        self.api.revoke_token(grant.access_token)

    def _save_grant(self, token: dict[str, Any], client_id: str, tenant: str) -> None:
        grant = _Grant(
            access_token=token["access_token"],
            refresh_token=token["refresh_token"],
            client_id=client_id,
            tenant=tenant,
            scope=str(token.get("scope") or GRAPH_SCOPE),
            expires_in=int(token["expires_in"]),
        )
        self._grants_by_refresh[grant.refresh_token] = grant
        self.api.issue_token(grant.access_token, expires_in=grant.expires_in, subject=tenant)

    # --- routes ----------------------------------------------------------------------------

    def _register_routes(self) -> None:
        api = self.api
        api.route("POST", "/{tenant}/oauth2/v2.0/token", self._token_endpoint, auth=False)
        graph: list[tuple[str, str, Callable[[Mailbox, RecordedRequest], Any]]] = [
            ("GET", "/v1.0/me", self._me),
            ("GET", "/v1.0/me/mailFolders/{folder}/messages/delta", self._delta),
            ("GET", "/v1.0/me/mailFolders/{folder}/messages", self._list_folder),
            ("GET", "/v1.0/me/messages", self._list_all),
            ("GET", "/v1.0/me/messages/{id}", self._get_message),
            ("POST", "/v1.0/me/sendMail", self._send_mail),
            ("POST", "/v1.0/subscriptions", self._create_subscription),
            ("GET", "/v1.0/subscriptions/{id}", self._get_subscription),
            ("PATCH", "/v1.0/subscriptions/{id}", self._renew_subscription),
            ("DELETE", "/v1.0/subscriptions/{id}", self._delete_subscription),
        ]
        for method, path, func in graph:
            api.route(method, path, self._graph_handler(func))

    def _graph_handler(
        self, func: Callable[[Mailbox, RecordedRequest], Any]
    ) -> Callable[[RecordedRequest], Any]:
        def handler(request: RecordedRequest) -> Any:
            info = self.api.token_info(request.bearer_token)
            mailbox = self._mailboxes.get(info.subject or "") if info is not None else None
            if mailbox is None:
                return _graph_error(404, "ErrorMailboxNotFound", "The mailbox does not exist.")
            self.stats.requests[mailbox.tenant] += 1
            if (refused := self._throttle(mailbox)) is not None:
                return refused
            return func(mailbox, request)

        return handler

    def _throttle(self, mailbox: Mailbox) -> Reply | None:
        now = self.clock()
        tenant = mailbox.tenant
        if mailbox.request_limit is not None:
            while mailbox.recent and mailbox.recent[0] <= now - mailbox.window:
                mailbox.recent.popleft()
            if len(mailbox.recent) >= mailbox.request_limit:
                wait = (mailbox.recent[0] + mailbox.window - now).total_seconds()
                self.stats.throttled[tenant] += 1
                return self._too_many(max(1, math.ceil(wait)), "MailboxConcurrency")
        draw = mailbox.rng.random()
        if draw < mailbox.throttle_rate:
            self.stats.throttled[tenant] += 1
            return self._too_many(mailbox.retry_after, "ApplicationThrottled")
        if draw < mailbox.throttle_rate + mailbox.server_error_rate:
            self.stats.server_errors[tenant] += 1
            return _graph_error(
                503, "ServiceUnavailable", "The service is temporarily unavailable."
            )
        mailbox.recent.append(now)
        return None

    @staticmethod
    def _too_many(seconds: int, limit: str) -> Reply:
        body = {
            "error": {
                "code": "ApplicationThrottled",
                "message": f"Application is over its {limit} limit.",
            }
        }
        return Reply.json(body, 429, {"Retry-After": str(seconds)})

    def _token_endpoint(self, request: RecordedRequest) -> Reply:
        tenant = request.params["tenant"]
        if tenant not in self._mailboxes:
            return _aad_error(400, "invalid_request", 90002, f"Tenant '{tenant}' not found.")
        form = request.form()
        # Azure AD accepts `.default` and other scope spellings a connector may send; the
        # simulator does not model consent, so scopes are not checked.
        form.pop("scope", None)
        oauth_request = _TokenRequest(tenant, request.headers, form, dict(request.query))
        status, body, _headers = self._authz.create_token_response(oauth_request)
        headers = {"Cache-Control": "no-store", "Pragma": "no-cache"}
        if status == 200:
            self.stats.token_refreshes[tenant] += 1
            body = {**body, "ext_expires_in": body.get("expires_in")}
            return Reply.json(body, 200, headers)
        error = str(body.get("error", "invalid_request"))
        self.stats.token_errors[f"{tenant}:{error}"] += 1
        code, description = _AADSTS.get(error, (90000, str(body.get("error_description", ""))))
        return _aad_error(status, error, code, description, headers)

    def _me(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        return {
            "@odata.context": f"{request.base_url}/v1.0/$metadata#users/$entity",
            "id": str(uuid.UUID(self._digest(f"user:{mailbox.tenant}")[:32])),
            "displayName": mailbox.display_name,
            "mail": mailbox.address,
            "userPrincipalName": mailbox.address,
        }

    def _delta(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        folder = _folder_name(request.params["folder"])
        if folder is None:
            return _graph_error(404, "ErrorItemNotFound", "The specified folder was not found.")
        tenant = mailbox.tenant
        skiptoken = request.query.get("$skiptoken")
        deltatoken = request.query.get("$deltatoken")
        if skiptoken is not None:
            found = self._skiptokens.get(skiptoken)
            round_ = self._rounds.get(found[0]) if found else None
            if (
                found is None
                or round_ is None
                or (round_.tenant, round_.folder)
                != (
                    tenant,
                    folder,
                )
            ):
                return self._sync_state_not_found(tenant)
            offset = found[1]
        elif deltatoken is not None:
            state = self._delta_tokens.get(deltatoken)
            too_old = (
                state is not None
                and self.delta_token_ttl is not None
                and self.clock() - state.issued_at > self.delta_token_ttl
            )
            if (
                state is None
                or state.expired
                or too_old
                or (state.tenant, state.folder) != (tenant, folder)
            ):
                return self._sync_state_not_found(tenant)
            round_, offset = self._new_round(tenant, folder, since=state.upto), 0
        else:
            self.stats.full_syncs[tenant] += 1
            round_, offset = self._new_round(tenant, folder, since=None), 0
        size = self._page_size(request)
        link = f"{request.base_url}/v1.0/me/mailFolders/{request.params['folder']}/messages/delta"
        body: dict[str, Any] = {
            "@odata.context": f"{request.base_url}/v1.0/$metadata#Collection(message)",
            "value": [self._delta_entry(i) for i in round_.ids[offset : offset + size]],
        }
        if offset + size < len(round_.ids):
            body["@odata.nextLink"] = f"{link}?$skiptoken={self._skiptoken(round_, offset + size)}"
        else:
            body["@odata.deltaLink"] = f"{link}?$deltatoken={self._deltatoken(round_)}"
        return body

    def _sync_state_not_found(self, tenant: str) -> Reply:
        self.stats.expired_delta_tokens[tenant] += 1
        return _graph_error(
            410,
            "SyncStateNotFound",
            "The sync state generation is not found or has expired. Start a full sync.",
        )

    def _list_folder(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        folder = _folder_name(request.params["folder"])
        if folder is None:
            return _graph_error(404, "ErrorItemNotFound", "The specified folder was not found.")
        return self._list(mailbox, request, folder)

    def _list_all(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        return self._list(mailbox, request, None)

    def _list(self, mailbox: Mailbox, request: RecordedRequest, folder: str | None) -> Any:
        items = [
            i
            for i in self._items.values()
            if i.tenant == mailbox.tenant and not i.deleted and folder in (None, i.folder)
        ]
        flt = request.query.get("$filter")
        if flt is not None:
            m = _FILTER.fullmatch(flt)
            if m is None:
                return _graph_error(
                    400,
                    "ErrorInvalidUrlQueryFilter",
                    "The simulator supports $filter=internetMessageId eq '<id>' only.",
                )
            wanted = m.group(1).replace("''", "'")
            items = [i for i in items if i.data.get("internetMessageId") == wanted]
        try:
            top = min(max(int(request.query.get("$top", "10")), 1), 1000)
            skip = max(int(request.query.get("$skip", "0")), 0)
        except ValueError:
            return _graph_error(400, "BadRequest", "Invalid $top or $skip.")
        # Graph lists newest first by default.
        items.sort(key=lambda i: (str(i.data.get("receivedDateTime") or ""), i.seq), reverse=True)
        body: dict[str, Any] = {
            "@odata.context": f"{request.base_url}/v1.0/$metadata#Collection(message)",
            "value": [dict(i.data) for i in items[skip : skip + top]],
        }
        if skip + top < len(items):
            query = {k: v for k, v in request.query.items() if k not in ("$skip", "$top")}
            query |= {"$top": str(top), "$skip": str(skip + top)}
            body["@odata.nextLink"] = f"{request.base_url}{request.path}?{urlencode(query)}"
        return body

    def _get_message(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        item = self._items.get(request.params["id"])
        if item is None or item.deleted or item.tenant != mailbox.tenant:
            return _graph_error(404, "ErrorItemNotFound", "The specified object was not found.")
        return dict(item.data)

    def _send_mail(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        try:
            payload = request.json()
        except ValueError:
            return _graph_error(400, "BadRequest", "Unable to read JSON request payload.")
        message = payload.get("message") if isinstance(payload, dict) else None
        if not isinstance(message, dict):
            return _graph_error(400, "ErrorInvalidRequest", "The 'message' property is required.")
        recipients = message.get("toRecipients")
        if not isinstance(recipients, list) or not recipients:
            return _graph_error(
                400, "ErrorInvalidRecipients", "At least one recipient is not valid."
            )
        now = self.clock()
        internet_id = message.get("internetMessageId") or (
            f"<{self._digest(f'imid:{self._counter}')[:20]}@{mailbox.tenant}.example>"
        )
        save = payload.get("saveToSentItems", True)
        if save not in (False, "false", "False"):
            data = {
                **message,
                "id": self._opaque("AAMk"),
                "internetMessageId": internet_id,
                "subject": message.get("subject", ""),
                "createdDateTime": _iso(now),
                "lastModifiedDateTime": _iso(now),
                "sentDateTime": _iso(now),
                "receivedDateTime": _iso(now),
                "from": {
                    "emailAddress": {"name": mailbox.display_name, "address": mailbox.address}
                },
                "sender": {
                    "emailAddress": {"name": mailbox.display_name, "address": mailbox.address}
                },
                "isRead": True,
                "isDraft": False,
            }
            self._changed(self._store(mailbox.tenant, "sentitems", data), "created")
        self.stats.sends[mailbox.tenant] += 1
        if mailbox.lost_send_rate > 0 and mailbox.rng.random() < mailbox.lost_send_rate:
            self.stats.lost_sends[mailbox.tenant] += 1
            return Fault.lost_response()  # sent and stored; the 202 never reaches the client
        return Reply.empty(202)

    # --- change notifications ---------------------------------------------------------------

    def subscriptions(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """The live subscriptions (of ``tenant``), as Graph shows them."""
        with self.api.lock:
            now = self.clock()
            return [
                self._subscription_body(sub)
                for sub in self._subscriptions.values()
                if (tenant in (None, sub.tenant)) and sub.expires_at > now
            ]

    def forget_subscription(self, subscription_id: str) -> None:
        """Drop a subscription as Graph sometimes does: renewing it then answers 404."""
        with self.api.lock:
            self._subscriptions.pop(subscription_id, None)

    def queued_notifications(self) -> int:
        with self.api.lock:
            return len(self._queued)

    async def send_notifications(self) -> list[int]:
        """POST every queued notification to its subscription's URL, one delivery per
        subscription (``{"value": [...]}``); the status of each delivery (0: no answer).
        Notifications of a subscription that expired meanwhile are dropped."""
        with self.api.lock:
            queued, self._queued = self._queued, []
            now = self.clock()
            batches: dict[str, list[dict[str, Any]]] = {}
            urls: dict[str, str] = {}
            for sub_id, note in queued:
                sub = self._subscriptions.get(sub_id)
                if sub is not None and sub.expires_at > now:
                    batches.setdefault(sub_id, []).append(note)
                    urls[sub_id] = sub.notification_url
        statuses: list[int] = []
        async with httpx.AsyncClient(timeout=10.0) as client:
            for sub_id, notes in batches.items():
                try:
                    r = await client.post(urls[sub_id], json={"value": notes})
                    statuses.append(r.status_code)
                except httpx.HTTPError:
                    statuses.append(0)
                self.stats.notifications[notes[0]["tenantId"]] += len(notes)
        return statuses

    def _changed(self, item: _Item, change: str) -> None:
        """Queue a notification for each live subscription that covers ``item``."""
        now = self.clock()
        for sub in self._subscriptions.values():
            if (
                sub.tenant != item.tenant
                or sub.expires_at <= now
                or change not in sub.change_types
                or sub.folder not in (None, item.folder)
            ):
                continue
            resource = f"Users/{self._user_id(item.tenant)}/Messages/{item.id}"
            note: dict[str, Any] = {
                "id": self._opaque("ntf"),
                "subscriptionId": sub.id,
                "subscriptionExpirationDateTime": _iso(sub.expires_at),
                "changeType": change,
                "resource": resource,
                "resourceData": {
                    "@odata.type": "#Microsoft.Graph.Message",
                    "@odata.id": resource,
                    "id": item.id,
                },
                "tenantId": item.tenant,
            }
            if sub.client_state is not None:
                note["clientState"] = sub.client_state
            self._queued.append((sub.id, note))

    def _user_id(self, tenant: str) -> str:
        return str(uuid.UUID(self._digest(f"user:{tenant}")[:32]))

    def _subscription_body(self, sub: _GraphSubscription) -> dict[str, Any]:
        return {
            "@odata.context": "https://graph.microsoft.com/v1.0/$metadata#subscriptions/$entity",
            "id": sub.id,
            "resource": sub.resource,
            "changeType": ",".join(sorted(sub.change_types)),
            "clientState": sub.client_state,
            "notificationUrl": sub.notification_url,
            "expirationDateTime": sub.expires_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        }

    def _expiry(self, raw: Any) -> datetime | Reply:
        """A requested ``expirationDateTime``, or the 400 Graph answers."""
        try:
            moment = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
        except ValueError:
            return _graph_error(400, "InvalidRequest", "expirationDateTime is not a date.")
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        now = self.clock()
        if moment <= now:
            return _graph_error(400, "InvalidRequest", "expirationDateTime is in the past.")
        if moment > now + MAX_SUBSCRIPTION_LIFETIME:
            return _graph_error(
                400,
                "InvalidRequest",
                "Subscription expiration can only be 4230 minutes in the future.",
            )
        return moment

    def _create_subscription(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        try:
            body = request.json()
        except ValueError:
            return _graph_error(400, "BadRequest", "Unable to read JSON request payload.")
        if not isinstance(body, dict):
            return _graph_error(400, "BadRequest", "A subscription is a JSON object.")
        url, resource = body.get("notificationUrl"), body.get("resource")
        changes = {c.strip() for c in str(body.get("changeType") or "").split(",") if c.strip()}
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            return _graph_error(400, "InvalidRequest", "notificationUrl must be an URL.")
        m = _RESOURCE.fullmatch(str(resource or ""))
        if m is None:
            return _graph_error(400, "InvalidRequest", f"Unsupported resource {resource!r}.")
        folder = _folder_name(m.group(1)) if m.group(1) else None
        if m.group(1) and folder is None:
            return _graph_error(404, "ErrorItemNotFound", "The specified folder was not found.")
        if not changes or not changes <= {"created", "updated", "deleted"}:
            return _graph_error(400, "InvalidRequest", "changeType is invalid.")
        expires = self._expiry(body.get("expirationDateTime"))
        if isinstance(expires, Reply):
            return expires
        problem = self._validate(url, mailbox.tenant)
        if problem is not None:
            return _graph_error(
                400,
                "InvalidRequest",
                f"Subscription validation request failed. {problem}",
            )
        state = body.get("clientState")
        sub = _GraphSubscription(
            id=str(uuid.UUID(self._digest(f"sub:{self._opaque('s')}")[:32])),
            tenant=mailbox.tenant,
            folder=folder,
            resource=str(resource),
            change_types=frozenset(changes),
            notification_url=url,
            client_state=str(state) if state is not None else None,
            expires_at=expires,
        )
        self._subscriptions[sub.id] = sub
        self.stats.subscriptions_created[mailbox.tenant] += 1
        return Reply.json(self._subscription_body(sub), 201)

    def _validate(self, url: str, tenant: str) -> str | None:
        """Graph's validation handshake: the URL must echo the token within 10 s."""
        token = f"Validation: Testing client application reachability {self._opaque('vt')}"
        self.stats.validations[tenant] += 1
        try:
            with httpx.Client(timeout=10.0) as client:
                r = client.post(
                    url, params={"validationToken": token}, headers={"Content-Type": "text/plain"}
                )
        except httpx.HTTPError as exc:
            return f"The notification URL could not be reached: {type(exc).__name__}."
        if r.status_code != 200 or r.text != token:
            return (
                "Response must exactly match validationToken query parameter "
                f"(got {r.status_code})."
            )
        return None

    def _live_subscription(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        sub = self._subscriptions.get(request.params["id"])
        if sub is None or sub.tenant != mailbox.tenant or sub.expires_at <= self.clock():
            return _graph_error(
                404, "ResourceNotFound", f"The object '{request.params['id']}' doesn't exist."
            )
        return sub

    def _get_subscription(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        sub = self._live_subscription(mailbox, request)
        return sub if isinstance(sub, Reply) else self._subscription_body(sub)

    def _renew_subscription(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        sub = self._live_subscription(mailbox, request)
        if isinstance(sub, Reply):
            return sub
        try:
            body = request.json()
        except ValueError:
            return _graph_error(400, "BadRequest", "Unable to read JSON request payload.")
        expires = self._expiry(body.get("expirationDateTime") if isinstance(body, dict) else None)
        if isinstance(expires, Reply):
            return expires
        sub.expires_at = expires
        self.stats.subscriptions_renewed[mailbox.tenant] += 1
        return self._subscription_body(sub)

    def _delete_subscription(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        sub = self._live_subscription(mailbox, request)
        if isinstance(sub, Reply):
            return sub
        del self._subscriptions[sub.id]
        self.stats.subscriptions_deleted[mailbox.tenant] += 1
        return Reply.empty(204)

    # --- internals -------------------------------------------------------------------------

    def _digest(self, label: str) -> str:
        return hashlib.sha256(f"{self.seed}:{label}".encode()).hexdigest()

    def _opaque(self, prefix: str) -> str:
        # Counter-derived rather than random: the same run issues the same ids and tokens.
        self._counter += 1
        raw = hashlib.sha256(f"{self.seed}:{prefix}:{self._counter}".encode()).digest()
        return prefix + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def _new_message(
        self, mailbox: Mailbox, folder: str, rng: random.Random, received: datetime
    ) -> dict[str, Any]:
        name, address = rng.choice(_SENDERS)
        topic = rng.choice(_TOPICS)
        ident = self._opaque("AAMk")
        stamp = _iso(received)
        change_key = self._opaque("CQAAAB")
        return {
            "@odata.etag": f'W/"{change_key}"',
            "id": ident,
            "createdDateTime": stamp,
            "lastModifiedDateTime": stamp,
            "changeKey": change_key,
            "receivedDateTime": stamp,
            "sentDateTime": stamp,
            "hasAttachments": False,
            "internetMessageId": f"<{ident[4:24]}@{address.split('@')[1]}>",
            "subject": f"{topic} #{self._counter}",
            "bodyPreview": f"{topic}: a simulated message for {mailbox.display_name}.",
            "importance": "normal",
            "parentFolderId": folder,
            "conversationId": self._opaque("AAQk"),
            "isRead": False,
            "isDraft": False,
            "body": {"contentType": "text", "content": f"{topic}\n\nSent by the simulator."},
            "from": {"emailAddress": {"name": name, "address": address}},
            "sender": {"emailAddress": {"name": name, "address": address}},
            "toRecipients": [
                {"emailAddress": {"name": mailbox.display_name, "address": mailbox.address}}
            ],
            "ccRecipients": [],
        }

    def _store(self, tenant: str, folder: str, data: dict[str, Any]) -> _Item:
        folder_name = _folder_name(folder)
        if folder_name is None:
            raise ValueError(f"unknown folder {folder!r} (known: {', '.join(FOLDERS)})")
        data["parentFolderId"] = folder_name
        self._seq += 1
        item = _Item(str(data["id"]), tenant, folder_name, data, self._seq)
        self._items[item.id] = item
        return item

    def _touch(self, item: _Item) -> None:
        self._seq += 1
        item.seq = self._seq
        if not item.deleted:
            stamp = _iso(self.clock())
            change_key = self._opaque("CQAAAB")
            item.data.update(
                {"lastModifiedDateTime": stamp, "changeKey": change_key},
            )
            item.data["@odata.etag"] = f'W/"{change_key}"'

    def _live(self, tenant: str, message_id: str) -> _Item:
        item = self._items.get(message_id)
        if item is None or item.deleted or item.tenant != tenant:
            raise KeyError(f"no message {message_id!r} in {tenant!r}'s mailbox")
        return item

    def _folder_items(self, tenant: str, folder: str) -> list[_Item]:
        name = _folder_name(folder)
        return sorted(
            (
                i
                for i in self._items.values()
                if i.tenant == tenant and i.folder == name and not i.deleted
            ),
            key=lambda i: i.seq,
        )

    def _new_round(self, tenant: str, folder: str, *, since: int | None) -> _Round:
        if since is None:
            chosen = self._folder_items(tenant, folder)
        else:
            chosen = sorted(
                (
                    i
                    for i in self._items.values()
                    if i.tenant == tenant and i.folder == folder and i.seq > since
                ),
                key=lambda i: i.seq,
            )
        number = len(self._rounds) + 1
        round_ = _Round(number, tenant, folder, tuple(i.id for i in chosen), self._seq)
        self._rounds[number] = round_
        return round_

    def _delta_entry(self, message_id: str) -> dict[str, Any]:
        item = self._items[message_id]
        if item.deleted:
            return {
                "@odata.type": "#microsoft.graph.message",
                "id": item.id,
                "@removed": {"reason": "deleted"},
            }
        return dict(item.data)

    def _skiptoken(self, round_: _Round, offset: int) -> str:
        # The same page asked for twice (a retry) links to the same next page.
        key = (round_.number, offset)
        if key not in self._skip_by_position:
            token = self._opaque("sk")
            self._skip_by_position[key] = token
            self._skiptokens[token] = key
        return self._skip_by_position[key]

    def _deltatoken(self, round_: _Round) -> str:
        if round_.number not in self._delta_by_round:
            token = self._opaque("dt")
            self._delta_by_round[round_.number] = token
            self._delta_tokens[token] = _DeltaState(
                round_.tenant, round_.folder, round_.upto, self.clock()
            )
        return self._delta_by_round[round_.number]

    def _page_size(self, request: RecordedRequest) -> int:
        m = _PAGE_SIZE_PREFERENCE.search(request.headers.get("prefer", ""))
        return max(1, min(int(m.group(1)), 1000)) if m else self.page_size


def _folder_name(folder: str) -> str | None:
    name = folder.lower()
    return name if name in FOLDERS else None


def _break(data: dict[str, Any], variant: int) -> None:
    """Make ``data`` violate one of :data:`REQUIRED_FIELDS` (the id stays, for the DLQ)."""
    match variant % 5:
        case 0:
            del data["receivedDateTime"]
        case 1:
            data["receivedDateTime"] = "last tuesday"
        case 2:
            data["subject"] = 12345
        case 3:
            data["from"] = "not-an-object@example.com"
        case _:
            del data["internetMessageId"]


def _aad_error(
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
        "timestamp": _iso(datetime.now(UTC)).replace("T", " ").rstrip("Z"),
        "trace_id": str(uuid.uuid4()),
        "correlation_id": str(uuid.uuid4()),
    }
    return Reply.json(body, status, headers)


# --- command line --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    """Serve a simulator until interrupted. The first line printed is the base URL; the
    second is JSON with the client credentials and each tenant's endpoints and tokens."""
    parser = argparse.ArgumentParser(
        prog="python -m synckit.examples.graph_mail.simulator",
        description="A simulated Microsoft Graph mail service on loopback.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tenants", default="contoso,fabrikam", help="comma-separated")
    parser.add_argument("--messages", type=int, default=25, help="per inbox")
    parser.add_argument("--malformed", type=int, default=2, help="per inbox")
    parser.add_argument("--page-size", type=int, default=10)
    parser.add_argument(
        "--throttle-hard", action="append", default=[], metavar="TENANT", help="repeatable"
    )
    parser.add_argument("--throttle-rate", type=float, default=0.0)
    parser.add_argument("--retry-after", type=int, default=2)
    parser.add_argument("--server-error-rate", type=float, default=0.0)
    parser.add_argument("--lost-send-rate", type=float, default=0.0)
    parser.add_argument("--token-lifetime", type=int, default=3600, help="seconds")
    args = parser.parse_args(argv)

    sim = GraphSimulator(
        seed=args.seed,
        page_size=args.page_size,
        access_token_lifetime=timedelta(seconds=args.token_lifetime),
        throttle_rate=args.throttle_rate,
        retry_after=args.retry_after,
        server_error_rate=args.server_error_rate,
        lost_send_rate=args.lost_send_rate,
    )
    tenants = [t.strip() for t in args.tenants.split(",") if t.strip()]
    for tenant in tenants:
        sim.add_mailbox(
            tenant,
            messages=args.messages,
            malformed=args.malformed,
            throttled_hard=tenant in args.throttle_hard,
        )

    async def serve() -> None:
        async with sim.serve(args.host, args.port) as base_url:
            info = {
                "graph_url": sim.graph_url(base_url),
                "client_id": sim.client_id,
                "client_secret": sim.client_secret,
                "tenants": {
                    t: {
                        "token_url": sim.token_url(base_url, t),
                        "address": sim.mailbox(t).address,
                        **sim.issue_tokens(t),
                    }
                    for t in tenants
                },
            }
            print(base_url, flush=True)
            print(json.dumps(info), flush=True)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":  # pragma: no cover
    main()
