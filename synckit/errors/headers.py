"""Pure parsing of the wait and quota signals APIs put in response headers.

Every function here takes header values exactly as a server sent them and returns
``None`` for anything it cannot read with confidence: garbage, negative numbers,
non-ASCII digits and dates that do not parse. A readable wait or reset further away than
:data:`MAX_WAIT` (ten years) is clamped to it, never discarded: a longer wait asked for
never reads as a shorter one (or as none). The runtime clamps again to the connector's
own cap (:mod:`synckit.errors.waits`). They never raise on header content.

Header lookups are case-insensitive for both :class:`httpx.Headers` and plain
mappings. When a header is repeated, the first occurrence is used.
"""

from __future__ import annotations

import email.utils
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    import httpx

__all__ = [
    "MAX_WAIT",
    "HeadersLike",
    "RateLimitInfo",
    "parse_rate_limit",
    "parse_retry_after",
    "server_wait",
    "server_wait_signal",
]

# A string, so that reading headers does not import httpx: httpx.Headers is a Mapping
# too, named for the reader (and _header reads its repeated headers' first value).
HeadersLike: TypeAlias = "httpx.Headers | Mapping[str, str]"

#: Waits and resets further away than this are clamped to it.
MAX_WAIT = timedelta(days=3653)

_MAX_WAIT_SECONDS = MAX_WAIT.total_seconds()

# ASCII digits only: ``\d`` would accept other scripts' digits, which no server means.
# Any number of digits is a number (a huge one is clamped, not ignored); float() reads
# them without int()'s cost on long strings.
_NUMBER = re.compile(r"\s*([0-9]+)(?:\.([0-9]+))?\s*", re.ASCII)
_LEADING_INT = re.compile(r"\s*([0-9]{1,18})(?:\.[0-9]*)?(?![0-9])", re.ASCII)

# X-RateLimit-Reset values below this are delta seconds (GitLab-style APIs and several
# others send "seconds until reset"); 1e9 seconds after the epoch is September 2001,
# so no real epoch timestamp is smaller. Values at or above 1e12 are epoch
# milliseconds (1e12 epoch seconds would be the year 33658).
_EPOCH_SECONDS_FROM = 1e9
_EPOCH_MILLIS_FROM = 1e12


@dataclass(frozen=True)
class RateLimitInfo:
    """A quota reported by the server.

    ``reset_at`` is when the quota refills (may be in the past: available now).
    Any field may be ``None`` when the server did not say or said garbage. ``source``
    names the header family it came from (``"X-RateLimit"`` or ``"RateLimit"``); it is
    left out of comparisons.
    """

    limit: int | None
    remaining: int | None
    reset_at: datetime | None
    source: str = field(default="", compare=False)

    @property
    def exhausted(self) -> bool:
        """True when the server said no request is left in the current window."""
        return self.remaining == 0


def _as_utc(moment: datetime) -> datetime:
    # HTTP dates are GMT and the stores may hand back naive datetimes: naive means UTC.
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _header(headers: HeadersLike, name: str) -> str | None:
    loaded = sys.modules.get("httpx")  # httpx not loaded: these are no httpx.Headers
    if loaded is not None and isinstance(headers, loaded.Headers):
        values = headers.get_list(name)
        return values[0] if values else None
    wanted = name.lower()
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == wanted and isinstance(value, str):
            return value
    return None


def _number(value: str | None) -> float | None:
    """A non-negative decimal number, or None."""
    if value is None:
        return None
    match = _NUMBER.fullmatch(value)
    if match is None:
        return None
    return float(match.group(0))


def _leading_int(value: str | None) -> int | None:
    """The integer at the start of a header such as ``"100, 100;w=60"``."""
    if value is None:
        return None
    match = _LEADING_INT.match(value)
    return int(match.group(1)) if match else None


def _shift(moment: datetime, delta: timedelta) -> datetime | None:
    try:
        return _as_utc(moment) + delta
    except OverflowError:  # ``now`` within ten years of datetime.max/min
        return None


def _seconds(seconds: float) -> timedelta | None:
    """A non-negative wait clamped to MAX_WAIT (infinity included); None for NaN or < 0."""
    if math.isnan(seconds) or seconds < 0:
        return None
    if seconds >= _MAX_WAIT_SECONDS:
        return MAX_WAIT
    return timedelta(seconds=seconds)


def parse_retry_after(value: str | None, now: datetime) -> timedelta | None:
    """The wait a ``Retry-After`` value asks for.

    Accepts delta-seconds (fractional values are rounded up to the next whole second)
    and HTTP-dates in the IMF-fixdate, obsolete RFC 850 and asctime forms. A two-digit
    year (RFC 850) is read as RFC 9110 section 5.6.7 says: the year with those last
    two digits that is at most 50 years after ``now`` (``-70`` read in 2026 or in 2070 is
    2070; read in 2015 it is 1970). ``0`` and
    dates in the past give ``timedelta(0)``; applying a minimum wait is the caller's
    business (:func:`synckit.errors.backoff.retry_delay`). A wait beyond
    :data:`MAX_WAIT` gives :data:`MAX_WAIT`.
    """
    if value is None:
        return None
    match = _NUMBER.fullmatch(value)
    if match is not None:
        whole, fraction = match.groups()
        seconds = float(whole) + (1 if fraction and fraction.strip("0") else 0)
        return _seconds(seconds)
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    two_digits = _TWO_DIGIT_YEAR.match(value)
    if two_digits is not None:
        moved = _rfc9110_century(when, int(two_digits.group(1)), _as_utc(now).year)
        if moved is None:
            return None
        when = moved
    try:
        wait = _as_utc(when) - _as_utc(now)
    except OverflowError:
        return None
    return min(max(wait, timedelta(0)), MAX_WAIT)


# An HTTP-date whose year has two digits: RFC 850's "Sunday, 06-Nov-94 08:49:37 GMT", or
# the same day-month-year order with spaces, which email.utils also reads.
_TWO_DIGIT_YEAR = re.compile(
    r"\s*(?:[A-Za-z]+,)?\s*[0-9]{1,2}[- ][A-Za-z]{3}[- ]([0-9]{2})(?![0-9])", re.ASCII
)


def _rfc9110_century(when: datetime, yy: int, this_year: int) -> datetime | None:
    """``when`` moved to the century RFC 9110 gives a two-digit year ``yy`` read in
    ``this_year``: a year that appears more than 50 years in the future is the most recent
    past year with the same last two digits, so the year lies in (this_year - 50,
    this_year + 50]. None when that year cannot hold the date (29 February, year 0)."""
    year = (this_year // 100) * 100 + yy
    if year > this_year + 50:
        year -= 100
    elif year <= this_year - 50:
        year += 100
    try:
        return when.replace(year=year)
    except ValueError:
        return None


def server_wait(headers: HeadersLike, now: datetime) -> timedelta | None:
    """The wait the server asked for: the longest of ``retry-after-ms``,
    ``x-ms-retry-after-ms`` and ``Retry-After`` that can be read."""
    signal = server_wait_signal(headers, now)
    return None if signal is None else signal[0]


def server_wait_signal(headers: HeadersLike, now: datetime) -> tuple[timedelta, str] | None:
    """:func:`server_wait` and the header that gave it (``"retry-after-ms"``, ...).

    When the headers disagree (``Retry-After: 30`` with ``x-ms-retry-after-ms: 100``),
    the longer wait wins: waiting too little earns another refusal, waiting a little
    more costs only that. On a tie the first named above wins (the finer header)."""
    found: tuple[timedelta, str] | None = None
    for name in ("retry-after-ms", "x-ms-retry-after-ms"):
        millis = _number(_header(headers, name))
        if millis is not None:
            wait = _seconds(millis / 1000)
            if wait is not None and (found is None or wait > found[0]):
                found = (wait, name)
    wait = parse_retry_after(_header(headers, "retry-after"), now)
    if wait is not None and (found is None or wait > found[0]):
        found = (wait, "Retry-After")
    return found


def _reset_from_delta(value: float | None, now: datetime) -> datetime | None:
    if value is None:
        return None
    delta = _seconds(value)
    return None if delta is None else _shift(now, delta)


def _reset_from_x_header(value: float | None, now: datetime) -> datetime | None:
    if value is None:
        return None
    if value < _EPOCH_SECONDS_FROM:
        return _reset_from_delta(value, now)
    epoch_seconds = value / 1000 if value >= _EPOCH_MILLIS_FROM else value
    now_utc = _as_utc(now)
    delta = epoch_seconds - now_utc.timestamp()
    if math.isnan(delta):
        return None
    # A reset in the past means "available now"; one absurdly far ahead is clamped.
    delta = min(max(delta, -_MAX_WAIT_SECONDS), _MAX_WAIT_SECONDS)
    return _shift(now_utc, timedelta(seconds=delta))


def _names_a_rate_limit(headers: HeadersLike) -> bool:
    """Whether any header's name has ``ratelimit`` or ``rate-limit`` in it, as every
    header :func:`parse_rate_limit` reads does."""
    for key in headers:
        if isinstance(key, str):
            name = key.lower()
            if "ratelimit" in name or "rate-limit" in name:
                return True
    return False


def _x_rate_limit(headers: HeadersLike, now: datetime) -> RateLimitInfo | None:
    # "X-Rate-Limit-*" is the spelling of Twitter/X and a few others.
    for prefix in ("x-ratelimit-", "x-rate-limit-"):
        limit = _leading_int(_header(headers, prefix + "limit"))
        remaining = _leading_int(_header(headers, prefix + "remaining"))
        reset = _reset_from_x_header(_number(_header(headers, prefix + "reset")), now)
        if limit is not None or remaining is not None or reset is not None:
            return RateLimitInfo(limit, remaining, reset, source="X-RateLimit")
    return None


def _split_outside_quotes(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == separator and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _structured_items(value: str) -> list[tuple[str | None, dict[str, str]]]:
    """Items of a structured-field list: ``"name";k=v;k2=v2, ...`` or ``k=v, k2=v2``."""
    items: list[tuple[str | None, dict[str, str]]] = []
    for raw_item in _split_outside_quotes(value, ","):
        name: str | None = None
        params: dict[str, str] = {}
        for piece in _split_outside_quotes(raw_item, ";"):
            piece = piece.strip()
            if not piece:
                continue
            key, sep, param = piece.partition("=")
            if sep:
                params[key.strip().lower()] = param.strip().strip('"')
            elif name is None:
                name = piece.strip('"')
        items.append((name, params))
    return items


def _ietf_rate_limit(headers: HeadersLike, now: datetime) -> RateLimitInfo | None:
    value = _header(headers, "ratelimit")
    if value is not None:
        items = _structured_items(value)
        # Draft 8+: '"default";r=0;t=30', one item per policy, quota in RateLimit-Policy.
        structured = [(n, p) for n, p in items if "r" in p or "t" in p]
        if structured:
            return _structured_rate_limit(structured, headers, now)
        # Drafts 5-7: 'limit=100, remaining=0, reset=30' (reset in delta seconds).
        merged: dict[str, str] = {}
        for _, params in items:
            merged.update(params)
        info = RateLimitInfo(
            limit=_leading_int(merged.get("limit")),
            remaining=_leading_int(merged.get("remaining")),
            reset_at=_reset_from_delta(_number(merged.get("reset")), now),
            source="RateLimit",
        )
        if info != RateLimitInfo(None, None, None):
            return info
    # Drafts up to 4: separate RateLimit-Limit/-Remaining/-Reset headers, delta seconds.
    limit = _leading_int(_header(headers, "ratelimit-limit"))
    remaining = _leading_int(_header(headers, "ratelimit-remaining"))
    reset = _reset_from_delta(_number(_header(headers, "ratelimit-reset")), now)
    if limit is None and remaining is None and reset is None:
        return None
    return RateLimitInfo(limit, remaining, reset, source="RateLimit")


def _structured_rate_limit(
    items: list[tuple[str | None, dict[str, str]]], headers: HeadersLike, now: datetime
) -> RateLimitInfo:
    # Several policies may be reported; the one with the least left (and, on a tie,
    # the latest reset) is the one that will block the next request.
    def tightness(item: tuple[str | None, dict[str, str]]) -> tuple[float, float]:
        remaining = _leading_int(item[1].get("r"))
        reset = _number(item[1].get("t"))
        return (
            math.inf if remaining is None else remaining,
            -(reset if reset is not None and reset <= _MAX_WAIT_SECONDS else 0.0),
        )

    name, params = min(items, key=tightness)
    quotas: dict[str | None, int | None] = {}
    policy = _header(headers, "ratelimit-policy")
    if policy is not None:
        for policy_name, policy_params in _structured_items(policy):
            quotas.setdefault(policy_name, _leading_int(policy_params.get("q")))
    limit = quotas.get(name)
    if limit is None and len(quotas) == 1:
        limit = next(iter(quotas.values()))
    return RateLimitInfo(
        limit=limit,
        remaining=_leading_int(params.get("r")),
        reset_at=_reset_from_delta(_number(params.get("t")), now),
        source="RateLimit",
    )


def parse_rate_limit(headers: HeadersLike, now: datetime) -> RateLimitInfo | None:
    """The quota the server reported, or None when it reported none.

    Reads ``X-RateLimit-Limit/-Remaining/-Reset`` (also spelled ``X-Rate-Limit-*``)
    and the IETF ``RateLimit`` header in all its draft forms: ``RateLimit:
    "default";r=0;t=30`` with ``RateLimit-Policy: "default";q=100;w=60``,
    ``RateLimit: limit=100, remaining=0, reset=30``, and separate
    ``RateLimit-Limit/-Remaining/-Reset`` headers.

    ``X-RateLimit-Reset`` is epoch seconds as GitHub sends it; values below 1e9 are
    taken as delta seconds (as several APIs send them) and values of 1e12 or more as
    epoch milliseconds. IETF resets are always delta seconds.

    When both families are present, the more restrictive report wins: the one with
    fewer requests remaining, then the one with the later reset.
    """
    if not _names_a_rate_limit(headers):
        return None  # most answers: ten header lookups saved
    candidates = [
        info
        for info in (_ietf_rate_limit(headers, now), _x_rate_limit(headers, now))
        if info is not None
    ]
    if not candidates:
        return None

    def restrictiveness(info: RateLimitInfo) -> tuple[float, float]:
        remaining = math.inf if info.remaining is None else info.remaining
        reset = 0.0 if info.reset_at is None else -_as_utc(info.reset_at).timestamp()
        return (remaining, reset)

    return min(candidates, key=restrictiveness)
