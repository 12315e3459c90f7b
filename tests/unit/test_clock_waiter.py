"""Waiter: waits go through a clock that can sleep (a FakeClock), else through asyncio."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from synckit.clock import SleepingClock, Waiter
from synckit.testing import FakeClock


async def test_a_fake_clock_takes_the_waits_and_times_them() -> None:
    clock = FakeClock()
    waiter = Waiter(clock)
    assert waiter.clock_sleeps and isinstance(clock, SleepingClock)
    mark, wall = waiter.mark(), time.perf_counter()
    await waiter.sleep(3600)
    assert time.perf_counter() - wall < 60  # the hour is the fake clock's, not waited for
    assert waiter.elapsed(mark) == 3600.0
    assert clock() == datetime(2024, 1, 1, 1, tzinfo=UTC)


async def test_a_plain_clock_waits_on_the_event_loop_and_times_monotonically() -> None:
    def jumping_clock() -> datetime:  # a wall clock that jumps back a day: budgets ignore it
        return datetime.now(UTC) - timedelta(days=1)

    waiter = Waiter(jumping_clock)
    assert not waiter.clock_sleeps
    mark = waiter.mark()
    await waiter.sleep(0.05)
    assert 0.04 <= waiter.elapsed(mark) < 60  # not the wall clock's jump of a day
    assert waiter.elapsed(asyncio.get_running_loop().time() + 10) == 0.0  # never negative


def test_a_clock_whose_sleep_is_not_async_is_not_trusted_with_waits() -> None:
    class Odd:
        def __call__(self) -> datetime:
            return datetime.now(UTC)

        def sleep(self, seconds: float) -> None:
            pass

    assert not Waiter(Odd()).clock_sleeps
