"""Per-resource state all workers share: limits, pacing and breakers in ``resources``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update

from synckit.runtime.db import Database
from synckit.runtime.jobs import _ensure_resources, utcnow
from synckit.runtime.schema import resources

_UNSET: Any = object()


@dataclass(frozen=True)
class ResourceInfo:
    resource_key: str
    parent_key: str | None
    state: str
    consecutive_failures: int
    reopen_count: int
    opened_at: datetime | None
    cooldown_until: datetime | None
    probe_job_id: int | None
    next_available_at: datetime | None
    last_error_class: str | None
    last_error: str | None
    max_in_flight: int | None
    rate_per_s: float | None
    burst: int | None


async def configure_resource(
    db: Database,
    resource_key: str,
    *,
    max_in_flight: int | None = _UNSET,
    parent_key: str | None = _UNSET,
    rate_per_s: float | None = _UNSET,
    burst: int | None = _UNSET,
) -> ResourceInfo:
    """Create the resource if needed and set the limits given (None removes a limit)."""
    if max_in_flight not in (_UNSET, None) and max_in_flight < 1:
        raise ValueError("max_in_flight must be at least 1")
    values = {
        k: v
        for k, v in {
            "max_in_flight": max_in_flight,
            "parent_key": parent_key,
            "rate_per_s": rate_per_s,
            "burst": burst,
        }.items()
        if v is not _UNSET
    }
    now = utcnow()
    keys = [resource_key] + ([parent_key] if parent_key not in (_UNSET, None) else [])
    async with db.begin() as conn:
        await _ensure_resources(conn, keys, now)
        if values:
            await conn.execute(
                update(resources)
                .where(resources.c.resource_key == resource_key)
                .values(**values, updated_at=now)
            )
    return await get_resource(db, resource_key)


async def get_resource(db: Database, resource_key: str) -> ResourceInfo:
    async with db.begin() as conn:
        row = (
            await conn.execute(select(resources).where(resources.c.resource_key == resource_key))
        ).first()
    if row is None:
        raise LookupError(f"no resource {resource_key!r}")
    return ResourceInfo(**{f: getattr(row, f) for f in ResourceInfo.__dataclass_fields__})


async def list_resources(db: Database) -> list[ResourceInfo]:
    async with db.begin() as conn:
        rows = await conn.execute(select(resources).order_by(resources.c.resource_key))
        return [
            ResourceInfo(**{f: getattr(r, f) for f in ResourceInfo.__dataclass_fields__})
            for r in rows
        ]


async def reset_resource(db: Database, resource_key: str) -> ResourceInfo:
    """Close the breaker and clear pacing of ``resource_key`` (an operator's reset).

    Raises :class:`LookupError` when no resource has that key.
    """
    await get_resource(db, resource_key)
    now = utcnow()
    async with db.begin() as conn:
        await conn.execute(
            update(resources)
            .where(resources.c.resource_key == resource_key)
            .values(
                state="closed",
                consecutive_failures=0,
                reopen_count=0,
                opened_at=None,
                cooldown_until=None,
                probe_job_id=None,
                probe_expires_at=None,
                next_available_at=None,
                rate_limit_streak=0,
                rate_limited_at=None,
                paced_reason=None,
                window_start=None,
                window_calls=0,
                window_failures=0,
                updated_at=now,
            )
        )
    return await get_resource(db, resource_key)
