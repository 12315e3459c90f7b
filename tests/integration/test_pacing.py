"""Pacing shared through the database: next_available_at and the token bucket, both engines."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from synckit.runtime import pacing
from synckit.runtime.db import Database, open_database
from synckit.runtime.resources import configure_resource, get_resource

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


async def test_bucket_gives_burst_then_paces_at_the_rate(db: Database) -> None:
    """A full bucket gives `burst` tokens at once, then one per 1/rate seconds."""
    waits = [await pacing.take_token(db, "api:t1", 10, 2, NOW) for _ in range(3)]
    assert waits[:2] == [0.0, 0.0]
    assert waits[2] > 0 and abs(waits[2] - 0.1) < 1e-6
    assert await pacing.take_token(db, "api:t1", 10, 2, NOW + timedelta(seconds=0.05)) > 0
    assert await pacing.take_token(db, "api:t1", 10, 2, NOW + timedelta(seconds=0.1)) == 0.0


async def test_bucket_is_exact_across_engines_and_concurrent_takers(migrated_url: str) -> None:
    """Two processes' engines taking at once from one bucket never get more than it holds."""
    a, b = open_database(migrated_url), open_database(migrated_url)
    try:
        results = await asyncio.gather(
            *(pacing.take_token(d, "shared", 1, 5, NOW) for d in [a, b] * 10)
        )
    finally:
        await a.dispose()
        await b.dispose()
    assert sum(1 for w in results if w == 0.0) == 5


async def test_defer_only_pushes_next_available_at_out(db: Database) -> None:
    """A deferral later than the current one moves it; an earlier one changes nothing."""
    later, sooner = NOW + timedelta(seconds=60), NOW + timedelta(seconds=10)
    assert await pacing.defer_resource(db, "api:t2", later, "quota", now=NOW)
    assert not await pacing.defer_resource(db, "api:t2", sooner, "quota", now=NOW)
    info = await get_resource(db, "api:t2")
    assert info.next_available_at == later
    assert info.last_error_class == "rate_limited"
    assert await pacing.resource_wait(db, "api:t2", NOW) == 60.0


async def test_wait_includes_the_parent_resource(db: Database) -> None:
    """A tenant waits while its API-wide parent is paced, even if it is not itself."""
    await configure_resource(db, "demo:t3", parent_key="api:demo")
    assert await pacing.resource_wait(db, "demo:t3", NOW) == 0.0
    await pacing.defer_resource(db, "api:demo", NOW + timedelta(seconds=30), "x", now=NOW)
    assert await pacing.resource_wait(db, "demo:t3", NOW) == 30.0
    assert await pacing.resource_wait(db, "unknown", NOW) == 0.0


async def test_acquire_checks_pacing_before_taking_a_token(db: Database) -> None:
    """A paced resource answers with its wait and keeps its tokens."""
    await pacing.defer_resource(db, "demo:t4", NOW + timedelta(seconds=5), "x", now=NOW)
    assert await pacing.acquire(db, "demo:t4", rate=1, burst=1, now=NOW) == (5.0, "paced")
    later = NOW + timedelta(seconds=5)
    assert await pacing.acquire(db, "demo:t4", rate=1, burst=1, now=later) == (0.0, "")
    wait, why = await pacing.acquire(db, "demo:t4", rate=1, burst=1, now=later)
    assert why == "rate_limit" and wait == 1.0
