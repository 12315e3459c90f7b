"""Request pacing shared by every worker: every SQL statement on a resource's pacing columns.

The columns (``resources``): ``next_available_at`` (no request before it),
``rate_limit_streak`` / ``rate_limited_at`` / ``paced_reason`` (the current rate-limit
event), ``quota_limit`` / ``quota_remaining`` / ``quota_reset_at`` / ``quota_at`` (the
quota the API last reported), ``learned_rate`` / ``learned_peak`` / ``learned_cut_at``
(the rate learnt for an API that declares none) and ``tokens_at`` (the shared request
schedule). The
decisions are the pure functions of :mod:`synckit.errors.pace`; this module reads the
row, calls them and writes what they decided. Named operations:

* :func:`record_rate_limit_sync` / :func:`record_rate_limit`: a rate-limited answer
  paces the resource (one event for a burst of in-flight answers);
* :func:`take_slot_sync`: before a request, in one short transaction: is the resource
  paced, and if a rate applies (declared, learnt, or spread from the reported quota),
  reserve the request's place on the shared schedule; it also stores the quota this
  process saw and adds the successes it counted to a learnt rate;
* :func:`take_first_slots_sync`: the same reservation for the first requests of many
  poll cycles starting together, in their start read's transaction (rows another
  transaction holds are skipped, never waited for);
* :func:`defer_resource` / :func:`defer_resource_sync`: push ``next_available_at`` out
  (e.g. a success reporting an exhausted quota);
* :func:`read_pace`: what a process caches between transactions;
* :func:`configure_pacing`, :func:`resource_wait`.

Deferring never pulls ``next_available_at`` in. The schedule is exact across processes:
the row is locked (``FOR UPDATE`` on PostgreSQL, SQLite's write lock otherwise) while a
request's slot is reserved, and a schedule ahead of a host's clock is honoured as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from synckit.clock import utcnow
from synckit.errors.classify import Classification
from synckit.errors.headers import RateLimitInfo
from synckit.errors.pace import (
    DECLARED_HORIZON,
    RESERVE_HORIZON,
    RESERVE_MAX,
    LearnedRate,
    PacePolicy,
    learn_from_limit,
    learn_from_successes,
    pace_decision,
    quota_rate,
    reserve_slot,
    reserve_slots,
    schedule_opens_at,
    slots_before,
)
from synckit.store.db import Conn, Database, SyncConn
from synckit.store.resources import (
    defer_resource_sync,
    lock_free_resources_sync,
    lock_resource_sync,
    read_pace_row_sync,
    write_resource_sync,
    write_tokens_at_sync,
)

__all__ = [
    "FirstSlots",
    "PaceView",
    "Quota",
    "SlotResult",
    "SlotWant",
    "defer_resource",
    "read_pace",
    "read_pace_sync",
    "record_rate_limit",
    "record_rate_limit_sync",
    "resource_wait",
    "take_first_slots_sync",
    "take_slot_sync",
]

_REASON_LIMIT = 300


@dataclass(frozen=True)
class Quota:
    """A quota an API reported (``limit``/``remaining``/``reset_at``), seen at ``at``."""

    limit: int | None
    remaining: int | None
    reset_at: datetime | None
    at: datetime

    @classmethod
    def of(cls, info: RateLimitInfo, at: datetime) -> Quota:
        return cls(info.limit, info.remaining, info.reset_at, at)


@dataclass(frozen=True)
class PaceView:
    """A resource's pacing as read: no request before ``available_at`` (its own or its
    parent's ``next_available_at``); ``quota`` as last stored by any worker; ``learned``
    the rate learnt for it (requests a second, None: none)."""

    available_at: datetime | None
    quota: Quota | None
    learned: float | None = None


@dataclass(frozen=True)
class SlotResult:
    """What :func:`take_slot_sync` found: wait ``wait`` seconds before sending.

    ``why`` is ``""`` (go now), ``"paced"`` (``next_available_at``), ``"quota"`` (the
    reported quota is spent until its reset) or ``"rate"`` (the schedule). ``reserved``
    says the wait is this request's reserved slot (sleep it, then send without asking
    again); otherwise ask again after waiting.
    """

    wait: float
    why: str
    reserved: bool
    view: PaceView
    #: Further slots reserved for this process's next requests (waits from the same
    #: ``now``, in order): see ``ahead`` in :func:`take_slot_sync`.
    more: tuple[float, ...] = ()
    #: Seconds between the reserved slots (the rate they were reserved at); 0: none.
    interval: float = 0.0
    #: When the declared rate's shared schedule, as this transaction stored it, lets the
    #: next request of any process go (:func:`~synckit.errors.pace.schedule_opens_at`);
    #: None when no declared schedule was stored. The schedule only moves on, so no
    #: process's next slot comes before it.
    opens_at: datetime | None = None


def _learned_of(row: Any) -> LearnedRate:
    return LearnedRate(row.learned_rate, row.learned_peak, row.learned_cut_at)


def _quota_of(row: Any) -> Quota | None:
    if row.quota_at is None:
        return None
    return Quota(row.quota_limit, row.quota_remaining, row.quota_reset_at, row.quota_at)


def _later(*moments: datetime | None) -> datetime | None:
    known = [m for m in moments if m is not None]
    return max(known) if known else None


def record_rate_limit_sync(
    conn: SyncConn,
    key: str,
    classification: Classification,
    *,
    sent_at: datetime | None,
    now: datetime,
    policy: PacePolicy,
    succeeded_at: datetime | None = None,
    accepted: float | None = None,
    learn: bool = False,
) -> datetime | None:
    """Record a rate-limited answer for resource ``key``; return when it is paced until.

    ``succeeded_at``: when the latest request this process saw succeed was sent (a
    success after the previous pace ended restarts the streak). With ``learn`` (a
    connector that declares no rate), a new event whose answer named no wait also cuts
    the resource's learnt rate (:func:`~synckit.errors.pace.learn_from_limit`, from the
    ``accepted`` successes a second the process saw and the previous event's start).

    Runs in the caller's transaction on a synchronous connection (``Database.write``).
    ``sent_at`` is when the answered request was sent (None: unknown, taken as ``now``;
    a worker recording a handler's own ``RateLimited`` passes the moment the handler
    started). The decision is :func:`synckit.errors.pace.pace_decision`: a request sent
    before the current event's pace ended belongs to that event (its streak and start
    stay; only a wait of its own that ends later pushes ``next_available_at`` out);
    otherwise ``next_available_at`` moves to the pace's end (never earlier than it was),
    and the streak, ``rate_limited_at`` and ``paced_reason`` are stored. Returns the
    resource's ``next_available_at`` afterwards (possibly in the past), or None when the
    classification is no rate limit.
    """
    row = lock_resource_sync(conn, key, now)
    decision = pace_decision(
        classification,
        now,
        streak=row.rate_limit_streak,
        sent_at=sent_at,
        event_started_at=row.rate_limited_at,
        event_until=row.next_available_at,
        policy=policy,
        succeeded_at=succeeded_at,
    )
    if decision is None:
        return None
    until = _later(row.next_available_at, decision.until)
    if decision.new_event:
        values: dict[str, Any] = {
            "next_available_at": until,
            "rate_limit_streak": decision.streak,
            "rate_limited_at": decision.event_started_at,
            "paced_reason": decision.reason[:_REASON_LIMIT],
            "last_error_class": "rate_limited",
            "last_error": classification.reason[:500],
            "updated_at": now,
        }
        if learn and classification.retry_after is None:
            before = _learned_of(row)
            after = learn_from_limit(before, accepted, now, policy, row.rate_limited_at)
            if after != before:
                values.update(
                    learned_rate=after.rate,
                    learned_peak=after.peak,
                    learned_cut_at=after.cut_at,
                )
        write_resource_sync(conn, key, values)
    elif row.next_available_at is None or until > row.next_available_at:
        # An answer of the same event naming a wait that ends later: the event's other
        # columns stay, its pace is pushed out to that wait.
        write_resource_sync(conn, key, {"next_available_at": until, "updated_at": now})
    return until


async def record_rate_limit(
    target: Database | Conn,
    key: str,
    classification: Classification,
    *,
    sent_at: datetime | None,
    now: datetime,
    policy: PacePolicy,
    succeeded_at: datetime | None = None,
    accepted: float | None = None,
    learn: bool = False,
) -> datetime | None:
    """:func:`record_rate_limit_sync` in its own transaction (a Database) or the caller's."""
    record = partial(
        record_rate_limit_sync,
        key=key,
        classification=classification,
        sent_at=sent_at,
        now=now,
        policy=policy,
        succeeded_at=succeeded_at,
        accepted=accepted,
        learn=learn,
    )
    if isinstance(target, Database):
        return await target.write(record)
    return await target.run_sync(record)


def take_slot_sync(
    conn: SyncConn,
    key: str,
    *,
    declared_rate: float | None,
    burst: int,
    in_flight: int,
    observed: Quota | None,
    now: datetime,
    max_wait: float,
    ahead: bool = False,
    successes: int = 0,
    policy: PacePolicy | None = None,
) -> SlotResult:
    """Before one request to ``key``: whether it may go, in one transaction.

    ``successes``: requests this process saw succeed since it last said so; they raise
    the resource's learnt rate, if it has one (:func:`~synckit.errors.pace.learn_from_successes`
    under ``policy``). A learnt rate paces like a quota's: one request at a time, the
    lower of the rates that apply.

    Stores ``observed`` (the quota this process saw last) when it is newer than the
    stored one. Then, unless the resource is paced, the request rate is the lower of
    ``declared_rate`` and the stored-or-observed quota spread over the time to its reset
    (:func:`~synckit.errors.pace.quota_rate`, ``in_flight`` requests reserved out of it);
    with a rate, the request's slot on the shared schedule is reserved when its wait is at
    most ``max_wait`` seconds (a longer one reserves nothing: the caller defers). With
    ``ahead``, the slots of the next requests within
    :data:`~synckit.errors.pace.DECLARED_HORIZON` (a declared or learnt rate) or
    :data:`~synckit.errors.pace.RESERVE_HORIZON` (a quota's) are reserved too
    (:func:`~synckit.errors.pace.reserve_slots`, returned in ``more``, ``interval``
    apart): one transaction then serves several requests of a busy tenant instead of one.
    When the rate is the reported quota's, those slots also end at its reset and number
    at most its remaining requests (those in flight reserved out of it).
    """
    row = lock_resource_sync(conn, key, now, parent=True)
    quota = _quota_of(row)
    values: dict[str, Any] = {}
    if observed is not None and (quota is None or observed.at > quota.at):
        quota = observed
        values.update(
            quota_limit=observed.limit,
            quota_remaining=observed.remaining,
            quota_reset_at=observed.reset_at,
            quota_at=observed.at,
        )
    learned = _learned_of(row)
    if successes > 0 and policy is not None and learned.rate is not None:
        grown = learn_from_successes(learned, successes, policy)
        if grown.rate != learned.rate:
            values["learned_rate"] = grown.rate
        learned = grown
    available = _later(row.next_available_at, row.parent_available_at)
    result = _slot(
        row.tokens_at,
        PaceView(available, quota, learned.rate),
        values,
        declared_rate=declared_rate,
        burst=burst,
        in_flight=in_flight,
        now=now,
        max_wait=max_wait,
        ahead=ahead,
    )
    if values:
        write_resource_sync(conn, key, values)
    return result


@dataclass(frozen=True)
class FirstSlots:
    """The slots a poll job's start read reserved for its cycle's first requests: the
    n-th goes at ``at`` plus the n-th wait of ``result`` (``wait``, then ``more``)."""

    result: SlotResult
    #: When the reservation came back to the job.
    at: datetime
    #: The rate they were reserved at (the connector class's declared one): a client
    #: pacing at another rate does not use them.
    rate: float
    burst: int


@dataclass(frozen=True)
class SlotWant:
    """A poll cycle about to start on ``key``, whose connector declares ``rate`` requests
    a second with bursts of ``burst``, and whose requests wait at most ``max_wait``
    seconds inline."""

    key: str
    rate: float
    burst: int
    max_wait: float


def take_first_slots_sync(
    conn: SyncConn, wants: list[SlotWant], *, now: datetime
) -> dict[str, SlotResult]:
    """The first slots of poll cycles starting together, in the caller's transaction (the
    poll jobs' start read): for each resource, what :func:`take_slot_sync` with ``ahead``
    reserves for a process that has sent nothing yet, so that a cycle's first requests
    need no transaction of their own.

    Only reservations are returned: a resource that is paced, whose reported quota is
    still running (its rate depends on what the process sees in flight), whose row
    another transaction holds (PostgreSQL: skipped, never waited for) or that does not
    exist yet is left out, and its first request asks :func:`take_slot_sync` as any
    other does. One want per key (the first given wins).
    """
    wanted: dict[str, SlotWant] = {}
    for want in wants:
        wanted.setdefault(want.key, want)
    if not wanted:
        return {}
    found: dict[str, SlotResult] = {}
    schedules: dict[str, datetime] = {}
    for row in lock_free_resources_sync(conn, list(wanted)):
        want = wanted[row.resource_key]
        quota = _quota_of(row)
        if quota is not None and quota.reset_at is not None and quota.reset_at > now:
            continue
        values: dict[str, Any] = {}
        result = _slot(
            row.tokens_at,
            PaceView(_later(row.next_available_at, row.parent_available_at), quota),
            values,
            declared_rate=want.rate,
            burst=want.burst,
            in_flight=0,
            now=now,
            max_wait=want.max_wait,
            ahead=True,
        )
        if result.reserved and "tokens_at" in values:
            found[row.resource_key] = result
            schedules[row.resource_key] = values["tokens_at"]
    write_tokens_at_sync(conn, schedules)
    return found


def _adaptive_rate(
    tokens_at: datetime | None,
    quota: Quota | None,
    declared_rate: float | None,
    burst: int,
    in_flight: int,
    now: datetime,
) -> float | None:
    """The rate that spreads a reported quota's remaining requests until its reset, or None."""
    if quota is None:
        return None
    adaptive = quota_rate(quota.remaining, quota.reset_at, now, in_flight=in_flight)
    if (
        adaptive
        and declared_rate is not None
        and adaptive < declared_rate
        and quota.remaining is not None
        and quota.reset_at is not None
        and slots_before(tokens_at, now, quota.reset_at, rate=declared_rate, burst=burst)
        <= quota.remaining - max(in_flight, 0)
    ):
        # The declared rate cannot spend more than the quota has left before its
        # reset: spreading what is left until then would only send slower than
        # allowed (an API counting 10 a second then got 9 in one second of six).
        return None
    return adaptive


def _spent(
    tokens_at: datetime | None,
    view: PaceView,
    values: dict[str, Any],
    *,
    declared_rate: float | None,
    burst: int,
    now: datetime,
    max_wait: float,
    ahead: bool,
) -> SlotResult:
    """The slot when the quota is spent until its reset (rate 0)."""
    quota = view.quota
    assert quota is not None and quota.reset_at is not None
    result = SlotResult((quota.reset_at - now).total_seconds(), "quota", False, view)
    if ahead and declared_rate is not None:
        # Spent until its reset: the declared rate's slots from the reset on are
        # this process's, reserved now rather than asked for again at the reset
        # (where every tenant of an API counting a quota per second asked at once).
        # The first goes at the reset itself, never a burst before it.
        start = _later(tokens_at, quota.reset_at)
        waits, tat = reserve_slots(
            start, now, rate=declared_rate, burst=1, max_wait=max_wait,
            horizon=DECLARED_HORIZON,
        )  # fmt: skip
        if tat is not None:
            values["tokens_at"] = tat
            opens = schedule_opens_at(tat, rate=declared_rate, burst=burst)
            result = SlotResult(
                waits[0], "quota", True, view, tuple(waits[1:]), 1 / declared_rate, opens
            )
    return result


def _slot(
    tokens_at: datetime | None,
    view: PaceView,
    values: dict[str, Any],
    *,
    declared_rate: float | None,
    burst: int,
    in_flight: int,
    now: datetime,
    max_wait: float,
    ahead: bool,
) -> SlotResult:
    """:func:`take_slot_sync`'s decision for a resource whose schedule stands at
    ``tokens_at`` and whose pacing is ``view``; the schedule it moves to goes in
    ``values["tokens_at"]``. No I/O."""
    available, quota = view.available_at, view.quota
    # A learnt rate binds only a connector that declares none (its declared rate is what
    # it knows of the API).
    learned = view.learned if declared_rate is None else None
    result: SlotResult
    if available is not None and available > now:
        result = SlotResult((available - now).total_seconds(), "paced", False, view)
    else:
        adaptive = _adaptive_rate(tokens_at, quota, declared_rate, burst, in_flight, now)
        rates = [r for r in (declared_rate, adaptive, learned) if r is not None]
        rate = min(rates) if rates else None
        if rate is None:
            result = SlotResult(0.0, "", False, view)
        elif rate <= 0:
            result = _spent(
                tokens_at, view, values, declared_rate=declared_rate, burst=burst, now=now,
                max_wait=max_wait, ahead=ahead,
            )  # fmt: skip
        else:
            result = _rated(
                tokens_at, view, values, rate=rate, declared_rate=declared_rate,
                learned=learned, burst=burst, in_flight=in_flight, now=now,
                max_wait=max_wait, ahead=ahead,
            )  # fmt: skip
    return result


def _rated(
    tokens_at: datetime | None,
    view: PaceView,
    values: dict[str, Any],
    *,
    rate: float,
    declared_rate: float | None,
    learned: float | None,
    burst: int,
    in_flight: int,
    now: datetime,
    max_wait: float,
    ahead: bool,
) -> SlotResult:
    """:func:`_slot`'s decision when a positive ``rate`` applies (the lowest of the
    declared, adaptive and learnt ones)."""
    quota = view.quota
    # A declared burst is the connector's; an adaptive rate sends one at a time.
    # Reserved ahead, a declared or learnt rate's slots reach DECLARED_HORIZON (a
    # learnt rate moves slowly: a cut is regained in recover seconds; at 0.5 s a
    # tenant learnt at 2-4/s reserved every request alone); a quota's stop at its
    # reset and at its remaining requests (those in flight reserved), so they
    # never spend more than the quota the API reported.
    declared = declared_rate is not None and rate == declared_rate
    reach: tuple[float, int] | None = None
    if ahead and (declared or (learned is not None and rate == learned)):
        reach = (DECLARED_HORIZON, RESERVE_MAX)
    elif ahead and quota is not None and quota.reset_at is not None:
        left = quota.remaining - max(in_flight, 0) if quota.remaining is not None else 0
        until_reset = (quota.reset_at - now).total_seconds()
        reach = (min(RESERVE_HORIZON, until_reset), min(RESERVE_MAX, left))
    if reach is not None and reach[1] >= 1:
        waits, tat = reserve_slots(
            tokens_at,
            now,
            rate=rate,
            burst=burst if declared else 1,
            max_wait=max_wait,
            horizon=reach[0],
            most=reach[1],
        )
        if tat is not None:
            values["tokens_at"] = tat
            why = "rate" if waits[0] > 0 else ""
            # Whichever rate reserved, a later slot by the declared rate (the
            # fastest any process may send) goes no earlier than this.
            opens = (
                schedule_opens_at(tat, rate=declared_rate, burst=burst)
                if declared_rate is not None
                else None
            )
            return SlotResult(waits[0], why, True, view, tuple(waits[1:]), 1 / rate, opens)
        slot = reserve_slot(tokens_at, now, rate=rate, burst=burst if declared else 1)
        return SlotResult(slot.wait, "rate", False, view)
    slot = reserve_slot(tokens_at, now, rate=rate, burst=burst if declared_rate else 1)
    if slot.wait <= max_wait:
        values["tokens_at"] = slot.tat
        return SlotResult(slot.wait, "rate" if slot.wait > 0 else "", True, view)
    return SlotResult(slot.wait, "rate", False, view)


def read_pace_sync(conn: SyncConn, key: str) -> PaceView:
    """:func:`read_pace` in the caller's transaction (a poll job reads it with the tenant)."""
    row = read_pace_row_sync(conn, key)
    if row is None:
        return PaceView(None, None)
    return PaceView(
        _later(row.next_available_at, row.parent_available_at), _quota_of(row), row.learned_rate
    )


async def read_pace(db: Database, key: str) -> PaceView:
    """The resource's pacing as stored (a process caches it briefly between requests)."""
    return await db.run_read(read_pace_sync, key)


async def resource_wait(db: Database, key: str, now: datetime) -> float:
    """Seconds until ``key`` may be called: its own and its parent's ``next_available_at``."""
    view = await read_pace(db, key)
    if view.available_at is None:
        return 0.0
    return max(0.0, (view.available_at - now).total_seconds())


async def defer_resource(
    target: Database | Conn,
    key: str,
    until: datetime,
    reason: str,
    *,
    now: datetime | None = None,
) -> bool:
    """:func:`defer_resource_sync` in its own transaction (a Database) or the caller's."""
    now = now or utcnow()
    if isinstance(target, Database):
        return await target.write(_defer_kw, key, until, reason, now)
    return await target.run_sync(_defer_kw, key, until, reason, now)


def _defer_kw(conn: SyncConn, key: str, until: datetime, reason: str, now: datetime) -> bool:
    return defer_resource_sync(conn, key, until, reason, now=now)
