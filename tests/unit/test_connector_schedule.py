"""Poll schedules and the token bucket's arithmetic (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synckit.connectors.schedule import cached_schedule, parse_schedule
from synckit.errors.exceptions import ConfigurationError

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


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("every 99999999999999d", "at most 366d"),
        ("every 367d", "at most 366d"),
        ("every 9000000h", "at most 366d"),
        ("every " + "9" * 400 + "s", "too long"),
        ("0 0 31 2 *", "never fires"),
        ("0 0 30 2 *", "never fires"),
        ("* * * * * * 2099", "year field"),
        ("0 0 1 1 * 0 2027", "year field"),
    ],
)
def test_out_of_range_schedules_are_configuration_errors(text: str, says: str) -> None:
    """An interval past a year (past the calendar), a cron that never fires or that ends:
    one ConfigurationError naming the fault, never an OverflowError or a croniter error."""
    with pytest.raises(ConfigurationError, match=says):
        parse_schedule(text)


@pytest.mark.parametrize("text", ["every 366d", "0 0 29 2 *", "* * * * * *", "@yearly"])
def test_schedules_at_the_bounds_tick_forever(text: str) -> None:
    """The longest interval and the rarest dates still have a next tick, far in the future."""
    schedule = parse_schedule(text)
    moment = datetime(2099, 3, 1, tzinfo=UTC)
    assert schedule.next_after(moment, "k") > moment


@given(number=st.integers(min_value=1, max_value=10**40), unit=st.sampled_from("smhd"))
def test_any_interval_parses_or_is_refused(number: int, unit: str) -> None:
    """Every ``every <n><unit>`` parses to a schedule whose next tick exists, or is refused."""
    try:
        schedule = parse_schedule(f"every {number}{unit}")
    except ConfigurationError:
        return
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    assert schedule.next_after(moment, "k") > moment


@pytest.mark.parametrize(
    "kwargs",
    [{"every": timedelta(days=99999)}, {"cron": "0 0 31 2 *"}, {"cron": "* * * * * * 2099"}],
)
def test_recurring_jobs_refuse_out_of_range_schedules(kwargs: dict[str, object]) -> None:
    """A recurring job's interval and cron are held to the same bounds as a poll schedule."""
    from synckit.runtime.jobs.handlers import Recurring

    with pytest.raises(ConfigurationError, match="recurring job 'r'"):
        Recurring(name="r", kind="k", **kwargs)  # type: ignore[arg-type]
