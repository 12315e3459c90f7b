"""How the runtime waits, so that a test's clock can stand in for the wall clock.

synckit takes a clock as a ``Callable[[], datetime]`` wherever it reads the time. A clock
that also offers ``async sleep(seconds)`` (:class:`SleepingClock`, e.g.
:class:`~synckit.testing.clock.FakeClock`, which advances itself instead of sleeping)
takes over the waits as well: pacing waits and inline retries after a rate limit go
through :class:`Waiter`, which sleeps and measures elapsed time on such a clock, and
otherwise uses ``asyncio.sleep`` and the event loop's monotonic time. A connector test
whose API answers ``429`` with ``Retry-After: 30`` therefore runs in milliseconds, with
the clock 30 s further on afterwards.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = [
    "DURATION_UNITS",
    "MAX_DURATION",
    "SleepingClock",
    "Waiter",
    "duration_unit",
    "parse_duration",
    "short_duration",
]


@runtime_checkable
class SleepingClock(Protocol):
    """A clock whose waits the runtime hands to it (instead of ``asyncio.sleep``)."""

    def __call__(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...


class Waiter:
    """Sleeps and stopwatch for waits tied to ``clock``.

    With a :class:`SleepingClock`, :meth:`sleep` is the clock's and elapsed time is read
    from the clock, so waited time counts against a budget (``max_inline_wait``) just as
    real waits do. Otherwise, ``asyncio.sleep`` and the loop's monotonic time: the wall
    clock may jump, a budget must not.
    """

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.clock = clock
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self._clock_sleeps = False
        if isinstance(clock, SleepingClock) and inspect.iscoroutinefunction(clock.sleep):
            self._sleep, self._clock_sleeps = clock.sleep, True

    @property
    def clock_sleeps(self) -> bool:
        """Whether waits go through the clock (a test's) rather than the event loop."""
        return self._clock_sleeps

    def mark(self) -> float:
        """A point to measure :meth:`elapsed` from."""
        if self._clock_sleeps:
            return self.clock().timestamp()
        return asyncio.get_running_loop().time()

    def elapsed(self, since: float) -> float:
        """Seconds since ``since`` (a :meth:`mark`), never negative."""
        return max(self.mark() - since, 0.0)

    async def sleep(self, seconds: float) -> None:
        await self._sleep(seconds)


def utcnow() -> datetime:
    """The wall clock, timezone-aware: the default wherever synckit takes a clock."""
    return datetime.now(UTC)


#: The longest duration an operator gives (``synckit dlq purge --older-than``, the
#: console's "since"): past it, a date computed from now leaves the calendar (or the
#: database's range), so it is a typo, not an intent.
MAX_DURATION = timedelta(days=100 * 366)


def parse_duration(text: str) -> timedelta:
    """``90s``, ``10m``, ``2h``, ``7d`` or a plain number of seconds, up to 100 years;
    :class:`ValueError` with a one-line reason otherwise."""
    m = re.fullmatch(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*([smhd]?)\s*", text)
    if not m:
        raise ValueError(f"cannot read duration {text!r}: use forms like 90s, 10m, 2h, 7d")
    unit = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    seconds = float(m.group(1)) * unit
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"duration {text.strip()!r} is longer than 100 years")
    return timedelta(seconds=seconds)


#: The units a duration is shown in, largest first: (suffix, seconds).
DURATION_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def duration_unit(seconds: int, times: int = 1) -> int:
    """Which of :data:`DURATION_UNITS` (its index) ``seconds`` reads best in: the largest
    unit it holds at least ``times`` times; seconds below a minute's worth."""
    for i, (_, size) in enumerate(DURATION_UNITS[:-1]):
        if seconds >= times * size:
            return i
    return len(DURATION_UNITS) - 1


def short_duration(seconds: float) -> str:
    """``95s``, ``12m``, ``3.5h``, ``2.1d``: a duration in the unit it reads best in (whole
    seconds below two minutes, minutes below two hours, hours below two days)."""
    s = int(seconds)
    unit, size = DURATION_UNITS[duration_unit(s, 2)]
    if size <= 60:
        return f"{s // size}{unit}"
    return f"{s / size:.1f}{unit}"
