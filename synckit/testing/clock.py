"""A clock that only moves when a test says so.

:class:`FakeClock` is a ``Callable[[], datetime]``, so it plugs in wherever synckit takes a
clock (``Worker(clock=...)``, :class:`~synckit.testing.fakeapi.FakeAPI`, the Graph
simulator)::

    clock = FakeClock(datetime(2024, 1, 1, tzinfo=UTC))
    worker = Worker(db, registry, clock=clock)
    clock.advance(timedelta(minutes=5))
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

__all__ = ["FakeClock"]

#: Where a :class:`FakeClock` starts unless told otherwise: fixed, so runs are repeatable.
DEFAULT_START = datetime(2024, 1, 1, tzinfo=UTC)


class FakeClock:
    """A timezone-aware clock that stands still until :meth:`advance` or :meth:`set`.

    Thread-safe: a loopback server thread may read it while the test moves it.
    """

    def __init__(self, start: datetime = DEFAULT_START) -> None:
        self._now = _aware(start)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        """The current fake time."""
        with self._lock:
            return self._now

    def __call__(self) -> datetime:
        return self.now()

    def timestamp(self) -> float:
        """The current fake time as POSIX seconds (for code that wants ``time.time()``)."""
        return self.now().timestamp()

    def advance(self, delta: timedelta | float) -> datetime:
        """Move forward by ``delta`` (a timedelta or seconds); returns the new time.

        Moving backwards is refused: use :meth:`set` to simulate a clock jump on purpose.
        """
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError(f"a clock only advances; got {step} (use set() to jump back)")
        with self._lock:
            self._now += step
            return self._now

    def set(self, moment: datetime) -> None:
        """Jump to ``moment`` (timezone-aware), forwards or backwards."""
        moment = _aware(moment)
        with self._lock:
            self._now = moment

    async def sleep(self, seconds: float) -> None:
        """An ``asyncio.sleep`` stand-in: advances the clock instead of waiting.

        It still yields to the event loop once, so other tasks get to run.
        """
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)

    def __repr__(self) -> str:
        return f"FakeClock({self.now().isoformat()})"


def _aware(moment: datetime) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"FakeClock needs a timezone-aware datetime, got {moment!r}")
    return moment
