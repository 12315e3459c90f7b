"""The circuit breaker's pure transitions and admission decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples  # type: ignore[import-not-found]

from synckit.errors import (
    BreakerOutcome,
    BreakerPolicy,
    BreakerSnapshot,
    BreakerState,
    Classification,
    ErrorClass,
    breaker_claim_probe,
    breaker_outcome,
    breaker_transition,
    reopen_cooldown,
)
from synckit.errors.breaker import open_cooldown
from synckit.errors.exceptions import ConfigurationError
from synckit.errors.gate import LaneFacts, gate

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
# Threshold 5, cool-down 30 s doubling up to 10 min (the default cool-down is 5 s; these
# tests pin the doubling with rounder numbers).
POLICY = BreakerPolicy(cooldown=timedelta(seconds=30))


def allows(snapshot: BreakerSnapshot, now: datetime) -> str:
    """What the claim's gate lets through for this breaker: allow, probe or deny."""
    g = gate(
        LaneFacts(
            state=snapshot.state.value,
            cooldown_until=snapshot.cooldown_until,
            probe_in_flight=snapshot.probe_in_flight,
            probe_expires_at=snapshot.probe_expires_at,
        ),
        now,
    )
    return "deny" if not g.open else "probe" if g.probe else "allow"


def fail_times(snapshot: BreakerSnapshot, n: int, now: datetime = T0) -> BreakerSnapshot:
    for _ in range(n):
        snapshot = breaker_transition(snapshot, "failure", now, POLICY)
    return snapshot


def opened(now: datetime = T0) -> BreakerSnapshot:
    return fail_times(BreakerSnapshot(), POLICY.failure_threshold, now)


def test_fresh_breaker_is_closed_and_allows() -> None:
    """A new breaker lets calls through."""
    assert allows(BreakerSnapshot(), T0) == "allow"


def test_failures_below_threshold_keep_it_closed() -> None:
    """Four consecutive failures (threshold 5) keep the breaker closed and counting."""
    snapshot = fail_times(BreakerSnapshot(), 4)
    assert snapshot.state is BreakerState.CLOSED
    assert snapshot.consecutive_failures == 4
    assert allows(snapshot, T0) == "allow"


def test_threshold_failure_opens_with_the_first_cooldown() -> None:
    """The fifth consecutive failure opens the breaker for 30 s."""
    snapshot = opened()
    assert snapshot.state is BreakerState.OPEN
    assert snapshot.opened_at == T0
    assert snapshot.cooldown_until == T0 + timedelta(seconds=30)
    assert snapshot.reopen_count == 0
    assert not snapshot.probe_in_flight


def test_success_resets_the_failure_count() -> None:
    """A success in between means the failures were not consecutive."""
    snapshot = fail_times(BreakerSnapshot(), 4)
    snapshot = breaker_transition(snapshot, "success", T0, POLICY)
    snapshot = fail_times(snapshot, 4)
    assert snapshot.state is BreakerState.CLOSED
    assert snapshot.consecutive_failures == 4


def test_ignored_outcomes_neither_count_nor_reset() -> None:
    """Validation-like failures are ignored: no count, no reset of the count."""
    snapshot = fail_times(BreakerSnapshot(), 4)
    for _ in range(10):
        snapshot = breaker_transition(snapshot, BreakerOutcome.IGNORED, T0, POLICY)
    assert (snapshot.state, snapshot.consecutive_failures) == (BreakerState.CLOSED, 4)
    assert fail_times(snapshot, 1).state is BreakerState.OPEN


def test_open_denies_until_the_cooldown_ends_then_offers_a_probe() -> None:
    """Open: deny before cooldown_until, probe from then on."""
    snapshot = opened()
    assert allows(snapshot, T0 + timedelta(seconds=29)) == "deny"
    assert allows(snapshot, T0 + timedelta(seconds=30)) == "probe"
    assert allows(snapshot, T0 + timedelta(hours=5)) == "probe"


def test_claimed_probe_denies_others_until_it_expires() -> None:
    """Once a probe is claimed, other callers are denied until the probe timeout passes."""
    claim_at = T0 + timedelta(seconds=31)
    snapshot = breaker_claim_probe(opened(), claim_at, POLICY)
    assert snapshot.state is BreakerState.HALF_OPEN
    assert snapshot.probe_in_flight
    assert allows(snapshot, claim_at) == "deny"
    assert allows(snapshot, claim_at + POLICY.probe_timeout) == "probe"


def test_half_open_without_a_probe_in_flight_offers_a_probe() -> None:
    """Half-open with no claimed probe lets one be claimed."""
    snapshot = BreakerSnapshot(state=BreakerState.HALF_OPEN, probe_in_flight=False)
    assert allows(snapshot, T0) == "probe"


def test_probe_success_closes_and_resets_everything() -> None:
    """A successful probe closes the breaker and forgets failures and re-opens."""
    snapshot = opened()
    now = T0 + timedelta(seconds=30)
    snapshot = breaker_claim_probe(snapshot, now, POLICY)
    snapshot = breaker_transition(snapshot, "failure", now, POLICY)  # re-open once
    now = snapshot.cooldown_until or now
    snapshot = breaker_claim_probe(snapshot, now, POLICY)
    snapshot = breaker_transition(snapshot, "success", now, POLICY)
    assert snapshot == BreakerSnapshot()
    assert allows(snapshot, now) == "allow"


def test_probe_failures_double_the_cooldown_up_to_the_cap() -> None:
    """Each failed probe re-opens with twice the cool-down: 30s, 60s, ... capped at 10 min."""
    snapshot = opened()
    now = T0
    cooldowns = []
    for _ in range(7):
        assert snapshot.cooldown_until is not None
        now = snapshot.cooldown_until
        snapshot = breaker_claim_probe(snapshot, now, POLICY)
        snapshot = breaker_transition(snapshot, "failure", now, POLICY)
        assert snapshot.state is BreakerState.OPEN
        assert snapshot.opened_at == now
        assert snapshot.cooldown_until is not None
        cooldowns.append((snapshot.cooldown_until - now).total_seconds())
    assert cooldowns == [60, 120, 240, 480, 600, 600, 600]
    assert snapshot.reopen_count == 7


def test_ignored_probe_result_releases_the_probe() -> None:
    """A probe answered by, say, a 404 frees the slot so another probe can run."""
    now = T0 + timedelta(seconds=30)
    snapshot = breaker_claim_probe(opened(), now, POLICY)
    snapshot = breaker_transition(snapshot, "ignored", now, POLICY)
    assert snapshot.state is BreakerState.HALF_OPEN
    assert not snapshot.probe_in_flight
    assert allows(snapshot, now) == "probe"


def test_stragglers_during_cooldown_change_nothing() -> None:
    """Results of calls started before the breaker opened do not move an open breaker."""
    snapshot = opened()
    during = T0 + timedelta(seconds=10)
    assert breaker_transition(snapshot, "success", during, POLICY) == snapshot
    assert breaker_transition(snapshot, "failure", during, POLICY) == snapshot


def test_open_after_cooldown_treats_outcome_as_probe_result() -> None:
    """A result after the cool-down counts as the probe's, even without a claim."""
    snapshot = opened()
    after = T0 + timedelta(seconds=45)
    assert breaker_transition(snapshot, "success", after, POLICY).state is BreakerState.CLOSED
    reopened = breaker_transition(snapshot, "failure", after, POLICY)
    assert (reopened.state, reopened.reopen_count) == (BreakerState.OPEN, 1)


def test_naive_datetimes_from_the_database_are_accepted() -> None:
    """Naive timestamps (as SQLite returns them) compare as UTC, without raising."""
    snapshot = opened()
    naive = BreakerSnapshot(
        state=snapshot.state,
        consecutive_failures=snapshot.consecutive_failures,
        opened_at=T0.replace(tzinfo=None),
        cooldown_until=(T0 + timedelta(seconds=30)).replace(tzinfo=None),
    )
    assert allows(naive, T0 + timedelta(seconds=10)) == "deny"
    assert allows(naive, T0 + timedelta(seconds=30)) == "probe"


def test_open_without_cooldown_offers_a_probe() -> None:
    """An open row missing its cool-down (hand-edited) does not stay closed forever."""
    assert allows(BreakerSnapshot(state=BreakerState.OPEN), T0) == "probe"


@pytest.mark.parametrize(
    ("classification_class", "expected"),
    [
        (None, BreakerOutcome.SUCCESS),
        (ErrorClass.TRANSIENT, BreakerOutcome.FAILURE),
        (ErrorClass.SERVER_ERROR, BreakerOutcome.FAILURE),
        (ErrorClass.VALIDATION, BreakerOutcome.IGNORED),
        (ErrorClass.NOT_FOUND, BreakerOutcome.IGNORED),
        (ErrorClass.AUTHORIZATION, BreakerOutcome.IGNORED),
    ],
)
def test_breaker_outcome_follows_counts_for_breaker(
    classification_class: ErrorClass | None, expected: BreakerOutcome
) -> None:
    """Successes, counted failures and ignored failures map to breaker outcomes."""
    classification = None
    if classification_class is not None:
        classification = Classification(
            error_class=classification_class,
            retryable=False,
            max_attempts=1,
            surface=False,
            retry_after=None,
            reason="x",
            counts_for_breaker=classification_class
            not in {ErrorClass.VALIDATION, ErrorClass.NOT_FOUND, ErrorClass.AUTHORIZATION},
        )
    assert breaker_outcome(classification) is expected


def test_reopen_cooldown_never_overflows() -> None:
    """Absurd re-open counts give the cap, negative ones the first cool-down."""
    assert reopen_cooldown(10**9, POLICY) == POLICY.cooldown_cap
    assert reopen_cooldown(-3, POLICY) == POLICY.cooldown
    huge = BreakerPolicy(cooldown_cap=timedelta.max)
    assert reopen_cooldown(10**9, huge) == timedelta.max


@pytest.mark.parametrize(
    "kwargs",
    [
        {"failure_threshold": 0},
        {"cooldown": timedelta(seconds=-1)},
        {"cooldown": timedelta(hours=1), "cooldown_cap": timedelta(minutes=1)},
        {"probe_timeout": timedelta(0)},
    ],
)
def test_invalid_breaker_policy_is_refused(kwargs: dict[str, object]) -> None:
    """Policies that cannot work raise ConfigurationError when built."""
    with pytest.raises(ConfigurationError):
        BreakerPolicy(**kwargs)  # type: ignore[arg-type]  # kwargs values vary in type


@settings(max_examples=examples(500), deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["success", "failure", "ignored", "claim"]),
            st.integers(min_value=0, max_value=900),
        ),
        max_size=60,
    )
)
def test_any_sequence_keeps_the_snapshot_consistent(steps: list[tuple[str, int]]) -> None:
    """Whatever happens, closed rows have no cool-down and open ones a capped cool-down."""
    snapshot = BreakerSnapshot()
    now = T0
    for action, seconds in steps:
        now += timedelta(seconds=seconds)
        if action == "claim":
            if allows(snapshot, now) == "probe":
                snapshot = breaker_claim_probe(snapshot, now, POLICY)
        else:
            snapshot = breaker_transition(snapshot, action, now, POLICY)  # type: ignore[arg-type]
        if snapshot.state is BreakerState.CLOSED:
            assert snapshot.cooldown_until is None
            assert snapshot.consecutive_failures < POLICY.failure_threshold
            assert allows(snapshot, now) == "allow"
        elif snapshot.state is BreakerState.OPEN:
            assert snapshot.cooldown_until is not None and snapshot.opened_at is not None
            assert snapshot.cooldown_until - snapshot.opened_at <= POLICY.cooldown_cap
            assert not snapshot.probe_in_flight


def test_alternating_failures_open_the_breaker_by_rate() -> None:
    """Half the calls failing opens it once enough calls were made, with no run of N."""
    from synckit.errors.breaker import BreakerPolicy as Policy

    policy = Policy(failure_threshold=5, rate_threshold=0.5, rate_min_calls=20)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    snap = BreakerSnapshot()
    for i in range(19):
        outcome = "failure" if i % 2 == 0 else "success"
        snap = breaker_transition(snap, outcome, now + timedelta(seconds=i), policy)
        assert snap.state is BreakerState.CLOSED
    # The 20th call: 10 failures of 20 calls.
    snap = breaker_transition(snap, "success", now + timedelta(seconds=19), policy)
    assert snap.state is BreakerState.CLOSED  # a success never opens it
    snap = breaker_transition(snap, "failure", now + timedelta(seconds=20), policy)
    assert snap.state is BreakerState.OPEN


def test_successes_of_a_healthy_resource_open_no_window() -> None:
    """Without a recent failure a success changes nothing (so it writes nothing)."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert breaker_transition(BreakerSnapshot(), "success", now) == BreakerSnapshot()


def test_failures_spread_beyond_the_window_do_not_trip_by_rate() -> None:
    """The rate counts one window: a failure every 2 minutes never opens it by rate."""
    from synckit.errors.breaker import BreakerPolicy as Policy

    policy = Policy(failure_threshold=100, rate_min_calls=2, rate_window=timedelta(minutes=1))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    snap = BreakerSnapshot()
    for i in range(10):
        snap = breaker_transition(snap, "failure", now + timedelta(minutes=2 * i), policy)
        snap = breaker_transition(snap, "success", now + timedelta(minutes=2 * i + 1.5), policy)
    assert snap.state is BreakerState.CLOSED


def test_default_first_cooldown_is_short() -> None:
    """Without a server wait, a first opening lasts the default 5 s, and re-opens grow."""
    policy = BreakerPolicy()
    assert policy.cooldown == timedelta(seconds=5)
    snap = BreakerSnapshot()
    for _ in range(policy.failure_threshold):
        snap = breaker_transition(snap, "failure", T0, policy)
    assert snap.cooldown_until == T0 + timedelta(seconds=5)
    assert [open_cooldown(n, None, policy).total_seconds() for n in range(4)] == [5, 10, 20, 40]


def test_first_opening_honours_the_servers_wait() -> None:
    """An outage whose last answer says "3 s left" opens 3 s, not the policy's cool-down."""
    snap = fail_times(BreakerSnapshot(), POLICY.failure_threshold - 1)
    snap = breaker_transition(snap, "failure", T0, POLICY, server_wait=timedelta(seconds=3))
    assert snap.state is BreakerState.OPEN
    assert snap.cooldown_until == T0 + timedelta(seconds=3)


def test_reopening_grows_and_is_never_shorter_than_the_servers_wait() -> None:
    """A re-open grows as the policy says; a longer server wait wins; both within the cap."""
    assert open_cooldown(1, timedelta(seconds=1), POLICY) == timedelta(seconds=60)
    assert open_cooldown(1, timedelta(seconds=90), POLICY) == timedelta(seconds=90)
    assert open_cooldown(0, timedelta(days=3_000_000), POLICY) == POLICY.cooldown_cap
    assert open_cooldown(0, timedelta(seconds=-5), POLICY) == timedelta(0)


@given(
    reopen=st.integers(min_value=0, max_value=200),
    wait=st.one_of(st.none(), st.timedeltas(min_value=timedelta(0))),
    longer=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=30)),
)
def test_open_cooldown_is_bounded_and_monotone(
    reopen: int, wait: timedelta | None, longer: timedelta
) -> None:
    """Any server wait gives a cool-down within the cap; a longer wait never a shorter one."""
    got = open_cooldown(reopen, wait, POLICY)
    assert timedelta(0) <= got <= POLICY.cooldown_cap
    if wait is not None and wait <= timedelta.max - longer:
        assert open_cooldown(reopen, wait + longer, POLICY) >= got


def test_rate_limits_never_count_for_the_breaker() -> None:
    """A rate-limited answer is ignored even if its classification says it counts."""
    c = Classification(
        error_class=ErrorClass.RATE_LIMITED,
        retryable=True,
        max_attempts=None,
        surface=False,
        retry_after=None,
        reason="429",
        counts_for_breaker=True,
    )
    assert breaker_outcome(c) is BreakerOutcome.IGNORED
    snap = fail_times(BreakerSnapshot(), POLICY.failure_threshold - 1)
    assert breaker_transition(snap, breaker_outcome(c), T0, POLICY) == snap


def test_a_lost_probe_is_replaced_after_the_probe_timeout() -> None:
    """A claimed probe blocks others until probe_timeout passes, then another may go."""
    policy = BreakerPolicy(probe_timeout=timedelta(seconds=20))
    snap = breaker_claim_probe(opened(), T0 + timedelta(seconds=30), policy)
    assert snap.probe_expires_at == T0 + timedelta(seconds=50)
    assert allows(snap, T0 + timedelta(seconds=49)) == "deny"
    assert allows(snap, T0 + timedelta(seconds=50)) == "probe"
