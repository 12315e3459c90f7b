"""Per-resource state all workers share: limits, pacing and breakers in ``resources``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import (
    ARRAY,
    Column,
    Row,
    Text,
    bindparam,
    func,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.clock import utcnow
from synckit.errors.breaker import BreakerSnapshot, BreakerState
from synckit.store.db import Database
from synckit.store.moments import guarded_columns, read_moment
from synckit.store.tables import UTCDateTime, resources

_UNSET: Any = object()


#: The breaker states the runtime writes; anything else in ``resources.state`` is read
#: as it is and marked unknown.
BREAKER_STATES = frozenset(s.value for s in BreakerState)


#: A timestamp read through :func:`readable`: UTC aware, or ``ValueError`` naming what is
#: stored instead. One reader for every table (``moments.read_moment``).
stored_moment = read_moment


def readable(columns: Iterable[Column[Any]]) -> list[Any]:
    """``columns`` for a read that must survive a corrupt row: timestamps come back
    guarded (:func:`~synckit.store.moments.guarded_moment`: as the driver has them, or a
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
        await ensure_lanes(conn, keys, now)
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


# --- the runtime's operations: pacing (synckit.runtime.http.pacing) and breakers (the worker) --
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
        ensure_lanes_sync(conn, [key], now)
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
    ensure_lanes_sync(conn, [key], now)
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
    await ensure_lanes(conn, [key] + ([parent_key] if parent_key else []), now)
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


def bulk_lanes_sql(source: str) -> tuple[Any, Any]:
    """SQL for tenants added in bulk (store/connections.py): each lane's row with the
    connector's limits (as configure_pacing), and its parent's row, from the rows
    ``source`` gives (``resource_key``, ``parent_key``, ``max_in_flight``, ``rate``,
    ``burst``), stamped ``:now``."""
    stamp = bindparam("now", type_=resources.c.updated_at.type)
    lanes = text(
        "INSERT INTO resources (resource_key, parent_key, state, max_in_flight, rate_per_s,"
        f" burst, updated_at) SELECT resource_key, parent_key, 'closed', max_in_flight, rate,"
        f" burst, :now FROM {source} WHERE true ON CONFLICT (resource_key) DO UPDATE SET"
        " parent_key = excluded.parent_key, max_in_flight = excluded.max_in_flight,"
        " rate_per_s = excluded.rate_per_s, burst = excluded.burst,"
        " updated_at = excluded.updated_at"
    ).bindparams(stamp)
    parents = text(
        "INSERT INTO resources (resource_key, state, updated_at)"
        f" SELECT DISTINCT parent_key, 'closed', :now FROM {source} WHERE true"
        " ON CONFLICT (resource_key) DO NOTHING"
    ).bindparams(stamp)
    return lanes, parents


# --- the queue's lanes: marks and probes, written in store/jobs/'s transactions -------
#
# ``resources.due_at`` marks the lanes a claim starts from: NULL when the lane has no
# pending job, else a time no later than its earliest pending job's ``run_at``. Claims
# read only the marked lanes, through the partial index ``ix_resources_lanes`` in
# fairness order, and never scan ``resources`` whole (see _lanes_statement).
#
# Whatever makes a job pending lowers its lane's mark in the same transaction (enqueue,
# retry, snooze, release, rescue, an operator's retry or reschedule); a claim that finds
# a lane short of due jobs sets the mark to the lane's next due time, or clears it. A
# mark lower than needed costs one empty look, which corrects it; a lane with work and no
# mark would never be claimed, so the two writes are ordered by the lane row's lock: the
# marking upsert locks the row even when it writes nothing (ON CONFLICT DO UPDATE locks
# the conflicting row whatever its WHERE says), and a claim recomputes a mark only while it
# holds the row from its lanes query. On PostgreSQL at READ COMMITTED an enqueue that locks
# the row first makes the claims skip the lane until it commits; one that comes second
# waits for the claim's commit and lowers the mark the claim just wrote. SQLite runs one
# writer at a time.
#
# The lists travel as arrays (PostgreSQL) or one JSON text (SQLite): a fixed number of
# parameters whatever their length.
_MARK_CONFLICT = (
    " ON CONFLICT (resource_key) DO UPDATE SET due_at = excluded.due_at"
    " WHERE resources.due_at IS NULL OR resources.due_at > excluded.due_at"
)
_LANE_COLUMNS = "INSERT INTO resources (resource_key, state, updated_at, due_at)"
_STAMP = bindparam("now", type_=resources.c.updated_at.type)
# Sorted keys: two transactions marking the same lanes lock them in the same order.
_MARK_LANES: dict[str, Any] = {
    "postgresql": text(
        f"{_LANE_COLUMNS} SELECT k, 'closed', :now, d FROM unnest(CAST(:keys AS varchar[]),"
        " CAST(:dues AS timestamptz[])) AS u(k, d) ORDER BY k" + _MARK_CONFLICT
    ).bindparams(_STAMP),
    "sqlite": text(
        f"{_LANE_COLUMNS} SELECT json_extract(value, '$[0]'), 'closed', :now,"
        " json_extract(value, '$[1]') FROM json_each(:lanes) WHERE true" + _MARK_CONFLICT
    ).bindparams(_STAMP),
}
# The lanes of jobs just made pending, due at their earliest run_at, read in SQL (a
# timestamp no datetime holds never reaches Python).


def mark_lanes_from(source: str, where: str = "") -> str:
    """SQL marking the lanes of the job rows ``source`` gives (``resource_key``,
    ``run_at``; filtered by ``where``), each due at its earliest ``run_at``; ``:now``
    is the stamp. Also a CTE of the enqueue of new jobs (``jobs.enqueue_new``)."""
    return (
        f"{_LANE_COLUMNS} SELECT resource_key, 'closed', :now, min(run_at) FROM {source}"
        f" WHERE {where}resource_key IS NOT NULL"
        " GROUP BY resource_key ORDER BY resource_key" + _MARK_CONFLICT
    )


_MARK_LANES_OF: dict[str, Any] = {
    dialect: text(mark_lanes_from("jobs", f"id {ids} AND status = 'pending' AND ")).bindparams(
        _STAMP
    )
    for dialect, ids in (
        ("postgresql", "= ANY(CAST(:ids AS bigint[]))"),
        ("sqlite", "IN (SELECT value FROM json_each(:ids))"),
    )
}
_ENSURE_LANES: dict[str, Any] = {
    "postgresql": text(
        "INSERT INTO resources (resource_key, state, updated_at) SELECT k, 'closed', :now"
        " FROM unnest(CAST(:keys AS varchar[])) AS u(k) ORDER BY k"
        " ON CONFLICT (resource_key) DO NOTHING"
    ).bindparams(_STAMP),
    "sqlite": text(
        "INSERT INTO resources (resource_key, state, updated_at) SELECT value, 'closed', :now"
        " FROM json_each(:keys) WHERE true ON CONFLICT (resource_key) DO NOTHING"
    ).bindparams(_STAMP),
}


def ensure_lanes_sync(conn: Connection, keys: Iterable[str], now: datetime) -> None:
    """Make sure a ``resources`` row exists for every key (its mark untouched)."""
    unique = sorted(set(keys))
    if not unique:
        return
    param = unique if conn.dialect.name == "postgresql" else json.dumps(unique)
    conn.execute(_ENSURE_LANES[conn.dialect.name], {"keys": param, "now": now})


async def ensure_lanes(conn: AsyncConnection, keys: Iterable[str], now: datetime) -> None:
    await conn.run_sync(ensure_lanes_sync, list(keys), now)


def mark_lanes_sync(conn: Connection, due: Mapping[str, datetime], now: datetime) -> None:
    """Mark each lane ``key`` as having a pending job due at ``due[key]`` (or lower its
    mark to that), creating its ``resources`` row if needed; locks the rows."""
    if not due:
        return
    keys = sorted(due)
    if conn.dialect.name == "postgresql":
        params: dict[str, Any] = {"keys": keys, "dues": [due[k] for k in keys]}
    else:
        params = {"lanes": json.dumps([[k, _SQLITE_TS_TEXT(due[k])] for k in keys])}
    conn.execute(_MARK_LANES[conn.dialect.name], {**params, "now": now})


def mark_lanes_of_sync(conn: Connection, job_ids: Sequence[int], now: datetime) -> None:
    """Mark the lanes of the jobs ``job_ids`` that are pending now (see mark_lanes_sync)."""
    if job_ids:
        param = list(job_ids) if conn.dialect.name == "postgresql" else json.dumps(list(job_ids))
        conn.execute(_MARK_LANES_OF[conn.dialect.name], {"ids": param, "now": now})


# The lane mark written with one job: PostgreSQL (a CTE of the enqueue's statement, with
# ``{key}``, ``{now}``, ``{due}`` its parameters) and SQLite (a raw sqlite3 statement).
PG_MARK_LANE = _LANE_COLUMNS + " VALUES ({key}, 'closed', {now}, {due})" + _MARK_CONFLICT
SQLITE_MARK_LANE = f"{_LANE_COLUMNS} VALUES (?, 'closed', ?, ?){_MARK_CONFLICT}"
_SQLITE_DIALECT = sqlite.dialect()
_SQLITE_TS_TEXT: Any = resources.c.due_at.type.dialect_impl(_SQLITE_DIALECT).bind_processor(
    _SQLITE_DIALECT
)


def claim_probe_sync(
    conn: Connection, key: str, probe: BreakerSnapshot, *, job_id: int, now: datetime
) -> None:
    """The claim gave ``job_id`` as the breaker's probe of lane ``key``."""
    conn.execute(
        update(resources)
        .where(resources.c.resource_key == key)
        .values(
            state=probe.state.value,
            probe_job_id=job_id,
            probe_expires_at=probe.probe_expires_at,
            updated_at=now,
        )
    )


# A lane's next due time: the earliest run_at of its pending jobs, NULL when it has none.
# ix_jobs_lane_due is ordered by priority first, so the minimum is taken per priority
# (the first entry of each), stepping from one priority to the next lower one: a few
# index probes however many jobs wait in the lane, where min(run_at) would read them all.
_NEXT_DUE = (
    "(WITH RECURSIVE p(pr) AS ("
    "SELECT max(j.priority) FROM jobs j WHERE j.status = 'pending'"
    " AND j.resource_key = resources.resource_key"
    " UNION ALL SELECT (SELECT max(j.priority) FROM jobs j WHERE j.status = 'pending'"
    " AND j.resource_key = resources.resource_key AND j.priority < p.pr)"
    " FROM p WHERE p.pr IS NOT NULL)"
    " SELECT min((SELECT min(j.run_at) FROM jobs j WHERE j.status = 'pending'"
    " AND j.resource_key = resources.resource_key AND j.priority = p.pr))"
    " FROM p WHERE p.pr IS NOT NULL)"
)


def _after_claim_statement(member: str) -> Any:
    """What a claim writes on the lane rows it holds: ``last_claimed_at`` of the lanes it
    served, and the mark of the lanes it found short of due jobs, recomputed."""
    return text(
        "UPDATE resources SET"
        f" last_claimed_at = CASE WHEN resource_key {member.format('served')} THEN :now"
        " ELSE last_claimed_at END,"
        f" due_at = CASE WHEN resource_key {member.format('short')} THEN {_NEXT_DUE}"
        " ELSE due_at END"
        f" WHERE resource_key {member.format('touched')}"
    ).bindparams(bindparam("now", type_=resources.c.last_claimed_at.type))


_AFTER_CLAIM = {
    "postgresql": _after_claim_statement("= ANY(CAST(:{} AS varchar[]))"),
    "sqlite": _after_claim_statement("IN (SELECT value FROM json_each(:{}))"),
}


def after_claim(conn: Connection, served: set[str], short: set[str], now: datetime) -> None:
    if not served and not short:
        return
    lists = {"served": sorted(served), "short": sorted(short), "touched": sorted(served | short)}
    if conn.dialect.name == "sqlite":
        params: dict[str, Any] = {k: json.dumps(v) for k, v in lists.items()}
    else:
        params = dict(lists)
    conn.execute(_AFTER_CLAIM[conn.dialect.name], {**params, "now": now})


# The breaker probes among jobs that stopped running, found by their lanes' keys.
_CLEAR_PROBES: dict[str, Any] = {
    dialect: text(
        f"UPDATE resources SET probe_job_id = NULL, updated_at = :now WHERE resource_key {keys}"
        f" AND probe_job_id {ids}"
    ).bindparams(_STAMP)
    for dialect, keys, ids in (
        (
            "postgresql",
            "= ANY(CAST(:keys AS varchar[]))",
            "= ANY(CAST(:ids AS bigint[]))",
        ),
        (
            "sqlite",
            "IN (SELECT value FROM json_each(:keys))",
            "IN (SELECT value FROM json_each(:ids))",
        ),
    )
}


async def clear_probes(conn: AsyncConnection, stopped: Sequence[Row[Any]], now: datetime) -> None:
    """Clear the probes among ``stopped`` jobs (rows with ``id`` and ``resource_key``)."""
    keys = sorted({r.resource_key for r in stopped if r.resource_key is not None})
    if not keys:
        return
    ids = [r.id for r in stopped if r.resource_key is not None]
    if conn.dialect.name == "postgresql":
        params: dict[str, Any] = {"keys": keys, "ids": ids}
    else:
        params = {"keys": json.dumps(keys), "ids": json.dumps(ids)}
    await conn.execute(_CLEAR_PROBES[conn.dialect.name], {**params, "now": now})
