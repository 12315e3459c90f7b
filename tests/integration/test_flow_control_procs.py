"""Flow control at the API edge (issue 14), end to end: three `synckit worker` processes
poll a hostile API on loopback (synckit.testing.hostile) on each engine.

Every figure is read where the client cannot hide it: the server's own counts and
timeline of each tenant, the ``jobs`` rows and the workers' logs.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from bench.sync import FlowRun, run_workers
from synckit.store.db import open_database
from synckit.store.tables import resources
from synckit.testing.hostile import Behaviour, HostileAPI, RetryAfterStyle, Stats

WORKERS = 3
#: Time is the behaviour here, so the runs are bounded, by budgets a busy machine does not
#: reach (the worker processes start, the API thread waits for the GIL) while the failure
#: each guards against would: a breaker's 30 s cool-down, a minute's pace.
#: Waiting for a run to finish (an event; reaching it means a bug).
RUN_BUDGET_S = 120
#: Beyond a run's ideal length.
SLACK_S = 15.0
#: The longest pause of a tenant whose server asked for less than a second.
PAUSE_BUDGET_S = 4.0
#: From the outage's end to a tenant's next success.
RESUME_BUDGET_S = 8.0


def gaps(stats: Stats, tenant: str) -> list[tuple[float, int]]:
    """(seconds to the next request, status of this one) along a tenant's timeline."""
    events = stats.tenants[tenant].events
    return [(b[0] - a[0], a[1]) for a, b in itertools.pairwise(events)]


async def breakers_open(url: str) -> list[str]:
    db = open_database(url)
    try:
        async with db.begin() as conn:
            rows = await conn.execute(
                select(resources.c.resource_key).where(resources.c.state != "closed")
            )
            return [r.resource_key for r in rows]
    finally:
        await db.dispose()


def summary(run: FlowRun) -> str:
    """What went wrong, for the assertion messages: the counts and the logs' warnings."""
    noisy = {k: v for k, v in run.events.most_common() if not k.startswith(("HTTP", "poll.page"))}
    return (
        f"finished {run.finished}/{run.tenants} in {run.wall_s:.1f}s; "
        f"{run.stats.requests} requests, statuses {dict(run.stats.statuses)}; "
        f"breaker opens {run.breaker_opens}; attempts {run.attempts}; events {noisy}"
    )


@pytest.mark.parametrize(("tenants", "pages"), [(3, 30)])
async def test_five_percent_429s_pace_without_breaker_or_attempt(
    migrated_url: str, tmp_path: Path, tenants: int, pages: int
) -> None:
    """5% of requests answer 429 Retry-After: 1 (limit declared): the run finishes with
    no breaker opening and no attempt spent, and every 429 is waited out, not failed."""
    api = HostileAPI()
    behaviour = Behaviour(pages=pages, records=10, latency=0.02, random_429=0.05, seed=3)
    with api.serve_in_thread():
        run = await run_workers(
            migrated_url,
            api,
            behaviour,
            tenants=tenants,
            workers=WORKERS,
            rate_limit=20,
            within=RUN_BUDGET_S,
            logs_dir=tmp_path,
        )
    assert run.stats.random_429 >= 3, "the seed must give the run some 429s"
    assert run.done, summary(run)
    assert run.breaker_opens == 0, summary(run)
    assert run.failed_attempts == 0, summary(run)
    assert await breakers_open(migrated_url) == []
    for name, timeline in run.stats.tenants.items():
        assert timeline.pages_done == pages
        for gap, status in gaps(run.stats, name):
            if status == 429:
                assert gap >= 0.95, f"{name} called again {gap:.2f}s after a Retry-After: 1"
    # One second per 429 of a tenant, plus its pages at the declared 20/s, plus slack; a
    # breaker's 30 s cool-down or a job retried on its backoff would not fit.
    worst = max(
        sum(1 for _, s, _ in t.events if s == 429) + pages / 20 for t in run.stats.tenants.values()
    )
    assert run.wall_s <= worst + SLACK_S, summary(run)


@pytest.mark.parametrize(
    ("style", "limit_status", "retry_after"),
    [("github-403", 403, "none"), ("429-fractional", 429, "fractional")],
)
async def test_a_burst_of_in_flight_rate_limits_is_one_pacing_event(
    migrated_url: str,
    tmp_path: Path,
    style: str,
    limit_status: int,
    retry_after: RetryAfterStyle,
) -> None:
    """The server allows 10 requests a second per tenant and says so only when it refuses;
    records are posted 8 at a time, so several requests are in flight when the limit hits.
    Their refusals together are one pacing event: no breaker, no attempt spent, no pause
    longer than the server asked (under a second), and the run converges near the
    limit's pace."""
    api = HostileAPI()
    tenants, pages, records = 2, 2, 20
    behaviour = Behaviour(
        pages=pages,
        records=records,
        latency=0.05,
        limit=10,
        limit_status=limit_status,
        limit_headers=False,
        retry_after=retry_after,
    )
    with api.serve_in_thread():
        run = await run_workers(
            migrated_url,
            api,
            behaviour,
            tenants=tenants,
            workers=WORKERS,
            sink=True,
            within=RUN_BUDGET_S,
            logs_dir=tmp_path,
        )
    assert run.stats.rate_limited > 0, f"{style}: the limit must be hit to test anything"
    assert run.done, summary(run)
    assert run.breaker_opens == 0, summary(run)
    assert run.failed_attempts == 0, summary(run)
    for name in run.stats.tenants:
        longest = max(g for g, _ in gaps(run.stats, name))
        assert longest <= PAUSE_BUDGET_S, f"{name} paused {longest:.1f}s; the server asked for < 1s"
    ideal = pages * (records + 1) / 10
    assert run.wall_s <= ideal * 1.5 + SLACK_S, summary(run)


@pytest.mark.parametrize("tenants", [3])
async def test_a_three_second_outage_resumes_within_two_seconds_of_its_end(
    migrated_url: str, tmp_path: Path, tenants: int
) -> None:
    """Every request answers 503 with Retry-After = the seconds left, for 3 s: each tenant
    unfinished by then succeeds again within seconds of the end (2 s on a quiet machine;
    RESUME_BUDGET_S), not after a 30 s cool-down."""
    api = HostileAPI()
    behaviour = Behaviour(pages=40, records=10, latency=0.02, outage_after=1.0, outage_for=3.0)
    with api.serve_in_thread():
        run = await run_workers(
            migrated_url,
            api,
            behaviour,
            tenants=tenants,
            workers=WORKERS,
            rate_limit=10,
            within=RUN_BUDGET_S,
            logs_dir=tmp_path,
        )
    assert run.stats.outage_503 > 0, "the outage must meet requests"
    recovery = run.stats.recovery_s()
    assert recovery, "some tenant must be unfinished when the outage ends"
    late = {k: v for k, v in recovery.items() if v is None or v > RESUME_BUDGET_S}
    assert not late, f"resumed late: {late}; {summary(run)}"
    assert run.done, summary(run)


@pytest.mark.parametrize("tenants", [2])
async def test_the_token_endpoint_is_not_hammered_during_its_outage(
    migrated_url: str, tmp_path: Path, tenants: int
) -> None:
    """Access tokens live 4 s, so they are refreshed (and then expire) while the token
    endpoint answers 503 + Retry-After = the seconds left, from 2.5 s to 5.5 s into the
    run. Its first 503 paces the tenant's refreshes: it is called at most twice per tenant
    during the outage, and the run completes after it."""
    api = HostileAPI()
    behaviour = Behaviour(
        pages=10,
        records=10,
        latency=0.02,
        oauth=True,
        outage_api=False,
        outage_token=True,
        token_expires_in=4.0,
    )
    env = {"SYNCKIT_SECRET_KEY": Fernet.generate_key().decode()}
    with api.serve_in_thread() as url:
        run = await run_workers(
            migrated_url,
            api,
            behaviour,
            tenants=tenants,
            workers=WORKERS,
            sink=True,
            rate_limit=20,
            token_url=f"{url}/oauth/token",
            within=RUN_BUDGET_S,
            logs_dir=tmp_path,
            extra_env=env,
            on_started=lambda: api.start_outage(3.0, after=2.5),
        )
    st = run.stats
    assert st.outage is not None and st.token_requests > 0
    last = max(at for t in st.tenants.values() for at, _, _ in t.events)
    assert last > st.outage[1], "the run must outlast the outage to test anything"
    assert st.token_requests_in_outage <= 2 * tenants, (
        f"{st.token_requests_in_outage} token requests during the 3 s outage; {summary(run)}"
    )
    assert run.done, summary(run)
