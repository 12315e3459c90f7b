"""Pacing decisions (pure): how long a rate limit paces a resource, and at what rate to send.

Three decisions, each values in and a frozen value out; the runtime
(:mod:`synckit.runtime.http.pacing`, :mod:`synckit.runtime.http.client`) stores and applies them:

* :func:`pace_decision`: a rate-limited answer paces the resource until a moment. The
  server's wait wins (the longest of ``retry-after-ms`` and ``Retry-After``, then an
  exhausted quota's reset); a limit that names no wait paces for :func:`default_pace`,
  which starts short (a second; a provider's documented first wait for a signal it
  recognises, such as GitHub's secondary limit) and grows on each repeat while the
  refusals continue, up to a cap; a success after the pace ended restarts it. Requests
  already in flight when the limit hit are one event: their 429s neither grow the
  streak nor push the pace further than the event's own.
* :func:`learn_from_limit` / :func:`learn_from_successes`: the request rate learnt for
  an API that declares nothing (additive increase on success, multiplicative decrease
  on a refusal): a :class:`LearnedRate`.
* :func:`quota_rate`: the request rate that spreads a reported quota's remaining requests
  (minus those already in flight) over the time until it resets; :func:`slots_before`
  says whether a declared rate could spend more than they are before the reset.
* :func:`reserve_slots`: the places of the next few requests of one process at once;
* :func:`reserve_slot`: one request's place on a resource's shared schedule (GCRA, the
  "virtual scheduling" form of a token bucket): when it may go, and the schedule after it.

Every wait is clamped to the policy's ``max_wait`` (:mod:`synckit.errors.waits`) and no
arithmetic here can overflow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING

from synckit.errors.classify import Classification, ErrorClass
from synckit.errors.exceptions import ConfigurationError
from synckit.errors.waits import DEFAULT_MAX_WAIT, clamp_wait, moment_after, seconds_wait

__all__ = [
    "DEFAULT_FIRST_WAITS",
    "LearnedRate",
    "PaceDecision",
    "PacePolicy",
    "Slot",
    "default_pace",
    "learn_from_limit",
    "learn_from_successes",
    "pace_decision",
    "quota_rate",
    "reserve_slot",
    "reserve_slots",
    "schedule_opens_at",
    "slots_before",
]

_ZERO = timedelta(0)
#: What slots_before answers for "more than any quota".
_MANY = 2**62


#: Provider-sized first waits for rate-limit signals that carry no wait (the
#: ``Classification.signal`` that :func:`~synckit.errors.classify.classify` sets): GitHub
#: documents "wait at least one minute" for its secondary rate limits, Salesforce's
#: ``REQUEST_LIMIT_EXCEEDED`` is a rolling 24-hour allocation that a second's pace would
#: only spend attempts on.
DEFAULT_FIRST_WAITS: Mapping[str, timedelta] = MappingProxyType(
    {
        "github_secondary_rate_limit": timedelta(seconds=60),
        "REQUEST_LIMIT_EXCEEDED": timedelta(seconds=60),
    }
)


def _duration(value: object, name: str) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return timedelta(seconds=value) if abs(value) < 1e11 else timedelta(days=10**6)
    raise ConfigurationError(f"invalid PacePolicy: {name} must be seconds or a timedelta")


@dataclass(frozen=True)
class PacePolicy:
    """How a rate limit that names no wait paces its resource, the cap on every pace, and
    how a rate is learnt for an API that declares none.

    A connector declares its own as a class attribute (``pace = PacePolicy(first=1.0,
    cap=300, growth=2.0)``; durations in seconds or as timedeltas). The n-th such limit
    in a row paces for ``min(first * growth ** (n - 1), cap, max_wait)``; ``first_waits``
    replaces ``first`` for a provider signal that names no wait
    (:data:`DEFAULT_FIRST_WAITS`). A limit is "in a row" unless a request sent after the
    previous pace ended succeeded, or it comes ``forget_after`` or more after that pace
    ended. Inside a streak (2nd in a row or later) a server's wait shorter than the
    streak's default pace is raised to it: a ``Retry-After: 0`` never shortens the
    backoff the refusals have earned.

    ``learn``: when the connector declares no :class:`~synckit.connectors.base.RateLimit`,
    refusals that name no wait teach the tenant a rate: a second one within
    ``learn_after`` of another cuts it below the rate the API let through, each
    later one
    cuts it to ``decrease`` times itself (never below ``min_rate`` requests a second), and
    each success raises it additively, so that a cut is regained in ``recover``
    (:func:`learn_from_limit`, :func:`learn_from_successes`).
    """

    first: timedelta = timedelta(seconds=1)
    growth: float = 2.0
    cap: timedelta = timedelta(minutes=15)
    forget_after: timedelta = timedelta(minutes=15)
    max_wait: timedelta = DEFAULT_MAX_WAIT
    first_waits: Mapping[str, timedelta] = field(default_factory=lambda: DEFAULT_FIRST_WAITS)
    learn: bool = True
    decrease: float = 0.8
    recover: timedelta = timedelta(seconds=20)
    min_rate: float = 0.1
    learn_after: timedelta = timedelta(seconds=3)

    if TYPE_CHECKING:
        # The constructor takes durations as seconds too (``first=1.0``); the fields hold
        # timedeltas once __post_init__ ran. Only the type checker sees this signature.
        def __init__(
            self,
            first: timedelta | float = ...,
            growth: float = ...,
            cap: timedelta | float = ...,
            forget_after: timedelta | float = ...,
            max_wait: timedelta | float = ...,
            first_waits: Mapping[str, timedelta | float] = ...,
            learn: bool = ...,
            decrease: float = ...,
            recover: timedelta | float = ...,
            min_rate: float = ...,
            learn_after: timedelta | float = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        for name in ("first", "cap", "forget_after", "max_wait", "recover", "learn_after"):
            object.__setattr__(self, name, _duration(getattr(self, name), name))
        if not isinstance(self.first_waits, Mapping):
            raise ConfigurationError("invalid PacePolicy: first_waits must be a mapping")
        waits = {str(k): _duration(v, f"first_waits[{k!r}]") for k, v in self.first_waits.items()}
        object.__setattr__(self, "first_waits", MappingProxyType(waits))
        problems = [
            message
            for failed, message in (
                (self.first < _ZERO, "first must not be negative"),
                (self.cap < self.first, "cap must not be below first"),
                (self.forget_after < _ZERO, "forget_after must not be negative"),
                (self.max_wait < _ZERO, "max_wait must not be negative"),
                (not (math.isfinite(self.growth) and self.growth >= 1), "growth must be >= 1"),
                (any(w < _ZERO for w in waits.values()), "first_waits must not be negative"),
                (not 0 < self.decrease < 1, "decrease must be between 0 and 1"),
                (self.recover <= _ZERO, "recover must be positive"),
                (self.learn_after < _ZERO, "learn_after must not be negative"),
                (not (math.isfinite(self.min_rate) and self.min_rate > 0), "min_rate must be > 0"),
            )
            if failed
        ]
        if problems:
            raise ConfigurationError(f"invalid PacePolicy: {'; '.join(problems)}")


@dataclass(frozen=True)
class PaceDecision:
    """The resource is paced until ``until`` (never earlier than it already was).

    ``new_event`` is False when the answer belongs to the event already recorded (the
    request was in flight when it started, or was sent while the resource was paced):
    then nothing is to be written. ``streak`` and ``event_started_at`` are the values to
    store; ``reason`` names the signal that set the pace (``"Retry-After"``,
    ``"X-RateLimit-Reset"``, ``"RateLimit"``, ``"default pace, 3rd in a row"``, ...).
    """

    until: datetime
    streak: int
    event_started_at: datetime
    reason: str
    new_event: bool


def default_pace(streak: int, policy: PacePolicy, first: timedelta | None = None) -> timedelta:
    """The pace of the ``streak``-th rate limit in a row that named no wait (1-based);
    ``first`` replaces the policy's first pace (a provider signal's, ``first_waits``)."""
    start = policy.first if first is None else max(first, _ZERO)
    top = min(max(policy.cap, start), policy.max_wait)
    exponent = max(streak, 1) - 1
    # log-space comparison: growth ** exponent may not be representable.
    if start <= _ZERO:
        return _ZERO
    limit = top / start
    if policy.growth > 1 and exponent * math.log(policy.growth) >= math.log(max(limit, 1.0)):
        return top
    return min(start * (policy.growth**exponent), top)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def pace_decision(
    classification: Classification,
    now: datetime,
    *,
    streak: int,
    sent_at: datetime | None,
    event_started_at: datetime | None,
    event_until: datetime | None,
    policy: PacePolicy,
    succeeded_at: datetime | None = None,
) -> PaceDecision | None:
    """How a rate-limited answer paces its resource; None when it is no rate limit.

    ``streak``, ``event_started_at`` and ``event_until`` are the resource's stored state
    (``rate_limit_streak``, ``rate_limited_at``, ``next_available_at``); ``sent_at`` is
    when the answered request left (None: unknown, taken as ``now``); ``succeeded_at``
    when the latest request known to have succeeded left (None: none known).

    A request sent before the current event's pace ended (in flight when the limit hit,
    or sent on a stale view while paced) belongs to that event: the streak stays, and so
    does the event's ``until``, unless the answer names a wait of its own that ends
    later, which is honoured from this answer (the server asked it; a burst answered
    together adds nothing, one answered later waits its own Retry-After). Otherwise this
    is a new event: the streak grows by one, or restarts at 1 when a request sent after
    the previous pace ended succeeded or that pace ended ``forget_after`` ago or more, and
    the resource is paced by the server's wait, else by :func:`default_pace` (from the
    policy's ``first_waits`` for the classification's ``signal``). From the second in a
    row on, a server's wait shorter than the streak's default pace is raised to it.
    """
    if classification.error_class is not ErrorClass.RATE_LIMITED:
        return None
    now = _utc(now)
    sent = _utc(sent_at) if sent_at is not None else now
    started = _utc(event_started_at) if event_started_at is not None else None
    until = _utc(event_until) if event_until is not None else None
    wait = clamp_wait(classification.retry_after, policy.max_wait)
    if until is not None and (sent < until or (started is not None and sent < started)):
        own = moment_after(now, wait, policy.max_wait) if wait is not None else None
        return PaceDecision(
            until=own if own is not None and own > until else until,
            streak=max(streak, 1),
            event_started_at=started or now,
            reason="in flight when the limit hit: same event",
            new_event=False,
        )
    relaxed = succeeded_at is not None and until is not None and _utc(succeeded_at) >= until
    fresh = until is None or streak <= 0 or relaxed or now - until >= policy.forget_after
    new_streak = 1 if fresh else streak + 1
    signal = classification.signal
    first = policy.first_waits.get(signal) if signal is not None else None
    earned = default_pace(new_streak, policy, first)
    if wait is not None:
        reason = classification.wait_source or "server wait"
        if new_streak > 1 and wait < earned:
            # The server's wait has been tried and refused again: "0" (or any short wait)
            # inside a streak never undoes the backoff the streak has earned.
            reason = f"{reason} raised to the default pace, {_ordinal(new_streak)} in a row"
            wait = earned
    else:
        wait = earned
        reason = f"default pace, {_ordinal(new_streak)} in a row"
        if first is not None:
            reason = f"{signal}: {reason}"
    return PaceDecision(
        until=moment_after(now, wait, policy.max_wait),
        streak=new_streak,
        event_started_at=now,
        reason=reason,
        new_event=True,
    )


@dataclass(frozen=True)
class LearnedRate:
    """The request rate learnt for a resource whose API declares none.

    ``rate``: requests a second the resource is held to (None: nothing learnt, no limit);
    ``peak``: the rate it was sending at when the last decrease happened, ``cut_at``:
    when. Stored in the resource's row, shared by every worker as a declared rate is.
    """

    rate: float | None = None
    peak: float | None = None
    cut_at: datetime | None = None


#: No learnt rate grows beyond this (requests a second): far above any API's limit, and
#: far below where float arithmetic on it loses meaning.
_MAX_LEARNED = 1e6


def learn_from_limit(
    state: LearnedRate,
    accepted: float | None,
    now: datetime,
    policy: PacePolicy,
    previous_at: datetime | None = None,
) -> LearnedRate:
    """The learnt rate after a new rate-limit event that named no wait.

    ``accepted`` is the rate the API let through to the reporting process (successes a
    second in its busiest second lately; None or 0: it does not know); ``previous_at``
    when the resource's previous rate-limit event began (None: there was none).

    Nothing learnt yet, one refusal alone is no limit (an API may refuse a request now
    and then): learning starts with a refusal that comes less than ``learn_after`` after
    the previous one began, and cuts the resource to ``decrease`` times ``accepted``
    (a count of one second can straddle two of the API's windows and read high; the
    peak is ``accepted``). With a learnt rate, a refusal cuts
    it to ``decrease`` times itself, and the
    rate before the cut becomes the ``peak``. A lone refusal while the learnt rate has
    not yet regained half of the last cut, made less than three ``recover`` ago, is left
    alone: the cut took the rate below where the refusals began, so this one is not the
    rate's doing (an API that refuses a share of requests at random would otherwise drive
    the rate to nothing); after that, a peak too high to be reached again (a limit that
    tightened) is forgotten. A refusal less than ``learn_after`` after the previous event
    began is not lone: refusals that close are the limit's (as when learning starts), so
    it cuts even below the last cut. A peak read too high (a count straddling two of the
    API's windows) would otherwise hold the rate above the limit, every refusal left
    alone, for three ``recover``. Pure.
    """
    if not policy.learn:
        return state
    now = _utc(now)
    since = now - _utc(previous_at) if previous_at is not None else None
    close = since is not None and timedelta(0) <= since < policy.learn_after
    if state.rate is None or not (state.rate > 0 and math.isfinite(state.rate)):
        if accepted is None or not (accepted > 0 and math.isfinite(accepted)):
            return state
        if not close:
            return state
        peak = min(accepted, _MAX_LEARNED)
        return LearnedRate(rate=max(policy.min_rate, peak * policy.decrease), peak=peak, cut_at=now)
    sending = state.rate
    if (
        not close
        and state.peak is not None
        and state.cut_at is not None
        and timedelta(0) <= now - _utc(state.cut_at) < policy.recover * 3
        and sending < state.peak * (1 + policy.decrease) / 2
    ):
        # Left alone, but never below the floor (a rate stored under another policy).
        return state if sending >= policy.min_rate else replace(state, rate=policy.min_rate)
    rate = min(max(policy.min_rate, policy.decrease * sending), _MAX_LEARNED)
    return LearnedRate(rate=rate, peak=min(sending, _MAX_LEARNED), cut_at=now)


def learn_from_successes(state: LearnedRate, successes: int, policy: PacePolicy) -> LearnedRate:
    """The learnt rate after ``successes`` more requests succeeded: additive increase.

    Each success adds ``(1 - decrease) * peak / (recover * rate)``: a resource sending
    at its learnt rate regains a cut in ``recover`` seconds, then keeps probing upwards
    at the same slope. Nothing learnt stays nothing. Pure.
    """
    if state.rate is None or successes <= 0 or not policy.learn:
        return state
    peak = state.peak if state.peak is not None else state.rate
    step = (1 - policy.decrease) * peak / (policy.recover.total_seconds() * max(state.rate, 1e-9))
    rate = min(state.rate + step * min(successes, 10**9), _MAX_LEARNED)
    return LearnedRate(rate=rate, peak=state.peak, cut_at=state.cut_at)


def quota_rate(
    remaining: int | None,
    reset_at: datetime | None,
    now: datetime,
    *,
    in_flight: int = 0,
) -> float | None:
    """Requests per second that spread a quota's remaining requests until its reset.

    ``in_flight`` requests already sent are reserved out of ``remaining`` (they will
    count against it). None when the quota is unknown or its reset has passed (a new
    window, nothing known about it yet); 0.0 when nothing is left before the reset.
    """
    if remaining is None or reset_at is None:
        return None
    seconds = (_utc(reset_at) - _utc(now)).total_seconds()
    if seconds <= 0:
        return None
    left = remaining - max(in_flight, 0)
    if left <= 0:
        return 0.0
    return left / seconds


def slots_before(
    tat: datetime | None,
    now: datetime,
    moment: datetime,
    *,
    rate: float,
    burst: int = 1,
) -> int:
    """How many requests a schedule stored at ``tat`` (:func:`reserve_slot`'s) lets go
    from ``now`` until before ``moment``, at most: request ``k`` may go at
    ``max(tat, now) + k / rate``, less the burst's ``burst - 1`` intervals."""
    now, moment = _utc(now), _utc(moment)
    if not (rate > 0 and math.isfinite(rate)) or moment <= now:
        return 0
    interval = _interval(rate, DEFAULT_MAX_WAIT)  # as reserve_slot rounds it
    start = now if tat is None or _utc(tat) < now else _utc(tat)
    opens = _allowed_at(start, interval, burst, DEFAULT_MAX_WAIT)
    if opens is None or interval <= _ZERO:
        return _MANY
    if moment <= opens:
        return 0
    return min(math.ceil((moment - opens) / interval), _MANY)


@dataclass(frozen=True)
class Slot:
    """A request may go ``wait`` seconds from now; ``tat`` is the schedule to store after it."""

    wait: float
    tat: datetime


def reserve_slot(
    tat: datetime | None,
    now: datetime,
    *,
    rate: float,
    burst: int = 1,
    cap: timedelta = DEFAULT_MAX_WAIT,
) -> Slot:
    """Reserve one request on a schedule of ``rate`` requests per second, ``burst`` at once.

    ``tat`` is the schedule's theoretical arrival time (None: a fresh schedule). The
    request may go once ``tat - (burst - 1) / rate`` has passed; the schedule then moves
    one interval on from ``max(tat, now)``. A ``tat`` ahead of ``now`` is honoured as it
    is, so a host whose clock runs behind never gets an earlier slot. Intervals are
    clamped to ``cap``; a non-positive or non-finite rate paces by the cap.
    """
    now = _utc(now)
    interval = _interval(rate, cap)
    start = now if tat is None or _utc(tat) < now else _utc(tat)
    allowed_at = _allowed_at(start, interval, burst, cap)
    wait = max((allowed_at - now).total_seconds(), 0.0) if allowed_at is not None else 0.0
    return Slot(wait=wait, tat=moment_after(start, interval, cap))


def _interval(rate: float, cap: timedelta) -> timedelta:
    return seconds_wait(1.0 / rate, cap) if rate > 0 else cap  # NaN fails rate > 0


def _allowed_at(tat: datetime, interval: timedelta, burst: int, cap: timedelta) -> datetime | None:
    """When a request may go on a schedule at ``tat`` (None: at any time)."""
    extra = max(burst - 1, 0)
    # Compared before multiplying: interval * burst may not fit a timedelta.
    tolerance = cap if interval > _ZERO and extra >= cap / interval else interval * extra
    try:
        return tat - tolerance
    except OverflowError:  # a tat near datetime.min: nothing to wait for
        return None


def schedule_opens_at(
    tat: datetime, *, rate: float, burst: int = 1, cap: timedelta = DEFAULT_MAX_WAIT
) -> datetime | None:
    """The earliest moment any further request may go on a schedule stored at ``tat``
    (:func:`reserve_slot`'s schedule): ``burst - 1`` intervals before it. None: no bound
    (a schedule so far in the past that every request may go)."""
    return _allowed_at(_utc(tat), _interval(rate, cap), burst, cap)


#: How far ahead one process reserves a reported quota's slots (:func:`reserve_slots`).
RESERVE_HORIZON = 0.5
#: How far ahead one process reserves a declared (or learnt) rate's slots. Longer than a
#: quota's rate (which changes with every answer): at 0.5 s a tenant paced at 10/s on
#: PostgreSQL spent ~10% more worker CPU on its reservations, and each one's round trip
#: was a chance to start a slot late.
DECLARED_HORIZON = 1.0
#: The most slots one reservation takes.
RESERVE_MAX = 16


def reserve_slots(
    tat: datetime | None,
    now: datetime,
    *,
    rate: float,
    burst: int = 1,
    max_wait: float,
    cap: timedelta = DEFAULT_MAX_WAIT,
    horizon: float = RESERVE_HORIZON,
    most: int = RESERVE_MAX,
) -> tuple[list[float], datetime | None]:
    """Reserve the next requests of one process on a schedule of ``rate`` per second.

    The first slot is :func:`reserve_slot`'s; further slots follow it on the same
    schedule while they fall within ``horizon`` seconds of the first and within
    ``max_wait``, up to ``most`` (and one only when ``rate * horizon`` is under 2: a slow
    rate gains nothing from reserving ahead). Returns the slots' waits from ``now``, in
    order, and the schedule to store; no slot (``[]``, None) when even the first would
    wait longer than ``max_wait``. The schedule is the one a process asking once per
    request would have left: reserving ahead costs other processes nothing they would
    have had, and an unused slot is a request not sent (never a burst later).
    """
    first = reserve_slot(tat, now, rate=rate, burst=burst, cap=cap)
    if first.wait > max_wait:
        return [], None
    waits, last = [first.wait], first.tat
    count = min(most, int(rate * horizon)) if rate > 0 and math.isfinite(rate) else 1
    while len(waits) < count:
        nxt = reserve_slot(last, now, rate=rate, burst=burst, cap=cap)
        if nxt.wait > max_wait or nxt.wait - first.wait > horizon:
            break
        waits.append(nxt.wait)
        last = nxt.tat
    return waits, last
