"""Many tenants on one database: ``python -m bench.tenants [--sizes 1000,10000] [--json]``.

Per size and engine (PostgreSQL; SQLite up to 10,000), with a trivial connector (one GET
answered at once with one empty page, ``flow_app`` on ``synckit.testing.hostile``):

* ``add_s``: adding every tenant with :func:`synckit.runtime.admin.bulk.add_tenants`;
* ``scheduler_all_due_s`` / ``scheduler_all_due_ok``: the first scheduler call after
  that (every tenant due), in bounded runs, and whether it enqueued them all;
* ``scheduler_none_due_ms``: a scheduler call with nothing due (median of 5);
* ``claim_ms``: one claim of 32 jobs with every tenant's cycle pending (median of 10);
* ``cycle_all_s_1w`` / ``cycle_all_s_2w``: one cycle of every tenant (at most
  ``--cycle-limit`` of them; then the time is scaled up from the measured rate) with 1
  and 2 ``synckit worker`` processes (``--workers 1,2,4`` adds ``cycle_all_s_4w``), and
  ``polls_per_s_<n>w`` the rate of each; ``polls_per_s_per_worker`` from the 1-worker
  run; ``worker_cpu_ms_per_poll_<n>w`` the worker processes' CPU time (user + system,
  all of them together) per finished cycle: what a worker costs per poll whatever else
  shares the machine's cores; ``api_cpu_ms_per_poll_<n>w`` and (PostgreSQL)
  ``db_cpu_ms_per_poll_<n>w`` the same for the fake API's process and the database
  server's processes, which share this machine's cores with the workers;
  ``db_deadlocks_<n>w`` (PostgreSQL) the deadlocks the server detected meanwhile (each
  costs two transactions ``deadlock_timeout``, 1 s);
* ``status_s``: ``read_status`` of one page and its rendering (what ``synckit status``
  does);
* ``peak_rss_mb``: the largest worker RSS seen during the runs.

``--skip cycles,status`` leaves out the end-to-end runs and the status view (the slow
parts at 100,000 tenants); their keys are then absent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import delete, func, select, update

from bench.sync import ROOT, fresh_database, postgres_cpu_seconds, postgres_deadlocks
from synckit.cli.status import render_status
from synckit.clock import utcnow
from synckit.runtime.admin.bulk import add_tenants
from synckit.runtime.admin.status import read_status
from synckit.runtime.observe.logging import configure_logging
from synckit.runtime.sync.poll import POLL_KIND, POLL_MAX_ATTEMPTS, poll_key
from synckit.store.db import Database, open_database
from synckit.store.jobs import claiming
from synckit.store.jobs.enqueueing import JobSpec, enqueue_new
from synckit.store.tables import checkpoints, jobs, resources
from synckit.testing.hostile import Behaviour, HostileProcess

sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "apps")]

import flow_app  # noqa: E402  (tests/apps, made importable above)
from procs import spawn_worker, stop_all  # noqa: E402

SQLITE_MAX = 10_000


async def _timed(coro: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = await coro
    return time.perf_counter() - t0, out


async def _poll_counts(db: Database) -> tuple[int, Any, Any]:
    """The poll jobs that succeeded: how many, the first's and the last's finish."""
    async with db.begin() as conn:
        row = (
            await conn.execute(
                select(
                    func.count(), func.min(jobs.c.finished_at), func.max(jobs.c.finished_at)
                ).where(jobs.c.kind == POLL_KIND, jobs.c.status == "succeeded")
            )
        ).one()
    return int(row[0]), row[1], row[2]


async def _clear_cycles(db: Database) -> None:
    """No poll job queued (the workers start idle, so none is running at the start of
    the clock) and no checkpoint: a checkpoint left by the previous run says the stream
    is read to its end, and its cycles would send no request at all."""
    async with db.begin() as conn:
        await conn.execute(delete(jobs).where(jobs.c.kind == POLL_KIND))
        await conn.execute(delete(checkpoints).where(checkpoints.c.connector == flow_app.CONNECTOR))
        # The deleted jobs' lanes lose their has-work marks too, as the store's own
        # operations would leave them: a raw delete of the 100,000 cycles the scheduler
        # enqueued left 100,000 marks, and the first run's claims walked 90,000 empty lanes
        # (each look corrects one mark), which held one worker at 27 polls/s.
        await conn.execute(
            update(resources)
            .where(resources.c.resource_key.like(f"{flow_app.CONNECTOR}:%"))
            .values(due_at=None)
        )


async def _enqueue_cycles(db: Database, names: list[str]) -> float:
    """Enqueue a cycle of every tenant of ``names`` in transactions of 5,000; the moment
    the first committed (the workers may start from then on)."""
    started: float | None = None
    for i in range(0, len(names), 5000):
        specs = [
            JobSpec(
                kind=POLL_KIND,
                payload={"tenant": t, "connector": flow_app.CONNECTOR, "stream": "default"},
                resource_key=f"{flow_app.CONNECTOR}:{t}",
                unique_key=poll_key(t, "default"),
                max_attempts=POLL_MAX_ATTEMPTS,
            )
            for t in names[i : i + 5000]
        ]
        async with db.begin() as conn:
            await enqueue_new(conn, specs, now=utcnow())
        if started is None:
            started = time.time()
    return started if started is not None else time.time()


#: Each worker's jobs in flight in the end-to-end runs (``--concurrency``).
CONCURRENCY = 64


@dataclasses.dataclass
class _CycleRun:
    wall: float
    done: int
    peak_rss_mb: float
    #: CPU seconds (user + system) from the enqueue to the last cycle, of the worker
    #: processes (idle polling included, startup not), of the fake API's process, and of
    #: PostgreSQL's server processes (None on SQLite, whose work is the workers').
    cpu: float
    api_cpu: float
    db_cpu: float | None
    #: Deadlocks PostgreSQL detected from the enqueue to the workers' exit (None on SQLite).
    deadlocks: int | None
    #: Seconds from the first jobs' commit to the first poll's success (the workers' ramp).
    first_poll_s: float | None = None


async def _cycle(
    url: str,
    db: Database,
    api: HostileProcess,
    names: list[str],
    workers: int,
    logs: Path,
    concurrency: int = CONCURRENCY,
) -> _CycleRun:
    """One cycle of ``names`` with ``workers`` processes: its seconds, how many finished,
    the largest worker RSS and the CPU spent by the workers, the fake API and the
    database server."""
    env = flow_app.env_for(api.url)
    await _clear_cycles(db)
    procs = [
        spawn_worker(
            url,
            logs / f"w{workers}.log",
            "--concurrency",
            str(concurrency),
            env=env,
            app="flow_app:app",
        )
        for _ in range(workers)
    ]
    peak = 0.0
    try:
        await asyncio.sleep(1.5)  # imports and first connections, off the clock
        postgres = url.startswith("postgresql")
        api_procs = [psutil.Process(api.pid)] if api.pid is not None else []
        cpu0, api0 = _cpu_seconds(procs), _cpu_seconds(api_procs)
        db0 = postgres_cpu_seconds() if postgres else 0.0
        deadlocks0 = await postgres_deadlocks(db) if postgres else 0
        # The clock starts when the first jobs are committed: a worker may take them
        # while the rest are being enqueued.
        t0 = await _enqueue_cycles(db, names)
        deadline = time.monotonic() + 600
        done, first, last = 0, None, None
        while time.monotonic() < deadline:
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    peak = max(peak, psutil.Process(p.pid).memory_info().rss / 2**20)
            done, first, last = await _poll_counts(db)
            if done >= len(names) or any(p.poll() is not None for p in procs):
                break
            await asyncio.sleep(0.2)
        wall = (last.timestamp() - t0) if last is not None else 600.0
        ramp = (first.timestamp() - t0) if first is not None else None
        cpu = _cpu_seconds(procs) - cpu0
        api_cpu = _cpu_seconds(api_procs) - api0
        db_cpu = postgres_cpu_seconds() - db0 if postgres else None
    finally:
        stop_all(procs, timeout=15)
    deadlocks = await postgres_deadlocks(db) - deadlocks0 if postgres else None
    return _CycleRun(wall, done, peak, cpu, api_cpu, db_cpu, deadlocks, ramp)


def _cpu_seconds(procs: list[Any]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(p.pid).cpu_times()
            total += t.user + t.system
    return total


async def measure(
    engine: str,
    size: int,
    cycle_limit: int,
    tmp: Path,
    skip: frozenset[str] = frozenset(),
    workers: tuple[int, ...] = (1, 2),
    concurrency: int = CONCURRENCY,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with HostileProcess(Behaviour(pages=1, records=0, latency=0.0)) as api:
        async with fresh_database(engine, tmp) as url:
            db = open_database(url)
            app = flow_app.make_app(api.url)
            try:
                names = [f"t{i:07d}" for i in range(size)]
                rows = [
                    {"tenant": t, "connector": flow_app.CONNECTOR, "schedule": "every 1d"}
                    for t in names
                ]
                out["add_s"], added = await _timed(add_tenants(db, rows, app=app))
                assert added.added == size, added.errors[:3]
                out["scheduler_all_due_s"], fired = await _timed(app.schedule(db))
                out["scheduler_all_due_ok"] = len(fired) == size
                none = [(await _timed(app.schedule(db)))[0] for _ in range(5)]
                out["scheduler_none_due_ms"] = statistics.median(none) * 1000
                claims = []
                for _ in range(10):
                    dt, _claimed = await _timed(claiming.claim(db, "bench", 32))
                    claims.append(dt)
                out["claim_ms"] = statistics.median(claims) * 1000
                if "cycles" not in skip:
                    sample = names[: min(size, cycle_limit)]
                    peak = 0.0
                    for w in workers:
                        run = await _cycle(url, db, api, sample, w, tmp, concurrency)
                        wall, done = run.wall, run.done
                        peak = max(peak, run.peak_rss_mb)
                        rate = done / wall if wall > 0 else 0.0
                        cpus = {"worker": run.cpu, "api": run.api_cpu, "db": run.db_cpu}
                        for who, seconds in cpus.items():
                            if seconds is not None:
                                per_poll = seconds * 1000 / done if done else None
                                out[f"{who}_cpu_ms_per_poll_{w}w"] = per_poll
                        if run.deadlocks is not None:
                            out[f"db_deadlocks_{w}w"] = run.deadlocks
                        out[f"first_poll_s_{w}w"] = run.first_poll_s
                        out[f"cycle_all_s_{w}w"] = size / rate if rate else None
                        out[f"polls_per_s_{w}w"] = rate
                    if "polls_per_s_1w" in out:
                        out["polls_per_s_per_worker"] = out["polls_per_s_1w"]
                    out["cycle_sample"] = len(sample)
                    out["concurrency"] = concurrency
                    out["peak_rss_mb"] = peak
                if "status" not in skip:
                    t0 = time.perf_counter()
                    snapshot = await read_status(db, limit=50)  # `synckit status`
                    from rich.console import Console

                    render_status(snapshot, Console(file=io.StringIO(), width=200))
                    out["status_s"] = time.perf_counter() - t0
            finally:
                await db.dispose()
                await app.aclose()
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


async def bench(
    sizes: list[int],
    engines: list[str],
    cycle_limit: int,
    skip: frozenset[str] = frozenset(),
    workers: tuple[int, ...] = (1, 2),
    concurrency: int = CONCURRENCY,
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in engines:
            for size in sizes:
                if engine == "sqlite" and size > SQLITE_MAX:
                    continue
                print(f"{engine} {size} ...", file=sys.stderr, flush=True)
                figures = await measure(
                    engine, size, cycle_limit, Path(tmp), skip, workers, concurrency
                )
                result.setdefault(engine, {})[str(size)] = figures
                print(f"  {json.dumps(figures)}", file=sys.stderr, flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tenants", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1000,10000,100000")
    p.add_argument("--engines", default="postgresql,sqlite")
    p.add_argument(
        "--cycle-limit",
        type=int,
        default=20_000,
        help="Tenants polled in the end-to-end runs (the rest scaled from the rate).",
    )
    p.add_argument(
        "--skip",
        default="",
        help="Parts to leave out, comma-separated: cycles (the end-to-end runs), status.",
    )
    p.add_argument(
        "--workers",
        default="1,2",
        help="Worker process counts of the end-to-end runs, comma-separated (e.g. 1,2,4).",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help="Each worker's --concurrency in the end-to-end runs.",
    )
    p.add_argument("--json", action="store_true", help="Print one JSON object.")
    args = p.parse_args(argv)
    if args.concurrency < 1:
        p.error(f"--concurrency: give at least 1, not {args.concurrency}")
    skip = frozenset(s for s in args.skip.split(",") if s)
    if unknown := skip - {"cycles", "status"}:
        p.error(f"--skip: unknown part(s) {', '.join(sorted(unknown))} (cycles, status)")
    configure_logging(level=logging.WARNING)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    engines = [e for e in args.engines.split(",") if e]
    try:
        workers = tuple(int(w) for w in args.workers.split(",") if w)
    except ValueError:
        p.error(f"--workers: not a list of numbers: {args.workers!r}")
    if not workers or min(workers) < 1:
        p.error(f"--workers: give process counts of at least 1, not {args.workers!r}")
    result = asyncio.run(bench(sizes, engines, args.cycle_limit, skip, workers, args.concurrency))
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return
    keys = sorted({k for per in result.values() for f in per.values() for k in f})
    for engine, per in result.items():
        print(f"{engine}:")
        print("  " + "".join(f"{k:>26}" for k in ["size", *keys]))
        for size, f in per.items():
            print("  " + "".join(f"{v!s:>26}" for v in [size, *(f.get(k) for k in keys)]))


if __name__ == "__main__":
    main()
