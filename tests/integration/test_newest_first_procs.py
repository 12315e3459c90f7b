"""Newest-first listings end to end (issue 37): three `synckit worker` processes on each
engine sync a Stripe-like API on loopback (synckit.testing.NewestFirstList), each tenant
on its own base URL (``base_url = "{api_url}/v1"``).

Every count is the server's: ``handle()`` posts each record to the API's ``/sink``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from procs import spawn_worker, stop_all  # type: ignore[import-not-found]
from sqlalchemy import select

from synckit.runtime.admin.actions import enqueue_cycles
from synckit.store.db import Database
from synckit.store.jobs._base import FINISHED
from synckit.store.tables import jobs
from synckit.testing import FakeAPI, NewestFirstList, RecordedRequest

WORKERS = 3
TENANTS = ("acme", "globex", "initech")
#: Seconds a phase may take at most on a loaded machine; the run takes a few.
BUDGET = 180.0


class StripeLikeApi:
    """One FakeAPI serving every tenant's lists under ``/t/<tenant>/v1``, and a sink."""

    def __init__(self) -> None:
        self.api = FakeAPI()
        self.customers: dict[str, NewestFirstList] = {}
        self.events: dict[str, NewestFirstList] = {}
        self.sunk: list[tuple[str, str, str]] = []
        self.api.route("GET", "/t/{tenant}/v1/customers", self._list(self.customers))
        self.api.route("GET", "/t/{tenant}/v1/events", self._list(self.events))
        self.api.route("POST", "/t/{tenant}/v1/sink", self._sink)

    def add_tenant(self, name: str, *, disorder: bool = False) -> None:
        self.customers[name] = NewestFirstList("cus", disorder=disorder)
        self.events[name] = NewestFirstList("evt", per_second=3)

    def _list(self, lists: dict[str, NewestFirstList]) -> Any:
        def handler(request: RecordedRequest) -> Any:
            return lists[request.params["tenant"]].handle(request)

        return handler

    def _sink(self, request: RecordedRequest) -> Any:
        body = request.json()
        self.sunk.append((request.params["tenant"], body["stream"], body["id"]))
        return {"ok": True}

    def handled(self, tenant: str, stream: str) -> list[str]:
        with self.api.lock:
            return [i for t, s, i in self.sunk if (t, s) == (tenant, stream)]


async def run_cycles(db: Database, tenants: Sequence[str], procs: Sequence[Any]) -> list[Any]:
    """Enqueue a cycle of every stream of ``tenants``; the finished poll jobs' rows."""
    from stripe_app import app  # type: ignore[import-not-found]

    ids = []
    for tenant in tenants:
        _, progress = await enqueue_cycles(db, app, tenant)
        assert all(p.created for p in progress), "a cycle of the phase before is unfinished"
        ids += [p.job_id for p in progress]
    deadline = time.monotonic() + BUDGET
    while True:
        async with db.read() as conn:
            rows = (await conn.execute(select(jobs).where(jobs.c.id.in_(ids)))).all()
        if all(r.status in FINISHED for r in rows):
            return list(rows)
        assert time.monotonic() < deadline, f"cycles unfinished: {[r.status for r in rows]}"
        assert all(p.poll() is None for p in procs), "a worker exited"
        await asyncio.sleep(0.1)


async def test_a_newest_first_listing_syncs_completely_on_the_first_and_incremental_cycle(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """2,000 customers over 20 pages per tenant, 3 tenants, 3 workers: every customer
    handled once on the first cycle; 150 more at the top, then every new one once on the
    next cycle (and nothing old again), which reads only the pages down to the old ones.
    The events stream backfills 250 events, then catches up 120 new ones oldest first,
    then resyncs once its position falls out of retention. A fourth tenant's list comes
    out of order: its cycle fails with an error naming the stream, and hands nothing on."""
    from stripe_app import CONNECTOR, app

    server = StripeLikeApi()
    for name in TENANTS:
        server.add_tenant(name)
        server.customers[name].add(2000)
        server.events[name].add(250)
    server.add_tenant("umbrella", disorder=True)
    server.customers["umbrella"].add(300)
    logs = tmp_path / "logs"
    logs.mkdir()
    with server.api.serve_in_thread() as url:
        for name in (*TENANTS, "umbrella"):
            await app.add_tenant(
                db, name, CONNECTOR, {"api_url": f"{url}/t/{name}"}, schedule="every 1d"
            )
        procs = [
            spawn_worker(
                migrated_url,
                logs / "worker.log",
                "--concurrency",
                "4",
                "--poll-interval",
                "0.1",
                "--grace",
                "2",
                app="stripe_app:app",
            )
            for _ in range(WORKERS)
        ]
        try:
            # The first cycle: a full walk down of 20 pages, and the events' backfill.
            first = await run_cycles(db, (*TENANTS, "umbrella"), procs)
            for name in TENANTS:
                handled = server.handled(name, "customers")
                assert len(handled) == 2000 and set(handled) == set(server.customers[name].ids())
                assert sorted(server.handled(name, "events")) == sorted(server.events[name].ids())
            broken = [r for r in first if r.resource_key.endswith("umbrella")]
            failed = [r for r in broken if r.status != "succeeded"]
            assert len(failed) == 1 and failed[0].status == "dead", [r.status for r in broken]
            assert "stream 'customers'" in failed[0].last_error
            assert "is not sorted by 'created'" in failed[0].last_error
            assert server.handled("umbrella", "customers") == []
            by_worker = Counter(r.locked_by for r in first)
            print(f"first cycles by worker: {dict(by_worker)}")

            # The incremental cycle: new records at the top of both lists.
            pages_before = {
                n: len(server.api.calls("GET", f"/t/{n}/v1/customers")) for n in TENANTS
            }
            new = {n: server.customers[n].add(150) for n in TENANTS}
            new_events = {n: server.events[n].add(120) for n in TENANTS}
            await run_cycles(db, TENANTS, procs)
            for name in TENANTS:
                handled = server.handled(name, "customers")
                assert len(handled) == len(set(handled)) == 2150, "lost or repeated"
                assert set(handled[2000:]) == {o["id"] for o in new[name]}
                # 150 new ones: two pages, the second reaching the old watermark.
                reads = len(server.api.calls("GET", f"/t/{name}/v1/customers"))
                assert reads - pages_before[name] == 2
                events = server.handled(name, "events")
                assert events[250:] == [o["id"] for o in new_events[name]]  # oldest first

            # The events' position falls out of retention: a resync walks down to it.
            for name in TENANTS:
                lst = server.events[name]
                position = server.handled(name, "events")[-1]
                with lst.lock:
                    lst.objects = [o for o in lst.objects if o["id"] != position]
                lst.add(40)
            await run_cycles(db, TENANTS, procs)
            for name in TENANTS:
                events = server.handled(name, "events")
                assert len(events) == len(set(events)) == 250 + 120 + 40, "lost or repeated"
        finally:
            stop_all(procs, timeout=15)


async def test_a_worker_killed_mid_walk_loses_nothing_and_moves_no_watermark_early(
    db: Database, migrated_url: str, tmp_path: Path
) -> None:
    """The worker walking a tenant's 2,000 newest-first customers is killed (SIGKILL) a
    quarter of the way down. Another worker resumes the walk from its last committed page:
    every customer is handled (only the page in flight when it died, uncommitted, twice;
    a page more for each attempt a late heartbeat ended on a loaded machine),
    and the next cycle hands on exactly the 150 new ones: the watermark did not move
    before the walk was over."""
    from stripe_app import CONNECTOR, app

    server = StripeLikeApi()
    server.api.latency = 0.005  # every answer, the sink's too: the walk takes seconds
    server.add_tenant("acme")
    server.customers["acme"].add(2000)
    logs = tmp_path / "logs"
    logs.mkdir()
    with server.api.serve_in_thread() as url:
        await app.add_tenant(
            db, "acme", CONNECTOR, {"api_url": f"{url}/t/acme"}, schedule="every 1d"
        )
        procs = [
            spawn_worker(
                migrated_url,
                logs / "worker.log",
                "--concurrency",
                "4",
                "--poll-interval",
                "0.1",
                "--lease",
                "3s",
                "--grace",
                "2",
                app="stripe_app:app",
            )
            for _ in range(WORKERS)
        ]
        try:
            _, progress = await enqueue_cycles(db, app, "acme", ["customers"])
            job_id = progress[0].job_id
            deadline = time.monotonic() + BUDGET
            while len(server.handled("acme", "customers")) < 500:
                assert time.monotonic() < deadline, "the walk did not get going"
                await asyncio.sleep(0.02)
            async with db.read() as conn:
                owner = (
                    await conn.execute(select(jobs.c.locked_by).where(jobs.c.id == job_id))
                ).scalar_one()
            victim = next(p for p in procs if f":{p.pid}:" in (owner or ""))
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            handled_at_kill = len(server.handled("acme", "customers"))
            assert handled_at_kill < 2000, "killed too late to be mid-walk"
            survivors = [p for p in procs if p is not victim]
            while True:
                async with db.read() as conn:
                    row = (await conn.execute(select(jobs).where(jobs.c.id == job_id))).one()
                if row.status in FINISHED:
                    break
                assert time.monotonic() < deadline, f"not resumed: {row.status}"
                await asyncio.sleep(0.1)
            assert row.status == "succeeded" and row.attempts >= 2, (row.status, row.attempts)
            handled = server.handled("acme", "customers")
            assert set(handled) == set(server.customers["acme"].ids()), "lost"
            twice = [i for i, n in Counter(handled).items() if n > 1]
            # Each attempt that did not finish repeats at most its page in flight (a page is
            # handled only once the one before it committed). The kill ends one; on a loaded
            # machine a 3 s lease can also lapse before a heartbeat (the job is rescued, the
            # late attempt's commit fenced), which ends another: the job's attempts say how
            # many there were.
            interrupted = row.attempts - 1
            assert len(twice) <= 100 * interrupted, (
                f"{len(twice)} handled twice: more than a page for each of the"
                f" {interrupted} interrupted attempt(s)"
            )
            print(
                f"killed after {handled_at_kill} handled; {len(twice)} handled twice;"
                f" {row.attempts} attempts"
            )

            before = len(handled)
            new = server.customers["acme"].add(150)
            await run_cycles(db, ["acme"], survivors)
            after = server.handled("acme", "customers")[before:]
            assert sorted(after) == sorted(o["id"] for o in new)
        finally:
            stop_all(procs, timeout=15)
