"""Webhooks a connector receives: how a delivery is verified and whose it is.

A connector declares them as data::

    class Stripe(Connector[StripeConfig]):
        webhooks = Webhooks(
            verify=StripeSignature(secret_field="webhook_secret", tolerance=300),
            tenant=TenantFromPath(),
        )

``synckit web`` (or :func:`synckit.web.webhooks.webhook_app` mounted in the user's own
ASGI app) then answers ``POST /webhooks/<connector>/<tenant>``: it verifies the
delivery with the tenant's secret (a field of its sealed config), stores each event in
the inbox and only then answers 2xx (:mod:`synckit.runtime.sync.webhooks`).

The verifiers are pure functions over (headers, raw body, secret, now): no I/O, no
clock of their own, every signature compared in constant time over the raw bytes. Each
returns ``None`` for a good delivery, else one line saying why it is refused. Built in:

* :class:`StandardWebhooks` (https://www.standardwebhooks.com): ``webhook-id``,
  ``webhook-timestamp``, ``webhook-signature`` (space-separated ``v1,<base64>``),
  HMAC-SHA256 over ``id.timestamp.body`` keyed by the base64 secret after ``whsec_``.
  The spec is implemented here rather than through the ``standardwebhooks`` package
  (MIT, used by the tests as the reference signer): its ``verify`` reads the wall clock
  (no ``now`` to pass), fixes the tolerance at five minutes, and raises ``ValueError``,
  ``binascii.Error`` or ``UnicodeDecodeError`` on malformed headers or a non-UTF-8 body
  where a refusal with a reason is wanted.
* :class:`StripeSignature`: ``Stripe-Signature: t=<unix>,v1=<hex>[,v1=...]``,
  HMAC-SHA256 over ``t.body``; a timestamp outside ``tolerance`` is refused.
* :class:`GitHubSignature`: ``X-Hub-Signature-256: sha256=<hex>`` over the body; GitHub
  signs no timestamp, so a replay is caught only by its ``X-GitHub-Delivery`` id (the
  inbox stores an event id once).
* :class:`GraphNotifications`: Microsoft Graph's ``validationToken`` handshake (echoed as
  ``text/plain``) and its ``clientState`` checked on every notification of a delivery.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from synckit.connectors.subscriptions import Subscription, check_stream_names
from synckit.errors.exceptions import ConfigurationError

__all__ = [
    "MAX_BODY",
    "GitHubSignature",
    "GraphNotifications",
    "StandardWebhooks",
    "StripeSignature",
    "TenantFromBody",
    "TenantFromPath",
    "Verifier",
    "WebhookEvent",
    "Webhooks",
    "sign_github",
    "sign_standard",
    "sign_stripe",
    "verify_github",
    "verify_graph",
    "verify_standard",
    "verify_stripe",
]

#: The largest body accepted by default (1 MiB): larger deliveries get 413.
MAX_BODY = 1024 * 1024

# A header longer than this is not a signature: refused before any parsing.
_MAX_HEADER = 4096


@dataclass(frozen=True)
class WebhookEvent:
    """One stored event, as a connector's ``on_webhook`` hook receives it."""

    id: int
    event_id: str
    tenant: str
    connector: str
    headers: Mapping[str, str]
    body: bytes
    received_at: datetime

    def json(self) -> Any:
        """The body parsed as JSON (raises ``ValueError`` when it is not JSON)."""
        return json.loads(self.body)


# --- the pure checks ---------------------------------------------------------------------


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _timestamp_problem(raw: str | None, now: datetime, tolerance: float) -> str | int:
    """The timestamp as an int, or why it is refused."""
    if not raw or len(raw) > 20 or not raw.strip().lstrip("-").isdigit():
        return "missing or malformed timestamp"
    ts = int(raw.strip())
    if abs(now.timestamp() - ts) > tolerance:
        return "timestamp outside the tolerance (stale or replayed)"
    return ts


def standard_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (``whsec_`` then base64)."""
    text = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigurationError("webhook secret is not whsec_ followed by base64") from None
    if not key:
        raise ConfigurationError("webhook secret is empty")
    return key


def sign_standard(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value a Standard Webhooks sender puts on ``body``."""
    mac = _hmac(standard_key(secret), f"{msg_id}.{timestamp}.".encode() + body)
    return "v1," + base64.b64encode(mac).decode()


def verify_standard(
    headers: Mapping[str, str], body: bytes, secret: str, now: datetime, tolerance: float = 300
) -> str | None:
    """Standard Webhooks: None if one ``v1`` signature matches and the timestamp is
    within ``tolerance`` seconds of ``now``; else why not. ``headers`` are lower-cased."""
    msg_id = headers.get("webhook-id")
    signatures = headers.get("webhook-signature")
    if not msg_id or not signatures:
        return "unsigned: webhook-id or webhook-signature missing"
    if len(signatures) > _MAX_HEADER or len(msg_id) > 500:
        return "malformed signature headers"
    ts = _timestamp_problem(headers.get("webhook-timestamp"), now, tolerance)
    if isinstance(ts, str):
        return ts
    expected = _hmac(standard_key(secret), f"{msg_id}.{ts}.".encode() + body)
    for item in signatures.split():
        version, _, value = item.partition(",")
        if version != "v1":
            continue
        try:
            given = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
        if hmac.compare_digest(expected, given):
            return None
    return "no matching signature"


def sign_stripe(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Stripe-Signature`` header value Stripe puts on ``body``."""
    mac = _hmac(secret.encode(), f"{timestamp}.".encode() + body).hex()
    return f"t={timestamp},v1={mac}"


def verify_stripe(
    headers: Mapping[str, str], body: bytes, secret: str, now: datetime, tolerance: float = 300
) -> str | None:
    """Stripe: None if a ``v1`` of ``Stripe-Signature`` is the HMAC-SHA256 of
    ``t.body`` and ``t`` is within ``tolerance`` seconds of ``now``; else why not."""
    header = headers.get("stripe-signature")
    if not header:
        return "unsigned: Stripe-Signature missing"
    if len(header) > _MAX_HEADER:
        return "malformed Stripe-Signature"
    parts = [p.partition("=") for p in header.split(",")]
    stamps = [v for k, _, v in parts if k.strip() == "t"]
    given = [v.strip() for k, _, v in parts if k.strip() == "v1"]
    if len(stamps) != 1 or not given:
        return "malformed Stripe-Signature"
    ts = _timestamp_problem(stamps[0], now, tolerance)
    if isinstance(ts, str):
        return ts
    expected = _hmac(secret.encode(), f"{ts}.".encode() + body).hex().encode()
    # Every v1 is compared (Stripe sends several while a secret is rolled).
    if any(hmac.compare_digest(expected, g.encode("ascii", "replace")) for g in given):
        return None
    return "no matching signature"


def sign_github(secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value GitHub puts on ``body``."""
    return "sha256=" + _hmac(secret.encode(), body).hex()


def verify_github(headers: Mapping[str, str], body: bytes, secret: str) -> str | None:
    """GitHub: None if ``X-Hub-Signature-256`` is ``sha256=`` the HMAC of the body."""
    header = headers.get("x-hub-signature-256")
    if not header:
        return "unsigned: X-Hub-Signature-256 missing"
    if not header.startswith("sha256=") or len(header) > 200:
        return "malformed X-Hub-Signature-256"
    expected = sign_github(secret, body).encode()
    if hmac.compare_digest(expected, header.encode("ascii", "replace")):
        return None
    return "no matching signature"


def graph_notifications(body: bytes) -> list[dict[str, Any]] | str:
    """The notifications of a Graph delivery (``{"value": [...]}``), or why it is none."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return "body is not JSON"
    items = doc.get("value") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        return "body has no notifications (value)"
    return items


def verify_graph(body: bytes, client_state: str) -> str | None:
    """Graph: None if every notification carries ``clientState`` equal to the tenant's;
    one that does not refuses the whole delivery (none of a forged batch is stored)."""
    items = graph_notifications(body)
    if isinstance(items, str):
        return items
    expected = client_state.encode()
    for item in items:
        given = item.get("clientState")
        if not isinstance(given, str):
            return "unsigned: a notification has no clientState"
        if not hmac.compare_digest(expected, given.encode("utf-8", "replace")):
            return "a notification's clientState does not match"
    return None


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _json_id(body: bytes, key: str) -> str | None:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    value = doc.get(key) if isinstance(doc, dict) else None
    return str(value)[:300] if isinstance(value, str | int) and value != "" else None


# --- declarations --------------------------------------------------------------------------


class Verifier(Protocol):
    """What :class:`Webhooks` needs of a verification scheme."""

    # Read-only (properties), so a frozen dataclass satisfies it.
    @property
    def secret_field(self) -> str:
        """The field of the tenant's config that holds the secret."""
        ...

    @property
    def kept_headers(self) -> tuple[str, ...]:
        """The headers kept with a stored event (lower-case)."""
        ...

    def check(
        self, headers: Mapping[str, str], body: bytes, secret: str, now: datetime
    ) -> str | None:
        """None for a delivery signed with ``secret``, else why it is refused."""
        ...

    def events(self, headers: Mapping[str, str], body: bytes) -> list[tuple[str, bytes]]:
        """The delivery's events: (provider event id, that event's body)."""
        ...


def _secret_field(name: str, scheme: str) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{scheme}: secret_field must name a field of the tenant's config")


@dataclass(frozen=True)
class _TimedSignature:
    """A scheme whose signature covers a timestamp, accepted within ``tolerance`` seconds
    of now, keyed by the tenant's ``secret_field``; ``_verify`` is the scheme's check."""

    secret_field: str
    tolerance: float = 300

    def __post_init__(self) -> None:
        _secret_field(self.secret_field, type(self).__name__)

    @staticmethod
    def _verify(
        headers: Mapping[str, str], body: bytes, secret: str, now: datetime, tolerance: float
    ) -> str | None:
        raise NotImplementedError

    def check(
        self, headers: Mapping[str, str], body: bytes, secret: str, now: datetime
    ) -> str | None:
        return self._verify(headers, body, secret, now, self.tolerance)


@dataclass(frozen=True)
class StandardWebhooks(_TimedSignature):
    """Standard Webhooks, keyed by the tenant's ``secret_field`` (a ``whsec_`` secret)."""

    kept_headers: tuple[str, ...] = ("webhook-id", "webhook-timestamp", "content-type")
    _verify = staticmethod(verify_standard)

    def events(self, headers: Mapping[str, str], body: bytes) -> list[tuple[str, bytes]]:
        return [(headers.get("webhook-id") or _digest(body), body)]


@dataclass(frozen=True)
class StripeSignature(_TimedSignature):
    """Stripe's ``Stripe-Signature``, keyed by the tenant's ``secret_field`` (``whsec_...``
    as Stripe shows it, used as is); the event id is the body's ``id``."""

    kept_headers: tuple[str, ...] = ("content-type",)
    _verify = staticmethod(verify_stripe)

    def events(self, headers: Mapping[str, str], body: bytes) -> list[tuple[str, bytes]]:
        return [(_json_id(body, "id") or _digest(body), body)]


@dataclass(frozen=True)
class GitHubSignature:
    """GitHub's ``X-Hub-Signature-256``; the event id is ``X-GitHub-Delivery``."""

    secret_field: str
    kept_headers: tuple[str, ...] = ("x-github-event", "x-github-delivery", "content-type")

    def __post_init__(self) -> None:
        _secret_field(self.secret_field, "GitHubSignature")

    def check(
        self, headers: Mapping[str, str], body: bytes, secret: str, now: datetime
    ) -> str | None:
        return verify_github(headers, body, secret)

    def events(self, headers: Mapping[str, str], body: bytes) -> list[tuple[str, bytes]]:
        return [((headers.get("x-github-delivery") or "")[:300] or _digest(body), body)]


@dataclass(frozen=True)
class GraphNotifications:
    """Microsoft Graph change notifications: the ``validationToken`` handshake, and the
    tenant's ``secret_field`` (the subscription's ``clientState``) on every notification.
    Each notification is an event of its own."""

    secret_field: str
    kept_headers: tuple[str, ...] = ("content-type",)

    def __post_init__(self) -> None:
        _secret_field(self.secret_field, "GraphNotifications")

    def check(
        self, headers: Mapping[str, str], body: bytes, secret: str, now: datetime
    ) -> str | None:
        return verify_graph(body, secret)

    def events(self, headers: Mapping[str, str], body: bytes) -> list[tuple[str, bytes]]:
        items = graph_notifications(body)
        if isinstance(items, str):
            return []
        out = []
        for item in items:
            raw = json.dumps(item, sort_keys=True, separators=(",", ":")).encode()
            given = item.get("id")
            out.append((str(given)[:300] if given else _digest(raw), raw))
        return out


@dataclass(frozen=True)
class TenantFromPath:
    """The tenant is named in the URL: ``/webhooks/<connector>/<tenant>`` (each tenant
    registers its own URL with the provider)."""


@dataclass(frozen=True)
class TenantFromBody:
    """The tenant is found from the body's JSON: ``field`` (dotted, e.g.
    ``installation.id``) is the tenant's name, or, with ``config_field``, equals that field
    of the tenant's config. The body is untrusted until verified: it only picks whose
    secret the delivery must be signed with."""

    field: str
    config_field: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.field, str) or not self.field:
            raise ConfigurationError("TenantFromBody: field must name a field of the body")

    def value(self, body: bytes) -> str | None:
        """The attribution value the body carries, or None."""
        try:
            doc: Any = json.loads(body)
        except (ValueError, RecursionError):
            return None
        for part in self.field.split("."):
            if not isinstance(doc, dict):
                return None
            doc = doc.get(part)
        return str(doc)[:200] if isinstance(doc, str | int) and doc != "" else None


_SCHEMES = (StandardWebhooks, StripeSignature, GitHubSignature, GraphNotifications)


@dataclass(frozen=True)
class Webhooks:
    """A connector's webhook declaration.

    ``verify`` is the scheme (its ``secret_field`` names the field of each tenant's sealed
    config that holds the secret); ``tenant`` says whose a delivery is; ``streams`` are
    the streams a stored event triggers a cycle of (default: every stream) unless the
    connector defines ``on_webhook(ctx, events)``; ``max_body`` caps a delivery (413).
    ``secret_env`` names an environment variable holding one secret for the whole
    endpoint (providers that sign every account's events alike: Stripe Connect, a GitHub
    App) instead of each tenant's ``secret_field``; a verified delivery naming no known
    tenant is then kept as an orphan for operators.

    ``records`` names a stream declared with ``Stream(records=Records(...))``: each
    event's records land in its table, a claimed batch of events in one transaction
    with their processed marks. The records of an event are the connector's
    ``webhook_records(ctx, event)`` (async: it may fetch what a notification only
    names), or by default the event's JSON body as one record; ``Records.map`` then
    maps them as it maps a poll page's. An event that fails (the hook raises, the model
    or the database refuses one of its records) becomes one dead letter (kind
    ``webhook:<connector>``; replaying it processes the event again) and the rest land.
    With ``Records(version=...)`` an older event never regresses a row.

    ``lease``: how long a processing claim holds a batch of events; the events of a
    worker killed mid-batch wait this long before another worker takes them (a claim
    that outlives it is fenced off: nothing of its batch lands).

    ``subscription``: the provider sends events only while a subscription lives (Graph);
    the runtime creates, renews and deletes it through the connector's
    ``create_subscription`` / ``renew_subscription`` / ``delete_subscription`` hooks
    (:mod:`synckit.connectors.subscriptions`).
    """

    verify: Verifier
    tenant: TenantFromPath | TenantFromBody = field(default_factory=TenantFromPath)
    streams: Sequence[str] | None = None
    max_body: int = MAX_BODY
    secret_env: str | None = None
    records: str | None = None
    lease: timedelta = timedelta(minutes=5)
    subscription: Subscription | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.verify, _SCHEMES) and not (
            hasattr(self.verify, "check") and hasattr(self.verify, "events")
        ):
            raise ConfigurationError("Webhooks.verify must be a verifier (e.g. StripeSignature)")
        if not isinstance(self.tenant, TenantFromPath | TenantFromBody):
            raise ConfigurationError("Webhooks.tenant must be TenantFromPath() or TenantFromBody()")
        if not isinstance(self.max_body, int) or self.max_body < 1:
            raise ConfigurationError("Webhooks.max_body must be a positive number of bytes")
        check_stream_names(self.streams, "Webhooks")
        if not isinstance(self.lease, timedelta) or self.lease <= timedelta(0):
            raise ConfigurationError("Webhooks.lease must be a positive timedelta")
        if self.records is not None and (not isinstance(self.records, str) or not self.records):
            raise ConfigurationError("Webhooks.records must be the name of a stream with Records")
        if self.subscription is not None and not isinstance(self.subscription, Subscription):
            raise ConfigurationError("Webhooks.subscription must be a Subscription(...)")
