"""Pacing on the wire: :class:`PacedTransport` wraps the real transport and sees every
request (auth retries included). Before each one the :class:`Pacer` waits for the
resource: while the tenant's (or its API's) ``next_available_at`` is in the future, and for
the request's slot on the tenant's shared schedule when a rate applies: the connector's
declared :class:`~synckit.connectors.base.RateLimit`, the rate that spreads the quota the
API reported (``X-RateLimit-*``, IETF ``RateLimit``) over the time to its reset, or the
lower of the two. A wait longer than the connector's ``max_inline_wait`` raises
:class:`~synckit.errors.exceptions.RateLimited` (with ``paced_until``) instead of
sleeping, so the worker puts the job back. After each response it notes the reported
quota (stored with the next slot, not by a write of its own), and a success reporting an
exhausted quota defers the resource until the reset.

The Pacer touches the database only when it must: while a rate applies, one short
transaction reserves the slots of this process's next requests on the tenant's shared
schedule (the next second's worth of a declared or learnt rate, half a second's of a
reported quota's; the shared schedule is what keeps every process of the tenant at the
rate), otherwise a read of the resource's pacing at most every :data:`REFRESH_SECONDS`
per process and resource. What a process learns of a resource (its learnt rate's
readings, the refusals being recorded) is shared by its Pacers (:class:`_Shared`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import time
import weakref
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import httpx
import structlog

from synckit.clock import Waiter
from synckit.connectors.base import RateLimit
from synckit.errors.classify import Classification
from synckit.errors.exceptions import RateLimited
from synckit.errors.headers import parse_rate_limit, server_wait
from synckit.errors.pace import PacePolicy
from synckit.runtime.http import pacing
from synckit.runtime.http.network import Network
from synckit.runtime.http.transports import DEFAULT_NETWORK, give_back_transport
from synckit.runtime.loop_state import PerLoop, per_loop
from synckit.runtime.observe.instruments import record_api_latency
from synckit.store.db import Database

__all__ = [
    "HOLD_REFUSALS",
    "REFRESH_SECONDS",
    "SENT_AT",
    "PacedTransport",
    "Pacer",
    "RefusalHold",
]

log = structlog.get_logger("synckit.http")

#: How stale a process's view of a resource's pacing may get when no rate applies.
REFRESH_SECONDS = 0.5
#: ``request.extensions`` key holding when the request left (after its pacing wait).
SENT_AT = "synckit.sent_at"
#: Set by :class:`SyncClient` on the requests it sends (a :class:`RefusalHold`): a refusal
#: answered to one holds the process's other requests to the resource until the client
#: has recorded it.
HOLD_REFUSALS = "synckit.hold_refusals"


@dataclasses.dataclass(slots=True)
class RefusalHold:
    """Whether a request's refusal holds its pacer (one per send, shared by resends)."""

    held: bool = False


#: The window (seconds) in which a process counts the successes a learnt rate starts
#: from: one second, the window most undeclared limits count in.
ACCEPTED_WINDOW = 1.0
#: How far back (seconds) a process looks for its busiest such window.
ACCEPTED_SPAN = 5.0
#: ``request.extensions`` key: whether the request waited for the learnt rate (only
#: such requests' successes raise it).
RATE_BOUND = "synckit.rate_bound"


@dataclasses.dataclass(eq=False)
class _Shared:
    """One process's view of one resource, shared by every client of it in the process."""

    view: pacing.PaceView | None = None
    read_at: float = -1e18  # time.monotonic() of the last read
    observed: pacing.Quota | None = None  # the freshest quota this process saw
    in_flight: int = 0
    #: Slots this process reserved ahead (when each may go), ``slot_interval`` apart.
    slots: collections.deque[datetime] = dataclasses.field(default_factory=collections.deque)
    slot_interval: float = 0.0
    #: The declared rate's shared schedule lets no request go before this (the latest
    #: ``SlotResult.opens_at`` this process saw; the schedule never moves back).
    schedule_opens_at: datetime | None = None
    #: Set while one request of this process reserves slots: the others wait for its
    #: slots rather than each reserving a batch of their own.
    taking: asyncio.Future[None] | None = None
    #: Rate-limited answers being recorded now: until they are, this process's requests
    #: to the resource wait (a request let through meanwhile would ignore the pace).
    recording: int = 0
    recorded: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    #: Successes not yet added to a learnt rate (those of requests the rate held back:
    #: a process that sends slower than its learnt rate has not tried it, and raising it
    #: then would only take it, untried, above the limit); when the latest success was
    #: sent; the monotonic times the last few seconds' successful requests were sent
    #: (the rate a refusal learns from).
    successes: int = 0
    succeeded_at: datetime | None = None
    #: When (monotonic) this process's latest request under a learnt rate may go or went.
    learned_sent: float = -1e18
    accepted: collections.deque[float] = dataclasses.field(default_factory=collections.deque)
    #: The busiest-window reading (:meth:`accepted_rate`) at this process's latest
    #: refusal, and when (monotonic) it was taken.
    refused_reading: float = 0.0
    refused_mono: float = -1e18

    def success(self, sent_at: datetime | None, sent_mono: float, *, bound: bool) -> None:
        if bound:
            self.successes += 1
        if sent_at is not None and (self.succeeded_at is None or sent_at > self.succeeded_at):
            self.succeeded_at = sent_at
        self.accepted.append(sent_mono)
        cutoff = time.monotonic() - ACCEPTED_SPAN
        while self.accepted and self.accepted[0] < cutoff:
            self.accepted.popleft()

    def accepted_rate(self, since: float = -1e18) -> float:
        """The most successful requests sent in any :data:`ACCEPTED_WINDOW` seconds of
        the last :data:`ACCEPTED_SPAN` (and after ``since``, monotonic), per second: what
        the API let through in a window, read where this process's own pace (or a random
        refusal) did not thin it out. Counted by when the requests left, which is what
        the API counts: their answers can come back bunched (a busy event loop handles
        several at once)."""
        start = max(since, time.monotonic() - ACCEPTED_SPAN)
        times = sorted(t for t in self.accepted if t >= start)
        most, first = 0, 0
        for last, t in enumerate(times):
            while t - times[first] > ACCEPTED_WINDOW:
                first += 1
            most = max(most, last - first + 1)
        return most / ACCEPTED_WINDOW

    def accepted_at_refusal(self) -> float:
        """The rate a refusal learns from: :meth:`accepted_rate` since this process's
        previous refusal, or the lower of it and the reading then, when that was at most
        :data:`ACCEPTED_SPAN` ago. A one-second count reads high when it straddles two of
        the API's windows (a limit of 3 a second read 5 or 6 when requests bunched at a
        window's end); two readings of separate stretches both do far less often. Nothing
        sent since the previous refusal: 0 (nothing to learn from), the previous reading
        kept."""
        now = time.monotonic()
        reading = self.accepted_rate(since=self.refused_mono)
        if reading <= 0:
            return 0.0
        accepted = reading
        if now - self.refused_mono <= ACCEPTED_SPAN and self.refused_reading > 0:
            accepted = min(reading, self.refused_reading)
        self.refused_reading, self.refused_mono = reading, now
        return accepted


#: Per event loop, database as given (its URL with any ``search_path``: two schemas are
#: two databases) and resource.
_shared_views: PerLoop[tuple[str, str], _Shared] = weakref.WeakKeyDictionary()


def _shared(db: Database, key: str) -> _Shared:
    return per_loop(_shared_views, (db.given_url, key), _Shared)


_waiters: weakref.WeakKeyDictionary[Callable[[], datetime], Waiter] = weakref.WeakKeyDictionary()


def _waiter_of(clock: Callable[[], datetime]) -> Waiter:
    """The clock's Waiter, made once per clock (it keeps no state of its own): making one
    checks the clock against a runtime-checkable protocol, ~3% of a trivial poll's CPU."""
    try:
        waiter = _waiters.get(clock)
        if waiter is None:
            waiter = _waiters[clock] = Waiter(clock)
    except TypeError:  # a clock that takes no weak reference
        waiter = Waiter(clock)
    return waiter


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
        pace: PacePolicy | None = None,
    ) -> None:
        self.db = db
        self.resource_key = resource_key
        self.rate_limit = rate_limit
        #: How rate limits that name no wait pace the resource (the connector's ``pace``).
        self.policy = pace if pace is not None else PacePolicy()
        #: Whether a rate is learnt for the resource (nothing declared, the policy's
        #: ``learn``): refusals cut it, successes raise it.
        self.learn = rate_limit is None and self.policy.learn
        #: The longest one request waits inline (the connector's max_inline_wait).
        self.max_wait = max_wait.total_seconds()
        self.clock = clock
        #: Pacing waits and inline retries sleep through it: on the clock when the clock
        #: can sleep (a test's FakeClock), else on the event loop.
        self.waiter = _waiter_of(clock)
        self._state: _Shared | None = None

    @property
    def state(self) -> _Shared:
        if self._state is None:
            self._state = _shared(self.db, self.resource_key)
        return self._state

    def _too_long(self, wait: float, why: str) -> RateLimited:
        return RateLimited(
            f"resource {self.resource_key} {why} for {wait:.1f}s "
            f"(more than the {self.max_wait:g}s a request may wait inline)",
            retry_after=timedelta(seconds=wait),
            paced_until=self.clock() + timedelta(seconds=wait),
        )

    def _wants_slot(self, now: datetime) -> bool:
        if self.rate_limit is not None:
            return True
        st = self.state
        if self.learn and st.view is not None and st.view.learned is not None:
            return True
        quotas = [q for q in (st.observed, st.view.quota if st.view else None) if q is not None]
        return any(q.reset_at is not None and q.reset_at > now for q in quotas)

    def _reserved_slot(self, now: datetime, budget: float) -> float | None:
        """The wait of this process's next slot reserved ahead, or None (ask the database).

        A slot is used only while the resource is not paced as far as this process knows
        (a rate-limit event drops them all) and until one interval after its time: a slot
        that passed unused is a request not sent, never part of a later burst.
        """
        st = self.state
        if not st.slots:
            return None
        available = st.view.available_at if st.view else None
        if available is not None and available > now:
            _drop_slots_before(st.slots, available)
        interval = st.slot_interval
        while st.slots:
            wait = (st.slots.popleft() - now).total_seconds()
            if wait >= -interval:
                if wait > budget:
                    st.slots.clear()
                    return None
                return max(wait, 0.0)
        return None

    def _paced_meanwhile(self) -> bool:
        """Whether, while this request slept until its slot, the resource was paced (a
        429 answered to another request of this process): the slot is then not used,
        and the request waits the pace like any other."""
        st = self.state
        available = st.view.available_at if st.view else None
        return available is not None and available > self.clock()

    async def before_request(self) -> bool:
        """Return when a request may go; raise RateLimited if that is too far off.
        Returns whether a learnt rate held the request back (its success may raise it)."""
        held = await self._before_request()
        st = self.state
        learned = st.view.learned if self.learn and st.view is not None else None
        if not learned:
            return False
        # Under a learnt rate, this process's own requests also keep its interval
        # between them: a reservation's round trip varies (a busy database), and a
        # slow one followed by a quick one sent two requests closer than the rate,
        # which an API counting per second refused even below its limit.
        now = time.monotonic()
        go = max(now, st.learned_sent + 1.0 / learned)
        st.learned_sent = go
        if go > now:
            await self.waiter.sleep(go - now)
        return held or go > now

    async def _before_request(self) -> bool:
        """:meth:`before_request`'s wait for the resource; whether the request waited
        for a slot of the schedule."""
        started = self.waiter.mark()
        st = self.state
        while True:
            while st.recording:
                await st.recorded.wait()
            now = self.clock()
            budget = self.max_wait - self.waiter.elapsed(started)
            if self._wants_slot(now):
                reserved = self._reserved_slot(now, budget)
                if reserved is not None:
                    if reserved > 0:
                        await self.waiter.sleep(reserved)
                        if self._paced_meanwhile():
                            continue
                    return reserved > 0
                if st.taking is not None:
                    # Another request of this process is reserving: wait for its slots
                    # (requests of a page's records, concurrent, each reserved a batch
                    # of their own, and most of those slots passed unused).
                    await asyncio.wait([st.taking])
                    continue
                st.taking = asyncio.get_running_loop().create_future()
                successes, st.successes = (st.successes, 0) if self.learn else (0, st.successes)
                try:
                    result = await self.db.write(
                        _take_slot,
                        self.resource_key,
                        self.rate_limit.per_second if self.rate_limit else None,
                        self.rate_limit.burst if self.rate_limit else 1,
                        st.in_flight,
                        st.observed,
                        now,
                        max(budget, 0.0),
                        successes,
                        self.policy,
                    )
                except BaseException:
                    st.successes += successes  # not added: the next reservation adds them
                    raise
                finally:
                    taking, st.taking = st.taking, None
                    taking.set_result(None)
                st.view, st.read_at = result.view, time.monotonic()
                # The slots' waits count from when the answer came back, as the first
                # request's does: the round trip is never taken out of the spacing the
                # API sees.
                back = self.clock()
                st.slots.extend(back + timedelta(seconds=w) for w in result.more)
                if result.more:
                    st.slot_interval = result.interval
                opens = result.opens_at
                if opens is not None and (
                    st.schedule_opens_at is None or opens > st.schedule_opens_at
                ):
                    st.schedule_opens_at = opens
                if result.wait <= 0:
                    return False
                if result.wait > budget:
                    why = {"paced": "is paced", "quota": "has spent its quota"}
                    raise self._too_long(result.wait, why.get(result.why, "is rate limited"))
                await self.waiter.sleep(result.wait)
                if result.reserved and not self._paced_meanwhile():
                    return result.why == "rate"
                continue
            if time.monotonic() - st.read_at > REFRESH_SECONDS:
                st.view = await pacing.read_pace(self.db, self.resource_key)
                st.read_at = time.monotonic()
                if self._wants_slot(now):
                    continue
            available = st.view.available_at if st.view else None
            wait = (available - now).total_seconds() if available is not None else 0.0
            if wait <= 0:
                return False
            if wait > budget:
                raise self._too_long(wait, "is paced")
            await self.waiter.sleep(wait)

    def seed(self, view: pacing.PaceView) -> None:
        """Take ``view``, read from the database just now by the caller (a poll job reads
        it with its tenant), as this process's view of the resource, unless it holds a
        fresher one: the first request then needs no read of its own."""
        st = self.state
        if time.monotonic() - st.read_at > REFRESH_SECONDS:
            st.view, st.read_at = view, time.monotonic()

    def seed_slots(self, first: pacing.FirstSlots) -> None:
        """Take the slots the caller reserved for this resource just now (a poll job, in
        its start read: :func:`~synckit.runtime.http.pacing.take_first_slots_sync`) as this
        process's own: the first requests go by them without a reservation of their own.
        """
        declared = self.rate_limit
        if declared is None or (declared.per_second, declared.burst) != (first.rate, first.burst):
            return  # this client paces at a rate of its own: its first request reserves
        st = self.state
        r = first.result
        st.slots.extend(first.at + timedelta(seconds=w) for w in (r.wait, *r.more))
        if any(a > b for a, b in itertools.pairwise(st.slots)):
            # Slots this process held already (another cycle of the resource): in order.
            st.slots = collections.deque(sorted(st.slots))
        if r.interval > 0:
            st.slot_interval = r.interval
        opens = r.opens_at
        if opens is not None and (st.schedule_opens_at is None or opens > st.schedule_opens_at):
            st.schedule_opens_at = opens

    def paced_until(self, until: datetime) -> None:
        """This process learnt the resource is paced until ``until`` (no read needed): its
        reserved slots before then are dropped; those after it stay reserved."""
        st = self.state
        current = st.view.available_at if st.view else None
        if current is None or until > current:
            st.view = (
                dataclasses.replace(st.view, available_at=until)
                if st.view is not None
                else pacing.PaceView(until, None)
            )
        _drop_slots_before(st.slots, until)

    async def defer(self, until: datetime, reason: str) -> None:
        """No request to the resource before ``until``, by any worker."""
        self.paced_until(until)
        if await pacing.defer_resource(self.db, self.resource_key, until, reason, now=self.clock()):
            log.info(
                "resource.deferred", resource_key=self.resource_key, until=until, reason=reason
            )

    def hold(self, hold: RefusalHold) -> None:
        """Hold this process's requests to the resource (as :meth:`record_rate_limit`
        does while it records) until :meth:`release` with the same ``hold``."""
        if hold.held:
            return
        hold.held = True
        self.state.recording += 1
        self.state.recorded.clear()

    def release(self, hold: RefusalHold) -> None:
        """End :meth:`hold`, if ``hold`` holds."""
        if not hold.held:
            return
        hold.held = False
        st = self.state
        st.recording -= 1
        if not st.recording:
            st.recorded.set()

    def paced_since_passed(self) -> bool:
        """Whether a request that passed :meth:`before_request` must pass it again: a
        refusal is being recorded, or the resource is paced now."""
        return bool(self.state.recording) or self._paced_meanwhile()

    async def record_rate_limit(
        self, c: Classification, sent_at: datetime | None, policy: PacePolicy
    ) -> datetime | None:
        """Record a rate-limited answer (one event per burst); when the resource is paced
        until, for every worker. Until it is recorded, this process's requests to the
        resource wait: one let through meanwhile would not see the pace."""
        st = self.state
        st.recording += 1
        st.recorded.clear()
        try:
            until = await pacing.record_rate_limit(
                self.db,
                self.resource_key,
                c,
                sent_at=sent_at,
                now=self.clock(),
                policy=policy,
                succeeded_at=st.succeeded_at,
                accepted=st.accepted_at_refusal(),
                learn=self.learn,
            )
        finally:
            st.recording -= 1
            if not st.recording:
                st.recorded.set()
        if until is not None:
            self.paced_until(until)
        return until

    async def after_response(
        self,
        response: httpx.Response,
        sent_at: datetime | None = None,
        *,
        sent_mono: float | None = None,
        rate_bound: bool = False,
    ) -> None:
        """Note the quota the response reports; a success that spent it defers the
        resource until the reset (Retry-After, when given, is the client's business). A
        success is counted for the streak and, sent at ``sent_mono`` (monotonic; None:
        now), for the rate a refusal learns from; when a learnt rate held the request
        back (``rate_bound``), it also raises that rate."""
        now = self.clock()
        if response.status_code < 400:
            sent = time.monotonic() if sent_mono is None else sent_mono
            self.state.success(sent_at, sent, bound=rate_bound)
        quota = parse_rate_limit(response.headers, now)
        if quota is None:
            return
        st = self.state
        if st.observed is None or st.observed.at <= now:
            st.observed = pacing.Quota.of(quota, now)
        if (
            response.status_code < 400
            and quota.exhausted
            and quota.reset_at is not None
            and quota.reset_at > now
            and server_wait(response.headers, now) is None
        ):
            current = st.view.available_at if st.view else None
            if current is None or current < quota.reset_at:
                opens = st.schedule_opens_at
                if self.rate_limit is not None and opens is not None and opens >= quota.reset_at:
                    # Every request goes by the declared rate's shared schedule, which
                    # lets none go before the reset: only this process's own reserved
                    # slots could, and they are dropped. No write: at a quota spent each
                    # window, a write and a new reservation per tenant per window stalled
                    # a worker's tenants together at every window's end.
                    self.paced_until(quota.reset_at)
                    return
                source = "X-RateLimit-Reset" if quota.source == "X-RateLimit" else "RateLimit"
                await self.defer(quota.reset_at, f"HTTP {response.status_code}: {source}")


def _drop_slots_before(slots: collections.deque[datetime], moment: datetime) -> None:
    """Drop the reserved slots (in time order) earlier than ``moment``."""
    while slots and slots[0] < moment:
        slots.popleft()


def _take_slot(
    conn: Any,
    key: str,
    declared_rate: float | None,
    burst: int,
    in_flight: int,
    observed: pacing.Quota | None,
    now: datetime,
    max_wait: float,
    successes: int,
    policy: PacePolicy,
) -> pacing.SlotResult:
    return pacing.take_slot_sync(
        conn,
        key,
        declared_rate=declared_rate,
        burst=burst,
        in_flight=in_flight,
        observed=observed,
        now=now,
        max_wait=max_wait,
        ahead=True,
        successes=successes,
        policy=policy,
    )


class PacedTransport(httpx.AsyncBaseTransport):
    """Wraps a transport: pacing before every request, quota headers after every response."""

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        pacer: Pacer,
        *,
        before_send: Callable[[httpx.Request], Awaitable[None]] | None = None,
        connector: str | None = None,
        borrowed: bool = False,
        network: Network = DEFAULT_NETWORK,
    ) -> None:
        self.inner = inner
        #: ``inner`` came from :func:`borrow_transport` (for ``connector`` on ``network``):
        #: closing this gives it back instead of closing it.
        self.borrowed = borrowed
        self.network = network
        self.pacer = pacer
        #: The connector's name, for the API metrics (None: not counted).
        self.connector = connector
        #: Awaited after the pacing wait, just before the request leaves: an auth that
        #: must attach a fresh credential at send time (OAuth2) sets it.
        self.before_send = before_send

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        while True:
            request.extensions[RATE_BOUND] = await self.pacer.before_request()
            if self.before_send is None:
                break
            await self.before_send(request)
            # The credential may have taken a while (a token refresh): a refusal answered
            # meanwhile paces this request too, as it would have before the pacing.
            if not self.pacer.paced_since_passed():
                break
        state = self.pacer.state
        request.extensions[SENT_AT] = self.pacer.clock()
        sent_mono = time.monotonic()
        state.in_flight += 1
        started = time.perf_counter()
        status: int | None = None
        try:
            response = await self.inner.handle_async_request(request)
            status = response.status_code
        finally:
            state.in_flight -= 1
            if self.connector is not None:
                record_api_latency(self.connector, status, time.perf_counter() - started)
        hold = request.extensions.get(HOLD_REFUSALS)
        if isinstance(hold, RefusalHold) and (
            response.status_code == 429 or "retry-after" in response.headers
        ):
            # A refusal: until the client has read, classified and recorded it, this
            # process's other requests to the resource wait (reading its body yields to
            # them, and one let through would not see the pace). The client releases it.
            self.pacer.hold(hold)
        try:
            await self.pacer.after_response(
                response,
                request.extensions[SENT_AT],
                sent_mono=sent_mono,
                rate_bound=request.extensions[RATE_BOUND],
            )
        except BaseException:
            if isinstance(hold, RefusalHold):
                self.pacer.release(hold)
            await response.aclose()
            raise
        return response

    async def aclose(self) -> None:
        if self.borrowed:
            await give_back_transport(self.connector or "", self.inner, self.network)
        else:
            await self.inner.aclose()
