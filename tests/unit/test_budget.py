"""Error budget decisions: rate, burn and level from counts (pure)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synckit.runtime.observe.budget import BudgetLevel, BudgetPolicy, budget_status


@pytest.mark.parametrize(
    ("ok", "failed", "rate", "burn", "level"),
    [
        (0, 0, 0.0, 0.0, BudgetLevel.HEALTHY),
        (1000, 0, 0.0, 0.0, BudgetLevel.HEALTHY),
        (1991, 9, 0.0045, 0.9, BudgetLevel.HEALTHY),
        (199, 1, 0.005, 1.0, BudgetLevel.WATCH),
        (993, 7, 0.007, 1.4, BudgetLevel.WATCH),
        (198, 2, 0.01, 2.0, BudgetLevel.WATCH),
        (297, 3, 0.01, 2.0, BudgetLevel.WATCH),
        (9979, 21, 0.0021, 0.42, BudgetLevel.HEALTHY),
        (979, 21, 0.021, 4.2, BudgetLevel.ALERT),
        (0, 5, 1.0, 200.0, BudgetLevel.ALERT),
    ],
)
def test_budget_levels_at_and_around_the_boundaries(
    ok: int, failed: int, rate: float, burn: float, level: BudgetLevel
) -> None:
    """Healthy below 100% burn, watch from 100% to 200% inclusive, alert above 200%."""
    s = budget_status(ok, failed)
    assert s.rate == pytest.approx(rate)
    assert s.burn == pytest.approx(burn)
    assert s.level is level
    assert (s.ok, s.failed, s.operations) == (ok, failed, ok + failed)


def test_budget_just_over_twice_is_alert() -> None:
    """A burn a hair above 200% is alert, exactly 200% is still watch."""
    assert budget_status(1_000_000 - 10_001, 10_001).level is BudgetLevel.ALERT
    assert budget_status(1_000_000 - 10_000, 10_000).level is BudgetLevel.WATCH


def test_custom_budget() -> None:
    """The burn is the rate divided by the budget given."""
    s = budget_status(90, 10, budget=0.1)
    assert s.rate == pytest.approx(0.1)
    assert (s.burn, s.level) == (1.0, BudgetLevel.WATCH)
    assert budget_status(90, 10, budget=0.02).level is BudgetLevel.ALERT


@pytest.mark.parametrize(("ok", "failed", "budget"), [(-1, 0, 0.005), (1, -1, 0.005), (1, 1, 0)])
def test_nonsense_is_refused(ok: int, failed: int, budget: float) -> None:
    """Negative counts and a zero budget are errors, not silent zeros."""
    with pytest.raises(ValueError):
        budget_status(ok, failed, budget)


@given(
    ok=st.integers(0, 10**7),
    failed=st.integers(0, 10**7),
    budget=st.floats(0.0001, 1.0),
)
def test_level_agrees_with_rate_and_budget(ok: int, failed: int, budget: float) -> None:
    """Healthy exactly when the rate is under the budget; alert when over twice it."""
    s = budget_status(ok, failed, budget)
    if ok + failed == 0:
        assert s.level is BudgetLevel.HEALTHY
        return
    rate = failed / (ok + failed)
    assert s.burn == pytest.approx(rate / budget, rel=1e-6, abs=1e-8)
    if rate < budget * (1 - 1e-6):
        assert s.level is BudgetLevel.HEALTHY
    if rate > 2 * budget * (1 + 1e-6):
        assert s.level is BudgetLevel.ALERT


@given(total=st.integers(1, 10**6), a=st.integers(0, 10**6), b=st.integers(0, 10**6))
def test_more_failures_never_improve_the_level(total: int, a: int, b: int) -> None:
    """For the same number of operations, more failures never lower the level."""
    fa, fb = sorted((min(a, total), min(b, total)))
    order = list(BudgetLevel)
    la = budget_status(total - fa, fa).level
    lb = budget_status(total - fb, fb).level
    assert order.index(la) <= order.index(lb)


def test_policy_validates_itself() -> None:
    """A budget outside (0, 1] or a non-positive window is refused."""
    with pytest.raises(ValueError):
        BudgetPolicy(budget=2)
    with pytest.raises(ValueError):
        BudgetPolicy(window=timedelta(0))
