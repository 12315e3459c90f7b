"""Parsing of Retry-After, millisecond waits and rate-limit headers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from unittest import mock

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples  # type: ignore[import-not-found]

from synckit.errors import headers as headers_module
from synckit.errors.headers import (
    MAX_WAIT,
    RateLimitInfo,
    parse_rate_limit,
    parse_retry_after,
    server_wait,
    server_wait_signal,
)

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
NOW_EPOCH = int(NOW.timestamp())


# --- Retry-After -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30", timedelta(seconds=30)),
        (" 30 ", timedelta(seconds=30)),
        ("0", timedelta(0)),
        ("1.5", timedelta(seconds=2)),
        ("0.2", timedelta(seconds=1)),
        ("2.000", timedelta(seconds=2)),
        ("120", timedelta(minutes=2)),
    ],
)
def test_retry_after_delta_seconds_fractions_round_up(value: str, expected: timedelta) -> None:
    """Delta-seconds parse exactly; fractional seconds round up to the next whole second."""
    assert parse_retry_after(value, NOW) == expected


def test_retry_after_imf_fixdate_in_the_future_is_the_remaining_time() -> None:
    """An IMF-fixdate gives the time from now until that instant."""
    assert parse_retry_after("Wed, 01 May 2024 12:01:30 GMT", NOW) == timedelta(seconds=90)


def test_retry_after_obsolete_rfc850_date_is_accepted() -> None:
    """The obsolete RFC 850 date form parses."""
    assert parse_retry_after("Wednesday, 01-May-24 12:00:10 GMT", NOW) == timedelta(seconds=10)


@pytest.mark.parametrize(
    ("now", "value", "expected"),
    [
        # Read in 2070, "-70" is 2070 (issue 39: it was taken as 1970, a wait of 0 s).
        (datetime(2070, 1, 1, 0, 0, 0, tzinfo=UTC), "Wednesday, 01-Jan-70 00:00:30 GMT", 30),
        # Read in 2026, 2070 is 44 years ahead: not more than 50, so 2070 (clamped later).
        (datetime(2026, 1, 1, tzinfo=UTC), "Wednesday, 01-Jan-70 00:00:30 GMT", None),
        # Read in 2015, 2070 is 55 years ahead: more than 50, so the past century's 1970.
        (datetime(2015, 1, 1, tzinfo=UTC), "Thursday, 01-Jan-70 00:00:30 GMT", 0),
        # Read in 2099, "-01" is 2101 (two years ahead), not 2001.
        (datetime(2100, 12, 31, 23, 59, 0, tzinfo=UTC), "Saturday, 01-Jan-01 00:00:00 GMT", 60),
        # The same rule for a day-month-year date with spaces and a two-digit year.
        (datetime(2070, 1, 1, tzinfo=UTC), "Wed, 01 Jan 70 00:00:05 GMT", 5),
    ],
)
def test_retry_after_two_digit_year_follows_rfc9110(
    now: datetime, value: str, expected: int | None
) -> None:
    """A two-digit year more than 50 years in the future is in the past century (RFC 9110
    5.6.7); otherwise it is the year with those digits ahead of or near now."""
    wait = parse_retry_after(value, now)
    assert wait is not None
    if expected is None:
        assert wait == MAX_WAIT  # 44 years ahead: clamped, never read as the past
    else:
        assert wait == timedelta(seconds=expected)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(9800, 1, 1)),
    st.integers(min_value=0, max_value=99),
)
def test_two_digit_years_land_within_fifty_years_of_now(now: datetime, yy: int) -> None:
    """Any two-digit year is read as a year in (now - 50, now + 50] with those digits."""
    aware = now.replace(tzinfo=UTC)
    (year,) = [y for y in range(aware.year - 49, aware.year + 51) if y % 100 == yy]
    expected = datetime(year, 6, 15, 12, tzinfo=UTC) - aware
    wait = parse_retry_after(f"Monday, 15-Jun-{yy:02d} 12:00:00 GMT", aware)
    assert wait == min(max(expected, timedelta(0)), MAX_WAIT)


def test_retry_after_asctime_date_is_accepted_as_utc() -> None:
    """The asctime form (no zone) is read as GMT."""
    assert parse_retry_after("Wed May  1 12:00:05 2024", NOW) == timedelta(seconds=5)


def test_retry_after_past_date_is_zero() -> None:
    """A date in the past means retry now: timedelta(0), the floor is applied later."""
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", NOW) == timedelta(0)


def test_retry_after_naive_now_is_treated_as_utc() -> None:
    """A naive clock does not make date arithmetic raise."""
    naive = NOW.replace(tzinfo=None)
    assert parse_retry_after("Wed, 01 May 2024 12:01:00 GMT", naive) == timedelta(minutes=1)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "   ",
        "soon",
        "-5",
        "+5",
        "1e3",
        "30s",
        "3 0",
        "\u0663",  # ARABIC-INDIC DIGIT THREE: int() would accept it, HTTP does not
        "Wed, 99 Foo 2024 12:00:00 GMT",
        "NaN",
        "inf",
    ],
)
def test_retry_after_garbage_or_negative_is_none(value: str | None) -> None:
    """Anything unreadable or negative gives None."""
    assert parse_retry_after(value, NOW) is None


@pytest.mark.parametrize(
    "value",
    [
        "315619201",  # just over ten years: used to read as no wait at all
        "9" * 40,
        "9" * 5000,  # longer than int() converts
        "999999999999",  # ~31,700 years
        "999999999999.5",
        "Wed, 01 May 2044 12:00:00 GMT",  # twenty years ahead
    ],
)
def test_retry_after_beyond_ten_years_is_clamped_not_discarded(value: str) -> None:
    """An absurdly long wait is still a long wait: clamped to MAX_WAIT, never None."""
    assert parse_retry_after(value, NOW) == MAX_WAIT


def test_retry_after_just_under_the_clamp_is_kept() -> None:
    """315532800 s (3652 days) is below MAX_WAIT and kept exactly (the runtime caps it)."""
    assert parse_retry_after("315532800", NOW) == timedelta(seconds=315532800)


@settings(max_examples=examples(500), deadline=None)
@given(st.integers(min_value=0, max_value=10**30), st.integers(min_value=0, max_value=10**30))
def test_retry_after_seconds_are_monotone(a: int, b: int) -> None:
    """A longer Retry-After never parses to a shorter wait."""
    low, high = sorted((a, b))
    wait_low, wait_high = parse_retry_after(str(low), NOW), parse_retry_after(str(high), NOW)
    assert wait_low is not None and wait_high is not None
    assert wait_low <= wait_high <= MAX_WAIT


@settings(max_examples=examples(1000), deadline=None)
@given(st.text())
def test_retry_after_never_raises_on_any_text(value: str) -> None:
    """Arbitrary text never makes parse_retry_after raise, and results are never negative."""
    result = parse_retry_after(value, NOW)
    assert result is None or result >= timedelta(0)


# --- millisecond headers (read by server_wait; disagreeing headers: below) ----------


def test_retry_after_ms_header_is_milliseconds() -> None:
    """retry-after-ms keeps sub-second precision."""
    assert server_wait({"retry-after-ms": "1500"}, NOW) == timedelta(milliseconds=1500)


def test_x_ms_retry_after_ms_header_is_read() -> None:
    """Azure's x-ms-retry-after-ms is read, case-insensitively."""
    headers = {"X-MS-Retry-After-Ms": "250.5"}
    assert server_wait(headers, NOW) == timedelta(microseconds=250500)


def test_garbage_retry_after_ms_falls_through_to_x_ms_header() -> None:
    """An unreadable retry-after-ms does not hide a readable x-ms-retry-after-ms."""
    headers = {"retry-after-ms": "later", "x-ms-retry-after-ms": "900"}
    assert server_wait(headers, NOW) == timedelta(milliseconds=900)


@pytest.mark.parametrize("value", ["", "-1", "abc", "1e5"])
def test_retry_after_ms_garbage_is_none(value: str) -> None:
    """Unreadable millisecond values give None."""
    assert server_wait({"retry-after-ms": value}, NOW) is None


def test_retry_after_ms_absurd_is_clamped() -> None:
    """An absurd millisecond wait is clamped to MAX_WAIT, not ignored."""
    assert server_wait({"retry-after-ms": "9" * 30}, NOW) == MAX_WAIT


# --- server_wait ---------------------------------------------------------------------


def test_server_wait_takes_the_longer_of_disagreeing_headers() -> None:
    """Retry-After: 30 with x-ms-retry-after-ms: 100 waits 30 s, not 0.1 s (issue 39)."""
    headers = httpx.Headers({"Retry-After": "30", "x-ms-retry-after-ms": "100"})
    assert server_wait_signal(headers, NOW) == (timedelta(seconds=30), "Retry-After")
    longer_ms = httpx.Headers({"Retry-After": "1", "retry-after-ms": "2500"})
    assert server_wait_signal(longer_ms, NOW) == (timedelta(milliseconds=2500), "retry-after-ms")


def test_server_wait_on_a_tie_names_the_millisecond_header() -> None:
    """Equal waits: the finer millisecond header is named as the source."""
    headers = httpx.Headers({"Retry-After": "3", "x-ms-retry-after-ms": "3000"})
    assert server_wait_signal(headers, NOW) == (timedelta(seconds=3), "x-ms-retry-after-ms")


@settings(max_examples=examples(300), deadline=None)
@given(
    st.integers(min_value=0, max_value=10**9),
    st.integers(min_value=0, max_value=10**12),
    st.sampled_from(["retry-after-ms", "x-ms-retry-after-ms"]),
)
def test_server_wait_is_never_shorter_than_any_header(seconds: int, millis: int, name: str) -> None:
    """Whatever two wait headers say, the wait is the longer of the two."""
    headers = {"Retry-After": str(seconds), name: str(millis)}
    wait = server_wait(headers, NOW)
    assert wait is not None
    assert wait >= min(timedelta(seconds=seconds), MAX_WAIT)
    assert wait >= min(timedelta(milliseconds=millis), MAX_WAIT)
    assert wait in (
        min(timedelta(seconds=seconds), MAX_WAIT),
        min(timedelta(milliseconds=millis), MAX_WAIT),
    )


def test_server_wait_falls_back_to_retry_after() -> None:
    """Without millisecond headers, Retry-After is the server's wait."""
    assert server_wait(httpx.Headers({"retry-after": "7"}), NOW) == timedelta(seconds=7)


def test_server_wait_reads_plain_mappings_case_insensitively() -> None:
    """A plain dict with any header capitalisation works like httpx.Headers."""
    assert server_wait({"RETRY-AFTER": "7"}, NOW) == timedelta(seconds=7)


def test_server_wait_uses_first_of_repeated_retry_after() -> None:
    """A repeated Retry-After uses its first value rather than a joined, unreadable one."""
    headers = httpx.Headers([("Retry-After", "5"), ("Retry-After", "60")])
    assert server_wait(headers, NOW) == timedelta(seconds=5)


def test_server_wait_without_signals_is_none() -> None:
    """No wait header at all gives None."""
    assert server_wait(httpx.Headers({"content-type": "application/json"}), NOW) is None


# --- rate-limit headers --------------------------------------------------------------


def test_x_ratelimit_with_epoch_seconds_reset() -> None:
    """GitHub-style X-RateLimit-* with an epoch-seconds reset."""
    headers = {
        "X-RateLimit-Limit": "5000",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": str(NOW_EPOCH + 600),
    }
    assert parse_rate_limit(headers, NOW) == RateLimitInfo(
        limit=5000, remaining=0, reset_at=NOW + timedelta(minutes=10)
    )


def test_x_ratelimit_small_reset_is_delta_seconds() -> None:
    """A reset below 1e9 is taken as seconds from now, as several APIs send it."""
    info = parse_rate_limit({"x-ratelimit-remaining": "3", "x-ratelimit-reset": "45"}, NOW)
    assert info == RateLimitInfo(limit=None, remaining=3, reset_at=NOW + timedelta(seconds=45))


def test_x_ratelimit_huge_reset_is_epoch_milliseconds() -> None:
    """A reset of 1e12 or more is epoch milliseconds."""
    info = parse_rate_limit({"x-ratelimit-reset": str((NOW_EPOCH + 2) * 1000)}, NOW)
    assert info is not None
    assert info.reset_at == NOW + timedelta(seconds=2)


def test_x_rate_limit_dashed_spelling_is_read() -> None:
    """The X-Rate-Limit-* spelling (Twitter/X) is read too."""
    info = parse_rate_limit({"x-rate-limit-remaining": "0", "x-rate-limit-limit": "15"}, NOW)
    assert info == RateLimitInfo(limit=15, remaining=0, reset_at=None)


def test_ietf_combined_ratelimit_header() -> None:
    """Drafts 5-7: RateLimit: limit=100, remaining=0, reset=30 (delta seconds)."""
    info = parse_rate_limit({"RateLimit": "limit=100, remaining=0, reset=30"}, NOW)
    assert info == RateLimitInfo(100, 0, NOW + timedelta(seconds=30))
    assert info.exhausted


def test_ietf_separate_ratelimit_headers() -> None:
    """Early drafts: separate RateLimit-Limit/-Remaining/-Reset, reset in delta seconds."""
    headers = {
        "RateLimit-Limit": "10, 10;w=1, 50;w=60",
        "RateLimit-Remaining": "4",
        "RateLimit-Reset": "7",
    }
    assert parse_rate_limit(headers, NOW) == RateLimitInfo(10, 4, NOW + timedelta(seconds=7))


def test_ietf_structured_ratelimit_with_policy() -> None:
    """Draft 8+: RateLimit: "default";r=0;t=30 with the quota from RateLimit-Policy."""
    headers = {"RateLimit": '"default";r=0;t=30', "RateLimit-Policy": '"default";q=100;w=60'}
    assert parse_rate_limit(headers, NOW) == RateLimitInfo(100, 0, NOW + timedelta(seconds=30))


def test_ietf_structured_ratelimit_picks_the_tightest_policy() -> None:
    """With several policies, the one with the least left decides, with its own quota."""
    headers = {
        "RateLimit": '"day";r=900;t=40000, "burst";r=0;t=5',
        "RateLimit-Policy": '"day";q=1000;w=86400, "burst";q=10;w=1',
    }
    assert parse_rate_limit(headers, NOW) == RateLimitInfo(10, 0, NOW + timedelta(seconds=5))


def test_ietf_structured_ratelimit_without_policy_has_no_limit() -> None:
    """Without RateLimit-Policy the quota is unknown but remaining and reset are read."""
    info = parse_rate_limit({"RateLimit": '"default";r=2;t=10'}, NOW)
    assert info == RateLimitInfo(None, 2, NOW + timedelta(seconds=10))


def test_more_restrictive_family_wins_when_both_present() -> None:
    """X-RateLimit saying 0 left beats an IETF header saying some are left."""
    headers = {
        "RateLimit": "limit=100, remaining=50, reset=30",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "60",
    }
    info = parse_rate_limit(headers, NOW)
    assert info == RateLimitInfo(None, 0, NOW + timedelta(seconds=60))


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"content-type": "text/html"},
        {"X-RateLimit-Remaining": "lots"},
        {"X-RateLimit-Remaining": "-1"},
        {"RateLimit": "garbage"},
        {"RateLimit": ";;;,,,==="},
    ],
)
def test_no_or_garbage_rate_limit_headers_give_none(headers: dict[str, str]) -> None:
    """Without any readable rate-limit field, parse_rate_limit returns None."""
    assert parse_rate_limit(headers, NOW) is None


def test_absurd_reset_is_clamped_and_remaining_kept() -> None:
    """A reset thousands of years away is clamped to MAX_WAIT; the other fields still count."""
    info = parse_rate_limit({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "9" * 15}, NOW)
    assert info == RateLimitInfo(None, 0, NOW + MAX_WAIT)
    assert info is not None and info.source == "X-RateLimit"


_HEADER_NAMES = st.sampled_from(
    [
        "retry-after",
        "retry-after-ms",
        "x-ms-retry-after-ms",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
    ]
) | st.text(max_size=20)
_HEADER_VALUES = (
    st.text(max_size=60)
    | st.integers().map(str)
    | st.floats(allow_nan=True).map(str)
    | st.from_regex(r'"[a-z]{0,5}";r=-?[0-9]{1,25};t=-?[0-9.]{1,25}', fullmatch=True)
)


@settings(max_examples=examples(1000), deadline=None)
@given(st.dictionaries(_HEADER_NAMES, _HEADER_VALUES, max_size=6), st.datetimes())
def test_header_parsers_never_raise(headers: dict[str, str], now: datetime) -> None:
    """Arbitrary header maps and clocks never make the parsers raise."""
    parse_rate_limit(headers, now)
    wait = server_wait(headers, now)
    assert wait is None or wait >= timedelta(0)


_CASED_NAMES = st.one_of(
    _HEADER_NAMES,
    st.sampled_from(["X-Rate-Limit-Remaining", "X-RateLimit-Reset", "RateLimit", "Date", "ETag"]),
).flatmap(lambda n: st.sampled_from([n, n.upper(), n.title()]))


@settings(max_examples=examples(500), deadline=None)
@given(
    st.dictionaries(_CASED_NAMES, _HEADER_VALUES, max_size=6),
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)),
    st.booleans(),
)
def test_the_name_check_before_the_parse_changes_no_answer(
    headers: dict[str, str], now: datetime, as_httpx: bool
) -> None:
    """parse_rate_limit skips the parse when no header names a rate limit: its answer is
    the one the full parse gives, for plain mappings and httpx headers alike."""
    given_headers: httpx.Headers | dict[str, str] = headers
    if as_httpx:  # as a response's headers arrive: bytes, whatever they hold
        given_headers = httpx.Headers([(k.encode(), v.encode()) for k, v in headers.items()])
    with mock.patch.object(headers_module, "_names_a_rate_limit", lambda _headers: True):
        expected = parse_rate_limit(given_headers, now)
    assert parse_rate_limit(given_headers, now) == expected
