"""How long to wait before the next attempt: one small pure function, :func:`retry_delay`,
over the one backoff formula, :func:`backoff_delay`.

The computed backoff is exponential with *equal-ish jitter*: the exponential delay
``d = min(cap, base * multiplier ** (attempt - 1))`` is multiplied by ``1 - jitter * u``
with ``u`` uniform in [0, 1). The default ``jitter=0.5`` is equal jitter (a delay in
[d/2, d]): it spreads a crowd of workers that failed together, while still guaranteeing
that the waits grow. ``jitter=1.0`` is AWS-style full jitter, ``0.0`` none. Every backoff
in synckit is this formula with its own knobs: job retries and the outbox relay (through
:class:`RetryPolicy`), dead-letter replays (:func:`synckit.errors.dlq_policy.next_retry_delay`)
and the alert webhook's attempts (:class:`synckit.runtime.observe.alert_delivery.WebhookSink`).

A wait the server asked for always wins over the computed backoff, even when it is
shorter: the server knows. It gets a safety buffer (default +20%), because clocks
differ and servers round. Every delay is at least ``floor``, so a ``Retry-After: 0``
cannot make a retry loop spin, and at most ``max_wait`` (default
:data:`~synckit.errors.waits.DEFAULT_MAX_WAIT`, 24 h), however long the wait asked for:
every delay lies in ``[floor, min(max_wait, max(cap, server_wait * (1 + buffer)))]``, and
a longer server wait never gives a shorter delay.

Tests of code that retries should not sleep: use ``RetryPolicy.deterministic()`` for
one policy, or :func:`set_testing` for the whole process (like ``stamina.set_testing``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from synckit.errors.classify import DEFAULT_MAX_ATTEMPTS, Classification, ErrorClass
from synckit.errors.exceptions import ConfigurationError
from synckit.errors.waits import DEFAULT_MAX_WAIT

__all__ = [
    "RetryDecision",
    "RetryPolicy",
    "backoff_delay",
    "is_testing",
    "retry_delay",
    "set_testing",
]

_MICROSECOND = timedelta(microseconds=1)
# Beyond this the exponential term has long passed any cap; clamping keeps huge attempt
# numbers from costing anything.
_MAX_EXPONENT = 100_000


@dataclass(frozen=True)
class RetryPolicy:
    """The knobs of :func:`retry_delay`.

    ``max_server_wait``: a server wait longer than this turns the decision into
    "defer the job until then" (``RetryDecision.defer``) instead of a sleep in the
    worker. ``max_attempts`` applies to classifications that carry no limit of their own
    (:func:`~synckit.errors.classify.classify` always sets one). ``fixed_delay``, when
    set, replaces every computed and server-told delay (see :meth:`deterministic`).
    ``max_wait`` bounds every delay, server-told, handler-given or computed (a
    connector's ``max_wait``).

    Raises :class:`~synckit.errors.exceptions.ConfigurationError` when the values
    cannot work together (negative durations, ``floor > cap``, ``multiplier < 1``,
    ``jitter`` outside [0, 1]).
    """

    base: timedelta = timedelta(seconds=1)
    cap: timedelta = timedelta(minutes=5)
    multiplier: float = 2.0
    jitter: float = 0.5
    server_wait_buffer: float = 0.20
    floor: timedelta = timedelta(seconds=1)
    max_server_wait: timedelta = timedelta(minutes=15)
    max_attempts: Mapping[ErrorClass, int] = field(default_factory=lambda: DEFAULT_MAX_ATTEMPTS)
    fixed_delay: timedelta | None = None
    max_wait: timedelta = DEFAULT_MAX_WAIT

    def __post_init__(self) -> None:
        zero = timedelta(0)
        problems = [
            message
            for failed, message in (
                (self.base < zero, "base must not be negative"),
                (self.floor < zero, "floor must not be negative"),
                (self.floor > self.cap, "floor must not exceed cap"),
                (self.max_server_wait < zero, "max_server_wait must not be negative"),
                (self.floor > self.max_wait, "floor must not exceed max_wait"),
                (not (math.isfinite(self.multiplier) and self.multiplier >= 1), "multiplier < 1"),
                (not 0.0 <= self.jitter <= 1.0, "jitter must be in [0, 1]"),
                (
                    not (math.isfinite(self.server_wait_buffer) and self.server_wait_buffer >= 0),
                    "server_wait_buffer must be a non-negative number",
                ),
                (
                    self.fixed_delay is not None and self.fixed_delay < zero,
                    "fixed_delay must not be negative",
                ),
            )
            if failed
        ]
        if problems:
            raise ConfigurationError(f"invalid RetryPolicy: {'; '.join(problems)}")

    @classmethod
    def deterministic(cls, delay: timedelta = timedelta(0)) -> RetryPolicy:
        """A policy for tests: every retry waits exactly ``delay``, no jitter, no defer.

        Server-told waits are ignored too, so a fake API answering ``Retry-After: 30``
        does not slow the test down. Attempt limits still apply.
        """
        return cls(
            base=delay,
            cap=delay,
            multiplier=1.0,
            jitter=0.0,
            floor=delay,
            fixed_delay=delay,
            max_wait=max(delay, DEFAULT_MAX_WAIT),
        )


@dataclass(frozen=True)
class RetryDecision:
    """Retry after ``delay``. When ``defer`` is true the runtime reschedules the job
    (and, for rate limits, the resource) for ``now + delay`` rather than sleeping.
    ``server_told`` says the delay came from the server rather than the backoff."""

    delay: timedelta
    defer: bool
    reason: str
    server_told: bool


_testing_delay: timedelta | None = None


def set_testing(enabled: bool, delay: timedelta = timedelta(0)) -> None:
    """Make every retry in this process wait exactly ``delay`` (default: no wait).

    Process-global, meant for test suites of code built on synckit; attempt limits still
    apply. ``set_testing(False)`` restores normal behaviour.
    """
    global _testing_delay
    if enabled and delay < timedelta(0):
        raise ConfigurationError("the testing delay must not be negative")
    _testing_delay = delay if enabled else None


def is_testing() -> bool:
    """Whether :func:`set_testing` is in effect."""
    return _testing_delay is not None


def retry_delay(
    classification: Classification,
    attempt: int,
    policy: RetryPolicy,
    *,
    rng: random.Random | Callable[[], float],
) -> RetryDecision | None:
    """When to retry after attempt number ``attempt`` (1-based) failed, or None for never.

    None when the class is not retryable or ``attempt`` reached the attempt limit (the
    classification's, else the policy's for the class). Never raises for any ``attempt``.
    ``rng`` returns floats in [0, 1): a :class:`random.Random` or a function; it is only
    called for computed backoffs.
    """
    if not classification.retryable:
        return None
    limit = classification.max_attempts
    if limit is None:
        limit = policy.max_attempts.get(classification.error_class)
    if limit is not None and attempt >= limit:
        return None
    server_told = classification.retry_after is not None
    top = policy.max_wait

    if _testing_delay is not None:
        delay = min(_testing_delay, top)
        return RetryDecision(delay, False, "testing mode: fixed delay", server_told)
    if policy.fixed_delay is not None:
        delay = min(policy.fixed_delay, top)
        return RetryDecision(delay, False, "deterministic policy", server_told)

    wait = classification.retry_after
    if wait is not None and wait >= timedelta(0):
        delay = _buffered(wait, policy)
        defer = wait > policy.max_server_wait
        reason = f"server asked for {_show(wait)}, waiting {_show(delay)}"
        if wait > top:
            reason += f" (capped at max_wait {_show(top)})"
        if defer:
            reason += f" (over {_show(policy.max_server_wait)}: deferred)"
        return RetryDecision(delay, defer, reason, True)

    delay = min(_backoff(policy, attempt, _uniform(rng)), top)
    return RetryDecision(
        delay, False, f"backoff after attempt {attempt}: {_show(delay)}", server_told=False
    )


def _buffered(wait: timedelta, policy: RetryPolicy) -> timedelta:
    """``max(floor, wait * (1 + buffer))`` within ``max_wait``, monotone, never overflowing."""
    top = policy.max_wait
    # Clamped first, so the product stays far below timedelta's range; the product is
    # monotone in the wait, and so is each min/max applied after it.
    base = min(wait, top)
    try:
        grown = base * (1.0 + policy.server_wait_buffer)
    except OverflowError:  # a max_wait of millennia times a huge buffer
        grown = top
    return min(max(policy.floor, grown), top)


def _uniform(rng: random.Random | Callable[[], float]) -> float:
    return rng.random() if isinstance(rng, random.Random) else rng()


def _backoff(policy: RetryPolicy, attempt: int, uniform: float) -> timedelta:
    return backoff_delay(
        attempt,
        uniform,
        base=policy.base,
        cap=policy.cap,
        multiplier=policy.multiplier,
        jitter=policy.jitter,
        floor=policy.floor,
    )


def backoff_delay(
    attempt: int,
    uniform: float,
    *,
    base: timedelta,
    cap: timedelta,
    multiplier: float = 2.0,
    jitter: float = 0.5,
    floor: timedelta = timedelta(0),
) -> timedelta:
    """The wait after failed attempt number ``attempt`` (1-based; below 1 counts as 1):
    ``d = min(cap, base * multiplier ** (attempt - 1))``, less up to ``jitter`` of it
    (``d * (1 - jitter * uniform)``), and never less than ``floor``.

    ``uniform`` is a draw in [0, 1]; anything else (NaN, out of range: a bad source)
    counts as 0, so the result always lies in ``[max(floor, (1 - jitter) d), max(floor,
    d)]``. Computed in whole microseconds, so no float rounding crosses ``cap`` or
    ``floor``, and any ``attempt`` costs the same and never overflows. ``ValueError``
    for a negative duration, a ``multiplier`` below 1 or a ``jitter`` outside [0, 1].
    """
    zero = timedelta(0)
    if base < zero or cap < zero or floor < zero:
        raise ValueError("backoff durations must not be negative")
    if not (math.isfinite(multiplier) and multiplier >= 1):
        raise ValueError(f"multiplier must be a number of at least 1, got {multiplier}")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError(f"jitter must be in [0, 1], got {jitter}")
    u = uniform if 0.0 <= uniform <= 1.0 else 0.0
    top = cap // _MICROSECOND
    start = base // _MICROSECOND
    exponent = min(max(attempt - 1, 0), _MAX_EXPONENT)
    try:
        grown = start * float(multiplier) ** exponent
    except OverflowError:
        grown = math.inf if start else 0.0
    raw = top if grown >= top else int(grown)
    jittered = min(raw, int(raw * (1.0 - jitter * u)))
    return max(floor // _MICROSECOND, jittered) * _MICROSECOND


def _show(delay: timedelta) -> str:
    return f"{delay.total_seconds():g}s"
