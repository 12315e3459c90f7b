"""The worker's handler slots: handed out first come, first served, with ``startable``
counting only the waiters still waiting (a cancelled one is passed over)."""

from __future__ import annotations

import asyncio

from synckit.runtime.jobs.worker import _Slots


async def test_startable_counts_live_waiters_through_gives_and_cancellations() -> None:
    slots = _Slots(2)
    assert slots.try_take() and slots.try_take() and not slots.try_take()
    waiters = [asyncio.create_task(slots.take()) for _ in range(4)]
    await asyncio.sleep(0)
    assert slots.startable == 0 and slots._waiting == 4
    waiters[1].cancel()  # gives up before any slot is handed out
    await asyncio.sleep(0)
    assert slots._waiting == 3
    slots.give()  # to waiter 0
    slots.give()  # to waiter 2: the cancelled waiter 1 is passed over
    await asyncio.sleep(0)
    assert waiters[0].done() and waiters[2].done() and not waiters[3].done()
    assert slots._waiting == 1 and slots.startable == 0
    slots.give()  # to waiter 3
    await asyncio.sleep(0)
    assert waiters[3].done() and slots._waiting == 0 and slots.startable == 0
    slots.give()
    assert slots.startable == 1 and slots.try_take() and slots.startable == 0


async def test_a_waiter_handed_a_slot_as_it_is_cancelled_gives_it_back() -> None:
    slots = _Slots(1)
    assert slots.try_take()
    waiter = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    slots.give()  # handed the slot ...
    waiter.cancel()  # ... and cancelled before it resumed
    await asyncio.gather(waiter, return_exceptions=True)
    assert waiter.cancelled() and slots._waiting == 0
    assert slots.startable == 1  # the slot it was handed is back
