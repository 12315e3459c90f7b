"""What a :class:`~synckit.testing.fakeapi.FakeAPI` request looks like
(:class:`RecordedRequest`) and what answers it: a :class:`Reply`, a :class:`Fault` (a
rate limit, a server error, a dropped connection...), :data:`PASS` (on to the route's
handler), random :class:`FaultRates`, and the :class:`TokenInfo` of an issued token."""

from __future__ import annotations

import http
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import parse_qsl

import httpx

if TYPE_CHECKING:
    pass

__all__ = [
    "PASS",
    "DropMode",
    "Fault",
    "FaultRates",
    "Handler",
    "Passthrough",
    "RecordedRequest",
    "Reply",
    "RetryAfterForm",
    "Step",
    "TokenInfo",
]

#: How a rate-limit fault states its wait.
RetryAfterForm = Literal["seconds", "http-date", "retry-after-ms", "x-ms-retry-after-ms"]
#: How a request goes unanswered (see the module docstring's table).
DropMode = Literal["timeout", "disconnect", "reset", "connect_error"]

JSON_TYPE = "application/json"
RETRY_HEADERS: Final[dict[str, str]] = {
    "seconds": "Retry-After",
    "http-date": "Retry-After",
    "retry-after-ms": "retry-after-ms",
    "x-ms-retry-after-ms": "x-ms-retry-after-ms",
}


# --- what a request looks like, and what answers it --------------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake received it; handlers get it too.

    ``path`` is percent-decoded; ``query`` keeps the last value of each parameter
    (``query_items`` keeps them all, in order); ``params`` are the route's path
    parameters (``/items/{id}`` gives ``{"id": ...}``); ``time`` is the fake's clock.
    """

    method: str
    path: str
    query: Mapping[str, str]
    headers: httpx.Headers
    body: bytes
    time: datetime
    url: str
    params: Mapping[str, str] = field(default_factory=dict)
    query_items: tuple[tuple[str, str], ...] = ()

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON (raises ``ValueError`` when it is not JSON)."""
        return json.loads(self.body)

    def form(self) -> dict[str, str]:
        """The body parsed as ``application/x-www-form-urlencoded``."""
        return dict(parse_qsl(self.text, keep_blank_values=True))

    @property
    def base_url(self) -> str:
        """``scheme://host[:port]`` as the client addressed the fake, for absolute links."""
        u = httpx.URL(self.url)
        port = f":{u.port}" if u.port is not None else ""
        return f"{u.scheme}://{u.host}{port}"

    @property
    def bearer_token(self) -> str | None:
        scheme, _, value = self.headers.get("authorization", "").partition(" ")
        return value.strip() or None if scheme.lower() == "bearer" else None


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: status, headers and body bytes."""

    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def json(cls, data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
        return cls(status, json.dumps(data).encode(), with_type(headers, JSON_TYPE))

    @classmethod
    def text(
        cls,
        text: str,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        content_type: str = "text/plain; charset=utf-8",
    ) -> Reply:
        return cls(status, text.encode(), with_type(headers, content_type))

    @classmethod
    def empty(cls, status: int = 204, headers: Mapping[str, str] | None = None) -> Reply:
        return cls(status, b"", tuple((headers or {}).items()))

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


def with_type(headers: Mapping[str, str] | None, content_type: str) -> tuple[tuple[str, str], ...]:
    items = dict(headers or {})
    if not any(k.lower() == "content-type" for k in items):
        items["Content-Type"] = content_type
    return tuple(items.items())


@dataclass(frozen=True)
class Fault:
    """Something going wrong on the server's side, in a script or from a handler.

    Build them with the class methods. ``repeat`` says how many script steps one fault
    stands for (``Fault.unavailable(times=3)`` is a burst of three 503s).
    """

    kind: Literal["reply", "drop", "lost_response", "truncated"]
    status: int = 0
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    retry_after: float | None = None
    retry_after_form: RetryAfterForm = "seconds"
    drop: DropMode | None = None
    delay: float = 0.0
    repeat: int = 1

    # --- answers that are HTTP responses ---

    @classmethod
    def rate_limited(
        cls,
        retry_after: float | None = 1,
        *,
        form: RetryAfterForm = "seconds",
        status: int = 429,
        body: Any = None,
        times: int = 1,
    ) -> Fault:
        """429 with the wait as ``Retry-After`` seconds (``form="seconds"``), as an HTTP-date
        that far from the fake's clock (``"http-date"``), or in milliseconds
        (``"retry-after-ms"``, ``"x-ms-retry-after-ms"``); ``retry_after=None`` sends none."""
        if form not in RETRY_HEADERS:
            raise ValueError(f"unknown Retry-After form {form!r}")
        payload = {"error": "rate_limited"} if body is None else body
        return cls(
            "reply",
            status,
            json.dumps(payload).encode(),
            (("Content-Type", JSON_TYPE),),
            retry_after=retry_after,
            retry_after_form=form,
            repeat=times,
        )

    @classmethod
    def server_error(cls, status: int = 500, *, body: Any = None, times: int = 1) -> Fault:
        payload = {"error": http.HTTPStatus(status).phrase} if body is None else body
        headers = (("Content-Type", JSON_TYPE),)
        return cls("reply", status, json.dumps(payload).encode(), headers, repeat=times)

    @classmethod
    def unavailable(cls, times: int = 1, *, retry_after: float | None = None) -> Fault:
        """503 Service Unavailable, ``times`` in a row, optionally with ``Retry-After``."""
        return replace(cls.server_error(503, times=times), retry_after=retry_after)

    @classmethod
    def token_expired(cls, description: str = "The access token expired") -> Fault:
        """401 with ``WWW-Authenticate: Bearer error="invalid_token"``, whatever the token."""
        return cls("reply", 401, *unauthorized_parts(description, None))

    @classmethod
    def gone(cls, body: Any = None) -> Fault:
        """410 Gone, as APIs answer an expired cursor or sync token."""
        payload = {"error": "cursor_expired"} if body is None else body
        return cls("reply", 410, json.dumps(payload).encode(), (("Content-Type", JSON_TYPE),))

    @classmethod
    def malformed_json(cls, body: bytes = b'{"items": [{"id": 1,, ]', status: int = 200) -> Fault:
        """A body that is not JSON, sent with a JSON content type."""
        return cls("reply", status, body, (("Content-Type", JSON_TYPE),))

    @classmethod
    def truncated_json(cls, data: Any = None) -> Fault:
        """The first half of a JSON document, with a JSON content type and a correct
        ``Content-Length``: ``data``'s serialisation, or, without data, the handler's own
        answer (the handler runs)."""
        body = None if data is None else json.dumps(data).encode()
        return cls("truncated", 200, body, (("Content-Type", JSON_TYPE),))

    # --- no answer ---

    @classmethod
    def timeout(cls, delay: float = 30.0) -> Fault:
        """No answer: in-process ``httpx.ReadTimeout``; on loopback the server waits
        ``delay`` seconds (make it longer than the client's timeout) and closes. The
        handler does not run."""
        return cls("drop", drop="timeout", delay=delay)

    @classmethod
    def disconnect(cls) -> Fault:
        """The server closes the connection without answering (handler does not run)."""
        return cls("drop", drop="disconnect")

    @classmethod
    def connection_reset(cls) -> Fault:
        """The connection is reset (TCP RST) instead of answered (handler does not run)."""
        return cls("drop", drop="reset")

    @classmethod
    def connect_error(cls) -> Fault:
        """In-process ``httpx.ConnectError``; on loopback an immediate reset."""
        return cls("drop", drop="connect_error")

    @classmethod
    def lost_response(cls, delay: float = 0.0) -> Fault:
        """The handler runs (a create commits), then the answer is lost: the connection
        closes without it, after ``delay`` seconds on loopback (in-process, a delay makes
        it a ``ReadTimeout``, as a client with a shorter timeout would see)."""
        return cls("lost_response", delay=delay)

    def repeated(self, times: int) -> Fault:
        """This fault as ``times`` consecutive script steps."""
        return replace(self, repeat=times)


class Passthrough:
    """The type of :data:`PASS`."""

    _instance: Passthrough | None = None

    def __new__(cls) -> Passthrough:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "PASS"


#: A script step meaning "answer this request normally" (auth, random faults, handler).
PASS: Final = Passthrough()

Step = Reply | Fault | Passthrough
#: A route handler: returns a :class:`Reply`, a :class:`Fault`, ``None`` (204) or any
#: JSON-serialisable value (200 with that JSON).
Handler = Callable[[RecordedRequest], Any]


@dataclass(frozen=True)
class FaultRates:
    """Probabilities of random faults per request (see :meth:`FakeAPI.faults`)."""

    rate_limit: float = 0.0
    server_error: float = 0.0
    timeout: float = 0.0
    connection_reset: float = 0.0
    lost_response: float = 0.0
    retry_after: float = 1.0
    retry_after_form: RetryAfterForm = "seconds"
    server_error_status: int = 503
    burst: int = 1
    timeout_delay: float = 30.0
    methods: frozenset[str] | None = None
    paths: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        rates = (
            self.rate_limit,
            self.server_error,
            self.timeout,
            self.connection_reset,
            self.lost_response,
        )
        if any(not 0.0 <= r <= 1.0 for r in rates) or sum(rates) > 1.0 + 1e-9:
            raise ValueError("fault rates must be in [0, 1] and add up to at most 1")
        if self.burst < 1:
            raise ValueError("burst must be at least 1")


@dataclass
class TokenInfo:
    """A bearer token the fake knows: who it is for and until when it is good."""

    token: str
    subject: str | None
    expires_at: datetime
    revoked: bool = False

    def valid_at(self, now: datetime) -> bool:
        return not self.revoked and now < self.expires_at


def unauthorized_parts(description: str, body: Any) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    payload = {"error": "invalid_token", "error_description": description} if body is None else body
    challenge = f'Bearer error="invalid_token", error_description="{description}"'
    return json.dumps(payload).encode(), (
        ("Content-Type", JSON_TYPE),
        ("WWW-Authenticate", challenge),
    )


@dataclass(frozen=True)
class Decision:
    """How the fake answers one request: ``reply``, or ``drop`` the connection, after
    ``delay`` seconds."""

    request: RecordedRequest
    reply: Reply | None
    drop: DropMode | None = None
    delay: float = 0.0
