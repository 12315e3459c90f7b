"""Pure pacing decisions: rate-limit events, the default pace, quota rates, shared slots."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples  # type: ignore[import-not-found]

from synckit.errors import classify
from synckit.errors.exceptions import ConfigurationError, RateLimited, RetryableError
from synckit.errors.pace import (
    LearnedRate,
    PacePolicy,
    default_pace,
    learn_from_limit,
    learn_from_successes,
    pace_decision,
    quota_rate,
    reserve_slot,
    reserve_slots,
    schedule_opens_at,
    slots_before,
)
from synckit.errors.waits import DEFAULT_MAX_WAIT

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
REQUEST = httpx.Request("GET", "https://api.example.com/items")
POLICY = PacePolicy()


def limited(headers: dict[str, str] | None = None, status: int = 429) -> object:
    return classify(httpx.Response(status, headers=headers, request=REQUEST), now=NOW)


def decide(c: object, now: datetime = NOW, **state: object) -> object:
    args: dict[str, object] = {
        "streak": 0,
        "sent_at": now,
        "event_started_at": None,
        "event_until": None,
        "policy": POLICY,
    }
    args.update(state)
    return pace_decision(c, now, **args)  # type: ignore[arg-type]


# --- events -----------------------------------------------------------------------------


def test_a_burst_of_in_flight_429s_is_one_event() -> None:
    """The first 429 starts an event; 429s of requests sent before it keep its streak
    (no growth) and its pace, unless their own wait, counted from their answer, ends
    later: that wait is the server's and is honoured."""
    first = decide(limited({"Retry-After": "1"}), sent_at=NOW - timedelta(seconds=0.2))
    assert first.new_event and first.streak == 1
    assert first.until == NOW + timedelta(seconds=1) and first.reason == "Retry-After"
    later = NOW + timedelta(seconds=0.05)
    for wait, until in (
        ("0", first.until),  # ends sooner: the event's pace stays
        ("1", later + timedelta(seconds=1)),  # answered 50 ms later: 50 ms more
        ("30", later + timedelta(seconds=30)),
    ):
        again = decide(
            limited({"Retry-After": wait}),
            later,
            streak=first.streak,
            sent_at=NOW - timedelta(seconds=0.1),
            event_started_at=first.event_started_at,
            event_until=first.until,
        )
        assert not again.new_event
        assert (again.until, again.streak, again.event_started_at) == (
            until,
            1,
            first.event_started_at,
        )
    # A 429 of the burst that names no wait never pushes the pace out.
    bare = decide(
        limited(),
        later,
        streak=1,
        sent_at=NOW - timedelta(seconds=0.1),
        event_started_at=first.event_started_at,
        event_until=first.until,
    )
    assert (bare.until, bare.streak, bare.new_event) == (first.until, 1, False)


def test_a_request_sent_after_the_pace_ended_is_a_new_event_and_grows_the_streak() -> None:
    """The limit hitting again soon after the pace ended is a repeat."""
    until = NOW - timedelta(seconds=2)
    d = decide(
        limited(), streak=1, sent_at=NOW, event_started_at=until - timedelta(minutes=1),
        event_until=until,
    )  # fmt: skip
    assert d.new_event and d.streak == 2
    assert d.until == NOW + timedelta(seconds=2) and d.reason == "default pace, 2nd in a row"


def test_the_streak_restarts_when_the_previous_pace_ended_long_ago() -> None:
    """No write on success: forget_after past the previous pace, a limit is a first again."""
    until = NOW - POLICY.forget_after
    d = decide(limited(), streak=5, event_started_at=until, event_until=until)
    assert (d.streak, d.until) == (1, NOW + timedelta(seconds=1))
    assert d.reason == "default pace, 1st in a row"


def test_a_success_after_the_pace_relaxes_the_streak() -> None:
    """A request sent after the previous pace ended that succeeded restarts the streak:
    the pace grows only while refusals continue (issue 37)."""
    until = NOW - timedelta(seconds=2)
    state = {"streak": 4, "event_started_at": until - timedelta(seconds=8), "event_until": until}
    relaxed = decide(limited(), succeeded_at=until + timedelta(seconds=0.5), **state)
    assert (relaxed.streak, relaxed.until) == (1, NOW + timedelta(seconds=1))
    # A success sent before that pace ended says nothing about after it: the streak grows.
    grown = decide(limited(), succeeded_at=until - timedelta(seconds=1), **state)
    assert (grown.streak, grown.until) == (5, NOW + timedelta(seconds=16))


def test_default_pace_starts_at_a_second_doubles_and_caps_at_15_minutes() -> None:
    """1 s, 2 s, 4 s, 8 s, ... then 900 s for ever (never above max_wait)."""
    paces = [default_pace(n, POLICY).total_seconds() for n in range(1, 13)]
    assert paces == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900]
    assert default_pace(10**9, POLICY) == timedelta(minutes=15)
    small = PacePolicy(max_wait=timedelta(seconds=3))
    assert default_pace(3, small) == timedelta(seconds=3)


def test_a_connector_policy_takes_seconds_or_timedeltas() -> None:
    """PacePolicy(first=2.0, cap=60, growth=3.0) is the same as with timedeltas."""
    assert PacePolicy(first=2.0, cap=60, growth=3.0) == PacePolicy(
        first=timedelta(seconds=2), cap=timedelta(minutes=1), growth=3.0
    )
    with pytest.raises(ConfigurationError, match="first must be seconds"):
        PacePolicy(first="soon")  # type: ignore[arg-type]


def _github_secondary() -> object:
    body = {"message": "You have exceeded a secondary rate limit."}
    return classify(httpx.Response(403, json=body, request=REQUEST), now=NOW)


def test_provider_signals_without_a_wait_start_from_their_documented_wait() -> None:
    """GitHub's secondary limit and Salesforce's REQUEST_LIMIT_EXCEEDED pace a minute
    first, then grow as any streak (issue 39); a connector declares its own signals."""
    d = decide(_github_secondary())
    assert d.until == NOW + timedelta(minutes=1)
    assert d.reason == "github_secondary_rate_limit: default pace, 1st in a row"
    body = [{"errorCode": "REQUEST_LIMIT_EXCEEDED", "message": "TotalRequests Limit exceeded."}]
    sf = classify(httpx.Response(403, json=body, request=REQUEST), now=NOW)
    until = NOW - timedelta(seconds=1)
    again = decide(sf, streak=1, event_started_at=until - timedelta(minutes=1), event_until=until)
    assert again.until == NOW + timedelta(minutes=2)
    own = PacePolicy(first_waits={"github_secondary_rate_limit": 300})
    assert decide(_github_secondary(), policy=own).until == NOW + timedelta(minutes=5)
    assert decide(limited(), policy=own).until == NOW + timedelta(seconds=1)


def test_retry_after_zero_inside_a_streak_keeps_the_earned_backoff() -> None:
    """The sixth 429 in a row saying Retry-After: 0 waits what the streak earned (32 s),
    as the same streak with no header does; a longer server wait still wins; a first
    Retry-After: 0 is honoured as it is (issue 39)."""
    until = NOW - timedelta(seconds=0.1)
    state = {"streak": 5, "event_started_at": until - timedelta(seconds=16), "event_until": until}
    bare = decide(limited(), **state)
    zero = decide(limited({"Retry-After": "0"}), **state)
    assert bare.until == zero.until == NOW + timedelta(seconds=32)
    assert zero.streak == 6 and zero.reason.startswith("Retry-After raised")
    longer = decide(limited({"Retry-After": "100"}), **state)
    assert longer.until == NOW + timedelta(seconds=100) and longer.reason == "Retry-After"
    assert decide(limited({"Retry-After": "0"})).until == NOW


@settings(max_examples=examples(1000), deadline=None)
@given(
    streak=st.integers(min_value=1, max_value=10**6),
    wait=st.integers(min_value=0, max_value=10**9),
    policy=st.builds(
        PacePolicy,
        first=st.timedeltas(min_value=timedelta(0), max_value=timedelta(minutes=5)),
        growth=st.floats(min_value=1.0, max_value=1e6),
        cap=st.just(timedelta(hours=1)),
    ),
)
def test_a_server_wait_in_a_streak_never_paces_shorter_than_no_wait(
    streak: int, wait: int, policy: PacePolicy
) -> None:
    """In a streak, any Retry-After paces at least as long as no header would, and at
    least as long as the server asked (within max_wait)."""
    until = NOW - timedelta(seconds=0.1)
    state = {
        "streak": streak, "event_started_at": until - timedelta(seconds=1), "event_until": until,
        "policy": policy,
    }  # fmt: skip
    told = decide(limited({"Retry-After": str(wait)}), **state).until
    assert told >= decide(limited(), **state).until
    assert told >= min(NOW + timedelta(seconds=wait), NOW + policy.max_wait)


def test_retry_after_10_beats_ratelimit_t_100() -> None:
    """With Retry-After: 10 and RateLimit: r=0;t=100 the resource is paced 10 s."""
    c = limited({"Retry-After": "10", "RateLimit": '"default";r=0;t=100'})
    d = decide(c)
    assert d.until == NOW + timedelta(seconds=10) and d.reason == "Retry-After"


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "40"}, "X-RateLimit-Reset"),
        ({"RateLimit": '"default";r=0;t=40'}, "RateLimit"),
        ({"retry-after-ms": "40000"}, "retry-after-ms"),
    ],
)
def test_the_reason_names_the_signal(headers: dict[str, str], reason: str) -> None:
    """paced_reason tells an operator which header set the pace."""
    d = decide(limited(headers))
    assert d.until == NOW + timedelta(seconds=40) and d.reason == reason


def test_a_huge_wait_is_clamped_to_max_wait() -> None:
    """One year of Retry-After paces the policy's max_wait (24 h by default)."""
    d = decide(limited({"Retry-After": str(365 * 86400)}))
    assert d.until == NOW + DEFAULT_MAX_WAIT


def test_not_a_rate_limit_is_no_pace() -> None:
    """A 500 is the breaker's business, not pacing's."""
    assert decide(limited(status=500)) is None


def test_bad_policy_is_refused() -> None:
    """A policy that cannot work is a configuration error naming the problem."""
    with pytest.raises(ConfigurationError, match="growth"):
        PacePolicy(growth=0.5)


# --- properties: every wait finite, capped, monotone -------------------------------------

_HEADER_NAMES = st.sampled_from(
    [
        "retry-after",
        "retry-after-ms",
        "x-ms-retry-after-ms",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-limit",
    ]
)
_HEADER_VALUES = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
    st.integers(min_value=0, max_value=10**25).map(str),
    st.just("0"),
)
_POLICIES = st.builds(
    PacePolicy,
    first=st.timedeltas(min_value=timedelta(0), max_value=timedelta(minutes=5)),
    growth=st.floats(min_value=1.0, max_value=1e6),
    cap=st.just(timedelta(hours=1)),
    max_wait=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=3650)),
)
_STATES = st.fixed_dictionaries(
    {
        "streak": st.integers(min_value=-5, max_value=10**12),
        "event_until": st.none() | st.datetimes(timezones=st.just(UTC)),
        "event_started_at": st.none() | st.datetimes(timezones=st.just(UTC)),
        "sent_at": st.none() | st.datetimes(timezones=st.just(UTC)),
    }
)


@settings(max_examples=examples(1500), deadline=None)
@given(
    headers=st.dictionaries(_HEADER_NAMES, _HEADER_VALUES, max_size=5),
    status=st.sampled_from([429, 403, 503, 509]),
    policy=_POLICIES,
    state=_STATES,
)
def test_any_headers_give_a_pace_within_the_cap(
    headers: dict[str, str], status: int, policy: PacePolicy, state: dict[str, object]
) -> None:
    """For any headers and stored state, a new pace ends within [now, now + max_wait]."""
    c = classify(httpx.Response(status, headers=headers, request=REQUEST), now=NOW)
    d = pace_decision(c, NOW, policy=policy, **state)  # type: ignore[arg-type]
    if d is None:
        return
    if d.new_event:
        assert NOW <= d.until <= NOW + policy.max_wait
        assert d.streak >= 1


@settings(max_examples=examples(1000), deadline=None)
@given(
    a=st.integers(min_value=0, max_value=10**30),
    b=st.integers(min_value=0, max_value=10**30),
    policy=_POLICIES,
)
def test_a_longer_retry_after_never_paces_shorter(a: int, b: int, policy: PacePolicy) -> None:
    """Monotone: Retry-After a <= b gives pace(a) <= pace(b) <= max_wait."""
    low, high = sorted((a, b))
    paces = [
        decide(limited({"Retry-After": str(v)}), policy=policy).until - NOW for v in (low, high)
    ]
    assert paces[0] <= paces[1] <= policy.max_wait


@settings(max_examples=examples(1000), deadline=None)
@given(
    a=st.timedeltas(min_value=timedelta(0)),
    b=st.timedeltas(min_value=timedelta(0)),
    policy=_POLICIES,
    kind=st.sampled_from([RateLimited, RetryableError]),
)
def test_handler_waits_are_capped_and_monotone(
    a: timedelta, b: timedelta, policy: PacePolicy, kind: type[RetryableError]
) -> None:
    """Handler-given waits up to timedelta.max: finite, within the cap, order kept."""
    low, high = sorted((a, b))
    verdicts = [classify(exc=kind("x", retry_after=w), now=NOW) for w in (low, high)]
    assert all(v.retry_after is not None for v in verdicts)
    if kind is RateLimited:
        paces = [decide(v, policy=policy).until - NOW for v in verdicts]
        assert paces[0] <= paces[1] <= policy.max_wait


# --- adaptive rate ---------------------------------------------------------------------------


def test_quota_rate_spreads_what_is_left_over_the_time_to_reset() -> None:
    """50 left, 10 s to reset, 5 in flight: 4.5 requests per second."""
    reset = NOW + timedelta(seconds=10)
    assert quota_rate(50, reset, NOW, in_flight=5) == pytest.approx(4.5)
    assert quota_rate(3, reset, NOW, in_flight=3) == 0.0
    assert quota_rate(None, reset, NOW) is None
    assert quota_rate(5, NOW, NOW) is None  # the window reset: nothing known of the next


@settings(max_examples=examples(500), deadline=None)
@given(
    remaining=st.integers(min_value=0, max_value=10**9),
    in_flight=st.integers(min_value=0, max_value=1000),
    seconds=st.floats(min_value=0.001, max_value=10**7),
)
def test_quota_rate_never_plans_more_than_is_left(
    remaining: int, in_flight: int, seconds: float
) -> None:
    """Sending at the rate until the reset spends at most remaining - in_flight."""
    rate = quota_rate(remaining, NOW + timedelta(seconds=seconds), NOW, in_flight=in_flight)
    assert rate is not None and rate >= 0
    exact = (NOW + timedelta(seconds=seconds) - NOW).total_seconds()
    assert rate * exact <= max(remaining - in_flight, 0) * (1 + 1e-9)


# --- shared schedule ---------------------------------------------------------------------


def test_slots_are_spaced_one_interval_apart_after_the_burst() -> None:
    """rate 10/s, burst 2: two go at once, then one each 0.1 s."""
    tat = None
    waits = []
    for _ in range(4):
        slot = reserve_slot(tat, NOW, rate=10, burst=2)
        waits.append(round(slot.wait, 6))
        tat = slot.tat
    assert waits == [0.0, 0.0, 0.1, 0.2]


def test_a_stored_schedule_opens_its_burst_before_it() -> None:
    """The next request on a schedule stored at ``tat`` goes no earlier than ``tat`` (burst
    1), or ``burst - 1`` intervals before it: what reserve_slot would give any taker."""
    tat = NOW + timedelta(seconds=2)
    assert schedule_opens_at(tat, rate=10) == tat
    assert schedule_opens_at(tat, rate=10, burst=3) == tat - timedelta(seconds=0.2)
    for now in (NOW, tat - timedelta(seconds=1), tat):
        opens = schedule_opens_at(tat, rate=10, burst=3)
        assert opens is not None
        assert now + timedelta(seconds=reserve_slot(tat, now, rate=10, burst=3).wait) >= opens
    assert schedule_opens_at(datetime.min.replace(tzinfo=UTC), rate=1, burst=5) is None


@settings(max_examples=examples(300), deadline=None)
@given(
    rate=st.floats(allow_nan=True, allow_infinity=True),
    burst=st.integers(min_value=-3, max_value=10**18),
    tat=st.datetimes(timezones=st.just(UTC)),
)
def test_schedule_opens_at_never_raises(rate: float, burst: int, tat: datetime) -> None:
    opens = schedule_opens_at(tat, rate=rate, burst=burst, cap=timedelta(hours=1))
    assert opens is None or tat - timedelta(hours=1) <= opens <= tat


def test_slots_before_counts_what_the_schedule_lets_go_before_a_moment() -> None:
    second = NOW + timedelta(seconds=1)
    assert slots_before(None, NOW, second, rate=10) == 10
    assert slots_before(NOW + timedelta(seconds=0.5), NOW, second, rate=10) == 5
    assert slots_before(NOW - timedelta(hours=1), NOW, second, rate=10) == 10
    assert slots_before(None, NOW, second, rate=10, burst=3) == 12
    assert slots_before(None, NOW, NOW + timedelta(seconds=0.95), rate=10) == 10
    assert slots_before(None, NOW, NOW, rate=10) == 0
    assert slots_before(None, NOW, second, rate=0) == 0
    assert slots_before(None, NOW, second, rate=float("nan")) == 0
    assert slots_before(None, NOW, datetime.max.replace(tzinfo=UTC), rate=1e300) >= 2**40


@settings(max_examples=examples(300), deadline=None)
@given(
    ahead_ms=st.integers(min_value=-2000, max_value=2000),
    until_ms=st.integers(min_value=1, max_value=3000),
    rate=st.sampled_from([0.5, 1.0, 3.0, 10.0, 7.0]),
    burst=st.integers(min_value=1, max_value=4),
)
def test_slots_before_is_what_reserving_one_by_one_gives(
    ahead_ms: int, until_ms: int, rate: float, burst: int
) -> None:
    """The count equals reserving slot after slot with reserve_slot and counting those
    that may go before the moment."""
    tat = NOW + timedelta(milliseconds=ahead_ms)
    moment = NOW + timedelta(milliseconds=until_ms)
    count, schedule = 0, tat
    while True:
        slot = reserve_slot(schedule, NOW, rate=rate, burst=burst)
        if NOW + timedelta(seconds=slot.wait) >= moment:
            break
        count, schedule = count + 1, slot.tat
    assert slots_before(tat, NOW, moment, rate=rate, burst=burst) == count


def test_a_schedule_ahead_of_a_slow_clock_is_honoured() -> None:
    """A host whose clock runs behind never gets an earlier slot than the schedule."""
    slot = reserve_slot(NOW + timedelta(seconds=5), NOW, rate=1)
    assert slot.wait == 5.0 and slot.tat == NOW + timedelta(seconds=6)


@settings(max_examples=examples(500), deadline=None)
@given(
    rate=st.floats(allow_nan=True, allow_infinity=True),
    burst=st.integers(min_value=-3, max_value=10**18),
    tat=st.none() | st.datetimes(timezones=st.just(UTC)),
)
def test_reserve_slot_never_raises_and_waits_within_the_cap(
    rate: float, burst: int, tat: datetime | None
) -> None:
    """Any rate (NaN, 0, inf), burst and stored schedule: a wait in [0, horizon]."""
    slot = reserve_slot(tat, NOW, rate=rate, burst=burst, cap=timedelta(hours=1))
    assert slot.wait >= 0
    if tat is None or tat <= NOW + timedelta(days=1):
        assert slot.wait <= timedelta(days=1, hours=1).total_seconds()


def test_reserving_ahead_takes_half_a_second_of_a_declared_rate() -> None:
    waits, tat = reserve_slots(None, NOW, rate=10.0, burst=1, max_wait=30.0)
    assert waits == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert tat == NOW + timedelta(seconds=0.5)


def test_a_slow_rate_reserves_one_slot_and_a_far_schedule_none() -> None:
    assert reserve_slots(None, NOW, rate=1.0, max_wait=30.0)[0] == [0.0]
    late = NOW + timedelta(seconds=40)
    assert reserve_slots(late, NOW, rate=10.0, max_wait=30.0) == ([], None)
    # Slots beyond max_wait are not reserved.
    near = NOW + timedelta(seconds=0.95)
    waits, _ = reserve_slots(near, NOW, rate=10.0, max_wait=1.2)
    assert waits == pytest.approx([0.95, 1.05, 1.15])


@given(
    rate=st.floats(min_value=0.001, max_value=10_000, allow_nan=False),
    burst=st.integers(min_value=1, max_value=50),
    offset=st.floats(min_value=-100, max_value=100, allow_nan=False),
    max_wait=st.floats(min_value=0, max_value=100, allow_nan=False),
)
@settings(max_examples=examples(300), deadline=None)
def test_reserving_ahead_is_what_asking_once_per_request_would_leave(
    rate: float, burst: int, offset: float, max_wait: float
) -> None:
    tat = NOW + timedelta(seconds=offset)
    waits, stored = reserve_slots(tat, NOW, rate=rate, burst=burst, max_wait=max_wait)
    # The same requests asking one at a time, all at NOW: the same waits, the same
    # schedule left behind, none beyond max_wait or the half-second horizon.
    current: datetime | None = tat
    for wait in waits:
        one = reserve_slot(current, NOW, rate=rate, burst=burst)
        assert one.wait == pytest.approx(wait)
        assert wait <= max_wait
        current = one.tat
    if waits:
        assert stored == current
        assert waits[-1] - waits[0] <= 0.5 + 1e-9
        assert len(waits) <= 16
    else:
        assert stored is None


# --- learnt rate (AIMD) -------------------------------------------------------------------


def test_learning_starts_with_a_second_refusal_soon_after_another() -> None:
    """One refusal alone learns nothing; a second within learn_after cuts the rate to
    0.8 x the successes a second just seen (3/s, the peak); a later one, once the rate
    has regained half the cut, cuts it again."""
    assert learn_from_limit(LearnedRate(), 3.0, NOW, POLICY) == LearnedRate()
    long_ago = NOW - POLICY.learn_after
    assert learn_from_limit(LearnedRate(), 3.0, NOW, POLICY, long_ago) == LearnedRate()
    held = learn_from_limit(LearnedRate(), 3.0, NOW, POLICY, NOW - timedelta(seconds=1))
    assert held == LearnedRate(rate=pytest.approx(2.4), peak=3.0, cut_at=NOW)
    soon = NOW - timedelta(seconds=1)
    assert learn_from_limit(LearnedRate(), None, NOW, POLICY, soon) == LearnedRate()
    # Right after the cut, another refusal is not the new rate's doing: left alone.
    assert learn_from_limit(held, 3.0, NOW + timedelta(seconds=1), POLICY) == held
    # Once half the cut is regained (2.7/s), a refusal cuts again, from the rate sent.
    regained = LearnedRate(rate=2.8, peak=3.0, cut_at=NOW)
    cut = learn_from_limit(regained, 3.0, NOW + timedelta(seconds=1), POLICY)
    assert (cut.rate, cut.peak) == (pytest.approx(2.24), pytest.approx(2.8))


def test_successes_regain_a_cut_in_recover_seconds() -> None:
    """At 2.4/s after a cut from 3/s, 20 s of successes (~54) regain the 0.6/s lost."""
    state = cut = LearnedRate(rate=2.4, peak=3.0, cut_at=NOW)
    for _ in range(54):
        state = learn_from_successes(state, 1, POLICY)
    assert state.rate == pytest.approx(3.0, rel=0.05)
    assert state.peak == cut.peak
    assert learn_from_successes(LearnedRate(), 100, POLICY) == LearnedRate()


def test_a_refusal_below_the_last_cut_is_not_the_rates_doing() -> None:
    """Random refusals while the rate has not regained half the cut leave it alone;
    from there on, or once the cut is three recover periods old, a refusal cuts again."""
    cut = LearnedRate(rate=8.0, peak=10.0, cut_at=NOW)
    soon = NOW + timedelta(seconds=5)
    assert learn_from_limit(cut, 9.0, soon, POLICY) == cut
    assert learn_from_limit(LearnedRate(8.9, 10.0, NOW), 9.0, soon, POLICY).rate == 8.9
    halfway = LearnedRate(rate=9.0, peak=10.0, cut_at=NOW)
    assert learn_from_limit(halfway, 12.0, soon, POLICY).rate == pytest.approx(7.2)
    late = NOW + POLICY.recover * 3
    assert learn_from_limit(cut, 9.0, late, POLICY).rate == pytest.approx(0.8 * 8.0)
    assert learn_from_limit(cut, 9.0, soon, PacePolicy(learn=False)) == cut


def test_a_refusal_close_after_another_cuts_even_below_the_last_cut() -> None:
    """Refusals less than learn_after apart are the limit's, as when learning starts: a
    rate learnt too high (a count that straddled two of the API's windows read 6 of an
    API allowing 3) comes down cut by cut instead of being left alone for 3 x recover;
    a lone refusal below the last cut still is."""
    high = learn_from_limit(LearnedRate(), 6.0, NOW, POLICY, NOW - timedelta(seconds=1))
    assert high.rate == pytest.approx(4.8)
    later = NOW + timedelta(seconds=2)
    cut = learn_from_limit(high, 6.0, later, POLICY, NOW)
    assert (cut.rate, cut.peak) == (pytest.approx(3.84), pytest.approx(4.8))
    again = learn_from_limit(cut, 6.0, later + timedelta(seconds=2), POLICY, later)
    assert again.rate == pytest.approx(0.8 * 3.84)
    # Alone (the previous refusal learn_after ago or more), below half the regain: kept.
    alone = later + POLICY.learn_after + timedelta(seconds=1)
    assert learn_from_limit(cut, 6.0, alone, POLICY, later) == cut


@settings(max_examples=examples(1000), deadline=None)
@given(
    rate=st.none() | st.floats(min_value=1e-3, max_value=1e5),
    peak=st.none() | st.floats(min_value=1e-3, max_value=1e5),
    accepted=st.none() | st.floats(min_value=0, max_value=1e5, allow_nan=False),
    after=st.timedeltas(min_value=timedelta(0), max_value=timedelta(hours=1)),
    successes=st.integers(min_value=0, max_value=10**12),
)
def test_learnt_rates_stay_positive_and_move_the_right_way(
    rate: float | None,
    peak: float | None,
    accepted: float | None,
    after: timedelta,
    successes: int,
) -> None:
    """A refusal never raises the rate, a success never lowers it; every learnt rate is
    finite and at least min_rate."""
    state = LearnedRate(rate=rate, peak=peak, cut_at=NOW if peak is not None else None)
    cut = learn_from_limit(state, accepted, NOW + after, POLICY, NOW)
    if cut.rate is not None:
        assert POLICY.min_rate <= cut.rate < float("inf")
        assert rate is None or cut.rate <= max(rate, POLICY.min_rate)
    grown = learn_from_successes(cut, successes, POLICY)
    assert (grown.rate is None) == (cut.rate is None)
    if grown.rate is not None and cut.rate is not None:
        assert cut.rate <= grown.rate < float("inf")
