"""Issue 34, "why, complete": a table of situations -> the sentence the console shows,
built in a real database on both engines, and checked against the claim's own decision:
a reason that ``blocks`` is given exactly when the claim would not take the tenant's next
job."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update
from web_app import app

from synckit.clock import utcnow
from synckit.runtime.admin.tenants import get_tenant, pause_tenant
from synckit.runtime.http.pacing import defer_resource
from synckit.runtime.sync.poll import POLL_KIND
from synckit.runtime.sync.scheduler import poll_job_spec
from synckit.store import console
from synckit.store.connections import mark_needs_reauth
from synckit.store.db import Database
from synckit.store.jobs import admin, claiming, enqueueing, outcomes
from synckit.store.resources import configure_resource, get_resource
from synckit.store.tables import resources
from synckit.web.explain import Why, tenant_why
from synckit.web.tenant_pages import cycle_facts

KEY = "shop:acme"
Setup = Callable[[Database], Awaitable[None]]


async def cycle(db: Database, *, run_at: Any = None) -> int:
    spec = poll_job_spec("acme", "shop", "default", KEY)
    made = await enqueueing.enqueue(
        db, spec.kind, spec.payload, resource_key=KEY, unique_key=spec.unique_key, run_at=run_at
    )
    return made.id


async def healthy(db: Database) -> None:
    await cycle(db)


async def paused(db: Database) -> None:
    await cycle(db)
    await pause_tenant(db, "acme", "paused for the migration")


async def needs_reauth(db: Database) -> None:
    await cycle(db)
    async with db.begin() as conn:
        await mark_needs_reauth(conn, "acme", reason="invalid_grant: revoked", now=utcnow())


async def breaker(db: Database, *, until: timedelta) -> None:
    await cycle(db)
    await get_resource(db, KEY)
    async with db.begin() as conn:
        await conn.execute(
            update(resources)
            .where(resources.c.resource_key == KEY)
            .values(state="open", cooldown_until=utcnow() + until, opened_at=utcnow())
        )


async def breaker_open(db: Database) -> None:
    await breaker(db, until=timedelta(minutes=5))


async def breaker_cooled(db: Database) -> None:
    await breaker(db, until=-timedelta(seconds=5))


async def paced(db: Database) -> None:
    await cycle(db)
    await defer_resource(db, KEY, utcnow() + timedelta(minutes=10), "Retry-After")


async def in_flight(db: Database) -> None:
    await configure_resource(db, KEY, max_in_flight=1)
    await enqueueing.enqueue(db, "send.invoice", {"n": 1}, resource_key=KEY)
    [running] = await claiming.claim(db, "other-worker", 1)
    assert running.resource_key == KEY
    await cycle(db)


async def failed_cycle(db: Database, *, retry_at: Any) -> None:
    await cycle(db)
    [claimed] = await claiming.claim(db, "w0", 1)
    async with db.begin() as conn:
        await outcomes.fail(
            conn,
            claimed,
            now=utcnow(),
            error_class="server_error",
            message="HTTP 503 Service Unavailable",
            retry_at=retry_at,
        )


async def retry_wait(db: Database) -> None:
    await failed_cycle(db, retry_at=utcnow() + timedelta(minutes=7))


async def cycle_dead(db: Database) -> None:
    await failed_cycle(db, retry_at=None)


async def not_scheduled(db: Database) -> None:
    return None


# (situation, setup, workers alive, the reasons' kinds, words the first sentence holds)
SITUATIONS: list[tuple[str, Setup, int | None, list[str], str]] = [
    ("healthy", healthy, None, [], ""),
    ("paused", paused, None, ["paused"], "paused: paused for the migration"),
    ("needs re-auth", needs_reauth, None, ["needs_reauth"], "invalid_grant: revoked"),
    ("breaker open", breaker_open, None, ["breaker"], "breaker open until"),
    ("breaker cooled", breaker_cooled, None, ["breaker"], "the next job is a probe"),
    ("paced", paced, None, ["paced"], "(Retry-After)"),
    ("in flight", in_flight, None, ["in_flight"], "in-flight limit reached: 1 of 1"),
    (
        "retry wait",
        retry_wait,
        None,
        ["retry_wait"],
        "after error server_error: HTTP 503 Service Unavailable (attempt 1 of",
    ),
    # No tick either here (no scheduler ran): both are said.
    ("cycle dead", cycle_dead, None, ["cycle_dead", "not_scheduled"], "server_error: HTTP 503"),
    ("not scheduled", not_scheduled, None, ["not_scheduled"], "not scheduled"),
    ("no worker", healthy, 0, ["no_worker"], "no worker alive"),
]


async def explain(db: Database, workers_alive: int | None) -> list[Why]:
    t = await get_tenant(db, "acme", reveal=False)
    row = await console.tenant_row(db, "acme")
    assert row is not None
    cycles = await admin.poll_jobs(db, KEY, "acme", kind=POLL_KIND)
    running = (await admin.running_counts(db, [KEY])).get(KEY, 0)
    return tenant_why(
        status=t.status,
        status_reason=t.status_reason,
        breaker=row.breaker,
        cooldown_until=row.cooldown_until,
        next_available_at=row.next_available_at,
        paced_reason=row.paced_reason,
        max_in_flight=row.max_in_flight,
        running=running,
        now=utcnow(),
        cycle=cycle_facts(cycles[0]) if cycles else None,
        scheduled=await console.has_schedule(db, "acme"),
        workers_alive=workers_alive,
    )


@pytest.mark.parametrize(
    ("setup", "workers", "kinds", "words"),
    [pytest.param(*s[1:], id=s[0]) for s in SITUATIONS],
)
async def test_why_says_what_holds_the_tenant_and_agrees_with_the_claim(
    db: Database, setup: Setup, workers: int | None, kinds: list[str], words: str
) -> None:
    await app.add_tenant(db, "acme", "shop", {"api_key": "k" * 20})
    await setup(db)
    why = await explain(db, workers)
    assert [w.kind for w in why] == kinds, why
    assert not why or words in why[0].text, why
    blocked = any(w.blocks for w in why)
    taken = [j for j in await claiming.claim(db, "w1", 10) if j.resource_key == KEY]
    assert (not taken) is blocked, (why, taken)
    if taken:
        assert taken[0].kind == POLL_KIND
