"""The worker's claim loop on an in-memory fake of the job store.

``Worker._claim_loop`` decides how many jobs to ask for and when (free handler slots, a
batch claimed ahead for short jobs, a few slots gathered before claiming again), how many
of them the claim may start (charge their attempt at once), and what to do when a claim
fails. ``Worker.claims`` (the :class:`~synckit.store.jobs.claiming.ClaimStore` operation) is where
it asks. Here a fake hands out jobs from a list and keeps every request, so those
decisions are pinned without a database; which jobs a claim returns (lanes, fairness,
caps, breakers) is SQL, tested on both engines in tests/integration/test_queue.py,
test_lane_marks.py and test_claim_plans.py.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from synckit.errors.exceptions import DatabaseUnavailable
from synckit.runtime.jobs.handlers import Registry
from synckit.runtime.jobs.worker import Worker
from synckit.store.jobs._base import ClaimedJob

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class FakeClaims:
    """Jobs handed out first in, first out; each request kept as (limit, start)."""

    pool: deque[int] = field(default_factory=lambda: deque(range(1, 101)))
    asked: list[tuple[int, int | None]] = field(default_factory=list)
    fail_next: int = 0
    answered: asyncio.Event = field(default_factory=asyncio.Event)

    async def claim(self, db: Any, worker_id: str, limit: int, **kw: Any) -> list[ClaimedJob]:
        self.asked.append((limit, kw["start"]))
        self.answered.set()
        if self.fail_next:
            self.fail_next -= 1
            raise DatabaseUnavailable("the database went away")
        start = limit if kw["start"] is None else kw["start"]
        out = []
        for i in range(min(limit, len(self.pool))):
            job_id = self.pool.popleft()
            out.append(ClaimedJob(job_id, "k", {}, None, 1, 5, 0, None, NOW, 1, started=i < start))
        return out


def _worker(fake: FakeClaims, **kw: Any) -> Worker:
    class OnFake(Worker):
        claims = fake

        def _start(self, job: ClaimedJob) -> None:
            # Held, never run: the test decides when a slot frees.
            self._held[job.id] = job

    return OnFake(db=None, registry=Registry(), **kw)  # type: ignore[arg-type]


async def _next_request(fake: FakeClaims, n: int) -> None:
    """Wait until the fake has answered ``n`` requests in all."""
    async with asyncio.timeout(5):
        while len(fake.asked) < n:
            fake.answered.clear()
            await fake.answered.wait()
    await asyncio.sleep(0.05)  # anything the loop would do next, it does now


async def _stop(worker: Worker, loop: asyncio.Task[None]) -> None:
    worker._stopping.set()
    worker._slot_free.set()
    worker._wake.set()
    async with asyncio.timeout(5):
        await loop


def _free(worker: Worker, n: int) -> None:
    for job_id in sorted(worker._held)[:n]:
        del worker._held[job_id]
    worker._slot_free.set()


async def test_a_worker_asks_only_for_its_free_slots_and_starts_what_can_run() -> None:
    """Before any job ran it claims one slot's worth each (4 of concurrency 4), all to be
    started at once; full, it asks for nothing; two freed, it asks for two."""
    fake = FakeClaims()
    worker = _worker(fake, concurrency=4)
    loop = asyncio.create_task(worker._claim_loop(idle_exit=False))
    await _next_request(fake, 1)
    assert fake.asked == [(4, 4)]
    assert len(worker._held) == 4  # and no further request while full
    _free(worker, 2)
    await _next_request(fake, 2)
    assert fake.asked[1][0] == 2
    assert len(fake.asked) == 2
    await _stop(worker, loop)


async def test_short_jobs_are_claimed_a_batch_ahead_and_claimed_again_at_half_a_batch() -> None:
    """Once jobs are known to take under 50 ms, the worker holds a batch beyond its handler
    slots (64 asked, only the 4 free slots' worth started by the claim), and claims again
    only when half a batch has room: each claim is a transaction."""
    fake = FakeClaims(pool=deque(range(1, 1001)))
    worker = _worker(fake, concurrency=4)
    worker._avg_run = 0.001
    loop = asyncio.create_task(worker._claim_loop(idle_exit=False))
    await _next_request(fake, 1)
    assert fake.asked == [(64, 4)]  # max(4 x 4, 64) asked, 4 slots to start
    _free(worker, 20)  # 24 of 68 free: under half a batch, no claim
    await asyncio.sleep(0.1)
    assert len(fake.asked) == 1
    _free(worker, 8)  # 32 free: half a batch
    await _next_request(fake, 2)
    assert fake.asked[1] == (32, 4)
    await _stop(worker, loop)


async def test_no_start_is_charged_by_a_claim_while_outcomes_are_unrecorded() -> None:
    """A start mark may not commit before outcomes that finished earlier here: while
    some are unrecorded, the claim starts nothing (the jobs start later, in order)."""
    fake = FakeClaims()
    worker = _worker(fake, concurrency=4)
    worker._unrecorded = 1
    loop = asyncio.create_task(worker._claim_loop(idle_exit=False))
    await _next_request(fake, 1)
    assert fake.asked[0] == (4, 0)
    await _stop(worker, loop)


async def test_charge_at_claim_lets_the_claim_start_every_job() -> None:
    fake = FakeClaims()
    worker = _worker(fake, concurrency=4, charge_at="claim")
    loop = asyncio.create_task(worker._claim_loop(idle_exit=False))
    await _next_request(fake, 1)
    assert fake.asked[0] == (4, None)
    await _stop(worker, loop)


async def test_a_failed_claim_is_retried_and_the_worker_goes_on() -> None:
    fake = FakeClaims(fail_next=2)
    worker = _worker(fake, concurrency=2)
    loop = asyncio.create_task(worker._claim_loop(idle_exit=False))
    await _next_request(fake, 3)
    assert [limit for limit, _ in fake.asked] == [2, 2, 2]
    assert sorted(worker._held) == [1, 2]
    assert not loop.done()
    await _stop(worker, loop)


async def test_an_idle_worker_in_burst_mode_stops_when_a_claim_finds_nothing() -> None:
    fake = FakeClaims(pool=deque())
    worker = _worker(fake, concurrency=4)
    async with asyncio.timeout(5):
        await worker._claim_loop(idle_exit=True)
    assert fake.asked == [(4, 4)]
