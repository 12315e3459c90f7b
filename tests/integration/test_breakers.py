"""Breakers and pacing shared by worker processes, against a real API on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

from loopback import LoopbackServer, Request  # type: ignore[import-not-found]
from procs import spawn_worker, stop_all  # type: ignore[import-not-found]
from waits import await_until  # tests/

from synckit.store.db import Database
from synckit.store.jobs import admin, enqueueing
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.resources import get_resource


async def all_succeeded(db: Database, n: int) -> bool:
    return (await admin.count_by_status(db)).get("succeeded", 0) == n


#: How late past its pacing a held resource's next call may come on a busy machine (a
#: worker's poll and claim, scheduled late): the pacing itself is the lower bound.
LATE_BUDGET = 5.0


async def test_three_processes_share_one_breaker_and_one_probe(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """Once the breaker opens no process calls the API until the cool-down ends; one probe."""
    healthy = False

    def respond(req: Request) -> tuple[int, dict[str, str], bytes]:
        return (200, {}, b"{}") if healthy else (503, {}, b"down")

    api = LoopbackServer(respond)
    n = 20
    await enqueueing.enqueue_many(
        db, [JobSpec("call", {"path": "/x"}, resource_key="api-1", max_attempts=100)] * n
    )
    env = {"BREAKER_APP_API": api.url}
    procs = [
        spawn_worker(
            migrated_url,
            tmp_path / "log",
            "--concurrency",
            "2",
            "--poll-interval",
            "0.05",
            env=env,
            app="breaker_app:registry",
        )
        for _ in range(3)
    ]
    try:
        # Phase 1: failures open the breaker (cool-down 2 s); the probe after it fails and
        # re-opens it for 4 s. Phase 2: the API recovers, the next probe closes it.
        async def probe_failed() -> bool:
            r = await get_resource(db, "api-1")
            return r.reopen_count >= 1 and r.state == "open"

        await await_until(probe_failed, "the first probe to fail")
        reopened = await get_resource(db, "api-1")
        healthy = True
        await await_until(lambda: all_succeeded(db, n), "every job after recovery")
    finally:
        stop_all(procs)
        api.close()
    times = api.times()
    first_open = reopened.cooldown_until.timestamp() - 4.0  # re-open time (cool-down 4 s)
    assert reopened.opened_at is not None
    # Between the first opening and the re-opening, exactly one call: the probe.
    opened_first = [t for t in times if t < first_open]
    burst_end = opened_first[-1]  # the call whose failure re-opened it is the probe
    before_probe = [t for t in times if t < burst_end]
    gap_before_probe = burst_end - before_probe[-1]
    # The cool-down is 2 s from the opening; a call already in flight when it opened may
    # land after it (up to a second under a loaded CI machine), hence the margin: without
    # the breaker the calls come every 0.05 s.
    assert gap_before_probe >= 1.0, f"a call during the first cool-down ({gap_before_probe:.2f}s)"
    in_second_cooldown = [t for t in times if first_open + 0.3 < t < first_open + 3.9]
    assert in_second_cooldown == [], "a call during the doubled cool-down"
    after = [t for t in times if t >= first_open + 3.9]
    assert len(after) >= n  # the probe that closed it, then every job


async def test_429_paces_its_resource_while_others_run(db: Database, tmp_path: Path) -> None:
    """A 429 with Retry-After: 7 holds its resource for 7 s plus 20%; others keep running."""
    import breaker_app  # type: ignore[import-not-found]

    from synckit.runtime.jobs.worker import Worker

    throttled_once = False

    def respond(req: Request) -> tuple[int, dict[str, str], bytes]:
        nonlocal throttled_once
        if req.path == "/a" and not throttled_once:
            throttled_once = True
            return 429, {"Retry-After": "7"}, b"slow down"
        return 200, {}, b"{}"

    api = LoopbackServer(respond)
    import os

    os.environ["BREAKER_APP_API"] = api.url
    await enqueueing.enqueue_many(
        db, [JobSpec("call", {"path": "/a"}, resource_key="tenant-a")] * 3
    )
    await enqueueing.enqueue_many(
        db, [JobSpec("call", {"path": "/b"}, resource_key="tenant-b", delay=None)] * 3
    )
    worker = Worker(db, breaker_app.registry, concurrency=1, poll_interval=0.05)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.sleep(2.0)
        # Meanwhile tenant-b's jobs ran; add more while tenant-a waits.
        await enqueueing.enqueue_many(
            db, [JobSpec("call", {"path": "/b"}, resource_key="tenant-b")] * 3
        )
        await await_until(lambda: all_succeeded(db, 9), "all jobs")
    finally:
        worker.stop()
        await running
        api.close()
        os.environ.pop("BREAKER_APP_API", None)
    a = api.times("/a")
    b = api.times("/b")
    assert len(a) == 4  # the 429, then the three jobs
    # The server's 7 s, no more: a rate limit paces by what the server says.
    assert 7 - 0.05 <= a[1] - a[0] < 7 * 1.2 + LATE_BUDGET, (
        f"tenant-a called again after {a[1] - a[0]:.2f}s"
    )
    # tenant-b was not held back: all its calls, including the jobs enqueued during the
    # wait, were made while tenant-a waited.
    assert len(b) == 6 and max(b) < a[1]
    assert sum(1 for t in b if a[0] < t) >= 3
