"""The circuit breaker as pure functions over a stored snapshot.

A breaker guards one resource (a tenant's connection, or a whole API). The runtime
keeps its :class:`BreakerSnapshot` in the ``resources`` table and, shared by every
worker, does three things with these functions:

1. before a call, the gate (:func:`synckit.errors.gate.gate`) says whether it may go,
   and whether it is the probe; the claim then stores the snapshot
   :func:`breaker_claim_probe` returns, in the same transaction, so exactly one worker
   probes;
2. after the call, :func:`breaker_transition` folds the outcome into the snapshot.

States::

    closed --(failure_threshold consecutive counted failures)--> open
    open --(cool-down elapsed, probe claimed)--> half_open
    half_open --probe success--> closed      (failures and re-open count reset)
    half_open --probe failure--> open        (cool-down doubled, up to cooldown_cap)

Breakers are for health: server errors, timeouts, resets. Failures whose classification
has ``counts_for_breaker=False`` (validation, not found, authorization, conflict) and
every rate limit (a throttled API is healthy; pacing handles it) are ``"ignored"``
outcomes: they leave the breaker as it is, except that an ignored probe result releases
the probe so another can be claimed. A first opening lasts the server's wait when the
failure carried one (an outage that says "3 s left" opens 3 s), else ``cooldown``; only
re-openings grow. A probe whose worker died is presumed lost after ``probe_timeout``.

The claim decides the gate in SQL (``store/jobs/claiming.py``), held to it by a property test
on both engines; it stores :func:`breaker_claim_probe`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Literal

from synckit.errors.classify import Classification, ErrorClass
from synckit.errors.exceptions import ConfigurationError
from synckit.errors.waits import clamp_wait, moment_after

__all__ = [
    "BreakerOutcome",
    "BreakerPolicy",
    "BreakerSnapshot",
    "BreakerState",
    "breaker_claim_probe",
    "breaker_outcome",
    "breaker_transition",
    "open_cooldown",
    "reopen_cooldown",
]


_MICROSECOND = timedelta(microseconds=1)
# Doubling past this many re-opens exceeds any cap a timedelta can hold.
_MAX_DOUBLINGS = 64


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class BreakerOutcome(StrEnum):
    """What a call through the breaker did, as far as the breaker cares."""

    SUCCESS = "success"
    FAILURE = "failure"
    IGNORED = "ignored"


@dataclass(frozen=True)
class BreakerSnapshot:
    """The stored state of one breaker. ``BreakerSnapshot()`` is a fresh, closed one.

    ``cooldown_until`` is when an open breaker lets a probe through;
    ``probe_expires_at`` is when a claimed probe is presumed lost.
    """

    state: BreakerState = BreakerState.CLOSED
    consecutive_failures: int = 0
    opened_at: datetime | None = None
    reopen_count: int = 0
    cooldown_until: datetime | None = None
    probe_in_flight: bool = False
    probe_expires_at: datetime | None = None
    #: The failure-rate window while closed: when it started, counted calls, failures.
    window_start: datetime | None = None
    window_calls: int = 0
    window_failures: int = 0


@dataclass(frozen=True)
class BreakerPolicy:
    """``cooldown`` is the first open period when the server gave no wait; each re-open
    doubles it, up to ``cooldown_cap``. ``probe_timeout`` bounds how long one claimed
    probe blocks others (its worker may have died)."""

    failure_threshold: int = 5
    # Short: an outage usually ends in seconds, and a probe every few seconds is cheap.
    cooldown: timedelta = timedelta(seconds=5)
    cooldown_cap: timedelta = timedelta(minutes=10)
    probe_timeout: timedelta = timedelta(minutes=5)
    #: The API-wide breaker opens when at least this many of its tenants' breakers are
    #: open, and they are at least ``global_ratio`` of its tenants.
    global_min_tenants: int = 3
    global_ratio: float = 0.5
    #: A closed breaker also opens when, within ``rate_window``, at least
    #: ``rate_min_calls`` counted calls were made and ``rate_threshold`` of them failed
    #: (an API failing every other call never reaches N failures in a row). None: off.
    rate_threshold: float | None = 0.5
    rate_window: timedelta = timedelta(minutes=1)
    rate_min_calls: int = 20

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ConfigurationError("failure_threshold must be at least 1")
        if self.cooldown < timedelta(0) or self.cooldown_cap < self.cooldown:
            raise ConfigurationError("need 0 <= cooldown <= cooldown_cap")
        if self.rate_threshold is not None and not 0 < self.rate_threshold <= 1:
            raise ConfigurationError("rate_threshold must be in (0, 1], or None")
        if self.rate_min_calls < 1 or self.rate_window <= timedelta(0):
            raise ConfigurationError("need rate_min_calls >= 1 and a positive rate_window")
        if self.probe_timeout <= timedelta(0):
            raise ConfigurationError("probe_timeout must be positive")


_DEFAULT_POLICY = BreakerPolicy()


def _utc(moment: datetime) -> datetime:
    # SQLite hands timestamps back naive; they are stored as UTC.
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _before(now: datetime, deadline: datetime | None) -> bool:
    return deadline is not None and _utc(now) < _utc(deadline)


def breaker_outcome(classification: Classification | None) -> BreakerOutcome:
    """The outcome of a call that succeeded (None) or failed with ``classification``."""
    if classification is None:
        return BreakerOutcome.SUCCESS
    if classification.error_class is ErrorClass.RATE_LIMITED:
        return BreakerOutcome.IGNORED  # a throttled API is healthy: pacing handles it
    if not classification.counts_for_breaker:
        return BreakerOutcome.IGNORED
    return BreakerOutcome.FAILURE


def reopen_cooldown(reopen_count: int, policy: BreakerPolicy = _DEFAULT_POLICY) -> timedelta:
    """How long the breaker stays open after its ``reopen_count``-th re-open (0: first open)."""
    doublings = min(max(reopen_count, 0), _MAX_DOUBLINGS)
    # Integer microseconds: doubling an int cannot overflow the way timedelta * 2**n can.
    grown = (policy.cooldown // _MICROSECOND) << doublings
    return min(policy.cooldown_cap // _MICROSECOND, grown) * _MICROSECOND


def open_cooldown(
    reopen_count: int, server_wait: timedelta | None, policy: BreakerPolicy = _DEFAULT_POLICY
) -> timedelta:
    """How long the breaker stays open after its ``reopen_count``-th re-open (0: first),
    when the failure that opened it carried ``server_wait`` (None: the server gave none).

    A first opening honours the server's wait, clamped to ``[0, cooldown_cap]``; a
    re-opening grows as :func:`reopen_cooldown`, and is never shorter than the wait.
    """
    grown = reopen_cooldown(reopen_count, policy)
    asked = clamp_wait(server_wait, policy.cooldown_cap)
    if asked is None:
        return grown
    if reopen_count <= 0:
        return asked
    return max(asked, grown)


def breaker_claim_probe(
    snapshot: BreakerSnapshot, now: datetime, policy: BreakerPolicy = _DEFAULT_POLICY
) -> BreakerSnapshot:
    """The snapshot to store when claiming the probe the gate offered."""
    return replace(
        snapshot,
        state=BreakerState.HALF_OPEN,
        probe_in_flight=True,
        probe_expires_at=moment_after(_utc(now), policy.probe_timeout, policy.probe_timeout),
    )


def breaker_transition(
    snapshot: BreakerSnapshot,
    outcome: BreakerOutcome | Literal["success", "failure", "ignored"],
    now: datetime,
    policy: BreakerPolicy = _DEFAULT_POLICY,
    *,
    server_wait: timedelta | None = None,
) -> BreakerSnapshot:
    """The snapshot after a call through the breaker ended with ``outcome``.

    ``server_wait`` is the wait the failed response asked for (its ``Retry-After``), which
    an opening honours (see :func:`open_cooldown`).

    An outcome that arrives while the breaker is open counts as a probe result once
    the cool-down has elapsed (the runtime may skip the half-open claim for a single
    worker); before that it is a straggler started while closed, and changes nothing.
    """
    outcome = BreakerOutcome(outcome)
    if outcome is BreakerOutcome.IGNORED:
        if snapshot.state is BreakerState.HALF_OPEN and snapshot.probe_in_flight:
            # The probe got an answer that says nothing about health: let another probe.
            return replace(snapshot, probe_in_flight=False, probe_expires_at=None)
        return snapshot

    if snapshot.state is BreakerState.CLOSED:
        failed = outcome is BreakerOutcome.FAILURE
        windowed = _count_in_window(snapshot, failed, now, policy)
        if not failed:
            return replace(windowed, consecutive_failures=0)
        failures = snapshot.consecutive_failures + 1
        if failures >= policy.failure_threshold or _rate_trips(windowed, policy):
            return _open(now, policy, failures=failures, reopen_count=0, server_wait=server_wait)
        return replace(windowed, consecutive_failures=failures)

    if snapshot.state is BreakerState.OPEN and _before(now, snapshot.cooldown_until):
        return snapshot

    # A probe result (half-open, or open with the cool-down over).
    if outcome is BreakerOutcome.SUCCESS:
        return BreakerSnapshot()
    return _open(
        now,
        policy,
        failures=snapshot.consecutive_failures + 1,
        reopen_count=snapshot.reopen_count + 1,
        server_wait=server_wait,
    )


def _count_in_window(
    snapshot: BreakerSnapshot, failed: bool, now: datetime, policy: BreakerPolicy
) -> BreakerSnapshot:
    """Count a call in the failure-rate window, which a failure opens and which lasts
    ``rate_window``: a healthy resource has no window, so its successes write nothing."""
    start = snapshot.window_start
    if start is None or _utc(now) - _utc(start) >= policy.rate_window:
        if not failed:
            return replace(snapshot, window_start=None, window_calls=0, window_failures=0)
        return replace(snapshot, window_start=_utc(now), window_calls=1, window_failures=1)
    return replace(
        snapshot,
        window_calls=snapshot.window_calls + 1,
        window_failures=snapshot.window_failures + int(failed),
    )


def _rate_trips(snapshot: BreakerSnapshot, policy: BreakerPolicy) -> bool:
    if policy.rate_threshold is None or snapshot.window_calls < policy.rate_min_calls:
        return False
    return snapshot.window_failures / snapshot.window_calls >= policy.rate_threshold


def breaker_open(
    snapshot: BreakerSnapshot, now: datetime, policy: BreakerPolicy = _DEFAULT_POLICY
) -> BreakerSnapshot:
    """Open the breaker now (a re-open doubles the cool-down), whatever its failure count."""
    reopen = snapshot.reopen_count + 1 if snapshot.opened_at is not None else 0
    return _open(now, policy, failures=snapshot.consecutive_failures, reopen_count=reopen)


def global_breaker_trips(
    open_tenants: int, tenants: int, policy: BreakerPolicy = _DEFAULT_POLICY
) -> bool:
    """Whether an API's breaker should open: many of its tenants failing together.

    One broken tenant is that tenant's problem; several at once is the API's.
    """
    if tenants <= 0 or open_tenants < policy.global_min_tenants:
        return False
    return open_tenants / tenants >= policy.global_ratio


def _open(
    now: datetime,
    policy: BreakerPolicy,
    *,
    failures: int,
    reopen_count: int,
    server_wait: timedelta | None = None,
) -> BreakerSnapshot:
    now = _utc(now)
    return BreakerSnapshot(
        state=BreakerState.OPEN,
        consecutive_failures=failures,
        opened_at=now,
        reopen_count=reopen_count,
        cooldown_until=moment_after(
            now, open_cooldown(reopen_count, server_wait, policy), policy.cooldown_cap
        ),
        probe_in_flight=False,
        probe_expires_at=None,
    )
