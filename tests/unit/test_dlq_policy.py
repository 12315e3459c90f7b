"""The DLQ's pure decisions: replay backoff and resource waits."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synckit.errors.dlq_policy import (
    JITTER,
    MAX_DELAY,
    PROBE_WAIT,
    blocked_until,
    next_retry_delay,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class Fixed:
    """A random source that always returns ``value``."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def nominal(attempt: int) -> timedelta:
    # 2^11 minutes already exceeds 24 h; larger exponents would overflow timedelta.
    return min(timedelta(minutes=2 ** min(attempt, 20)), timedelta(hours=24))


@pytest.mark.parametrize("attempt", range(0, 64))
def test_delay_without_jitter_doubles_from_one_minute_up_to_24_hours(attempt: int) -> None:
    """u = 0 gives the nominal delay min(2^attempt minutes, 24 h), for every attempt."""
    assert next_retry_delay(attempt, Fixed(0.0)) == nominal(attempt)


def test_the_sequence_and_where_it_caps() -> None:
    """1, 2, 4, ... 1024 minutes, then 24 h from attempt 11 on."""
    minutes = [next_retry_delay(a, Fixed(0.0)) / timedelta(minutes=1) for a in range(13)]
    assert minutes == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1440, 1440]


@pytest.mark.parametrize("attempt", range(0, 20))
def test_full_jitter_takes_off_at_most_a_quarter(attempt: int) -> None:
    """u close to 1 gives (1 - JITTER) of the nominal delay, never less."""
    low = next_retry_delay(attempt, Fixed(0.999999999))
    assert nominal(attempt) * (1 - JITTER) <= low < nominal(attempt)
    assert next_retry_delay(attempt, Fixed(1.0)) == nominal(attempt) * (1 - JITTER)


def test_huge_attempt_numbers_cost_nothing_and_stay_capped() -> None:
    """An attempt count far past the cap is still exactly 24 h (no overflow)."""
    assert next_retry_delay(10**12, Fixed(0.0)) == MAX_DELAY


def test_negative_attempt_and_bad_jitter_are_refused() -> None:
    """A negative attempt or a jitter outside [0, 1] is a programming error."""
    with pytest.raises(ValueError):
        next_retry_delay(-1, Fixed(0.0))
    with pytest.raises(ValueError):
        next_retry_delay(1, Fixed(0.0), jitter=1.5)


@given(
    attempt=st.integers(min_value=0, max_value=10**6),
    u=st.floats(allow_nan=False, allow_infinity=False),
    jitter=st.floats(min_value=0.0, max_value=1.0),
)
def test_delay_bounds_hold_for_any_random_value(attempt: int, u: float, jitter: float) -> None:
    """Whatever the source returns, the delay lies in [(1 - jitter) d, d] and d <= 24 h."""
    delay = next_retry_delay(attempt, Fixed(u), jitter=jitter)
    d = nominal(attempt)
    assert d * (1 - jitter) - timedelta(microseconds=1) <= delay <= d <= MAX_DELAY


@given(st.integers(min_value=0, max_value=30), st.integers(min_value=0, max_value=2**32))
def test_lower_bound_of_the_next_attempt_is_never_below_this_one(attempt: int, seed: int) -> None:
    """Waits grow: the next attempt's shortest wait is at least this one's (until the cap)."""
    rng = random.Random(seed)
    this = next_retry_delay(attempt, rng)
    floor_next = nominal(attempt + 1) * (1 - JITTER)
    assert floor_next >= this * (1 - JITTER)


def test_a_closed_resource_does_not_wait() -> None:
    """Closed, no pacing: available now."""
    assert (
        blocked_until(
            state="closed",
            cooldown_until=None,
            next_available_at=None,
            probe_in_flight=False,
            probe_expires_at=None,
            now=NOW,
        )
        is None
    )


def test_an_open_breaker_waits_until_its_cooldown() -> None:
    """Open with a future cooldown: wait until it; a past cooldown does not block."""
    later = NOW + timedelta(minutes=5)
    assert (
        blocked_until(
            state="open",
            cooldown_until=later,
            next_available_at=None,
            probe_in_flight=False,
            probe_expires_at=None,
            now=NOW,
        )
        == later
    )
    assert (
        blocked_until(
            state="open",
            cooldown_until=NOW - timedelta(seconds=1),
            next_available_at=None,
            probe_in_flight=False,
            probe_expires_at=None,
            now=NOW,
        )
        is None
    )


def test_pacing_and_a_breaker_together_wait_for_the_later() -> None:
    """next_available_at and cooldown_until both in the future: the later one wins."""
    a, b = NOW + timedelta(minutes=1), NOW + timedelta(minutes=9)
    assert (
        blocked_until(
            state="open",
            cooldown_until=a,
            next_available_at=b,
            probe_in_flight=False,
            probe_expires_at=None,
            now=NOW,
        )
        == b
    )
    assert (
        blocked_until(
            state="closed",
            cooldown_until=None,
            next_available_at=a,
            probe_in_flight=False,
            probe_expires_at=None,
            now=NOW,
        )
        == a
    )


def test_a_half_open_breaker_with_its_probe_out_waits_briefly() -> None:
    """Half-open: replays wait PROBE_WAIT while the probe is in flight (less when it
    expires sooner), not otherwise; an expired probe is lost and holds nothing."""
    assert (
        blocked_until(
            state="half_open",
            cooldown_until=None,
            next_available_at=None,
            probe_in_flight=True,
            probe_expires_at=NOW + timedelta(minutes=5),
            now=NOW,
        )
        == NOW + PROBE_WAIT
    )
    soon = NOW + timedelta(seconds=3)
    assert (
        blocked_until(
            state="half_open",
            cooldown_until=None,
            next_available_at=None,
            probe_in_flight=True,
            probe_expires_at=soon,
            now=NOW,
        )
        == soon
    )
    assert (
        blocked_until(
            state="half_open",
            cooldown_until=None,
            next_available_at=None,
            probe_in_flight=True,
            probe_expires_at=NOW - timedelta(seconds=1),
            now=NOW,
        )
        is None
    )
    assert (
        blocked_until(
            state="half_open",
            cooldown_until=None,
            next_available_at=None,
            probe_in_flight=False,
            probe_expires_at=None,
            now=NOW,
        )
        is None
    )


@given(
    status=st.sampled_from([None, "pending", "review", "ignored", "resolved"]),
    streak=st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.text(max_size=3)),
)
def test_dead_cycle_streak(status: str | None, streak: object) -> None:
    """A new or resolved row starts at 1; an open row with a streak grows by one; a
    missing or hand-edited streak counts as none."""
    from synckit.errors.dlq_policy import dead_cycle_streak

    got = dead_cycle_streak(status, streak)
    if status in (None, "resolved") or isinstance(streak, bool) or not isinstance(streak, int):
        assert got == 1
    else:
        assert got == max(streak, 0) + 1
