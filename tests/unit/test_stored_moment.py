"""stored_moment: what a corrupt-row-proof read makes of a stored timestamp (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synckit.store.resources import read_moments, stored_moment

MOMENTS = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)


@given(MOMENTS)
def test_sqlite_text_and_driver_datetimes_read_back_as_written(moment: datetime) -> None:
    """SQLite's naive UTC text, and PostgreSQL's aware datetime in any zone, give the
    moment back, UTC aware."""
    naive_text = str(moment.replace(tzinfo=None))
    assert stored_moment(naive_text) == moment and stored_moment(naive_text).tzinfo is UTC  # type: ignore[union-attr]
    shifted = moment.astimezone(timezone(timedelta(hours=-3)))
    assert stored_moment(shifted) == moment and stored_moment(shifted).tzinfo is UTC  # type: ignore[union-attr]


@given(st.one_of(st.text(max_size=80), st.integers(), st.floats(), st.binary(max_size=20)))
def test_anything_else_is_a_value_error_naming_it_or_a_moment(value: object) -> None:
    """Whatever a hand-edited SQLite column holds: a moment, or a ValueError saying
    "not a timestamp" (never another exception)."""
    try:
        got = stored_moment(value)
    except ValueError as exc:
        assert str(exc).startswith("not a timestamp: ")
    else:
        assert got is not None and got.tzinfo is UTC


def test_none_is_none_and_read_moments_names_the_bad_columns() -> None:
    """NULL stays None; read_moments gives None for a bad column and names it."""
    assert stored_moment(None) is None
    row = {"a": "2026-01-02 03:04:05", "b": "garbage", "c": None, "d": 17}
    moments, bad = read_moments(row, ["a", "b", "c", "d"])
    assert moments == {
        "a": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "b": None,
        "c": None,
        "d": None,
    }
    assert bad == (("b", "not a timestamp: 'garbage'"), ("d", "not a timestamp: '17'"))
    for text in ("2026-13-01", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
        with pytest.raises(ValueError, match="not a timestamp"):
            stored_moment(text)
