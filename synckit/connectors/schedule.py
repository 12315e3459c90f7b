"""Poll schedules: ``every 5m`` or a cron expression, and their next tick (pure).

This is the one schedule grammar: the poller, tenants' settings, connectors' declarations
and the ``poll_lag`` alert rule all read schedules through :func:`parse_schedule`.

Interval ticks are spread over the interval by a stable phase derived from the schedule's
key (``poll:tenant:stream``): a thousand tenants on ``every 5m`` do not all fire in the
same second, and every worker computes the same ticks for one key. Cron ticks are exact,
because whoever wrote ``0 3 * * *`` meant three o'clock.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from synckit.errors.exceptions import ConfigurationError

DEFAULT_SCHEDULE = "every 5m"
#: The longest ``every`` interval: a yearly poll, and every tick stays inside the calendar
#: (``every 99999999999999d`` is one error line, not an overflow in the poller).
MAX_INTERVAL = timedelta(days=366)
# A cron must fire from here (and then fires forever: with no year field the calendar
# repeats, and every day-of-month a month has comes within croniter's 50-year search).
_CRON_PROBE = datetime(2000, 1, 1, tzinfo=UTC)

_EVERY = re.compile(r"\s*every\s+(\d+(?:\.\d+)?)\s*([smhd])\s*", re.IGNORECASE | re.ASCII)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class PollSchedule:
    """A parsed schedule: exactly one of ``every`` and ``cron`` is set."""

    text: str
    every: timedelta | None = None
    cron: str | None = None

    def next_after(self, moment: datetime, key: str = "") -> datetime:
        """The first tick strictly after ``moment`` for the schedule of ``key``."""
        if self.every is not None:
            step = self.every.total_seconds()
            phase = _phase(key, step)
            t = moment.timestamp()
            n = (t - phase) // step + 1
            return datetime.fromtimestamp(n * step + phase, tz=moment.tzinfo or UTC)
        assert self.cron is not None
        from croniter import croniter  # cron schedules only: `every 5m` never loads it

        nxt: datetime = croniter(self.cron, moment).get_next(datetime)
        return nxt


def _phase(key: str, step: float) -> float:
    digest = hashlib.sha256(key.encode()).digest()
    return (int.from_bytes(digest[:8], "big") % 1_000_000) / 1_000_000 * step


def parse_schedule(text: str) -> PollSchedule:
    """Read ``every <n><s|m|h|d>`` or a cron expression; :class:`ConfigurationError` if neither."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError("schedule is empty: use 'every 5m' or a cron expression")
    match = _EVERY.fullmatch(text)
    if match is not None:
        number = match.group(1)
        if len(number) > 32:  # more digits than any interval up to MAX_INTERVAL needs
            raise ConfigurationError(f"schedule {text[:60]!r}...: the interval is too long")
        seconds = float(number) * _UNIT[match.group(2).lower()]
        if seconds < 1:
            raise ConfigurationError(f"schedule {text!r}: the interval must be at least 1s")
        if seconds > MAX_INTERVAL.total_seconds():
            raise ConfigurationError(
                f"schedule {text!r}: the interval must be at most {MAX_INTERVAL.days}d"
            )
        return PollSchedule(text=text.strip(), every=timedelta(seconds=seconds))
    expr = text.strip()
    from croniter import croniter

    if croniter.is_valid(expr):
        problem = cron_problem(expr)
        if problem is not None:
            raise ConfigurationError(f"schedule {text!r}: {problem}")
        return PollSchedule(text=expr, cron=expr)
    raise ConfigurationError(
        f"schedule {text!r} is neither 'every <n><s|m|h|d>' (e.g. 'every 5m') "
        "nor a valid cron expression (e.g. '*/10 * * * *')"
    )


def cron_problem(expr: str) -> str | None:
    """Why a cron expression that croniter accepts still cannot serve as a schedule (a
    year field, which ends; a date that never comes, like ``0 0 31 2 *``), or None."""
    if len(expr.split()) > 6:
        return "a year field is not supported: a schedule must keep firing"
    from croniter import croniter

    try:
        croniter(expr, _CRON_PROBE).get_next(datetime)
    except (ValueError, OverflowError):  # CroniterBadDateError is a ValueError
        return "it never fires (no such date)"
    return None


@functools.lru_cache(maxsize=1024)
def cached_schedule(text: str) -> PollSchedule:
    """:func:`parse_schedule`, remembered: a few distinct schedules serve many tenants, and
    a rule reading every tenant's should not parse the same text each time. A text that
    cannot be read raises each time (errors are not cached)."""
    return parse_schedule(text)
