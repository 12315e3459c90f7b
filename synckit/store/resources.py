"""Per-resource state all workers share: limits, pacing and breakers in ``resources``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import ARRAY, Column, Text, bindparam, func, literal_column, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.clock import utcnow
from synckit.errors.breaker import BreakerState
from synckit.store.db import Database
from synckit.store.jobs import (
    _ensure_resources,
    _ensure_resources_sync,
    guarded_columns,
    read_moment,
)
from synckit.store.tables import UTCDateTime, resources

_UNSET: Any = object()


#: The breaker states the runtime writes; anything else in ``resources.state`` is read
#: as it is and marked unknown.
BREAKER_STATES = frozenset(s.value for s in BreakerState)


#: A timestamp read through :func:`readable`: UTC aware, or ``ValueError`` naming what is
#: stored instead. One reader for every table (``jobs.read_moment``).
stored_moment = read_moment


def readable(columns: Iterable[Column[Any]]) -> list[Any]:
    """``columns`` for a read that must survive a corrupt row: timestamps come back
    guarded (:func:`~synckit.store.jobs.guarded_moment`: as the driver has them, or a
    marker where no datetime holds the value, which PostgreSQL's driver would fail the
    whole fetch on), for :func:`stored_moment`."""
    return guarded_columns(columns)


def read_moments(
    row: Mapping[Any, Any], names: Iterable[str]
) -> tuple[dict[str, datetime | None], tuple[tuple[str, str], ...]]:
    """The timestamps ``names`` of a row read through :func:`readable`, and the
    ``(column, reason)`` of those that could not be read (given as None)."""
    out: dict[str, datetime | None] = {}
    bad: list[tuple[str, str]] = []
    for name in names:
        try:
            out[name] = stored_moment(row[name])
        except ValueError as exc:
            out[name] = None
            bad.append((name, str(exc)))
    return out, tuple(bad)


@dataclass(frozen=True)
class ResourceInfo:
    """One ``resources`` row. ``unreadable`` names the values a corrupt row holds
    (``(column, reason)``): such a timestamp reads as None, an unknown ``state`` as it
    is stored."""

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
    unreadable: tuple[tuple[str, str], ...] = ()


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


_FIELDS = [f for f in ResourceInfo.__dataclass_fields__ if f != "unreadable"]
_MOMENTS = [f for f in _FIELDS if isinstance(resources.c[f].type, UTCDateTime)]
_READ = select(*readable(resources.c[f] for f in _FIELDS))


def _info(row: Any) -> ResourceInfo:
    m = row._mapping
    moments, bad = read_moments(m, _MOMENTS)
    if m["state"] not in BREAKER_STATES:
        bad += (("state", f"unknown state {str(m['state'])[:60]!r}"),)
    values: dict[str, Any] = {f: moments[f] if f in moments else m[f] for f in _FIELDS}
    return ResourceInfo(**values, unreadable=bad)


async def get_resource(db: Database, resource_key: str) -> ResourceInfo:
    async with db.read() as conn:
        row = (await conn.execute(_READ.where(resources.c.resource_key == resource_key))).first()
    if row is None:
        raise LookupError(f"no resource {resource_key!r}")
    return _info(row)


async def list_resources(db: Database) -> list[ResourceInfo]:
    """Every resource by key; a corrupt row is listed with what is unreadable in it."""
    async with db.read() as conn:
        rows = await conn.execute(_READ.order_by(resources.c.resource_key))
        return [_info(r) for r in rows]


async def reset_resource(db: Database, resource_key: str) -> ResourceInfo:
    """Close the breaker and clear pacing of ``resource_key`` (an operator's reset),
    the learnt rate included: the tenant learns it again.

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
                learned_rate=None,
                learned_peak=None,
                learned_cut_at=None,
                window_start=None,
                window_calls=0,
                window_failures=0,
                updated_at=now,
            )
        )
    return await get_resource(db, resource_key)


# --- the runtime's operations: pacing (synckit.runtime.pacing) and breakers (the worker) --
#
# Synchronous: they run in the caller's transaction inside ``Database.write`` (the
# recorder's batch, a request's slot), as the rest of the hot path does.

_REASON_LIMIT = 300


def write_resource_sync(conn: Connection, key: str, values: Mapping[str, Any]) -> None:
    """Set ``values`` (column -> value) on the resource ``key``."""
    conn.execute(update(resources).where(resources.c.resource_key == key).values(**values))


def lock_resource_sync(conn: Connection, key: str, now: datetime, *, parent: bool = False) -> Any:
    """The resource's row, created if needed, locked until the caller commits (on
    PostgreSQL; SQLite's write transaction holds the file's lock already). With
    ``parent``, the row also carries its parent's ``next_available_at`` as
    ``parent_available_at`` (read in the same statement, the parent's row not locked)."""
    stmt = _LOCK_ONE_WITH_PARENT if parent else _LOCK_ONE
    row = conn.execute(stmt, {"key": key}).first()
    if row is None:
        _ensure_resources_sync(conn, [key], now)
        row = conn.execute(stmt, {"key": key}).first()
    assert row is not None
    return row


# A resource joined to its parent (an API-wide resource), whose next_available_at the
# pacing reads with the resource's own.
_parent = resources.alias("parent")
_WITH_PARENT = resources.outerjoin(_parent, _parent.c.resource_key == resources.c.parent_key)
_PARENT_AVAILABLE = _parent.c.next_available_at.label("parent_available_at")

_LOCK_ONE = select(resources).where(resources.c.resource_key == bindparam("key")).with_for_update()
_LOCK_ONE_WITH_PARENT = (
    select(resources, _PARENT_AVAILABLE)
    .select_from(_WITH_PARENT)
    .where(resources.c.resource_key == bindparam("key"))
    .with_for_update(of=resources)
)

# A resource's pacing and its parent's next_available_at, in one statement: read per
# request refresh (every half second per paced resource), it was two full-row reads.
_READ_PACE = (
    select(
        resources.c.next_available_at,
        _PARENT_AVAILABLE,
        resources.c.quota_limit,
        resources.c.quota_remaining,
        resources.c.quota_reset_at,
        resources.c.quota_at,
        resources.c.learned_rate,
    )
    .select_from(_WITH_PARENT)
    .where(resources.c.resource_key == bindparam("key"))
)


def read_pace_row_sync(conn: Connection, key: str) -> Any:
    """The resource's ``next_available_at``, its parent's (``parent_available_at``), its
    reported quota (``quota_*``) and its ``learned_rate``; None when there is no such
    resource."""
    return conn.execute(_READ_PACE, {"key": key}).first()


def defer_resource_sync(
    conn: Connection, key: str, until: datetime, reason: str, *, now: datetime
) -> bool:
    """No call to ``key`` before ``until`` (by any worker); True if that moved the limit."""
    _ensure_resources_sync(conn, [key], now)
    res = conn.execute(
        update(resources)
        .where(
            resources.c.resource_key == key,
            or_(resources.c.next_available_at.is_(None), resources.c.next_available_at < until),
        )
        .values(
            next_available_at=until,
            paced_reason=reason[:_REASON_LIMIT],
            last_error_class="rate_limited",
            last_error=reason[:500],
            updated_at=now,
        )
        .returning(resources.c.resource_key)
    )
    return res.first() is not None


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


# ``resources`` rows as the worker's recorder reads them: timestamps guarded
# (:func:`readable`) and parsed per row by the caller, so that a corrupt row reads as
# closed instead of failing the batch.
_BREAKERS: Any = select(*readable(resources.c))


def _among_keys(postgres: bool) -> Any:
    # The keys travel as one parameter (an array; a JSON array on SQLite): the statement
    # is the same for every batch, prepared once, its parameter count fixed.
    if postgres:
        return resources.c.resource_key == func.any(bindparam("keys", type_=ARRAY(Text)))
    return resources.c.resource_key.in_(
        select(literal_column("value")).select_from(func.json_each(bindparam("keys")))
    )


def _key_list(postgres: bool, keys: list[str]) -> Any:
    return keys if postgres else json.dumps(keys)


def lock_free_resources_sync(conn: Connection, keys: list[str]) -> list[Any]:
    """The pacing columns of the resources ``keys`` (those that exist: ``resource_key``,
    ``next_available_at``, ``tokens_at``, ``quota_*``), each with its parent's
    ``next_available_at`` as ``parent_available_at``, locked until the caller commits.

    On PostgreSQL a row another transaction holds is left out (``SKIP LOCKED``): the
    statement never waits for a lock, so a transaction that locks many resources through
    it is never part of a lock cycle. SQLite's write transaction holds the file's lock.
    """
    postgres = conn.dialect.name == "postgresql"
    stmt = _LOCK_FREE[postgres]
    return list(conn.execute(stmt, {"keys": _key_list(postgres, sorted(keys))}))


def _lock_free_statement(postgres: bool) -> Any:
    return (
        select(
            resources.c.resource_key,
            resources.c.next_available_at,
            resources.c.tokens_at,
            resources.c.quota_limit,
            resources.c.quota_remaining,
            resources.c.quota_reset_at,
            resources.c.quota_at,
            _PARENT_AVAILABLE,
        )
        .select_from(_WITH_PARENT)
        .where(_among_keys(postgres))
        .order_by(resources.c.resource_key)
        .with_for_update(of=resources, skip_locked=True)
    )


_LOCK_FREE = {postgres: _lock_free_statement(postgres) for postgres in (False, True)}

_SET_TOKENS_AT = (
    update(resources)
    .where(resources.c.resource_key == bindparam("key"))
    .values(tokens_at=bindparam("tokens_at"))
)


def write_tokens_at_sync(conn: Connection, schedules: Mapping[str, datetime]) -> None:
    """Move each resource's shared request schedule (``tokens_at``) to its given time:
    one statement, run for every resource (its parameters are one row's)."""
    if schedules:
        conn.execute(
            _SET_TOKENS_AT, [{"key": k, "tokens_at": t} for k, t in sorted(schedules.items())]
        )


# The resources among ``keys`` whose breaker a success changes: not closed, failures
# counted, or a failure-rate window open (successes count in it too). A clean resource,
# the common case, costs no write.
_DIRTY = {
    pg: _BREAKERS.where(
        _among_keys(pg),
        (resources.c.state != "closed")
        | (resources.c.consecutive_failures > 0)
        | resources.c.window_start.is_not(None),
    )
    for pg in (True, False)
}
_NOT_CLOSED = {
    pg: _BREAKERS.where(_among_keys(pg), resources.c.state != "closed") for pg in (True, False)
}


def breaker_row_sync(conn: Connection, key: str | None) -> Any:
    """The resource's row, timestamps guarded (None when there is none)."""
    return conn.execute(_BREAKERS.where(resources.c.resource_key == key)).first()


def dirty_breakers_sync(conn: Connection, keys: list[str]) -> Any:
    """The rows (guarded) of the resources among ``keys`` whose breaker a success changes:
    not closed, failures counted, or a failure-rate window open."""
    postgres = conn.dialect.name == "postgresql"
    return conn.execute(_DIRTY[postgres], {"keys": _key_list(postgres, keys)})


def unclosed_breakers_sync(conn: Connection, keys: list[str]) -> Any:
    """The rows (guarded) of the resources among ``keys`` whose breaker is not closed."""
    postgres = conn.dialect.name == "postgresql"
    return conn.execute(_NOT_CLOSED[postgres], {"keys": _key_list(postgres, keys)})


def child_states_sync(conn: Connection, parent_key: str) -> list[str]:
    """The breaker state of each resource whose parent is ``parent_key``."""
    return [
        r.state
        for r in conn.execute(select(resources.c.state).where(resources.c.parent_key == parent_key))
    ]


class BreakerStore(Protocol):
    """The operations the worker's recorder folds outcomes into breakers with: this
    module is one; a unit test's in-memory fake is another."""

    def breaker_row_sync(self, conn: Connection, key: str | None) -> Any: ...

    def dirty_breakers_sync(self, conn: Connection, keys: list[str]) -> Any: ...

    def unclosed_breakers_sync(self, conn: Connection, keys: list[str]) -> Any: ...

    def child_states_sync(self, conn: Connection, parent_key: str) -> list[str]: ...

    def write_resource_sync(
        self, conn: Connection, key: str, values: Mapping[str, Any]
    ) -> None: ...
