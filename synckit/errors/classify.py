"""Turn a failed API call into an error class: the one seam where httpx errors are read.

:func:`classify` looks at a response, an exception, or both, and returns a frozen
:class:`Classification` saying what the runtime should do. It is pure (the clock is
an argument) and never raises, whatever the server sent.

Precedence, first match wins:

1. a :class:`~synckit.errors.exceptions.HandlerOutcome` raised by the handler (the
   connector has already decided);
2. the connector's ``body_rules``, then the class its error-body description names
   (``describe``: ``Connector.describe_error``, see :mod:`synckit.errors.error_body`),
   then its ``by_status`` (see :class:`ClassifyRules`); a connector's rule is never
   undone by a default;
3. the default table below, for the response (or the response of an
   :class:`httpx.HTTPStatusError`);
4. the exception, when there is no response or the response was a success.

Default table:

==========================================  =============  =========================
input                                       class          attempts (first included)
==========================================  =============  =========================
timeouts, connect/read errors, other        transient      8
httpx transport errors, builtin
TimeoutError/ConnectionError, 408, 425,
499, 502, 504, 520-524, 503 without a wait,
413 with a server wait
429, 509; 503 with a server wait; 403 with  rate_limited   20
rate-limit headers or a rate-limit body
401                                         auth           2 (one retry after refresh)
403, 407                                    authorization  1
404, 410                                    not_found      1
409, 412, 423                               conflict       3
400, 422, any other 4xx                     validation     1
500, 501, 505-599 except the above,         server_error   3
undecodable content-encoding, a 2xx that
is not JSON when JSON was expected (an
empty 202/204/205 is fine), a body that
does not parse (json.JSONDecodeError)
1xx/3xx/unexpected 2xx, out-of-range        unknown        3
statuses, any other exception
==========================================  =============  =========================

The "other 4xx" rows (405, 406, 411, 413-418, 421, 431, ...) are validation: the
request as sent is wrong, so repeating it cannot help, and a reviewer should see it. A
413 that names a wait says the condition is temporary (RFC 9110 15.5.14): transient.
Conflicts do not count toward the circuit breaker, like not_found, validation and
authorization: they describe one record, not the health of the API. Rate limits do not
count either: the API is healthy and said when to come back. Nor does a 413 with a wait.

The wait (``Classification.retry_after``) is the server's ``retry-after-ms`` /
``x-ms-retry-after-ms`` / ``Retry-After`` when it sent one (the longest, when they
disagree); only without one does an
exhausted quota's reset (``X-RateLimit-Reset``, IETF ``RateLimit``) give the wait and
``rate_limit_reset`` (the IETF RateLimit draft: Retry-After takes precedence).
``wait_source`` names the header that gave the wait. Every wait, a handler's too, is
clamped to :data:`~synckit.errors.headers.MAX_WAIT`; the runtime clamps again to the
connector's ``max_wait``.

Connectors override it in two ways. Declaratively, with a ``classify_rules =
ClassifyRules(...)`` class attribute. Or by overriding the method: the runtime calls
``connector.classify(response, exc, now)``, whose default is ``classify(response, exc,
now=now, rules=self.classify_rules)``; a subclass can inspect the call itself and
return its own :class:`Classification`, or call :func:`classify` and adjust the result
with :func:`dataclasses.replace`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple, TypeVar, cast

from synckit.errors.exceptions import (
    DatabaseUnavailable,
    HandlerOutcome,
    NeedsReauth,
    PermanentError,
    RateLimited,
    RetryableError,
)
from synckit.errors.headers import MAX_WAIT, parse_rate_limit, server_wait_signal

# httpx is imported where a failure is read, not here: the error kinds and classes of
# this package are imported by every command, most of which never make an HTTP call.
if TYPE_CHECKING:
    import httpx

    from synckit.errors.error_body import ErrorDescription

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "BodyRule",
    "Classification",
    "ClassifyRules",
    "Describe",
    "ErrorClass",
    "classify",
]


class ErrorClass(StrEnum):
    """What kind of failure happened; each kind has its own treatment."""

    TRANSIENT = "transient"
    RATE_LIMITED = "rate_limited"
    AUTH = "auth"
    AUTHORIZATION = "authorization"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    VALIDATION = "validation"
    SERVER_ERROR = "server_error"
    UNKNOWN = "unknown"


#: Attempts allowed per class, the first one included. A class is retried when its
#: limit is above 1, so a connector opts into retrying 404s with
#: ``max_attempts={ErrorClass.NOT_FOUND: 3}``.
DEFAULT_MAX_ATTEMPTS: Mapping[ErrorClass, int] = MappingProxyType(
    {
        ErrorClass.TRANSIENT: 8,
        ErrorClass.RATE_LIMITED: 20,
        ErrorClass.AUTH: 2,
        ErrorClass.AUTHORIZATION: 1,
        ErrorClass.NOT_FOUND: 1,
        ErrorClass.CONFLICT: 3,
        ErrorClass.VALIDATION: 1,
        ErrorClass.SERVER_ERROR: 3,
        ErrorClass.UNKNOWN: 3,
    }
)

# Classes an operator must look at as soon as they happen.
_SURFACED = frozenset(
    {ErrorClass.AUTH, ErrorClass.AUTHORIZATION, ErrorClass.VALIDATION, ErrorClass.UNKNOWN}
)
# Classes that say nothing about the API's health: about one record, or the API's own
# flow control (a rate limit is the API working as designed).
_NOT_COUNTED = frozenset(
    {
        ErrorClass.VALIDATION,
        ErrorClass.NOT_FOUND,
        ErrorClass.AUTHORIZATION,
        ErrorClass.CONFLICT,
        ErrorClass.RATE_LIMITED,
    }
)
# Successes that carry no body by definition (Graph's sendMail answers 202 and nothing).
_EMPTY_OK = frozenset({202, 204, 205})

_DEFAULT_BY_STATUS: Mapping[int, ErrorClass] = MappingProxyType(
    {
        400: ErrorClass.VALIDATION,
        401: ErrorClass.AUTH,
        403: ErrorClass.AUTHORIZATION,
        404: ErrorClass.NOT_FOUND,
        407: ErrorClass.AUTHORIZATION,
        408: ErrorClass.TRANSIENT,
        409: ErrorClass.CONFLICT,
        410: ErrorClass.NOT_FOUND,
        412: ErrorClass.CONFLICT,
        422: ErrorClass.VALIDATION,
        423: ErrorClass.CONFLICT,
        425: ErrorClass.TRANSIENT,
        429: ErrorClass.RATE_LIMITED,
        499: ErrorClass.TRANSIENT,
        500: ErrorClass.SERVER_ERROR,
        502: ErrorClass.TRANSIENT,
        503: ErrorClass.TRANSIENT,
        504: ErrorClass.TRANSIENT,
        # Cloudflare's edge errors: the origin could not be reached in time.
        520: ErrorClass.TRANSIENT,
        521: ErrorClass.TRANSIENT,
        522: ErrorClass.TRANSIENT,
        523: ErrorClass.TRANSIENT,
        524: ErrorClass.TRANSIENT,
        # Bandwidth Limit Exceeded (cPanel, Apache): a quota, not a fault.
        509: ErrorClass.RATE_LIMITED,
    }
)

# Only this much of a 403 body is parsed when looking for a rate-limit message.
_SNIFF_LIMIT = 256 * 1024
_REASON_LIMIT = 200
# A reason carrying the provider's own message may be longer (the message is bounded).
_DESCRIBED_REASON_LIMIT = 400
_DESCRIPTION_LIMIT = 300


class BodyRule(NamedTuple):
    """One of :attr:`ClassifyRules.body_rules`: when ``matches(response)`` is true, the
    failure is of ``error_class``.

    ``matches`` gets the :class:`httpx.Response` (an error body is read, up to 64 KiB)
    and may raise: that counts as no match. A plain ``(matches, error_class)`` tuple
    works too. Example, Stripe's missing object inside a 400::

        BodyRule(lambda r: r.json()["error"]["code"] == "resource_missing",
                 ErrorClass.NOT_FOUND)

    (``Connector.error_body`` reads bodies with less code:
    ``ErrorBody(classes={"resource_missing": ErrorClass.NOT_FOUND})``.)
    """

    matches: Callable[[httpx.Response], bool]
    error_class: ErrorClass


#: ``Connector.describe_error``'s shape: ``(status, body) -> ErrorDescription | None``,
#: the body parsed JSON, or its text when it is not JSON.
Describe = Callable[[int, object], "ErrorDescription | None"]


@dataclass(frozen=True)
class Classification:
    """The verdict on one failure; what the runtime acts on and stores.

    ``max_attempts`` counts attempts including the first; ``None`` lets the retry
    policy's default for the class apply. ``retry_after`` is the wait asked for
    (``Retry-After``, ``retry-after-ms``, a handler's ``retry_after``, or, without any
    of those, the time until an exhausted quota resets), within ``[0, MAX_WAIT]``.
    ``rate_limit_reset`` is the instant an exhausted quota resets, set only when no
    explicit wait was given (an explicit wait wins, so taking the later of the two
    never picks the reset). ``wait_source`` names what gave ``retry_after``
    (``"Retry-After"``, ``"retry-after-ms"``, ``"x-ms-retry-after-ms"``,
    ``"X-RateLimit-Reset"``, ``"RateLimit"``, ``"handler"``), None without a wait.
    ``signal`` names a provider's rate-limit signal that carries no wait
    (``"github_secondary_rate_limit"``, ``"REQUEST_LIMIT_EXCEEDED"``): the pacing gives it
    the provider's first wait (``PacePolicy.first_waits``).
    """

    error_class: ErrorClass
    retryable: bool
    max_attempts: int | None
    surface: bool
    retry_after: timedelta | None
    reason: str
    rate_limit_reset: datetime | None = None
    counts_for_breaker: bool = True
    wait_source: str | None = None
    signal: str | None = None


@dataclass(frozen=True)
class ClassifyRules:
    """A connector's changes to the default table.

    ``body_rules`` is a sequence of :class:`BodyRule` pairs ``(matches, error_class)``,
    tried in order on every response; the first whose ``predicate(response)`` is true
    decides the class; a ``matches`` that raises counts as not matching. For example::

        ClassifyRules(
            body_rules=[
                (lambda r: r.json()["error"]["code"] == "resource_missing",
                 ErrorClass.NOT_FOUND),
            ],
            by_status={402: ErrorClass.VALIDATION},
        )

    (the same rule reads shorter as ``error_body = ErrorBody(classes={"resource_missing":
    ErrorClass.NOT_FOUND})`` on the connector.)

    ``by_status`` replaces the default class of a status outright (a
    403 mapped to authorization stays authorization even with rate-limit headers).
    ``expect_json`` makes a 2xx whose body is not JSON a server error (breaker counted).
    ``max_attempts`` changes the attempt limit of a class; a limit above 1 makes the
    class retryable.
    """

    by_status: Mapping[int, ErrorClass] = field(default_factory=dict)
    body_rules: Sequence[BodyRule | tuple[Callable[[httpx.Response], bool], ErrorClass]] = ()
    expect_json: bool = False
    max_attempts: Mapping[ErrorClass, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Copies, so that mutating the dict a connector passed in changes nothing later.
        object.__setattr__(self, "by_status", MappingProxyType(dict(self.by_status)))
        object.__setattr__(self, "body_rules", tuple(BodyRule(*rule) for rule in self.body_rules))
        object.__setattr__(self, "max_attempts", MappingProxyType(dict(self.max_attempts)))


_DEFAULT_RULES = ClassifyRules()
_T = TypeVar("_T")


def classify(
    response: httpx.Response | None = None,
    exc: BaseException | None = None,
    *,
    now: datetime,
    rules: ClassifyRules | None = None,
    expect_json: bool | None = None,
    describe: Describe | None = None,
) -> Classification:
    """Classify a failed call from its response and/or exception; never raises.

    ``expect_json`` overrides ``rules.expect_json`` for this call. ``describe`` reads a
    failed response's body (``Connector.describe_error``); without it the default
    :class:`~synckit.errors.error_body.ErrorBody` does. Its description (one bounded
    line; ``ctx.http`` redacts it) is added to the reason, and its class, if any, applies after the
    connector's body rules.
    """
    rules = rules or _DEFAULT_RULES
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)  # naive clocks are UTC, like the parsed headers
    if expect_json is None:
        expect_json = rules.expect_json
    # The exception is foreign code: its attributes, even ``__class__``, may raise
    # anything. So its type is read with type() (never isinstance(), which consults
    # ``__class__``) and every attribute through _attribute().
    exc_type = type(exc)
    carried = _typed(_attribute(exc, "classification"), Classification)
    if carried is not None:
        # Classified where the response was seen (synckit.errors.raising): keep it.
        return carried
    if exc is not None and issubclass(exc_type, HandlerOutcome):
        return _from_outcome(cast(HandlerOutcome, exc), rules)
    import httpx

    if response is None and issubclass(exc_type, httpx.HTTPStatusError):
        response = _typed(_attribute(exc, "response"), httpx.Response)
    if response is not None:
        verdict = _from_response(response, exc, now, rules, expect_json, describe)
        if verdict is not None:
            return verdict
    if exc is not None:
        return _from_exception(exc, rules)
    if response is not None:
        return _make(ErrorClass.UNKNOWN, f"{_status_line(response)}: reported as a failure", rules)
    return _make(ErrorClass.UNKNOWN, "no response and no exception", rules)


def _make(
    error_class: ErrorClass,
    reason: str,
    rules: ClassifyRules,
    *,
    retry_after: timedelta | None = None,
    rate_limit_reset: datetime | None = None,
    max_attempts: int | None = None,
    wait_source: str | None = None,
    counts_for_breaker: bool | None = None,
    reason_limit: int = _REASON_LIMIT,
    signal: str | None = None,
) -> Classification:
    if max_attempts is None:
        max_attempts = rules.max_attempts.get(error_class, DEFAULT_MAX_ATTEMPTS[error_class])
    max_attempts = max(1, max_attempts)
    if retry_after is not None:
        retry_after = min(max(retry_after, timedelta(0)), MAX_WAIT)
    return Classification(
        error_class=error_class,
        retryable=max_attempts > 1,
        max_attempts=max_attempts,
        surface=error_class in _SURFACED,
        retry_after=retry_after,
        reason=_one_line(reason, reason_limit),
        rate_limit_reset=rate_limit_reset,
        counts_for_breaker=(
            error_class not in _NOT_COUNTED if counts_for_breaker is None else counts_for_breaker
        ),
        wait_source=wait_source if retry_after is not None else None,
        signal=signal,
    )


def _one_line(text: str, limit: int = _REASON_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _attribute(exc: BaseException | None, name: str) -> object:
    """``exc.name``, or None when it is missing or reading it raises (foreign code)."""
    if exc is None:
        return None
    try:
        return getattr(exc, name, None)
    except Exception:  # a property or __getattr__ that raises is an absent attribute
        return None


def _typed(value: object, kind: type[_T]) -> _T | None:
    """``value`` if it is a ``kind``, else None; unlike isinstance(), never reads the
    value's own (possibly raising) ``__class__``."""
    return cast(_T, value) if issubclass(type(value), kind) else None


def _plain_timedelta(value: timedelta | None) -> timedelta | None:
    """A plain copy of a timedelta (a subclass may override its comparisons), read
    through timedelta's own slots."""
    if value is None:
        return None
    return timedelta(
        days=timedelta.days.__get__(value),
        seconds=timedelta.seconds.__get__(value),
        microseconds=timedelta.microseconds.__get__(value),
    )


def _describe(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not break classification
        message = "<unprintable>"
    if type(message) is not str:  # a str subclass may override split() and friends
        message = "<unprintable>"
    try:
        name = str(type(exc).__name__)
    except Exception:  # a metaclass may make even the class name raise
        name = "<unnamed exception>"
    return f"{name}: {message}" if message else name


def _from_outcome(exc: HandlerOutcome, rules: ClassifyRules) -> Classification:
    reason = _describe(exc)
    exc_type = type(exc)
    if issubclass(exc_type, RetryableError):
        wait = _plain_timedelta(_typed(_attribute(exc, "retry_after"), timedelta))
        if wait is not None and wait < timedelta(0):
            wait = None
        rate_limited = issubclass(exc_type, RateLimited)
        error_class = ErrorClass.RATE_LIMITED if rate_limited else ErrorClass.TRANSIENT
        # A handler's wait is clamped like a server's (3,000,000 days becomes MAX_WAIT).
        return _make(error_class, reason, rules, retry_after=wait, wait_source="handler")
    if issubclass(exc_type, NeedsReauth):
        # The handler already knows a refresh will not help: no retry at all.
        return _make(ErrorClass.AUTH, reason, rules, max_attempts=1)
    if issubclass(exc_type, PermanentError):
        return _make(ErrorClass.VALIDATION, reason, rules, max_attempts=1)
    return _make(ErrorClass.UNKNOWN, reason, rules)


def _from_exception(exc: BaseException, rules: ClassifyRules) -> Classification:
    import httpx

    reason = _describe(exc)
    exc_type = type(exc)
    if issubclass(exc_type, httpx.DecodingError):
        # The server sent a content-encoding we cannot undo (e.g. corrupt gzip).
        return _make(ErrorClass.SERVER_ERROR, reason, rules)
    if issubclass(
        exc_type, httpx.TransportError | TimeoutError | ConnectionError | DatabaseUnavailable
    ):
        return _make(ErrorClass.TRANSIENT, reason, rules)
    if issubclass(exc_type, json.JSONDecodeError):
        # The server answered something that is not the JSON it serves (a maintenance
        # page, a proxy's error): server-side, counted by the breaker, retried.
        return _make(ErrorClass.SERVER_ERROR, reason, rules)
    return _make(ErrorClass.UNKNOWN, reason, rules)


def _status_line(response: httpx.Response) -> str:
    return f"HTTP {response.status_code} {response.reason_phrase}".rstrip()


def _said(response: httpx.Response, description: str | None) -> str:
    """``": <description>"`` for a reason, or "" when the body said nothing new."""
    # "HTTP 404 Not Found: Not Found" says nothing twice.
    if not description or description.lower() == response.reason_phrase.lower():
        return ""
    return f": {description}"


def _from_response(
    response: httpx.Response,
    exc: BaseException | None,
    now: datetime,
    rules: ClassifyRules,
    expect_json: bool,
    describe: Describe | None = None,
) -> Classification | None:
    """The verdict from the response, or None to let the exception decide."""
    status = response.status_code
    status_line = _status_line(response)
    described = _description(response, describe) if status >= 400 else None
    said = _said(response, described[0] if described is not None else None)
    told = server_wait_signal(response.headers, now)
    wait, wait_source = told if told is not None else (None, None)
    quota = parse_rate_limit(response.headers, now)
    # An explicit wait wins over a quota's reset (IETF RateLimit draft): the reset is
    # reported only when the server gave no wait of its own.
    reset = quota.reset_at if quota is not None and quota.exhausted and wait is None else None

    def make(
        error_class: ErrorClass,
        reason: str,
        *,
        counts_for_breaker: bool | None = None,
        signal: str | None = None,
    ) -> Classification:
        retry_after, source = wait, wait_source
        if retry_after is None and reset is not None and error_class is ErrorClass.RATE_LIMITED:
            retry_after = max(reset - now, timedelta(0))
            source = "X-RateLimit-Reset" if quota and quota.source == "X-RateLimit" else "RateLimit"
        return _make(
            error_class,
            reason + said,
            rules,
            retry_after=retry_after,
            rate_limit_reset=reset,
            wait_source=source,
            counts_for_breaker=counts_for_breaker,
            reason_limit=_DESCRIBED_REASON_LIMIT if said else _REASON_LIMIT,
            signal=signal,
        )

    for index, (predicate, error_class) in enumerate(rules.body_rules):
        if _matches(predicate, response):
            return make(error_class, f"{status_line} (connector body rule {index})")
    if described is not None and described[1] is not None:
        return make(described[1], f"{status_line} (connector error body)")
    if status in rules.by_status:
        return make(rules.by_status[status], f"{status_line} (connector status rule)")

    if 200 <= status < 300:
        if expect_json and not _is_empty_ok(response) and not _is_json(response):
            # An HTML maintenance page behind a 200: the server is unwell, not the
            # record; the breaker must count it.
            return make(ErrorClass.SERVER_ERROR, f"{status_line}: body is not JSON")
        return None
    if status == 503 and wait is not None:
        return make(ErrorClass.RATE_LIMITED, f"{status_line} with a server-told wait")
    if status == 413 and wait is not None:
        # "Too large for now": retry after the wait; it says nothing about health.
        return make(
            ErrorClass.TRANSIENT, f"{status_line} with a server-told wait", counts_for_breaker=False
        )
    if status == 403:
        exhausted = quota is not None and quota.exhausted
        signal = _rate_limit_signal(response, wait is not None, exhausted)
        if signal:
            return make(
                ErrorClass.RATE_LIMITED, f"{status_line} ({signal})", signal=_SIGNALS.get(signal)
            )
    if status in _DEFAULT_BY_STATUS:
        return make(_DEFAULT_BY_STATUS[status], status_line)
    if 400 <= status < 500:
        return make(ErrorClass.VALIDATION, status_line)
    if 500 <= status < 600:
        return make(ErrorClass.SERVER_ERROR, status_line)
    if exc is not None:
        return None
    return make(ErrorClass.UNKNOWN, f"{status_line}: unexpected status")


def _description(
    response: httpx.Response, describe: Describe | None
) -> tuple[str, ErrorClass | None] | None:
    """The provider's own account of a failed response (redacted, one bounded line) and
    the class it names, or None. Connector code and hostile bodies: never raises."""
    content = _content(response)
    if not content or len(content) > _SNIFF_LIMIT:
        return None
    body = _parse_json(content)
    if body is _NOT_JSON:
        if b"\x00" in content[:1024]:
            return None  # binary: nothing a reader could use
        body = content.decode("utf-8", "replace")
    try:
        if describe is None:
            # Imported here: error_body builds on this module's ErrorClass.
            from synckit.errors.error_body import ErrorBody

            described = ErrorBody().describe(response.status_code, body)
        else:
            described = describe(response.status_code, body)
        if described is None:
            return None
        text = described.text()
        error_class = described.error_class
        if not isinstance(text, str) or not isinstance(error_class, ErrorClass | None):
            return None
    except Exception:  # connector code: a description that fails is no description
        return None
    # Not redacted here (errors/ sits below redaction): ctx.http's exceptions redact their
    # message (synckit.runtime.http.client.api_error), and every store and log redacts again.
    text = _one_line(text, _DESCRIPTION_LIMIT)
    if not text and error_class is None:
        return None
    return text, error_class


def _matches(predicate: Callable[[httpx.Response], bool], response: httpx.Response) -> bool:
    try:
        return bool(predicate(response))
    except Exception:  # connector code: a predicate that fails is a rule that did not match
        return False


def _content(response: httpx.Response) -> bytes | None:
    import httpx

    try:
        return response.content
    except httpx.ResponseNotRead:
        return None


def _is_empty_ok(response: httpx.Response) -> bool:
    if response.status_code not in _EMPTY_OK:
        return False
    content = _content(response)
    return content is not None and not content.strip()


def _is_json(response: httpx.Response) -> bool:
    content = _content(response)
    if content is None:
        return True  # a streamed body was not read here; the handler will judge it
    return _parse_json(content) is not _NOT_JSON


_NOT_JSON = object()


def _parse_json(content: bytes) -> object:
    try:
        return json.loads(content)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return _NOT_JSON


_GITHUB_SECONDARY = "secondary rate-limit message in body"
# A 403's rate-limit reason -> the provider signal it is (Classification.signal), for
# those whose providers document a first wait (synckit.errors.pace.DEFAULT_FIRST_WAITS).
_SIGNALS = {
    _GITHUB_SECONDARY: "github_secondary_rate_limit",
    "REQUEST_LIMIT_EXCEEDED": "REQUEST_LIMIT_EXCEEDED",
}
_GOOGLE_RATE_REASONS = frozenset({"ratelimitexceeded", "userratelimitexceeded"})


def _rate_limit_signal(response: httpx.Response, has_wait: bool, exhausted: bool) -> str:
    """Why a 403 is really throttling, or "" when it is a plain refusal."""
    if exhausted:
        return "rate limit exhausted"
    if has_wait:
        return "Retry-After"
    content = _content(response)
    if not content or len(content) > _SNIFF_LIMIT:
        return ""
    return _rate_limit_body(_parse_json(content))


def _rate_limit_body(body: object) -> str:
    # GitHub: {"message": "API rate limit exceeded for ..."} and the secondary limit
    # "You have exceeded a secondary rate limit"; its older wording was abuse detection.
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str):
            lowered = message.lower()
            if "secondary rate limit" in lowered or "abuse detection" in lowered:
                return _GITHUB_SECONDARY
            if "rate limit" in lowered:
                return "rate-limit message in body"
        if body.get("errorCode") == "REQUEST_LIMIT_EXCEEDED":
            return "REQUEST_LIMIT_EXCEEDED"
        # Google APIs answer quota exhaustion with a 403 and these reasons.
        error = body.get("error")
        if isinstance(error, dict):
            if error.get("status") == "RESOURCE_EXHAUSTED":
                return "RESOURCE_EXHAUSTED"
            errors = error.get("errors")
            if isinstance(errors, list):
                for item in errors:
                    reason = item.get("reason") if isinstance(item, dict) else None
                    if isinstance(reason, str) and reason.lower() in _GOOGLE_RATE_REASONS:
                        return reason
    # Salesforce: [{"message": "...", "errorCode": "REQUEST_LIMIT_EXCEEDED"}]
    if isinstance(body, list):
        for item in body:
            if isinstance(item, dict) and item.get("errorCode") == "REQUEST_LIMIT_EXCEEDED":
                return "REQUEST_LIMIT_EXCEEDED"
    return ""
