"""Request pacing shared by every worker: a resource's ``next_available_at`` and token bucket.

Every SQL statement that paces calls to a resource lives here, named:

* :func:`resource_wait`: how long until the resource (and its parent, the per-API
  resource) may be called again;
* :func:`defer_resource`: push ``next_available_at`` out (never pulls it in), e.g. when a
  response says the quota is exhausted until its reset;
* :func:`take_token`: take one token from the resource's bucket in ``resources.tokens`` /
  ``tokens_at``, or say how long until one is there.

The bucket is exact across processes: the row is locked (``FOR UPDATE`` on PostgreSQL,
SQLite's write lock otherwise) while a taker refills it by the elapsed time, takes a token
and writes it back. Clocks of different hosts are never trusted to go backwards: the
refill uses ``max(tokens_at, now)``, so a host whose clock runs behind cannot mint tokens.
The arithmetic is the pure :func:`bucket_level`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.runtime.db import Database
from synckit.runtime.jobs import _ensure_resources, utcnow
from synckit.runtime.schema import resources

__all__ = [
    "BucketState",
    "acquire",
    "bucket_level",
    "configure_pacing",
    "defer_resource",
    "resource_wait",
    "take_token",
]


@dataclass(frozen=True)
class BucketState:
    """The bucket after a refill: ``level`` tokens now, ``wait`` seconds until one is whole."""

    level: float
    wait: float


def bucket_level(
    tokens: float | None,
    tokens_at: datetime | None,
    *,
    rate: float,
    burst: int,
    now: datetime,
) -> BucketState:
    """Refill a token bucket (pure). An unknown bucket starts full."""
    if tokens is None or tokens_at is None:
        level = float(burst)
    else:
        elapsed = max(0.0, (now - tokens_at).total_seconds())
        level = min(float(burst), max(0.0, tokens) + elapsed * rate)
    wait = 0.0 if level >= 1.0 else (1.0 - level) / rate
    return BucketState(level=level, wait=wait)


async def _wait_on(conn: AsyncConnection, key: str, now: datetime) -> float:
    parent = resources.alias("parent")
    row = (
        await conn.execute(
            select(
                resources.c.next_available_at,
                parent.c.next_available_at.label("parent_available_at"),
            )
            .select_from(
                resources.outerjoin(parent, parent.c.resource_key == resources.c.parent_key)
            )
            .where(resources.c.resource_key == key)
        )
    ).first()
    if row is None:
        return 0.0
    moments = [m for m in (row.next_available_at, row.parent_available_at) if m is not None]
    if not moments:
        return 0.0
    return max(0.0, float((max(moments) - now).total_seconds()))


async def resource_wait(db: Database, key: str, now: datetime) -> float:
    """Seconds until ``key`` may be called: its own and its parent's ``next_available_at``."""
    async with db.begin() as conn:
        return await _wait_on(conn, key, now)


async def defer_resource(
    target: Database | AsyncConnection,
    key: str,
    until: datetime,
    reason: str,
    *,
    now: datetime | None = None,
) -> bool:
    """No call to ``key`` before ``until`` (by any worker); True if that moved the limit.

    Runs in its own transaction given a Database, else in the caller's.
    """
    now = now or utcnow()
    if isinstance(target, Database):
        async with target.begin() as conn:
            return await _defer_on(conn, key, until, reason, now)
    return await _defer_on(target, key, until, reason, now)


async def _defer_on(
    conn: AsyncConnection, key: str, until: datetime, reason: str, now: datetime
) -> bool:
    await _ensure_resources(conn, [key], now)
    res = await conn.execute(
        update(resources)
        .where(
            resources.c.resource_key == key,
            or_(resources.c.next_available_at.is_(None), resources.c.next_available_at < until),
        )
        .values(
            next_available_at=until,
            last_error_class="rate_limited",
            last_error=reason[:500],
            updated_at=now,
        )
        .returning(resources.c.resource_key)
    )
    return res.first() is not None


async def _take_on(
    conn: AsyncConnection, key: str, rate: float, burst: int, now: datetime
) -> float:
    stmt = (
        select(resources.c.tokens, resources.c.tokens_at)
        .where(resources.c.resource_key == key)
        .with_for_update()
    )
    row = (await conn.execute(stmt)).first()
    if row is None:
        await _ensure_resources(conn, [key], now)
        row = (await conn.execute(stmt)).first()
    assert row is not None
    at = now if row.tokens_at is None else max(row.tokens_at, now)
    state = bucket_level(row.tokens, row.tokens_at, rate=rate, burst=burst, now=at)
    if state.wait > 0:
        return state.wait
    await conn.execute(
        update(resources)
        .where(resources.c.resource_key == key)
        .values(tokens=state.level - 1.0, tokens_at=at)
    )
    return 0.0


async def take_token(db: Database, key: str, rate: float, burst: int, now: datetime) -> float:
    """Take one token from ``key``'s bucket: 0.0 when taken, else the seconds to wait.

    Nothing is taken when the answer is a wait; the caller sleeps and asks again.
    """
    async with db.begin() as conn:
        return await _take_on(conn, key, rate, burst, now)


async def acquire(
    db: Database, key: str, *, rate: float | None, burst: int, now: datetime
) -> tuple[float, str]:
    """One transaction of :func:`resource_wait` then, if free, :func:`take_token`.

    Returns ``(seconds to wait, why)``: ``why`` is ``"paced"`` for ``next_available_at``,
    ``"rate_limit"`` for the bucket, ``""`` when the call may go now (token taken).
    """
    async with db.begin() as conn:
        wait = await _wait_on(conn, key, now)
        if wait > 0:
            return wait, "paced"
        if rate is None:
            return 0.0, ""
        wait = await _take_on(conn, key, rate, burst, now)
        return (wait, "rate_limit") if wait > 0 else (0.0, "")


async def configure_pacing(
    conn: AsyncConnection,
    key: str,
    *,
    parent_key: str | None,
    max_in_flight: int | None,
    rate: float | None,
    burst: int | None,
    now: datetime,
) -> None:
    """Create ``key`` (and its parent) and record its limits, in the caller's transaction."""
    await _ensure_resources(conn, [key] + ([parent_key] if parent_key else []), now)
    values: dict[str, Any] = {
        "parent_key": parent_key,
        "max_in_flight": max_in_flight,
        "rate_per_s": rate,
        "burst": burst,
        "updated_at": now,
    }
    await conn.execute(update(resources).where(resources.c.resource_key == key).values(**values))
