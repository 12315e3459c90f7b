"""What the demo's wire saw: every Graph request of every tenant's client and its answer
(:class:`Wire`), and whether each 429's ``Retry-After`` was honoured
(:func:`retry_after_report`)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from synckit.clock import utcnow
from synckit.runtime.http.pacer import SENT_AT

__all__ = ["Call", "Wire", "retry_after_report"]


@dataclass(frozen=True)
class Call:
    tenant: str
    #: When the request passed pacing (time.monotonic()); it left on the wire later.
    paced: float
    answered: float
    status: int | None
    retry_after: float | None


class Wire(httpx.AsyncBaseTransport):
    """The network of every tenant's client, recording each Graph request and its answer."""

    def __init__(self, tenant_of: Callable[[str | None], str]) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.calls: list[Call] = []
        self._tenant_of = tenant_of

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        header = request.headers.get("authorization", "")
        tenant = self._tenant_of(header.removeprefix("Bearer ") or None)
        sent = time.monotonic()
        # The runtime stamps when the request passed pacing: under load it may reach the
        # wire a while later, and it is the pacing that must have waited.
        passed = request.extensions.get(SENT_AT)
        paced = sent - (utcnow() - passed).total_seconds() if isinstance(passed, datetime) else sent
        try:
            response = await self.inner.handle_async_request(request)
        except httpx.TransportError:
            self.calls.append(Call(tenant, paced, time.monotonic(), None, None))
            raise
        wait = _seconds(response.headers.get("retry-after"))
        self.calls.append(Call(tenant, paced, time.monotonic(), response.status_code, wait))
        return response

    async def aclose(self) -> None:
        """Shared by every tenant's client: closed by the demo, not by each client."""


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def retry_after_report(calls: list[Call], grace: float = 0.25) -> dict[str, Any]:
    """For each 429 with ``Retry-After``: did the tenant's next request wait that long?

    A request that passed pacing within ``grace`` of the 429's arrival was already on its
    way (the 429 was not yet classified and recorded), so it is counted as in flight, not
    as a failure to wait. Times are when a request passed pacing, not when it reached
    the wire: under load the two can be far apart.
    """
    by_tenant: dict[str, list[Call]] = defaultdict(list)
    for c in calls:
        by_tenant[c.tenant].append(c)
    answers = honoured = in_flight = ignored = unfollowed = 0
    asked: set[float] = set()
    gaps: list[float] = []
    for tenant_calls in by_tenant.values():
        tenant_calls.sort(key=lambda c: c.paced)
        for c in tenant_calls:
            if c.status != 429 or c.retry_after is None:
                continue
            answers += 1
            asked.add(c.retry_after)
            later = [d.paced - c.answered for d in tenant_calls if d.paced > c.answered]
            if not later:
                unfollowed += 1
                continue
            racing = [g for g in later if g < grace]
            in_flight += len(racing)
            gap = min((g for g in later if g >= grace), default=None)
            if gap is None:
                unfollowed += 1
            elif gap >= c.retry_after:
                honoured += 1
                gaps.append(gap)
            else:
                ignored += 1
    return {
        "answers": answers,
        "asked_seconds": sorted(asked),
        "honoured": honoured,
        "not_honoured": ignored,
        "no_later_request": unfollowed,
        "requests_already_in_flight": in_flight,
        "shortest_wait_seconds": round(min(gaps), 2) if gaps else None,
    }
