"""The worker's claim sizing (``claim_plan``, pure): how many jobs it may hold and claim."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from synckit.runtime.jobs.worker import claim_plan

concurrency = st.integers(min_value=1, max_value=512)
short = st.floats(min_value=0.0, max_value=0.0499, allow_nan=False)
long_ = st.floats(min_value=0.05, max_value=1e6, allow_nan=False)
batch = st.integers(min_value=1, max_value=10_000)


def test_unknown_run_time_claims_only_free_handler_slots() -> None:
    """Before any job ran, a worker claims no more than it can run."""
    assert claim_plan(8, None) == (8, 8)


@given(concurrency, short)
def test_short_jobs_are_claimed_a_large_batch_ahead(c: int, avg: float) -> None:
    """Under 50 ms a job, the batch is 4 x concurrency (at least 64), held beyond the
    handler slots, so claiming overlaps running."""
    capacity, size = claim_plan(c, avg)
    assert size == max(4 * c, 64)
    assert capacity == c + size


@given(concurrency, long_)
def test_long_jobs_are_claimed_only_for_free_slots(c: int, avg: float) -> None:
    """From 50 ms a job, a worker never holds more than it runs (idle workers take the
    rest)."""
    assert claim_plan(c, avg) == (c, c)


@given(concurrency, short, batch)
def test_an_explicit_batch_sets_the_batch_ahead(c: int, avg: float, b: int) -> None:
    assert claim_plan(c, avg, b) == (c + b, b)


@given(concurrency, st.one_of(st.none(), long_), batch)
def test_an_explicit_batch_never_exceeds_the_slots_of_long_jobs(
    c: int, avg: float | None, b: int
) -> None:
    assert claim_plan(c, avg, b) == (c, min(b, c))


def test_the_boundary_is_50_ms() -> None:
    assert claim_plan(2, 0.0499)[0] > 2
    assert claim_plan(2, 0.05) == (2, 2)
