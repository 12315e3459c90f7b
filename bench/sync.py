"""Sync benchmark: ``python -m bench.sync [--json] [--tenants 100] [--pages 100] ...``.

Tenants poll a hostile fake API (:mod:`synckit.testing.hostile`, served by a process of
its own) through real ``synckit worker`` processes running ``tests/apps/flow_app.py``, on
each engine; beside each run, the same workload as a plain httpx + tenacity loop in one
process (the baseline). Every count is taken on the server's side (requests, 429s, each
tenant's timeline) or read from what synckit wrote (jobs, worker logs).

Scenarios (``--scenarios``):

* ``declared``: the server allows ``limit`` requests per tenant per second (429 +
  Retry-After + ``X-RateLimit-*`` beyond it) and the connector declares that limit;
  ``wall_over_ideal``, ``http_429``;
* ``undeclared``: the same server, nothing declared: ``wall_over_ideal``, ``share_429``;
* ``undeclared_no_headers``: the same limit enforced with bare 429s (no ``Retry-After``,
  no ``X-RateLimit-*`` on any answer), nothing declared: the tenants must learn the rate
  (``PacePolicy``'s learnt rate): ``wall_over_ideal``, ``share_429``; bar: wall at most
  1.5x ideal, at most 5% of requests refused;
* ``random_429``: 5% of requests answer ``429 Retry-After: 1``, limit declared:
  ``wall_over_ideal``, ``breaker_opens`` (``breaker.opened`` events in the worker logs),
  ``failed_attempts`` (poll attempts spent beyond the one that succeeded, from ``jobs``),
  ``floor_s`` and ``wall_over_floor``: the least wall any client honouring every
  Retry-After could take given the 429s each tenant met (:func:`retry_after_floor_s`),
  and the run's wall over it;
* ``outage``: every request answers 503 with ``Retry-After`` = the seconds left, for 3 s,
  starting a third of the ideal time in: ``recovery_max_s``, the longest time from the
  end of the outage to a tenant's next success (over the tenants unfinished by then);
* ``zero_latency``: no latency, no limit: ``framework_us_per_record``, the CPU time of
  the worker processes per record handled.

Each run's details also give, from the server's timeline, how long after the enqueue the
tenants' first requests came (``first_request_median_s``, ``first_request_max_s``) and the
median span from a tenant's first request to its last (``span_median_s``).

On PostgreSQL each run also reports ``db_deadlocks``, the deadlocks the server detected
during it (``pg_stat_database``; each costs two transactions ``deadlock_timeout``, 1 s).

``ideal = requests / (tenants x limit)``. Each key maps an engine to its figure; the
baseline's figures (``baseline_wall_s``, ``baseline_http_429``) are engine-free. A run
that does not finish by ``--timeout`` reports the timeout as its wall time and the
tenants left in ``details``.

Latency per scenario (``SCENARIO_LATENCY``; ``--latency-ms`` overrides it for every
scenario but ``zero_latency``): a tenant's pages are read one after another (the next
page's URL is in the previous answer), so one tenant alone makes at most
``1 / latency`` requests a second. At 100 ms that is the 10 req/s limit itself: the
limit never binds, synckit and the baseline alike meet no 429 and the rate scenarios
measure nothing about pacing. ``declared``, both ``undeclared`` and ``random_429`` therefore
answer in 20 ms (unthrottled, a tenant would make ~50 req/s, five times its limit), so
the wall time is the pacing's and ``ideal`` stays ``requests / (tenants x limit)``.
``outage`` keeps 100 ms (its figure is recovery after a 3 s outage, which needs no
pressure on the limit, and a slower API keeps tenants unfinished when it ends);
``zero_latency`` has none (it measures synckit's CPU per record). Each scenario's
latency is in the table and in its JSON object (``latency_ms``) and in
``settings.latency_ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import psutil
from sqlalchemy import func, select, text

from synckit.runtime.observe.logging import configure_logging
from synckit.runtime.sync.poll import POLL_KIND
from synckit.store import migrate
from synckit.store.db import Database, open_database
from synckit.store.tables import jobs
from synckit.testing.hostile import Behaviour, HostileProcess, Stats

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "apps")]

import flow_app  # noqa: E402  (tests/apps, made importable above)
from procs import spawn_worker, stop_all  # noqa: E402

PG_URL = os.environ.get("SYNCKIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
SCENARIOS = (
    "declared",
    "undeclared",
    "undeclared_no_headers",
    "random_429",
    "outage",
    "zero_latency",
)
#: The API's latency (seconds) per scenario; the module docstring says why.
SCENARIO_LATENCY = {
    "declared": 0.02,
    "undeclared": 0.02,
    "undeclared_no_headers": 0.02,
    "random_429": 0.02,
    "outage": 0.1,
    "zero_latency": 0.0,
}
ENGINES = ("sqlite", "postgresql")


class Server(Protocol):
    """What a run needs of the hostile API: a HostileProcess, or a HostileAPI in a thread."""

    url: str

    def reset(self, behaviour: Behaviour) -> None: ...

    def snapshot(self) -> Stats: ...


# --- one run of synckit workers ------------------------------------------------------------


@dataclass
class FlowRun:
    """What one run of the workers did."""

    tenants: int
    finished: int
    wall_s: float
    stats: Stats
    events: Counter[str]
    breaker_opens: int
    failed_attempts: int
    attempts: list[tuple[str, str, int]]
    worker_cpu_s: float
    logs: list[Path] = field(default_factory=list)
    #: CPU seconds of the fake API's process (None: served in this process) and of
    #: PostgreSQL's server processes (None on SQLite, whose work is the workers'), over
    #: the same span as ``worker_cpu_s``: with the workers', what the run asked of the
    #: machine's cores.
    api_cpu_s: float | None = None
    db_cpu_s: float | None = None
    #: Deadlocks PostgreSQL detected during the run (None on SQLite): each costs two
    #: transactions ``deadlock_timeout`` (1 s) and one of them its work.
    db_deadlocks: int | None = None
    #: When the cycles were enqueued (epoch seconds; None: unknown).
    started_at: float | None = None

    def timeline(self) -> dict[str, float | None]:
        """From the server's timeline: how long after the enqueue the tenants' first
        requests came (median and last), and the median span from a tenant's first
        request to its last (``pages / limit`` at best, minus one interval)."""
        firsts = sorted(t.events[0][0] for t in self.stats.tenants.values() if t.events)
        spans = [t.events[-1][0] - t.events[0][0] for t in self.stats.tenants.values() if t.events]
        if not firsts or self.started_at is None:
            return {"first_request_median_s": None, "first_request_max_s": None,
                    "span_median_s": None}  # fmt: skip
        return {
            "first_request_median_s": round(statistics.median(firsts) - self.started_at, 3),
            "first_request_max_s": round(firsts[-1] - self.started_at, 3),
            "span_median_s": round(statistics.median(spans), 3),
        }

    @property
    def cores_busy(self) -> float:
        """The workers', the fake API's and the database server's CPU over the wall time:
        how many of the machine's cores the run kept busy."""
        total = self.worker_cpu_s + (self.api_cpu_s or 0.0) + (self.db_cpu_s or 0.0)
        return total / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def done(self) -> bool:
        return self.finished == self.tenants

    def log_lines(self, event: str) -> list[dict[str, Any]]:
        """The worker log events named ``event`` (JSON lines of every worker)."""
        return [e for e in _read_events(self.logs) if e.get("event") == event]


def _read_events(paths: Sequence[Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        yield json.loads(line)


@contextlib.asynccontextmanager
async def fresh_database(engine: str, tmp: Path) -> AsyncIterator[str]:
    """A migrated empty database: a SQLite file in ``tmp``, or a PostgreSQL schema of its
    own (dropped afterwards); yields its URL."""
    if engine == "sqlite":
        url = f"sqlite:///{tmp / f'{uuid.uuid4().hex[:8]}.db'}"
        schema = None
    else:
        schema = f"bench_sync_{uuid.uuid4().hex[:10]}"
        await _pg_admin(f"CREATE SCHEMA {schema}")
        url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}search_path={schema}"
    db = open_database(url)
    try:
        await migrate.upgrade(db)
    finally:
        await db.dispose()
    try:
        yield url
    finally:
        if schema is not None:
            await _pg_admin(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def _pg_admin(sql: str) -> None:
    admin = open_database(PG_URL, pool_size=1)
    try:
        async with admin.begin() as conn:
            await conn.execute(text(sql))
    finally:
        await admin.dispose()


async def _finished(db: Database) -> tuple[int, Any]:
    # A read: on SQLite it must not take the write lock the workers are sharing.
    async with db.read() as conn:
        row = (
            await conn.execute(
                select(func.count(), func.max(jobs.c.finished_at)).where(
                    jobs.c.kind == POLL_KIND, jobs.c.status == "succeeded"
                )
            )
        ).one()
    return int(row[0]), row[1]


def _wait_started(logs_dir: Path, workers: int, within: float = 60.0) -> list[Path]:
    """The workers' log files, once every worker has logged ``worker.started``."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        paths = sorted(logs_dir.glob("worker-*.stderr"))
        started = sum(
            1 for p in paths if any(e.get("event") == "worker.started" for e in _read_events([p]))
        )
        if len(paths) >= workers and started >= workers:
            return paths
        time.sleep(0.05)
    problems = "\n".join(p.read_text()[-2000:] for p in logs_dir.glob("worker-*.stderr"))
    raise RuntimeError(f"workers did not start within {within:.0f}s:\n{problems}")


async def run_workers(
    url: str,
    server: Server,
    behaviour: Behaviour,
    *,
    tenants: int,
    workers: int = 2,
    concurrency: int | None = None,
    rate_limit: float | None = None,
    burst: int = 1,
    token_url: str | None = None,
    sink: bool = False,
    within: float = 120.0,
    logs_dir: Path,
    extra_env: dict[str, str] | None = None,
    on_started: Callable[[], None] | None = None,
) -> FlowRun:
    """Poll ``tenants`` tenants of ``server`` to their last page with ``workers`` real
    ``synckit worker`` processes on ``url`` (a migrated, empty database).

    The workers start first; then the tenants are added, the server's counters reset
    and every tenant's cycle enqueued at once: the wall time runs from there to the last
    poll job's success (or ``within`` seconds).
    """
    await asyncio.to_thread(logs_dir.mkdir, parents=True, exist_ok=True)
    names = [f"t{i:03d}" for i in range(tenants)]
    concurrency = concurrency or max(10, math.ceil(tenants / workers) + 4)
    env = {
        **flow_app.env_for(server.url, rate_limit=rate_limit, burst=burst, token_url=token_url),
        **(extra_env or {}),
    }
    procs = [
        spawn_worker(
            url,
            logs_dir / "worker.log",
            "--concurrency",
            str(concurrency),
            "--poll-interval",
            "0.1",
            "--grace",
            "2",
            env=env,
            app="flow_app:app",
        )
        for _ in range(workers)
    ]
    db = open_database(url)
    app = flow_app.make_app(server.url, rate_limit=rate_limit, burst=burst, token_url=token_url)
    # Deadlocks counted before the run (PostgreSQL only), and during it.
    deadlocks_before: int | None = None
    deadlocks: int | None = None
    try:
        logs = await asyncio.to_thread(_wait_started, logs_dir, workers)
        for name in names:
            await app.add_tenant(db, name, flow_app.CONNECTOR, {"sink": sink}, schedule="every 1d")
        api_pid: int | None = getattr(server, "pid", None)
        postgres = url.startswith("postgresql")
        cpu_before = sum(_cpu(p.pid) for p in procs)
        api_before = _cpu(api_pid) if api_pid is not None else 0.0
        db_before = postgres_cpu_seconds() if postgres else 0.0
        if postgres:
            deadlocks_before = await postgres_deadlocks(db)
        server.reset(behaviour)
        if on_started is not None:
            on_started()
        t0 = time.time()
        await app.schedule(db)
        deadline = time.monotonic() + within
        finished, last = 0, None
        while time.monotonic() < deadline:
            finished, last = await _finished(db)
            if finished >= tenants:
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a worker exited; see {logs_dir}")
            await asyncio.sleep(0.1)
        wall = (last.timestamp() - t0) if finished >= tenants and last else within
        cpu = sum(_cpu(p.pid) for p in procs) - cpu_before
        api_cpu = _cpu(api_pid) - api_before if api_pid is not None else None
        db_cpu = postgres_cpu_seconds() - db_before if postgres else None
        stats = server.snapshot()
        attempts = await _poll_attempts(db)
    finally:
        stop_all(procs, timeout=15)
        await app.aclose()
        try:
            # Read once the workers exited: their server processes report on exit.
            if deadlocks_before is not None:
                deadlocks = await postgres_deadlocks(db) - deadlocks_before
        finally:
            await db.dispose()
    events = Counter(str(e.get("event")) for e in _read_events(logs))
    return FlowRun(
        tenants=tenants,
        finished=finished,
        wall_s=wall,
        stats=stats,
        events=events,
        breaker_opens=events["breaker.opened"],
        failed_attempts=sum(a - (1 if s == "succeeded" else 0) for _, s, a in attempts),
        attempts=attempts,
        worker_cpu_s=cpu,
        logs=logs,
        api_cpu_s=api_cpu,
        db_cpu_s=db_cpu,
        db_deadlocks=deadlocks,
        started_at=t0,
    )


async def postgres_deadlocks(db: Database, *, settle: float = 0.5) -> int:
    """The deadlocks PostgreSQL has detected in every database of the server
    (``pg_stat_database.deadlocks``). A server process reports its counts when it ends
    and between transactions at most once a second, so a run reads this after its
    workers stopped, ``settle`` seconds later."""
    await asyncio.sleep(settle)
    async with db.read() as conn:
        query = text("SELECT coalesce(sum(deadlocks), 0) FROM pg_stat_database")
        return int((await conn.execute(query)).scalar_one())


def postgres_cpu_seconds() -> float:
    """CPU seconds (user + system) of every PostgreSQL server process alive now; a
    backend that exited meanwhile is not counted (workers keep theirs through a run)."""
    total = 0.0
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in ("postgres", "postmaster"):
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
    return total


def _cpu(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


async def _poll_attempts(db: Database) -> list[tuple[str, str, int]]:
    """``(tenant, status, attempts)`` of every poll job."""
    async with db.begin() as conn:
        rows = await conn.execute(
            select(jobs.c.payload, jobs.c.status, jobs.c.attempts).where(jobs.c.kind == POLL_KIND)
        )
        return [(str(r.payload.get("tenant")), r.status, r.attempts) for r in rows]


# --- the baseline: httpx + tenacity ---------------------------------------------------------


class _Refused(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _retry_after(exc: BaseException | None) -> float | None:
    if isinstance(exc, _Refused):
        value = exc.response.headers.get("retry-after")
        with contextlib.suppress(ValueError, TypeError):
            return max(0.0, float(value)) if value is not None else None
    return None


async def run_baseline(
    server: Server, behaviour: Behaviour, *, tenants: int, limit: float | None
) -> tuple[float, Stats]:
    """The same tenants read by a plain loop: one task per tenant, tenacity retrying
    429/5xx (the server's Retry-After, else exponential backoff with jitter), and, with a
    declared ``limit``, requests of a tenant spaced ``1/limit`` apart."""
    from tenacity import (
        AsyncRetrying,
        RetryCallState,
        retry_if_exception_type,
        stop_after_attempt,
        wait_exponential,
        wait_random,
    )

    backoff = wait_exponential(multiplier=0.5, max=30) + wait_random(0, 0.5)

    def wait(state: RetryCallState) -> float:
        server_wait = _retry_after(state.outcome.exception() if state.outcome else None)
        return server_wait if server_wait is not None else backoff(state)

    server.reset(behaviour)
    limits = httpx.Limits(max_connections=tenants, max_keepalive_connections=tenants)
    async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=30) as client:

        async def tenant(name: str) -> None:
            page: int | None = 1
            next_slot = 0.0
            while page is not None:
                async for attempt in AsyncRetrying(
                    retry=retry_if_exception_type((_Refused, httpx.TransportError)),
                    wait=wait,
                    stop=stop_after_attempt(30),
                    reraise=True,
                ):
                    with attempt:
                        if limit:
                            now = time.monotonic()
                            next_slot = max(next_slot, now)
                            await asyncio.sleep(next_slot - now)
                            next_slot += 1.0 / limit
                        r = await client.get(f"/t/{name}/items", params={"page": page})
                        if r.status_code == 429 or r.status_code >= 500 or r.status_code == 403:
                            raise _Refused(r)
                        r.raise_for_status()
                body = r.json()
                for _record in body["items"]:
                    pass  # the handler: nothing, as in the synckit runs
                page = body["next"]

        t0 = time.perf_counter()
        await asyncio.gather(*(tenant(f"t{i:03d}") for i in range(tenants)))
        wall = time.perf_counter() - t0
    return wall, server.snapshot()


# --- scenarios ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    tenants: int = 100
    pages: int = 100
    records: int = 100
    #: Overrides SCENARIO_LATENCY for every scenario but zero_latency (None: the defaults).
    latency: float | None = None
    limit: int = 10
    workers: int = 2
    timeout: float = 300.0
    #: Run the plain httpx + tenacity loop beside each scenario (``--no-baseline``: not).
    baseline: bool = True

    @property
    def requests(self) -> int:
        return self.tenants * self.pages

    @property
    def ideal_s(self) -> float:
        return self.requests / (self.tenants * self.limit)

    def latency_of(self, scenario: str) -> float:
        """The API's latency in ``scenario``, in seconds."""
        if scenario not in SCENARIO_LATENCY:
            raise ValueError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
        if scenario == "zero_latency" or self.latency is None:
            return SCENARIO_LATENCY[scenario]
        return self.latency


def scenario_setup(name: str, s: Settings) -> tuple[Behaviour, float | None]:
    """The server's behaviour and the declared limit of a scenario."""
    base = Behaviour(pages=s.pages, records=s.records, latency=s.latency_of(name), limit=s.limit)
    if name == "declared":
        return base, s.limit
    if name == "undeclared":
        return base, None
    if name == "undeclared_no_headers":
        return dataclasses.replace(base, bare_limit=True), None
    if name == "random_429":
        return dataclasses.replace(base, random_429=0.05, random_retry_after=1.0, seed=14), s.limit
    if name == "outage":
        after = max(1.0, s.ideal_s / 3)
        return dataclasses.replace(base, outage_after=after, outage_for=3.0), s.limit
    if name == "zero_latency":
        return dataclasses.replace(base, latency=0.0, limit=None), None
    raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")


def figures(name: str, s: Settings, run: FlowRun) -> dict[str, Any]:
    st = run.stats
    over = run.wall_s / s.ideal_s
    if name == "declared":
        return {"wall_over_ideal": over, "http_429": st.rate_limited}
    if name in ("undeclared", "undeclared_no_headers"):
        return {"wall_over_ideal": over, "share_429": st.rate_limited / max(1, st.requests)}
    if name == "random_429":
        floor = retry_after_floor_s(s, st, retry_after=1.0)
        return {
            "wall_over_ideal": over,
            "breaker_opens": run.breaker_opens,
            "failed_attempts": run.failed_attempts,
            "floor_s": floor,
            "wall_over_floor": run.wall_s / floor,
        }
    if name == "outage":
        rec = st.recovery_s().values()
        worst = None if any(v is None for v in rec) else max(rec, default=0.0)
        return {"recovery_max_s": worst}
    records = s.tenants * s.pages * s.records
    return {"framework_us_per_record": run.worker_cpu_s / max(1, records) * 1e6}


def retry_after_floor_s(s: Settings, st: Stats, *, retry_after: float) -> float:
    """The least wall time any client honouring every ``Retry-After`` could have taken,
    given the 429s the server sent each tenant: a tenant's pages need ``pages / limit``
    seconds, and each 429 it met holds it ``retry_after`` more (no request of the tenant
    before then, and the refused page is asked again after it). The most refused tenant
    decides: with 5% refused at random, the most refused of 100 tenants meets ~11 429s
    in ~105 requests, so the floor is ~2.1 x ideal whatever the client does."""
    refused = [sum(1 for e in t.events if e[1] == 429) for t in st.tenants.values()]
    return s.pages / s.limit + max(refused, default=0) * retry_after


def details(s: Settings, run: FlowRun) -> dict[str, Any]:
    st = run.stats
    return {
        "wall_s": round(run.wall_s, 3),
        "ideal_s": s.ideal_s,
        "finished_tenants": run.finished,
        "requests": st.requests,
        "http_429": st.rate_limited,
        "http_503": st.outage_503,
        "breaker_opens": run.breaker_opens,
        "failed_attempts": run.failed_attempts,
        "worker_cpu_s": round(run.worker_cpu_s, 2),
        "api_cpu_s": None if run.api_cpu_s is None else round(run.api_cpu_s, 2),
        "db_cpu_s": None if run.db_cpu_s is None else round(run.db_cpu_s, 2),
        "cores_busy": round(run.cores_busy, 2),
        "db_deadlocks": run.db_deadlocks,
        **run.timeline(),
    }


async def bench(
    s: Settings, scenarios: Sequence[str], engines: Sequence[str], keep_logs: Path | None
) -> dict[str, Any]:
    settings = dataclasses.asdict(s)
    del settings["latency"]
    result: dict[str, Any] = {
        "settings": settings
        | {
            "requests": s.requests,
            "ideal_s": s.ideal_s,
            "latency_ms": {name: _ms(s.latency_of(name)) for name in scenarios},
        }
    }
    with tempfile.TemporaryDirectory(prefix="synckit-bench-sync-") as tmp_name:
        tmp = keep_logs or Path(tmp_name)
        with HostileProcess() as server:
            for name in scenarios:
                behaviour, declared = scenario_setup(name, s)
                out: dict[str, Any] = {"latency_ms": _ms(behaviour.latency), "details": {}}
                for engine in engines:
                    async with fresh_database(engine, Path(tmp_name)) as url:
                        run = await run_workers(
                            url,
                            server,
                            behaviour,
                            tenants=s.tenants,
                            workers=s.workers,
                            rate_limit=declared,
                            within=s.timeout,
                            logs_dir=tmp / f"{name}-{engine}",
                        )
                    for key, value in figures(name, s, run).items():
                        out.setdefault(key, {})[engine] = _round(value)
                    out["details"][engine] = details(s, run)
                    _progress(f"{name} {engine}: {out['details'][engine]}")
                if s.baseline:
                    wall, st = await run_baseline(
                        server, behaviour, tenants=s.tenants, limit=declared
                    )
                    out["baseline_wall_s"] = round(wall, 3)
                    out["baseline_http_429"] = st.rate_limited
                    _progress(f"{name} baseline: {wall:.2f}s, {st.rate_limited} x 429")
                result[name] = out
    if "zero_latency" in result:
        result["framework_us_per_record"] = result["zero_latency"]["framework_us_per_record"]
    return result


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _round(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def render(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        f"bench.sync: {s['tenants']} tenants x {s['pages']} pages x {s['records']} records, "
        f"limit {s['limit']}/s per tenant, {s['workers']} workers; ideal {s['ideal_s']:.2f} s",
        "",
        f"{'scenario':<13} {'latency':>8} {'figure':<24} {'sqlite':>10} {'postgresql':>11} "
        f"{'baseline wall':>14} {'baseline 429':>13}",
    ]
    for name in SCENARIOS:
        if name not in result:
            continue
        out = result[name]
        first = True
        for key, per_engine in out.items():
            if key in ("details", "latency_ms", "baseline_wall_s", "baseline_http_429"):
                continue
            cells = [_cell(per_engine.get(e)) for e in ENGINES]
            head = f"{name:<13} {out['latency_ms']:>5g} ms" if first else f"{'':<22}"
            tail = ""
            if first and "baseline_wall_s" in out:
                tail = f"{out['baseline_wall_s']:>13.2f}s {out['baseline_http_429']:>13}"
            lines.append(f"{head} {key:<24} {cells[0]:>10} {cells[1]:>11} {tail}")
            first = False
        for engine, d in out["details"].items():
            lines.append(
                f"{'':<22}   {engine}: wall {d['wall_s']:.2f}s, {d['finished_tenants']}/"
                f"{s['tenants']} tenants done, {d['requests']} requests, {d['http_429']} x 429, "
                f"{d['breaker_opens']} breaker opens, {d['failed_attempts']} attempts spent, "
                f"worker CPU {d['worker_cpu_s']}s{_other_cpu(d)}{_starts(d)}"
            )
    return "\n".join(lines)


def _other_cpu(d: dict[str, Any]) -> str:
    """``, API CPU 2.1s, database CPU 3.0s, 1.85 cores busy`` (what is known of them)."""
    parts = [
        f"{label} CPU {d[key]}s"
        for key, label in (("api_cpu_s", "API"), ("db_cpu_s", "database"))
        if d.get(key) is not None
    ]
    if "cores_busy" in d:
        parts.append(f"{d['cores_busy']} cores busy")
    if d.get("db_deadlocks") is not None:
        parts.append(f"{d['db_deadlocks']} deadlocks")
    return "".join(f", {p}" for p in parts)


def _starts(d: dict[str, Any]) -> str:
    """``; first requests 0.21 / 0.33 s after the enqueue (median / last), span 9.95 s``."""
    if d.get("first_request_max_s") is None:
        return ""
    return (
        f"; first requests {d['first_request_median_s']} / {d['first_request_max_s']} s after "
        f"the enqueue (median / last), median span {d['span_median_s']} s"
    )


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.sync", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="Print one JSON object.")
    p.add_argument("--tenants", type=int, default=100)
    p.add_argument("--pages", type=int, default=100, help="Pages (requests) per tenant.")
    p.add_argument("--records", type=int, default=100, help="Records per page.")
    p.add_argument(
        "--latency-ms",
        type=float,
        help="The API's latency in every scenario but zero_latency (default: per scenario, "
        + ", ".join(f"{k} {v * 1000:g}" for k, v in SCENARIO_LATENCY.items())
        + ").",
    )
    p.add_argument("--limit", type=int, default=10, help="Requests per second per tenant.")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0, help="Seconds allowed per run.")
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="Leave out the plain httpx + tenacity runs (their keys are then absent).",
    )
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--keep-logs", type=Path, help="Keep the worker logs in this directory.")
    p.add_argument(
        "--tracing",
        choices=("off", "memory"),
        default="off",
        help="OpenTelemetry in the workers: off (no provider), or on to the SDK's in-memory"
        " exporter behind a batch processor (FLOW_TRACING=memory in tests/apps/flow_app.py).",
    )
    a = p.parse_args(argv)
    if a.tracing == "memory":
        os.environ["FLOW_TRACING"] = "memory"  # the workers inherit it
    engines = [e for e in a.engines.split(",") if e]
    scenarios = [x for x in a.scenarios.split(",") if x]
    for e in engines:
        if e not in ENGINES:
            p.error(f"unknown engine {e!r} (known: {', '.join(ENGINES)})")
    for x in scenarios:
        if x not in SCENARIOS:
            p.error(f"unknown scenario {x!r} (known: {', '.join(SCENARIOS)})")
    s = Settings(
        tenants=a.tenants,
        pages=a.pages,
        records=a.records,
        latency=None if a.latency_ms is None else a.latency_ms / 1000,
        limit=a.limit,
        workers=a.workers,
        timeout=a.timeout,
        baseline=not a.no_baseline,
    )
    # This process's own log lines (the App's, adding tenants) stay off stdout.
    configure_logging(json_lines=False, level=logging.WARNING)
    result = asyncio.run(bench(s, scenarios, engines, a.keep_logs))
    print(json.dumps(result, sort_keys=True) if a.json else render(result))


if __name__ == "__main__":
    main()
