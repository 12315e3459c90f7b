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
  ``me/messages``, ``expirationDateTime`` at most
  :data:`~synckit.examples.graph_mail.graph_subscriptions.MAX_SUBSCRIPTION_LIFETIME` ahead,
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

from synckit.examples.graph_mail.graph_delta import Delta
from synckit.examples.graph_mail.graph_shapes import FOLDERS, folder_name, graph_error, iso
from synckit.examples.graph_mail.graph_subscriptions import Subscriptions
from synckit.examples.graph_mail.graph_tokens import Tokens
from synckit.testing.fakeapi import FakeAPI
from synckit.testing.replies import Fault, RecordedRequest, Reply

__all__ = [
    "HARD_THROTTLE_RATE",
    "REQUIRED_FIELDS",
    "GraphSimulator",
    "Mailbox",
    "SimulatorStats",
    "main",
]

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
        self.client_secret = client_secret or f"sim-secret-{self.digest('client-secret')[:24]}"
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
        self.mailboxes: dict[str, Mailbox] = {}
        #: Every message by id, deleted ones kept (delta reports them removed).
        self.items: dict[str, _Item] = {}
        #: The last change's sequence number (each add, update or delete takes the next).
        self.seq = 0
        self._counter = 0
        #: Delta query: its rounds and the skip and delta tokens that lead through them.
        self.delta = Delta(self)
        #: The token endpoint and the grants it issued.
        self.tokens = Tokens(self)
        #: Change-notification subscriptions and the notifications queued for them.
        self.notifications = Subscriptions(self)
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
            if tenant in self.mailboxes:
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
            self.mailboxes[tenant] = mailbox
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
        return self.mailboxes[tenant]

    @property
    def tenants(self) -> list[str]:
        return sorted(self.mailboxes)

    def add_message(self, tenant: str, folder: str = "inbox", **fields: Any) -> dict[str, Any]:
        """Deliver a new well-formed message (``fields`` override any property); returns it."""
        with self.api.lock:
            mailbox = self.mailboxes[tenant]
            rng = random.Random(f"{self.seed}:{tenant}:{self._counter}")
            data = self._new_message(mailbox, folder, rng, self.clock())
            data.update(fields)
            item = self._store(tenant, folder, data)
            self.notifications.changed(item, "created")
            return dict(item.data)

    def update_message(self, tenant: str, message_id: str, **fields: Any) -> dict[str, Any]:
        """Change a message (it shows up again in the next delta round); returns it."""
        with self.api.lock:
            item = self._live(tenant, message_id)
            item.data.update(fields)
            self._touch(item)
            self.notifications.changed(item, "updated")
            return dict(item.data)

    def delete_message(self, tenant: str, message_id: str) -> None:
        """Delete a message (the next delta round reports it as ``@removed``)."""
        with self.api.lock:
            item = self._live(tenant, message_id)
            item.deleted = True
            self._touch(item)
            self.notifications.changed(item, "deleted")

    def messages(self, tenant: str, folder: str = "inbox") -> list[dict[str, Any]]:
        """Copies of the messages in a folder, oldest first."""
        with self.api.lock:
            return [dict(i.data) for i in self.folder_items(tenant, folder)]

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
        return self.delta.expire(tenant, folder)

    # --- tokens ----------------------------------------------------------------------------

    def issue_tokens(self, tenant: str) -> dict[str, Any]:
        """Tokens for ``tenant``, as the authorization-code exchange after consent would
        return them (the token endpoint's response shape)."""
        return self.tokens.issue(tenant)

    def expire_access_tokens(self, tenant: str) -> None:
        """Make every access token of ``tenant`` expired now (Graph answers 401)."""
        self.tokens.expire_access(tenant)

    def revoke(self, tenant: str, *, access_tokens: bool = False) -> None:
        """Revoke ``tenant``'s refresh tokens, as an admin revoking the app's sessions: the
        next refresh gets ``invalid_grant``. Access tokens stay good until they expire, as in
        Azure AD, unless ``access_tokens`` is true."""
        self.tokens.revoke(tenant, access_tokens=access_tokens)

    # --- change notifications ----------------------------------------------------------------

    def subscriptions(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """The live subscriptions (of ``tenant``), as Graph shows them."""
        return self.notifications.live(tenant)

    def forget_subscription(self, subscription_id: str) -> None:
        """Drop a subscription as Graph sometimes does: renewing it then answers 404."""
        self.notifications.forget(subscription_id)

    def queued_notifications(self) -> int:
        return self.notifications.queued_count()

    async def send_notifications(self) -> list[int]:
        """POST every queued notification to its subscription's URL, one delivery per
        subscription (``{"value": [...]}``); the status of each delivery (0: no answer).
        Notifications of a subscription that expired meanwhile are dropped."""
        return await self.notifications.send()

    # --- routes ----------------------------------------------------------------------------

    def _register_routes(self) -> None:
        api = self.api
        api.route("POST", "/{tenant}/oauth2/v2.0/token", self.tokens.endpoint, auth=False)
        graph: list[tuple[str, str, Callable[[Mailbox, RecordedRequest], Any]]] = [
            ("GET", "/v1.0/me", self._me),
            ("GET", "/v1.0/me/mailFolders/{folder}/messages/delta", self.delta.page),
            ("GET", "/v1.0/me/mailFolders/{folder}/messages", self._list_folder),
            ("GET", "/v1.0/me/messages", self._list_all),
            ("GET", "/v1.0/me/messages/{id}", self._get_message),
            ("POST", "/v1.0/me/sendMail", self._send_mail),
            ("POST", "/v1.0/subscriptions", self.notifications.create),
            ("GET", "/v1.0/subscriptions/{id}", self.notifications.get),
            ("PATCH", "/v1.0/subscriptions/{id}", self.notifications.renew),
            ("DELETE", "/v1.0/subscriptions/{id}", self.notifications.delete),
        ]
        for method, path, func in graph:
            api.route(method, path, self._graph_handler(func))

    def _graph_handler(
        self, func: Callable[[Mailbox, RecordedRequest], Any]
    ) -> Callable[[RecordedRequest], Any]:
        def handler(request: RecordedRequest) -> Any:
            info = self.api.token_info(request.bearer_token)
            mailbox = self.mailboxes.get(info.subject or "") if info is not None else None
            if mailbox is None:
                return graph_error(404, "ErrorMailboxNotFound", "The mailbox does not exist.")
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
            return graph_error(503, "ServiceUnavailable", "The service is temporarily unavailable.")
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

    def _me(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        return {
            "@odata.context": f"{request.base_url}/v1.0/$metadata#users/$entity",
            "id": str(uuid.UUID(self.digest(f"user:{mailbox.tenant}")[:32])),
            "displayName": mailbox.display_name,
            "mail": mailbox.address,
            "userPrincipalName": mailbox.address,
        }

    def _list_folder(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        folder = folder_name(request.params["folder"])
        if folder is None:
            return graph_error(404, "ErrorItemNotFound", "The specified folder was not found.")
        return self._list(mailbox, request, folder)

    def _list_all(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        return self._list(mailbox, request, None)

    def _list(self, mailbox: Mailbox, request: RecordedRequest, folder: str | None) -> Any:
        items = [
            i
            for i in self.items.values()
            if i.tenant == mailbox.tenant and not i.deleted and folder in (None, i.folder)
        ]
        flt = request.query.get("$filter")
        if flt is not None:
            m = _FILTER.fullmatch(flt)
            if m is None:
                return graph_error(
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
            return graph_error(400, "BadRequest", "Invalid $top or $skip.")
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
        item = self.items.get(request.params["id"])
        if item is None or item.deleted or item.tenant != mailbox.tenant:
            return graph_error(404, "ErrorItemNotFound", "The specified object was not found.")
        return dict(item.data)

    def _send_mail(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        try:
            payload = request.json()
        except ValueError:
            return graph_error(400, "BadRequest", "Unable to read JSON request payload.")
        message = payload.get("message") if isinstance(payload, dict) else None
        if not isinstance(message, dict):
            return graph_error(400, "ErrorInvalidRequest", "The 'message' property is required.")
        recipients = message.get("toRecipients")
        if not isinstance(recipients, list) or not recipients:
            return graph_error(
                400, "ErrorInvalidRecipients", "At least one recipient is not valid."
            )
        now = self.clock()
        internet_id = message.get("internetMessageId") or (
            f"<{self.digest(f'imid:{self._counter}')[:20]}@{mailbox.tenant}.example>"
        )
        save = payload.get("saveToSentItems", True)
        if save not in (False, "false", "False"):
            data = {
                **message,
                "id": self.opaque("AAMk"),
                "internetMessageId": internet_id,
                "subject": message.get("subject", ""),
                "createdDateTime": iso(now),
                "lastModifiedDateTime": iso(now),
                "sentDateTime": iso(now),
                "receivedDateTime": iso(now),
                "from": {
                    "emailAddress": {"name": mailbox.display_name, "address": mailbox.address}
                },
                "sender": {
                    "emailAddress": {"name": mailbox.display_name, "address": mailbox.address}
                },
                "isRead": True,
                "isDraft": False,
            }
            self.notifications.changed(self._store(mailbox.tenant, "sentitems", data), "created")
        self.stats.sends[mailbox.tenant] += 1
        if mailbox.lost_send_rate > 0 and mailbox.rng.random() < mailbox.lost_send_rate:
            self.stats.lost_sends[mailbox.tenant] += 1
            return Fault.lost_response()  # sent and stored; the 202 never reaches the client
        return Reply.empty(202)

    # --- internals -------------------------------------------------------------------------

    def digest(self, label: str) -> str:
        return hashlib.sha256(f"{self.seed}:{label}".encode()).hexdigest()

    def opaque(self, prefix: str) -> str:
        # Counter-derived rather than random: the same run issues the same ids and tokens.
        self._counter += 1
        raw = hashlib.sha256(f"{self.seed}:{prefix}:{self._counter}".encode()).digest()
        return prefix + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def _new_message(
        self, mailbox: Mailbox, folder: str, rng: random.Random, received: datetime
    ) -> dict[str, Any]:
        name, address = rng.choice(_SENDERS)
        topic = rng.choice(_TOPICS)
        ident = self.opaque("AAMk")
        stamp = iso(received)
        change_key = self.opaque("CQAAAB")
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
            "conversationId": self.opaque("AAQk"),
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
        name = folder_name(folder)
        if name is None:
            raise ValueError(f"unknown folder {folder!r} (known: {', '.join(FOLDERS)})")
        data["parentFolderId"] = name
        self.seq += 1
        item = _Item(str(data["id"]), tenant, name, data, self.seq)
        self.items[item.id] = item
        return item

    def _touch(self, item: _Item) -> None:
        self.seq += 1
        item.seq = self.seq
        if not item.deleted:
            stamp = iso(self.clock())
            change_key = self.opaque("CQAAAB")
            item.data.update(
                {"lastModifiedDateTime": stamp, "changeKey": change_key},
            )
            item.data["@odata.etag"] = f'W/"{change_key}"'

    def _live(self, tenant: str, message_id: str) -> _Item:
        item = self.items.get(message_id)
        if item is None or item.deleted or item.tenant != tenant:
            raise KeyError(f"no message {message_id!r} in {tenant!r}'s mailbox")
        return item

    def folder_items(self, tenant: str, folder: str) -> list[_Item]:
        name = folder_name(folder)
        return sorted(
            (
                i
                for i in self.items.values()
                if i.tenant == tenant and i.folder == name and not i.deleted
            ),
            key=lambda i: i.seq,
        )

    def page_size_of(self, request: RecordedRequest) -> int:
        m = _PAGE_SIZE_PREFERENCE.search(request.headers.get("prefer", ""))
        return max(1, min(int(m.group(1)), 1000)) if m else self.page_size


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
