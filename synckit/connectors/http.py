"""``ctx.http``: an ``httpx.AsyncClient`` that paces, classifies and raises for connectors.

Two layers, because they see different things:

* :class:`PacedTransport` wraps the real transport and sees every request on the wire
  (auth retries included). Before each one it waits for the resource: while the
  tenant's (or its API's) ``next_available_at`` is in the future, then for a token of
  the connector's :class:`~synckit.connectors.base.RateLimit`. A wait longer than the
  connector's ``max_inline_wait`` raises :class:`~synckit.errors.RateLimited` instead of
  sleeping, so the worker defers the job. After each response, a quota reported as
  exhausted (``X-RateLimit-Remaining: 0``, ``RateLimit: ...;r=0``) on *any* response
  defers the resource until the reported reset.
* :class:`SyncClient` overrides ``send``, so it sees the final response after
  authentication (an OAuth auth flow may answer a 401 itself by refreshing). A failed
  response is classified by ``connector.classify`` and raised as the synckit exception
  that tells the runtime what to do (:func:`synckit.errors.raising.exception_for`):
  :class:`~synckit.errors.RateLimited` (and the resource is deferred by the wait),
  :class:`~synckit.errors.NeedsReauth`, a permanent error for validation, authorization
  and not-found, a retryable one for the rest. Transport errors (timeouts, resets) are
  translated the same way, ``from`` the httpx error. Hooks never check status codes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import httpx
import structlog

from synckit.connectors.base import Connector, RateLimit
from synckit.errors.classify import Classification, ClassifyRules, ErrorClass
from synckit.errors.exceptions import HandlerOutcome, RateLimited
from synckit.errors.headers import parse_rate_limit
from synckit.errors.raising import exception_for
from synckit.runtime import pacing
from synckit.runtime.db import Database

__all__ = ["PacedTransport", "Pacer", "SyncClient", "api_error"]

log = structlog.get_logger("synckit.http")

#: A 429 that names no wait still defers the resource this long.
DEFAULT_RATE_LIMIT_WAIT = timedelta(seconds=30)

# One lock per (event loop, database, resource) serialises this process's takers of one
# bucket, so they queue in order instead of all polling the row at once.
_bucket_locks: weakref.WeakValueDictionary[tuple[int, str, str], asyncio.Lock] = (
    weakref.WeakValueDictionary()
)


def _bucket_lock(db: Database, key: str) -> asyncio.Lock:
    ident = (id(asyncio.get_running_loop()), str(db.url), key)
    lock = _bucket_locks.get(ident)
    if lock is None:
        lock = asyncio.Lock()
        _bucket_locks[ident] = lock
    return lock


class Pacer:
    """The pacing of one tenant's resource, shared by every request of one client."""

    def __init__(
        self,
        db: Database,
        resource_key: str,
        *,
        rate_limit: RateLimit | None,
        max_wait: timedelta,
        clock: Callable[[], datetime],
    ) -> None:
        self.db = db
        self.resource_key = resource_key
        self.rate_limit = rate_limit
        self.max_wait = max_wait.total_seconds()
        self.clock = clock
        self._lock: asyncio.Lock | None = None

    def _too_long(self, wait: float, why: str) -> RateLimited:
        return RateLimited(
            f"resource {self.resource_key} {why} for {wait:.1f}s "
            f"(more than the {self.max_wait:g}s a request may wait inline)",
            retry_after=timedelta(seconds=wait),
        )

    async def before_request(self) -> None:
        """Return when a request may go; raise RateLimited if that is too far off."""
        if self.rate_limit is None:
            await self._wait_until_available()
            return
        if self._lock is None:
            self._lock = _bucket_lock(self.db, self.resource_key)
        started = asyncio.get_running_loop().time()
        if self._lock.locked():
            if self.max_wait <= 0:
                raise self._too_long(0.0, "has a queue of requests")
            try:
                await asyncio.wait_for(self._lock.acquire(), timeout=self.max_wait)
            except TimeoutError:
                raise self._too_long(self.max_wait, "has a queue of requests") from None
        else:
            await self._lock.acquire()
        try:
            await self._take(started)
        finally:
            self._lock.release()

    async def _wait_until_available(self) -> None:
        while True:
            wait = await pacing.resource_wait(self.db, self.resource_key, self.clock())
            if wait <= 0:
                return
            if wait > self.max_wait:
                raise self._too_long(wait, "is paced")
            await asyncio.sleep(wait)

    async def _take(self, started: float) -> None:
        assert self.rate_limit is not None
        loop = asyncio.get_running_loop()
        while True:
            wait, why = await pacing.acquire(
                self.db,
                self.resource_key,
                rate=self.rate_limit.per_second,
                burst=self.rate_limit.burst,
                now=self.clock(),
            )
            if wait <= 0:
                return
            if loop.time() - started + wait > self.max_wait:
                raise self._too_long(wait, "is paced" if why == "paced" else "is rate limited")
            await asyncio.sleep(wait)

    async def defer(self, until: datetime, reason: str) -> None:
        """No request to the resource before ``until``, by any worker."""
        if await pacing.defer_resource(self.db, self.resource_key, until, reason, now=self.clock()):
            log.info(
                "resource.deferred", resource_key=self.resource_key, until=until, reason=reason
            )

    async def after_response(self, response: httpx.Response) -> None:
        """Defer the resource when the response says its quota is exhausted."""
        now = self.clock()
        quota = parse_rate_limit(response.headers, now)
        if quota is None or not quota.exhausted or quota.reset_at is None:
            return
        if quota.reset_at > now:
            await self.defer(quota.reset_at, f"HTTP {response.status_code}: quota exhausted")


class PacedTransport(httpx.AsyncBaseTransport):
    """Wraps a transport: pacing before every request, quota headers after every response."""

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        pacer: Pacer,
        *,
        before_send: Callable[[httpx.Request], Awaitable[None]] | None = None,
    ) -> None:
        self.inner = inner
        self.pacer = pacer
        #: Awaited after the pacing wait, just before the request leaves: an auth that
        #: must attach a fresh credential at send time (OAuth2) sets it.
        self.before_send = before_send

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await self.pacer.before_request()
        if self.before_send is not None:
            await self.before_send(request)
        response = await self.inner.handle_async_request(request)
        try:
            await self.pacer.after_response(response)
        except BaseException:
            await response.aclose()
            raise
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _where(request: httpx.Request) -> str:
    # No query string: it may carry an API key, and the message reaches logs and the DLQ.
    return f"{request.method} {request.url.copy_with(query=None, fragment=None)}"


def api_error(classification: Classification, request: httpx.Request | None) -> HandlerOutcome:
    """The synckit exception for a failed call, its message naming the request."""
    if request is not None:
        reason = f"{_where(request)}: {classification.reason}"
        classification = dataclasses.replace(classification, reason=reason)
    return exception_for(classification)


def _classifies_successes(connector: Connector[Any]) -> bool:
    """Whether a 2xx can be a failure for this connector (else it is never classified)."""
    rules: ClassifyRules = connector.classify_rules
    return (
        type(connector).classify is not Connector.classify
        or bool(rules.body_rules)
        or rules.expect_json
        or any(status < 400 for status in rules.by_status)
    )


class SyncClient(httpx.AsyncClient):
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
        self.connector = connector
        self.pacer = pacer
        self.clock = clock
        self._check_successes = _classifies_successes(connector)

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        try:
            response = await super().send(request, **kwargs)
        except httpx.HTTPError as exc:
            c = self.connector.classify(None, exc, self.clock())
            raise api_error(c, request) from exc
        if response.status_code < 400 and not self._check_successes:
            return response
        try:
            if response.status_code >= 400:
                # Error bodies are small and the classifier may read them (rate-limit
                # messages in a 403, a connector's body rules).
                await response.aread()
            c = self.connector.classify(response, None, self.clock())
        except BaseException:
            await response.aclose()
            raise
        if response.status_code < 400 and c.error_class is ErrorClass.UNKNOWN:
            return response  # no rule said this success is a failure
        await response.aclose()
        if c.error_class is ErrorClass.RATE_LIMITED:
            now = self.clock()
            candidates = [m for m in (c.rate_limit_reset,) if m is not None]
            if c.retry_after is not None:
                candidates.append(now + c.retry_after)
            until = max(candidates) if candidates else now + DEFAULT_RATE_LIMIT_WAIT
            if until > now:
                await self.pacer.defer(until, f"HTTP {response.status_code}: {c.reason}")
        raise api_error(c, request)
