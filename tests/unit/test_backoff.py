"""retry_delay(): server-told waits, exponential backoff with jitter, limits, test modes;
backoff_delay(), the one formula every backoff in synckit uses."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples  # type: ignore[import-not-found]

from synckit.errors import (
    Classification,
    ErrorClass,
    RetryPolicy,
    is_testing,
    retry_delay,
    set_testing,
)
from synckit.errors.backoff import backoff_delay
from synckit.errors.exceptions import ConfigurationError

NO_JITTER = RetryPolicy(jitter=0.0)


def verdict(
    error_class: ErrorClass = ErrorClass.TRANSIENT,
    *,
    retryable: bool = True,
    max_attempts: int | None = 100,
    retry_after: timedelta | None = None,
) -> Classification:
    return Classification(
        error_class=error_class,
        retryable=retryable,
        max_attempts=max_attempts,
        surface=False,
        retry_after=retry_after,
        reason="test",
    )


def always(value: float) -> random.Random:
    rng = random.Random()
    rng.random = lambda: value  # type: ignore[method-assign]  # a fixed draw for the test
    return rng


@pytest.fixture(autouse=True)
def _no_testing_mode() -> Iterator[None]:
    set_testing(False)
    yield
    set_testing(False)


# --- server-told waits ---------------------------------------------------------------


def test_server_wait_gets_the_buffer() -> None:
    """Retry-After: 30 becomes 36 s with the default 20% buffer, and is marked server-told."""
    decision = retry_delay(
        verdict(retry_after=timedelta(seconds=30)), 1, RetryPolicy(), rng=always(0)
    )
    assert decision is not None
    assert decision.delay == timedelta(seconds=36)
    assert decision.server_told
    assert not decision.defer


def test_server_wait_wins_even_when_shorter_than_backoff() -> None:
    """A short server wait beats a long computed backoff on a late attempt."""
    c = verdict(retry_after=timedelta(seconds=2))
    decision = retry_delay(c, 20, NO_JITTER, rng=always(0))
    assert decision is not None
    assert decision.delay == timedelta(seconds=2.4)


def test_zero_server_wait_is_raised_to_the_floor() -> None:
    """Retry-After: 0 waits the floor, so a retry loop cannot spin."""
    c = verdict(retry_after=timedelta(0))
    decision = retry_delay(c, 1, RetryPolicy(floor=timedelta(milliseconds=500)), rng=always(0))
    assert decision is not None
    assert decision.delay == timedelta(milliseconds=500)


def test_server_wait_beyond_max_server_wait_defers() -> None:
    """A wait longer than max_server_wait defers the job instead of sleeping in the worker."""
    c = verdict(ErrorClass.RATE_LIMITED, retry_after=timedelta(hours=1))
    decision = retry_delay(c, 1, RetryPolicy(), rng=always(0))
    assert decision is not None
    assert decision.defer
    assert decision.delay == timedelta(hours=1.2)
    assert "deferred" in decision.reason


def test_server_wait_at_max_server_wait_does_not_defer() -> None:
    """Exactly max_server_wait is still a sleep."""
    c = verdict(retry_after=timedelta(minutes=15))
    decision = retry_delay(c, 1, RetryPolicy(), rng=always(0))
    assert decision is not None
    assert not decision.defer


def test_negative_server_wait_falls_back_to_backoff() -> None:
    """A negative wait on a hand-built classification is ignored."""
    decision = retry_delay(verdict(retry_after=timedelta(seconds=-5)), 1, NO_JITTER, rng=always(0))
    assert decision is not None
    assert decision.delay == timedelta(seconds=1)
    assert not decision.server_told


# --- computed backoff ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "seconds"),
    [(1, 1), (2, 2), (3, 4), (4, 8), (8, 128), (9, 256), (10, 300), (50, 300)],
)
def test_exponential_backoff_without_jitter_is_capped(attempt: int, seconds: int) -> None:
    """base * 2**(attempt-1), capped at 5 minutes."""
    decision = retry_delay(verdict(), attempt, NO_JITTER, rng=always(0.9))
    assert decision is not None
    assert decision.delay == timedelta(seconds=seconds)
    assert not decision.server_told


def test_equal_jitter_spans_half_to_full_delay() -> None:
    """The default jitter (0.5) gives delays between d/2 and d."""
    policy = RetryPolicy()
    high = retry_delay(verdict(), 4, policy, rng=always(0.0))
    low = retry_delay(verdict(), 4, policy, rng=always(0.999999))
    assert high is not None and low is not None
    assert high.delay == timedelta(seconds=8)
    assert timedelta(seconds=4) <= low.delay < timedelta(seconds=4.001)


def test_full_jitter_is_still_floored() -> None:
    """Full jitter with a draw near 1 gives the floor, never zero."""
    policy = RetryPolicy(jitter=1.0, floor=timedelta(seconds=1))
    decision = retry_delay(verdict(), 3, policy, rng=always(0.99999))
    assert decision is not None
    assert decision.delay == timedelta(seconds=1)


def test_rng_may_be_a_plain_function() -> None:
    """rng accepts a zero-argument callable as well as random.Random."""
    decision = retry_delay(verdict(), 2, RetryPolicy(), rng=lambda: 0.5)
    assert decision is not None
    assert decision.delay == timedelta(seconds=1.5)


@pytest.mark.parametrize("bad", [float("nan"), -1.0, 7.0])
def test_out_of_range_rng_cannot_push_delay_out_of_bounds(bad: float) -> None:
    """A broken random source is treated as 0 (no jitter reduction)."""
    decision = retry_delay(verdict(), 3, RetryPolicy(), rng=lambda: bad)
    assert decision is not None
    assert decision.delay == timedelta(seconds=4)


def test_huge_attempt_number_gives_the_cap() -> None:
    """A billion-and-more attempt does not overflow: it is simply capped."""
    c = verdict(max_attempts=None)
    decision = retry_delay(c, 10**100, RetryPolicy(max_attempts={}), rng=always(0))
    assert decision is not None
    assert decision.delay == timedelta(minutes=5)


def test_zero_or_negative_attempt_is_treated_as_the_first() -> None:
    """Nonsense attempt numbers get the first delay rather than an error."""
    for attempt in (0, -5, -(10**50)):
        decision = retry_delay(verdict(), attempt, NO_JITTER, rng=always(0))
        assert decision is not None
        assert decision.delay == timedelta(seconds=1)


# --- limits --------------------------------------------------------------------------


def test_not_retryable_gives_none() -> None:
    """A non-retryable classification is never retried, whatever the attempt."""
    assert retry_delay(verdict(retryable=False), 1, RetryPolicy(), rng=always(0)) is None


def test_attempt_limit_of_the_classification() -> None:
    """With max_attempts=3, attempts 1 and 2 retry and attempt 3 is the last."""
    c = verdict(max_attempts=3)
    assert retry_delay(c, 2, RetryPolicy(), rng=always(0)) is not None
    assert retry_delay(c, 3, RetryPolicy(), rng=always(0)) is None
    assert retry_delay(c, 10**30, RetryPolicy(), rng=always(0)) is None


def test_policy_limit_applies_when_classification_has_none() -> None:
    """A classification without a limit uses the policy's limit for its class."""
    c = verdict(ErrorClass.CONFLICT, max_attempts=None)
    policy = RetryPolicy(max_attempts={ErrorClass.CONFLICT: 2})
    assert retry_delay(c, 1, policy, rng=always(0)) is not None
    assert retry_delay(c, 2, policy, rng=always(0)) is None


def test_default_policy_limits_match_classify_defaults() -> None:
    """The default policy falls back to the same per-class limits classify uses."""
    c = verdict(ErrorClass.SERVER_ERROR, max_attempts=None)
    assert retry_delay(c, 2, RetryPolicy(), rng=always(0)) is not None
    assert retry_delay(c, 3, RetryPolicy(), rng=always(0)) is None


# --- deterministic and testing modes -------------------------------------------------


def test_deterministic_policy_has_zero_delay_even_for_server_waits() -> None:
    """RetryPolicy.deterministic() waits nothing, even when the server asked for a wait."""
    policy = RetryPolicy.deterministic()
    for c in (verdict(), verdict(retry_after=timedelta(hours=2))):
        decision = retry_delay(c, 5, policy, rng=always(0.3))
        assert decision is not None
        assert (decision.delay, decision.defer) == (timedelta(0), False)


def test_deterministic_policy_fixed_delay_and_limits() -> None:
    """deterministic(delay) waits exactly that delay and still stops at the limit."""
    policy = RetryPolicy.deterministic(timedelta(milliseconds=10))
    decision = retry_delay(verdict(max_attempts=2), 1, policy, rng=always(0.3))
    assert decision is not None
    assert decision.delay == timedelta(milliseconds=10)
    assert retry_delay(verdict(max_attempts=2), 2, policy, rng=always(0.3)) is None


def test_set_testing_makes_every_retry_instant_until_disabled() -> None:
    """set_testing(True) zeroes delays process-wide; set_testing(False) restores them."""
    c = verdict(retry_after=timedelta(minutes=30))
    set_testing(True)
    assert is_testing()
    decision = retry_delay(c, 1, RetryPolicy(), rng=always(0))
    assert decision is not None
    assert (decision.delay, decision.defer) == (timedelta(0), False)
    assert retry_delay(verdict(max_attempts=1), 1, RetryPolicy(), rng=always(0)) is None
    set_testing(False)
    assert not is_testing()
    decision = retry_delay(c, 1, RetryPolicy(), rng=always(0))
    assert decision is not None
    assert decision.defer


def test_set_testing_with_a_fixed_delay() -> None:
    """set_testing(True, delay) uses that delay for every retry."""
    set_testing(True, timedelta(milliseconds=5))
    decision = retry_delay(verdict(), 9, RetryPolicy(), rng=always(0))
    assert decision is not None
    assert decision.delay == timedelta(milliseconds=5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": timedelta(seconds=-1)},
        {"floor": timedelta(minutes=10)},
        {"multiplier": 0.5},
        {"multiplier": float("nan")},
        {"jitter": 1.5},
        {"server_wait_buffer": -0.1},
        {"server_wait_buffer": float("inf")},
        {"max_server_wait": timedelta(seconds=-1)},
        {"fixed_delay": timedelta(seconds=-1)},
    ],
)
def test_invalid_policy_is_a_configuration_error(kwargs: dict[str, object]) -> None:
    """Policies that cannot work are refused when built, not when used."""
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]  # kwargs values vary in type


# --- properties ----------------------------------------------------------------------

_DURATIONS = st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=30))


@st.composite
def policies(draw: st.DrawFn) -> RetryPolicy:
    floor, cap = sorted([draw(_DURATIONS), draw(_DURATIONS)])
    max_wait = draw(st.timedeltas(min_value=floor, max_value=timedelta(days=3653)))
    return RetryPolicy(
        max_wait=max_wait,
        base=draw(st.timedeltas(min_value=timedelta(0), max_value=timedelta.max)),
        cap=cap,
        floor=floor,
        multiplier=draw(st.floats(min_value=1.0, max_value=1e6)),
        jitter=draw(st.floats(min_value=0.0, max_value=1.0)),
        server_wait_buffer=draw(st.floats(min_value=0.0, max_value=100.0)),
        max_server_wait=draw(_DURATIONS),
    )


_CLASSIFICATIONS = st.builds(
    Classification,
    error_class=st.sampled_from(ErrorClass),
    retryable=st.booleans(),
    max_attempts=st.none() | st.integers(),
    surface=st.booleans(),
    retry_after=st.none() | st.timedeltas(),
    reason=st.just("property"),
)
_ATTEMPTS = st.integers() | st.integers(min_value=1, max_value=60) | st.just(10**400)


@settings(max_examples=examples(2000), deadline=None)
@given(
    c=_CLASSIFICATIONS,
    attempt=_ATTEMPTS,
    policy=policies(),
    draw=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_every_delay_lies_between_floor_and_cap_or_buffered_server_wait(
    c: Classification, attempt: int, policy: RetryPolicy, draw: float
) -> None:
    """For any input, retry_delay never raises and delays stay in
    [floor, min(max_wait, max(cap, wait*buf))]."""
    decision = retry_delay(c, attempt, policy, rng=lambda: draw)
    if decision is None:
        return
    upper = policy.cap
    if c.retry_after is not None and c.retry_after >= timedelta(0):
        try:
            upper = max(upper, c.retry_after * (1 + policy.server_wait_buffer))
        except OverflowError:
            upper = timedelta.max
    assert policy.floor <= decision.delay <= min(upper, policy.max_wait)
    assert decision.server_told is (c.retry_after is not None and c.retry_after >= timedelta(0))
    assert not decision.defer or decision.server_told


@settings(max_examples=examples(300), deadline=None)
@given(attempt=st.integers(min_value=1, max_value=40), draw=st.floats(0.0, 0.999))
def test_backoff_grows_with_attempts_under_equal_jitter(attempt: int, draw: float) -> None:
    """Under equal jitter, the worst delay of attempt n+1 is never below the best of attempt n/2."""
    policy = RetryPolicy(floor=timedelta(0))
    later = retry_delay(verdict(), attempt + 1, policy, rng=lambda: draw)
    earlier = retry_delay(verdict(), attempt, policy, rng=lambda: 0.0)
    assert later is not None and earlier is not None
    assert later.delay >= earlier.delay / 2


@settings(max_examples=examples(1000), deadline=None)
@given(
    policy=policies(),
    a=st.timedeltas(min_value=timedelta(0)),
    b=st.timedeltas(min_value=timedelta(0)),
)
def test_a_longer_server_wait_never_gives_a_shorter_delay(
    policy: RetryPolicy, a: timedelta, b: timedelta
) -> None:
    """Monotone and bounded: any two server waits, up to timedelta.max, keep their order."""
    low, high = sorted((a, b))
    d_low = retry_delay(verdict(retry_after=low), 1, policy, rng=lambda: 0.5)
    d_high = retry_delay(verdict(retry_after=high), 1, policy, rng=lambda: 0.5)
    assert d_low is not None and d_high is not None
    assert d_low.delay <= d_high.delay <= policy.max_wait


def test_a_3_000_000_day_wait_is_capped_at_max_wait() -> None:
    """The default cap is 24 h; a connector's max_wait sets its own."""
    huge = verdict(retry_after=timedelta(days=3_000_000))
    decision = retry_delay(huge, 1, RetryPolicy(), rng=lambda: 0.0)
    assert decision is not None and decision.delay == timedelta(hours=24) and decision.defer
    week = RetryPolicy(max_wait=timedelta(days=7))
    decision = retry_delay(huge, 1, week, rng=lambda: 0.0)
    assert decision is not None and decision.delay == timedelta(days=7)


def test_floor_above_max_wait_is_refused() -> None:
    """A policy whose floor exceeds its max_wait cannot hold both promises."""
    with pytest.raises(ConfigurationError, match="max_wait"):
        RetryPolicy(floor=timedelta(hours=2), cap=timedelta(hours=2), max_wait=timedelta(hours=1))


# --- the one formula ----------------------------------------------------------------


SECOND = timedelta(seconds=1)


def test_backoff_delay_doubles_from_base_to_cap_less_its_jitter() -> None:
    """1, 2, 4 s then the 5 s cap (attempts below 1 count as 1); a draw of 1 takes off
    the jitter's share; the floor wins over a shorter wait."""
    waits = [backoff_delay(a, 0.0, base=SECOND, cap=5 * SECOND) for a in range(-1, 6)]
    assert waits == [SECOND, SECOND, SECOND, 2 * SECOND, 4 * SECOND, 5 * SECOND, 5 * SECOND]
    assert backoff_delay(3, 1.0, base=SECOND, cap=5 * SECOND) == 2 * SECOND
    assert backoff_delay(3, 1.0, base=SECOND, cap=5 * SECOND, jitter=0.25) == 3 * SECOND
    assert backoff_delay(3, 1.0, base=SECOND, cap=5 * SECOND, floor=3 * SECOND) == 3 * SECOND
    assert backoff_delay(4, 0.0, base=SECOND, cap=60 * SECOND, multiplier=3) == 27 * SECOND
    assert backoff_delay(10**400, 0.0, base=timedelta(0), cap=SECOND) == timedelta(0)


@pytest.mark.parametrize(
    "knobs",
    [
        {"base": -SECOND},
        {"cap": -SECOND},
        {"floor": -SECOND},
        {"multiplier": 0.5},
        {"multiplier": float("nan")},
        {"jitter": 1.5},
        {"jitter": -0.1},
    ],
)
def test_backoff_delay_refuses_knobs_that_cannot_work(knobs: dict[str, object]) -> None:
    """A negative duration, a shrinking or NaN multiplier, a jitter outside [0, 1]."""
    args: dict[str, object] = {"base": SECOND, "cap": 5 * SECOND, **knobs}
    with pytest.raises(ValueError):
        backoff_delay(2, 0.5, **args)  # type: ignore[arg-type]


@settings(max_examples=examples(1000), deadline=None)
@given(
    attempt=_ATTEMPTS,
    uniform=st.floats(allow_nan=True, allow_infinity=True),
    base=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=30)),
    cap=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=30)),
    floor=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=30)),
    multiplier=st.floats(min_value=1.0, max_value=1e6),
    jitter=st.floats(min_value=0.0, max_value=1.0),
)
def test_backoff_delay_stays_in_its_bounds_for_any_draw(
    attempt: int,
    uniform: float,
    base: timedelta,
    cap: timedelta,
    floor: timedelta,
    multiplier: float,
    jitter: float,
) -> None:
    """Whatever the attempt and the draw (NaN, out of range), the wait lies in
    [max(floor, (1 - jitter) * min(base, cap)), max(floor, cap)]."""
    delay = backoff_delay(
        attempt, uniform, base=base, cap=cap, multiplier=multiplier, jitter=jitter, floor=floor
    )
    least = min(base, cap) * (1 - jitter) - timedelta(microseconds=1)
    assert max(floor, least) <= delay <= max(floor, cap)


@settings(max_examples=examples(500), deadline=None)
@given(
    attempt=st.integers(min_value=1, max_value=80),
    policy=policies(),
    draw=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_retry_delay_backs_off_by_the_one_formula(
    attempt: int, policy: RetryPolicy, draw: float
) -> None:
    """A computed retry waits backoff_delay with the policy's knobs (within max_wait)."""
    decision = retry_delay(verdict(max_attempts=10**9), attempt, policy, rng=lambda: draw)
    assert decision is not None and not decision.server_told
    expected = backoff_delay(
        attempt,
        draw,
        base=policy.base,
        cap=policy.cap,
        multiplier=policy.multiplier,
        jitter=policy.jitter,
        floor=policy.floor,
    )
    assert decision.delay == min(expected, policy.max_wait)


@given(
    attempt=st.integers(min_value=0, max_value=10**6),
    draw=st.floats(allow_nan=True),
    jitter=st.floats(min_value=0.0, max_value=1.0),
)
def test_dead_letter_replays_back_off_by_the_one_formula(
    attempt: int, draw: float, jitter: float
) -> None:
    """next_retry_delay is backoff_delay from 1 minute doubling to 24 h, the capture
    counting as the first attempt."""
    from synckit.errors.dlq_policy import BASE_DELAY, MAX_DELAY, next_retry_delay

    class Fixed:
        def random(self) -> float:
            return draw

    assert next_retry_delay(attempt, Fixed(), jitter=jitter) == backoff_delay(
        attempt + 1, draw, base=BASE_DELAY, cap=MAX_DELAY, jitter=jitter
    )


@given(draws=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=20))
def test_the_workers_database_backoff_is_the_one_formula(draws: list[float]) -> None:
    """The worker's waits after database trouble are backoff_delay from 0.2 s doubling to
    5 s less up to half, counted from 1 again after a reset."""
    from synckit.runtime.jobs.recorder import _Backoff

    source = iter(draws * 2)
    backoff = _Backoff(lambda: next(source))
    for _ in range(2):
        waits = [backoff.next() for _ in draws]
        expected = [
            backoff_delay(
                n, d, base=timedelta(seconds=0.2), cap=timedelta(seconds=5), jitter=0.5
            ).total_seconds()
            for n, d in enumerate(draws, 1)
        ]
        assert waits == expected
        backoff.reset()
    assert 0.1 <= _Backoff().next() <= 0.2
