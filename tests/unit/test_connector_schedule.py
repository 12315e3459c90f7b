"""Poll schedules and the token bucket's arithmetic (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synckit.connectors.schedule import cached_schedule, parse_schedule
from synckit.errors import ConfigurationError

NOW = datetime(2024, 5, 1, 12, 0, 7, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("every 5m", 300), ("every 30s", 30), ("EVERY 2h", 7200), ("every 1d", 86400)],
)
def test_interval_schedules(text: str, seconds: int) -> None:
    assert parse_schedule(text).every == timedelta(seconds=seconds)


def test_cron_schedule_ticks_exactly() -> None:
    s = parse_schedule("*/10 * * * *")
    assert s.cron == "*/10 * * * *"
    assert s.next_after(NOW) == datetime(2024, 5, 1, 12, 10, tzinfo=UTC)


@pytest.mark.parametrize("text", ["", "sometimes", "every 0s", "every 5 minutes", "61 * * * *"])
def test_bad_schedules_are_refused_with_the_forms_named(text: str) -> None:
    with pytest.raises(ConfigurationError, match="schedule"):
        parse_schedule(text)


@pytest.mark.parametrize("text", ["every 5m", "*/10 * * * *", "sometimes", "every 0s", ""])
def test_the_cached_reading_is_parse_schedule(text: str) -> None:
    """cached_schedule reads as parse_schedule does, refuses with the same words, and
    parses a readable text once."""
    try:
        expected = parse_schedule(text)
    except ConfigurationError as exc:
        with pytest.raises(ConfigurationError) as info:
            cached_schedule(text)
        assert str(info.value) == str(exc)
        return
    assert cached_schedule(text) == expected
    assert cached_schedule(text) is cached_schedule(text)


def test_interval_ticks_are_spread_by_key_and_stable() -> None:
    """Tenants on one interval tick at different offsets, and each always at its own."""
    s = parse_schedule("every 5m")
    ticks = {s.next_after(NOW, f"poll:t{i}:default") for i in range(50)}
    assert len(ticks) > 40
    a = s.next_after(NOW, "poll:acme:default")
    assert s.next_after(NOW, "poll:acme:default") == a
    assert s.next_after(a, "poll:acme:default") - a == timedelta(minutes=5)


@given(
    st.integers(min_value=1, max_value=86400),
    st.integers(min_value=0, max_value=10**6),
    st.text(max_size=20),
)
def test_next_tick_is_after_and_within_one_interval(step: int, offset: int, key: str) -> None:
    s = parse_schedule(f"every {step}s")
    moment = NOW + timedelta(seconds=offset)
    nxt = s.next_after(moment, key)
    assert moment < nxt <= moment + timedelta(seconds=step) + timedelta(microseconds=1)
