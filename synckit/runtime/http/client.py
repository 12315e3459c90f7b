"""``ctx.http``: an ``httpx.AsyncClient`` that paces, classifies and raises for connectors.

Two layers, because they see different things:

* :class:`~synckit.runtime.http.pacer.PacedTransport` wraps the real transport and sees
  every request on the wire (auth retries included); its
  :class:`~synckit.runtime.http.pacer.Pacer` holds each to the resource's pace.
* :class:`SyncClient` overrides ``send``, so it sees the final response after
  authentication (an OAuth auth flow may answer a 401 itself by refreshing). A failed
  response is classified by ``connector.classify`` and raised as the synckit exception
  that tells the runtime what to do (:func:`synckit.errors.raising.exception_for`). A
  rate-limited one is first recorded as a rate-limit event of the resource
  (:func:`synckit.runtime.http.pacing.record_rate_limit`: in-flight answers of one burst are
  one event); when the pace it leads to fits in ``max_inline_wait`` the request is sent
  again after it (at most :data:`MAX_INLINE_RETRIES` times; a non-idempotent method only
  after a refusal, a 429 or a rate-limited 403/509), else
  :class:`~synckit.errors.exceptions.RateLimited` carries the clamped wait. Transport
  errors (timeouts, resets) are translated the same way, ``from`` the httpx error.
  Hooks never check status codes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
import structlog

from synckit import tracing
from synckit.connectors.base import Connector
from synckit.errors.classify import Classification, ClassifyRules, ErrorClass
from synckit.errors.exceptions import HandlerOutcome, RateLimited
from synckit.errors.raising import exception_for
from synckit.errors.waits import clamp_wait
from synckit.redaction import redact_text
from synckit.runtime.http.api_errors import api_response
from synckit.runtime.http.http1 import IDEMPOTENT
from synckit.runtime.http.pacer import HOLD_REFUSALS, SENT_AT, Pacer, RefusalHold

__all__ = [
    "ERROR_BODY_LIMIT",
    "MAX_INLINE_RETRIES",
    "OneParseClient",
    "SyncClient",
    "api_error",
    "read_capped",
]

log = structlog.get_logger("synckit.http")

#: A rate-limited request is sent again inline at most this many times.
MAX_INLINE_RETRIES = 3


def _where(request: httpx.Request) -> str:
    # No query string: it may carry an API key, and the message reaches logs and the DLQ.
    return f"{request.method} {request.url.copy_with(query=None, fragment=None)}"


def api_error(
    classification: Classification,
    request: httpx.Request | None,
    response: httpx.Response | None = None,
) -> HandlerOutcome:
    """The synckit exception for a failed call, its message naming the request; with the
    ``response`` it is also an :class:`~synckit.errors.exceptions.ApiError` carrying it."""
    if request is not None or response is not None:
        # The reason may quote the API's error body, which may echo a credential.
        reason = classification.reason
        if request is not None:
            reason = f"{_where(request)}: {reason}"
        classification = dataclasses.replace(classification, reason=redact_text(reason))
    return exception_for(classification, api_response(response) if response is not None else None)


def _classifies_successes(connector: Connector[Any]) -> bool:
    """Whether a 2xx can be a failure for this connector (else it is never classified)."""
    rules: ClassifyRules = connector.classify_rules
    return (
        type(connector).classify is not Connector.classify
        or bool(rules.body_rules)
        or rules.expect_json
        or any(status < 400 for status in rules.by_status)
    )


class _Cookies(httpx.Cookies):
    """A client's cookie jar that skips responses setting no cookie: httpx hands every
    response to ``http.cookiejar``, whose emulation of a urllib request and response
    cost ~2% of a trivial poll cycle's CPU."""

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


class OneParseClient(httpx.AsyncClient):
    """An httpx client that parses a request's URL once.

    For ``get("/items", params={...})`` httpx parses the relative URL, then the base URL
    with the new path, then the result with the query: three runs of its RFC 3986 parser,
    ~9% of a trivial poll's CPU. When the URL is a path under ``base_url`` (no scheme, no
    query, no fragment) and the client has no params of its own, the query is encoded as
    httpx encodes it and the whole URL parsed once; the result is the same URL
    (``tests/unit/test_http_urls.py`` compares them). Anything else goes httpx's way.
    """

    def build_request(
        self,
        method: str,
        url: httpx.URL | str,
        *,
        params: Any = None,
        **kwargs: Any,
    ) -> httpx.Request:
        if (
            params is not None
            and isinstance(url, str)
            and self._is_path(url)
            and "?" not in url
            and not self.params
        ):
            query = httpx.QueryParams(params)
            if query:  # any key, even one with no values: httpx then writes "?"
                url = f"{url}?{query}"
            params = None
        return super().build_request(method, url, params=params, **kwargs)

    def _merge_url(self, url: httpx.URL | str) -> httpx.URL:
        if isinstance(url, str) and self._is_path(url):
            base = self.base_url
            if base.is_absolute_url and not base.query and not base.fragment:
                # httpx appends the path to the base's (which ends in "/"), its leading
                # "/" stripped. The base's text leaves out a path of just "/".
                prefix = str(base)
                if not prefix.endswith("/"):
                    prefix += "/"
                return httpx.URL(prefix + url.lstrip("/"))
        return super()._merge_url(url)

    @staticmethod
    def _is_path(url: str) -> bool:
        """A path-absolute reference ("/" then anything but a second "/"), no fragment."""
        return url[:1] == "/" and url[1:2] != "/" and "#" not in url


class SyncClient(OneParseClient):
    """The client behind ``ctx.http``: every failed call raises a synckit exception."""

    def __init__(
        self,
        *,
        connector: Connector[Any],
        pacer: Pacer,
        clock: Callable[[], datetime],
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # httpx keeps the jar in ``_cookies`` (setting ``cookies`` would copy it into a
        # plain Cookies); cookies still persist across this client's requests.
        self._cookies = _Cookies(self._cookies)
        self.connector = connector
        self.pacer = pacer
        self.clock = clock
        self._check_successes = _classifies_successes(connector)

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        waiter = self.pacer.waiter
        started = waiter.mark()
        retries = 0
        hold = request.extensions[HOLD_REFUSALS] = RefusalHold()
        while True:
            # One span per request sent (a resend is a span of its own), as the HTTP
            # client conventions have it; nothing at all when tracing is off.
            try:
                with tracing.http_span(request, retries) as span:
                    response, c = await self._send_once(request, **kwargs)
                    if span is not None:
                        tracing.http_response(span, response.status_code, c)
                    if c is None:
                        return response
                    wait = await self._resend_wait(request, response, c, started, retries, span)
            finally:
                # The refusal is recorded (or was not one): the process's requests go on.
                self.pacer.release(hold)
            retries += 1
            if wait > 0:
                await waiter.sleep(wait)

    async def _resend_wait(
        self,
        request: httpx.Request,
        response: httpx.Response,
        c: Classification,
        started: float,
        retries: int,
        span: Any,
    ) -> float:
        """A failed response: how long to wait before sending the request again inline
        (a rate limit whose pace fits the bounds), else its error raised."""
        if c.error_class is not ErrorClass.RATE_LIMITED:
            raise api_error(c, request, response)
        sent_at = response.request.extensions.get(SENT_AT)
        until = await self.pacer.record_rate_limit(
            c, sent_at if isinstance(sent_at, datetime) else None, self.pacer.policy
        )
        now = self.clock()
        wait = max((until - now).total_seconds(), 0.0) if until is not None else 0.0
        inline_left = self.pacer.max_wait - self.pacer.waiter.elapsed(started)
        if (
            retries < MAX_INLINE_RETRIES
            and wait <= inline_left
            and _may_resend(request, response.status_code)
        ):
            log.info(
                "http.rate_limited_inline",
                resource_key=self.pacer.resource_key,
                wait=wait,
                retry=retries + 1,
            )
            tracing.set_attributes(
                span, synckit__pace__outcome="resend", synckit__pace__wait_s=wait
            )
            return wait
        error = api_error(c, request, response)
        if isinstance(error, RateLimited):
            error.paced_until = until
            if until is not None:
                error.retry_after = clamp_wait(until - now, self.connector.max_wait)
        tracing.set_attributes(
            span,
            synckit__pace__outcome="raise",
            synckit__pace__until=until.isoformat() if until is not None else None,
        )
        raise error

    async def _send_once(
        self, request: httpx.Request, **kwargs: Any
    ) -> tuple[httpx.Response, Classification | None]:
        """One send; the response and, when it is a failure, its classification."""
        stream = bool(kwargs.pop("stream", False))
        try:
            # Streamed, so that an error body is read only up to ERROR_BODY_LIMIT.
            response = await super().send(request, stream=True, **kwargs)
            if response.status_code < 400 and not stream:
                try:
                    await response.aread()
                except BaseException:
                    await response.aclose()
                    raise
        except httpx.HTTPError as exc:
            c = self.connector.classify(None, exc, self.clock())
            raise api_error(c, request) from exc
        if response.status_code < 400 and not self._check_successes:
            return response, None
        try:
            if response.status_code >= 400:
                # The classifier may read an error body (rate-limit messages in a 403, a
                # connector's body rules); a hostile one (32 MiB) costs 64 KiB, no more.
                await read_capped(response)
            c = self.connector.classify(response, None, self.clock())
        except BaseException:
            await response.aclose()
            raise
        if response.status_code < 400 and c.error_class is ErrorClass.UNKNOWN:
            return response, None  # no rule said this success is a failure
        await response.aclose()
        return response, c


#: How much of an error body is read: enough for any API's error message.
ERROR_BODY_LIMIT = 64 * 1024


async def read_capped(response: httpx.Response, limit: int = ERROR_BODY_LIMIT) -> bytes:
    """Read at most ``limit`` bytes of ``response``'s (decoded) body, close it, and leave
    them as ``response.content``; a transport error mid-body keeps what arrived."""
    buf = bytearray()
    try:
        async for chunk in response.aiter_bytes():
            buf += chunk
            if len(buf) >= limit:
                break
    except httpx.HTTPError:
        pass  # the status already says it failed; the body was only a detail
    finally:
        await response.aclose()
    response._content = bytes(buf[:limit])  # what .content, .text and .json() read
    return response._content


# Rate-limited statuses that say the server refused the request without acting on it.
_REFUSALS = frozenset({403, 429, 509})


def _may_resend(request: httpx.Request, status: int) -> bool:
    """Whether a rate-limited request may be sent again inline.

    A non-idempotent request only after a refusal (a 429, or a 403/509 classified as a
    rate limit: GitHub answers its exhausted quota with 403 + ``X-RateLimit-Remaining:
    0``), never after a 503, which a proxy may send after the origin acted; and only a
    request whose body is in memory (a streamed one cannot be replayed).
    """
    if request.method.upper() not in IDEMPOTENT and status not in _REFUSALS:
        return False
    return isinstance(request.stream, httpx.ByteStream)
