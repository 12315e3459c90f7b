"""The pure decisions behind webhook subscriptions: when to renew one, and what a failed
create or renewal leaves (state, retry time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synckit import App, ConfigurationError, Connector, Subscription, Webhooks
from synckit.connectors.subscriptions import (
    ACTIVE,
    FAILED,
    LAPSED,
    PENDING,
    after_failure,
    renew_at,
)
from synckit.connectors.webhooks import GraphNotifications

T0 = datetime(2026, 1, 1, tzinfo=UTC)
spans = st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=30))
#: Hypothesis's per-example deadline is a wall-clock bound: on a loaded machine it fails
#: a pure function that is merely slow to be scheduled (seen once under load 14).
UNTIMED = settings(deadline=None)
policies = st.builds(
    Subscription,
    lifetime=st.timedeltas(min_value=timedelta(seconds=1), max_value=timedelta(days=30)),
    renew_fraction=st.floats(min_value=0.01, max_value=1.0),
    renew_before=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=5)),
    max_failures=st.integers(min_value=1, max_value=20),
    retry_base=st.timedeltas(min_value=timedelta(seconds=1), max_value=timedelta(hours=1)),
    retry_lapsed=st.timedeltas(min_value=timedelta(seconds=1), max_value=timedelta(days=1)),
)


def test_graph_s_lifetime_is_renewed_at_two_thirds_when_that_comes_first() -> None:
    """4230 minutes granted: 2/3 is 2820 minutes, earlier than 6 hours before expiry."""
    policy = Subscription(lifetime=timedelta(minutes=4230))
    assert renew_at(T0, T0 + timedelta(minutes=4230), policy) == T0 + timedelta(minutes=2820)


def test_a_short_grant_is_renewed_renew_before_its_expiry_when_that_comes_first() -> None:
    policy = Subscription(renew_fraction=0.9, renew_before=timedelta(hours=6))
    assert renew_at(T0, T0 + timedelta(hours=24), policy) == T0 + timedelta(hours=18)


@UNTIMED
@given(span=spans, policy=policies)
def test_renewal_is_never_before_the_renewal_nor_after_the_expiry(
    span: timedelta, policy: Subscription
) -> None:
    at = renew_at(T0, T0 + span, policy)
    assert T0 <= at <= max(T0, T0 + span)
    if span > policy.renew_before and span > timedelta(0):
        assert at < T0 + span  # strictly before it expires, when there is room


@UNTIMED
@given(
    failures=st.integers(min_value=1, max_value=40),
    left=st.timedeltas(min_value=timedelta(seconds=-3600), max_value=timedelta(days=3)),
    uniform=st.floats(min_value=0, max_value=1),
    policy=policies,
)
def test_an_active_subscription_lapses_only_after_max_failures_or_its_expiry(
    failures: int, left: timedelta, uniform: float, policy: Subscription
) -> None:
    decided = after_failure(ACTIVE, failures, T0 + left, T0, uniform, policy)
    should_lapse = failures >= policy.max_failures or left <= timedelta(0)
    assert (decided.state == LAPSED) == should_lapse
    if should_lapse:
        assert decided.retry_at == T0 + policy.retry_lapsed
    else:
        assert decided.state == ACTIVE
        assert T0 < decided.retry_at <= T0 + left  # retried before it expires


@UNTIMED
@given(
    failures=st.integers(min_value=1, max_value=40),
    uniform=st.floats(min_value=0, max_value=1),
    policy=policies,
)
def test_a_pending_subscription_fails_after_max_failures_and_backs_off_before(
    failures: int, uniform: float, policy: Subscription
) -> None:
    decided = after_failure(PENDING, failures, None, T0, uniform, policy)
    if failures >= policy.max_failures:
        assert decided == type(decided)(FAILED, T0 + policy.retry_lapsed)
    else:
        assert decided.state == PENDING
        assert T0 < decided.retry_at <= T0 + max(policy.retry_lapsed, policy.retry_base)


@pytest.mark.parametrize("state", [LAPSED, FAILED])
def test_lapsed_and_failed_ones_keep_their_state_and_are_tried_again_later(state: str) -> None:
    policy = Subscription()
    assert after_failure(state, 99, None, T0, 0.5, policy).state == state
    assert after_failure(state, 99, None, T0, 0.5, policy).retry_at == T0 + policy.retry_lapsed


@pytest.mark.parametrize(
    "bad",
    [
        {"lifetime": timedelta(0)},
        {"renew_fraction": 0},
        {"renew_fraction": 1.5},
        {"renew_before": timedelta(seconds=-1)},
        {"max_failures": 0},
        {"streams": "messages"},
    ],
)
def test_a_bad_declaration_is_refused_when_it_is_made(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        Subscription(**bad)  # type: ignore[arg-type]


def test_webhooks_take_only_a_subscription_declaration() -> None:
    with pytest.raises(ConfigurationError, match="subscription"):
        Webhooks(verify=GraphNotifications(secret_field="s"), subscription={"days": 3})  # type: ignore[arg-type]


def test_a_connector_declaring_a_subscription_without_its_hooks_is_refused() -> None:
    class NoHooks(Connector):
        name = "nohooks"
        webhooks = Webhooks(
            verify=GraphNotifications(secret_field="s"), subscription=Subscription()
        )

    with pytest.raises(ConfigurationError, match="create_subscription, renew_subscription"):
        App([NoHooks])
