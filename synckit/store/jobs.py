"""The job queue's persistence: every SQL statement on ``jobs`` lives here, named.

The worker and the CLI call these operations; they never build SQL themselves.

Claiming is fair across *lanes*. A lane is a resource key (a tenant's connection, say);
jobs without a key share one more lane. A claim picks the lanes that have due work and
whose resource is available (breaker not open, ``next_available_at`` passed, connection
active), least recently served first, and takes at most an even share of the batch from
each, bounded by the resource's ``max_in_flight``. A tenant with a backlog of 100,000 jobs
therefore delays another tenant by at most one claim batch. On PostgreSQL the lane rows and
the job rows are locked with ``FOR UPDATE SKIP LOCKED``, so concurrent workers never wait
on each other and never claim one job twice; on SQLite the claim runs in one
``BEGIN IMMEDIATE`` transaction, which SQLite serialises.

Every claim stamps its rows with a fresh ``claim_token``; completing checks it, so a
handler that outlived its lease cannot overwrite what happened after the rescue (fencing).

An attempt is charged when a job *starts* (:func:`start_many`, or at claim for the
jobs the worker starts at once), not when it is claimed ahead: a claimed job that has not
started has ``started_at`` NULL and a short lease, and a rescue gives it back to others
with its attempts unchanged.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

import structlog
from sqlalchemy import (
    ARRAY,
    BigInteger,
    Integer,
    Row,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from synckit.clock import utcnow
from synckit.errors.breaker import (
    BreakerPolicy,
    BreakerSnapshot,
    BreakerState,
    breaker_claim_probe,
)
from synckit.errors.exceptions import JobError, JobNotFound, JobStateError, PayloadError
from synckit.errors.gate import LaneFacts, gate
from synckit.store import leases, notify
from synckit.store import resources as lanes
from synckit.store.db import Database, _Busy
from synckit.store.moments import (
    MOMENT_HI,
    MOMENT_LO,
    OUT_OF_RANGE,
    OUT_OF_RANGE_SQL,
    guarded_columns,
    guarded_moment,
    json_holds_nul,
    read_moment,
    read_payload,
)
from synckit.store.pages import (
    COUNT_CAP,
    Count,
    Page,
    bounded,
    off_index,
    page_size,
    paged,
    scan_window,
)
from synckit.store.tables import connections, dialect_insert, jobs, resources

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
from synckit.tracing import current_traceparent, trace_id_of

JobStatus = Literal["pending", "running", "succeeded", "dead", "cancelled", "discarded"]
FINISHED: tuple[JobStatus, ...] = ("succeeded", "dead", "cancelled", "discarded")
NOTIFY_CHANNEL = "synckit_jobs"
_log = structlog.get_logger("synckit.jobs")
DEFAULT_MAX_ATTEMPTS = 5
#: The lease of a job claimed ahead and not started, renewed by its worker's heartbeat
#: (every third of it): when the worker dies, such jobs go back to the queue, uncharged,
#: within about this long plus one rescue pass, whatever the full lease is.
START_LEASE = timedelta(seconds=2)

#: The jobs' lease on the one mechanism of :mod:`synckit.store.leases`: a claim writes
#: its batch's token (``claim_token``, one per claim batch, so that one statement fences
#: a whole batch), the lease's end and the worker's id; every outcome is fenced on the
#: token (:func:`_fence`), so a worker whose lease ran out and whose job was rescued and
#: claimed again cannot finish it. The raw SQL of the hot paths (``_CLAIM_LANES_PG``,
#: ``_PG_START_SQL``, ``_SQLITE_COMPLETE_MANY``, ``_PG_COMPLETE_AND_START``, ``_HELD``)
#: spells the same claim and fence.
JOB_LEASE = leases.LeaseColumns(
    token="claim_token", expires_at="lease_expires_at", holder="locked_by"
)

# Literals, not bound parameters: the planners of both engines can only use a partial
# index when the query's predicate visibly implies the index's.
_PENDING: Any = literal_column("'pending'")
_RUNNING: Any = literal_column("'running'")


def _check_payload(kind: str, payload: Any) -> str:
    """The payload as JSON text, or :class:`PayloadError`."""
    try:
        text = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload of job {kind!r} is not JSON-serialisable: {exc}") from exc
    if json_holds_nul(text):
        raise PayloadError(
            f"payload of job {kind!r} contains a NUL character (U+0000), "
            "which PostgreSQL cannot store in JSON"
        )
    return text


#: The text columns a spec fills, with the longest value each holds (``tables.jobs``).
_TEXT_LIMITS = (
    ("kind", 200),
    ("resource_key", 200),
    ("unique_key", 300),
    ("trace_id", 64),
    ("trace_parent", 64),
)
#: The database's integer columns: ``Integer`` (priority, attempts) and ``BigInteger`` (ids).
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def _check_fields(spec: JobSpec) -> None:
    """What the ``jobs`` columns cannot hold, as a :class:`JobError` naming the field,
    before any write: a value the database refuses would fail a whole batch (a worker's
    recording of a handler's follow-ups, say), not just this job."""
    for name, limit in _TEXT_LIMITS:
        value = getattr(spec, name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise JobError(f"job {spec.kind!r}: {name} must be text, not {type(value).__name__}")
        if "\x00" in value:
            raise JobError(f"job {spec.kind!r}: {name} holds a NUL character")
        if len(value) > limit:
            raise JobError(f"job {spec.kind!r}: {name} is longer than {limit} characters")
    # max_attempts 0 (or None) is the default, as it always was.
    for name, low in (("priority", INT32[0]), ("max_attempts", 0)):
        value = getattr(spec, name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise JobError(f"job {spec.kind!r}: {name} must be a whole number")
        if not low <= value <= INT32[1]:
            raise JobError(f"job {spec.kind!r}: {name} must be from {low} to {INT32[1]}")


@dataclass(frozen=True)
class JobSpec:
    """One job to enqueue (see :func:`enqueue`)."""

    kind: str
    payload: Any = field(default_factory=dict)
    resource_key: str | None = None
    priority: int = 0
    run_at: datetime | None = None
    delay: timedelta | None = None
    max_attempts: int | None = None
    unique_key: str | None = None
    trace_id: str | None = None
    #: The W3C traceparent of the span it is made in (None when tracing is off): its
    #: job's span continues that trace (:mod:`synckit.tracing`).
    trace_parent: str | None = field(default_factory=current_traceparent)

    def row(self, now: datetime) -> dict[str, Any]:
        return self.row_and_json(now)[0]

    def row_and_json(self, now: datetime) -> tuple[dict[str, Any], str]:
        """The ``jobs`` row for this spec, and its payload as JSON text (checked)."""
        if self.run_at is not None and self.delay is not None:
            raise JobError(f"job {self.kind!r}: give run_at or delay, not both")
        if not self.kind:
            raise JobError("a job needs a kind")
        _check_fields(self)
        payload_json = _check_payload(self.kind, self.payload)
        run_at = self.run_at or (now + self.delay if self.delay is not None else now)
        if run_at.tzinfo is None:
            raise JobError(f"job {self.kind!r}: run_at must be timezone-aware")
        return {
            "kind": self.kind,
            "payload": self.payload,
            "resource_key": self.resource_key,
            "status": "pending",
            "priority": self.priority,
            "attempts": 0,
            "max_attempts": self.max_attempts or DEFAULT_MAX_ATTEMPTS,
            "run_at": run_at,
            "unique_key": self.unique_key,
            "trace_id": self.trace_id or trace_id_of(self.trace_parent) or uuid.uuid4().hex,
            "trace_parent": self.trace_parent,
            "created_at": now,
            "updated_at": now,
        }, payload_json


@dataclass(frozen=True)
class Enqueued:
    """The job an enqueue names: ``created`` is False when a unique key matched a job."""

    id: int
    created: bool


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker holds: the fields a handler sees, and the fencing token."""

    id: int
    kind: str
    payload: Any
    resource_key: str | None
    attempts: int
    max_attempts: int
    priority: int
    trace_id: str | None
    run_at: datetime
    claim_token: int
    probe: bool = False
    #: Its start is recorded (attempt charged); False for a job claimed ahead.
    started: bool = False
    #: The W3C traceparent it was enqueued under (:attr:`JobSpec.trace_parent`).
    trace_parent: str | None = None


Executor: TypeAlias = "Database | AsyncConnection | AsyncSession"


async def _connection(target: AsyncConnection | AsyncSession) -> AsyncConnection:
    if isinstance(target, AsyncConnection):
        return target
    return await target.connection()


def _notify_sql(conn: AsyncConnection | Connection) -> str | None:
    return f"NOTIFY {NOTIFY_CHANNEL}" if conn.dialect.name == "postgresql" else None


def _earliest(rows: Iterable[Mapping[str, Any]]) -> dict[str, datetime]:
    """The earliest ``run_at`` of each lane among job rows (those with a resource key)."""
    due: dict[str, datetime] = {}
    for r in rows:
        key = r["resource_key"]
        if key and (key not in due or r["run_at"] < due[key]):
            due[key] = r["run_at"]
    return due


def _insert(conn: AsyncConnection | Connection) -> Any:
    return dialect_insert(conn)


_INSERT_ONE: Any = insert(jobs).returning(jobs.c.id)


def _enqueue_sync(conn: Connection, specs: Sequence[JobSpec], now: datetime) -> list[Enqueued]:
    """Insert the jobs on a synchronous connection (see :meth:`Database.write`)."""
    checked = [s.row_and_json(now) for s in specs]
    rows = [row for row, _ in checked]
    lanes.mark_lanes_sync(conn, _earliest(rows), now)
    results: list[Enqueued] = []
    plain = [r for r in rows if r["unique_key"] is None]
    plain_json = [j for r, j in checked if r["unique_key"] is None]
    keyed = [r for r in rows if r["unique_key"] is not None]
    ids_plain: list[int] = []
    if len(plain) == 1:
        # One row: a plain execute, not SQLAlchemy's executemany machinery.
        ids_plain = [conn.execute(_INSERT_ONE, plain[0]).scalar_one()]
    elif plain:
        if conn.dialect.name == "sqlite":
            ids_plain = _insert_many_sqlite(conn, plain, plain_json, now)
        else:
            ids_plain = _insert_many_pg(conn, plain, plain_json, now)
    keyed_results: dict[int, Enqueued] = {}
    for i, r in enumerate(keyed):
        # One statement per unique key: the conflict target is the partial index on
        # unfinished jobs, so a finished job with the same key does not block a new one.
        stmt = (
            _insert(conn)(jobs)
            .values(**r)
            .on_conflict_do_nothing(
                index_elements=["unique_key"],
                # Literal SQL: with bound parameters PostgreSQL's generic plan (after five
                # runs) cannot match the statement to the partial unique index.
                index_where=text("status IN ('pending', 'running')"),
            )
            .returning(jobs.c.id)
        )
        new_id = (conn.execute(stmt)).scalar()
        if new_id is not None:
            keyed_results[i] = Enqueued(int(new_id), True)
            continue
        existing = (
            conn.execute(
                select(jobs.c.id).where(
                    jobs.c.unique_key == r["unique_key"], jobs.c.status.in_(["pending", "running"])
                )
            )
        ).scalar()
        if existing is None:  # finished between the insert and the select: try again
            new_id = (conn.execute(insert(jobs).values(**r).returning(jobs.c.id))).scalar_one()
            keyed_results[i] = Enqueued(int(new_id), True)
        else:
            keyed_results[i] = Enqueued(int(existing), False)
    it_plain = iter(ids_plain)
    k = 0
    for r in rows:
        if r["unique_key"] is None:
            results.append(Enqueued(next(it_plain), True))
        else:
            results.append(keyed_results[k])
            k += 1
    if (sql := _notify_sql(conn)) is not None and any(e.created for e in results):
        conn.exec_driver_sql(sql)
    return results


# Many rows on PostgreSQL: one array per column, unnested server-side. The statement
# text is the same for every batch size, so asyncpg prepares it once, and the server
# parses 8 parameters instead of 12 per row. INSERT ... SELECT ... ORDER BY assigns the
# serial ids in row order, so the returned ids sorted are the rows' ids in order: the
# same reasoning as SQLAlchemy's own ``sort_by_parameter_order`` for serial keys.
_PG_INSERT_MANY: Any = text(
    "INSERT INTO jobs (kind, payload, resource_key, status, priority, attempts,"
    " max_attempts, run_at, trace_id, trace_parent, created_at, updated_at)"
    " SELECT k, p::jsonb, r, 'pending', pr, 0, m, ra, t, tp, :now, :now"
    " FROM unnest(CAST(:kind AS text[]), CAST(:payload AS text[]),"
    " CAST(:resource_key AS text[]), CAST(:priority AS int[]),"
    " CAST(:max_attempts AS int[]), CAST(:run_at AS timestamptz[]),"
    " CAST(:trace_id AS text[]), CAST(:trace_parent AS text[]))"
    " WITH ORDINALITY AS u(k, p, r, pr, m, ra, t, tp, ord)"
    " ORDER BY ord RETURNING id"
).bindparams(bindparam("now", type_=jobs.c.created_at.type))


def _insert_many_pg(
    conn: Connection, rows: Sequence[dict[str, Any]], payloads: list[str], now: datetime
) -> list[int]:
    """Insert pending, un-keyed ``rows`` made at ``now`` (``payloads``: their payloads as
    JSON text); their ids in row order."""
    params: dict[str, Any] = {
        name: [r[name] for r in rows]
        for name in (
            "kind",
            "resource_key",
            "priority",
            "max_attempts",
            "run_at",
            "trace_id",
            "trace_parent",
        )
    }
    params["payload"] = payloads
    params["now"] = now
    return sorted(r[0] for r in conn.execute(_PG_INSERT_MANY, params))


# The same on SQLite: the rows as one JSON text, inserted in its order. The transaction
# holds SQLite's write lock, so the new rowids ascend in row order; sorting them is exact.
_SQLITE_INSERT_MANY: Any = text(
    "INSERT INTO jobs (kind, payload, resource_key, status, priority, attempts,"
    " max_attempts, run_at, trace_id, trace_parent, created_at, updated_at)"
    " SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),"
    " json_extract(value, '$[2]'), 'pending', json_extract(value, '$[3]'), 0,"
    " json_extract(value, '$[4]'), json_extract(value, '$[5]'), json_extract(value, '$[6]'),"
    " json_extract(value, '$[7]'), :now, :now FROM json_each(:rows) ORDER BY key RETURNING id"
)


def _insert_many_sqlite(
    conn: Connection, rows: Sequence[dict[str, Any]], payloads: list[str], now: datetime
) -> list[int]:
    """:func:`_insert_many_pg` on SQLite."""
    packed = json.dumps(
        [
            [
                r["kind"],
                p,
                r["resource_key"],
                r["priority"],
                r["max_attempts"],
                _SQLITE_TS_TEXT(r["run_at"]),
                r["trace_id"],
                r["trace_parent"],
            ]
            for r, p in zip(rows, payloads, strict=True)
        ]
    )
    res = conn.execute(_SQLITE_INSERT_MANY, {"rows": packed, "now": _SQLITE_TS_TEXT(now)})
    return sorted(r[0] for r in res)


_ROW_COLUMNS = (
    "kind",
    "payload",
    "resource_key",
    "status",
    "priority",
    "attempts",
    "max_attempts",
    "run_at",
    "unique_key",
    "trace_id",
    "trace_parent",
    "created_at",
    "updated_at",
)

# One job on PostgreSQL: its lane's resources row (when it has a resource key), the job,
# and the NOTIFY that wakes workers, all in one autocommitted statement, sent straight
# through asyncpg (see :meth:`Database.raw_pg`). Data-modifying CTEs all run, whether or
# not the outer query reads them.
_PG_INSERT_ONE = (
    f"WITH ins AS (INSERT INTO jobs ({', '.join(_ROW_COLUMNS)}) VALUES ($1, $2::jsonb, $3,"
    " $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING id)"
    f" SELECT id, pg_notify('{NOTIFY_CHANNEL}', '') FROM ins"
)
# The lane's mark comes with the job (see resources.mark_lanes_sync): $3 is its key, $8 its run_at.
_PG_INSERT_ONE_IN_LANE = (
    f"WITH lane AS ({lanes.PG_MARK_LANE.format(key='$3', now='$12', due='$8')}), "
    + _PG_INSERT_ONE.removeprefix("WITH ")
)


async def _enqueue_one_pg(db: Database, spec: JobSpec, now: datetime) -> Enqueued:
    """One job on PostgreSQL in one autocommitted statement that also notifies workers.

    A single statement is atomic by itself, so this is as safe as a transaction and
    saves the BEGIN, NOTIFY and COMMIT round trips: one-at-a-time enqueue is the path
    applications hit most. It bypasses SQLAlchemy, whose per-execution work cost as much
    as the round trip itself.
    """
    row, payload_json = spec.row_and_json(now)
    params = [payload_json if c == "payload" else row[c] for c in _ROW_COLUMNS]
    async with db.raw_pg() as conn:
        sql = _PG_INSERT_ONE if row["resource_key"] is None else _PG_INSERT_ONE_IN_LANE
        new_id = await conn.fetchval(sql, *params)
    return Enqueued(int(new_id), True)


def _sqlite_params(columns: Sequence[str]) -> list[tuple[str, Any]]:
    """Each column with SQLAlchemy's own bind processor for SQLite (JSON, UTC timestamps)."""
    dialect = sqlite.dialect()
    return [(c, jobs.c[c].type.bind_processor(dialect)) for c in columns]


_SQLITE_INSERT_ONE = (
    f"INSERT INTO jobs ({', '.join(_ROW_COLUMNS)}) VALUES ({', '.join('?' * len(_ROW_COLUMNS))})"
    " RETURNING id"
)
_SQLITE_JOB_PARAMS = _sqlite_params(_ROW_COLUMNS)
_SQLITE_TIMESTAMP: Any = resources.c.updated_at.type.bind_processor(sqlite.dialect())


def _enqueue_one_sqlite(conn: Any, row: dict[str, Any], payload_json: str) -> int:
    """One job on a raw ``sqlite3`` connection (see :meth:`Database.try_inline`).

    The same INSERT as :func:`_enqueue_sync` makes, with the values bound through the
    columns' own SQLAlchemy bind processors, minus SQLAlchemy's per-statement overhead.
    """
    if row["resource_key"]:
        conn.execute(
            lanes.SQLITE_MARK_LANE,
            (
                row["resource_key"],
                _SQLITE_TIMESTAMP(row["created_at"]),
                _SQLITE_TIMESTAMP(row["run_at"]),
            ),
        )
    params = tuple(
        payload_json if c == "payload" else row[c] if p is None else p(row[c])
        for c, p in _SQLITE_JOB_PARAMS
    )
    return int(conn.execute(_SQLITE_INSERT_ONE, params).fetchone()[0])


async def enqueue_many(
    target: Executor, specs: Sequence[JobSpec], *, now: datetime | None = None
) -> list[Enqueued]:
    """Enqueue several jobs in one transaction (the caller's, if given a connection).

    ``now`` defaults to the database's clock (:attr:`Database.clock`: an
    ``App(clock=...)`` that used it sets it), else, for a connection, the wall clock."""
    now = now or (target.clock() if isinstance(target, Database) else utcnow())
    if not specs:
        return []
    if isinstance(target, Database):
        if len(specs) == 1 and specs[0].unique_key is None:
            if target.is_postgres:
                return [await _enqueue_one_pg(target, specs[0], now)]
            new_id = target.try_inline(_enqueue_one_sqlite, *specs[0].row_and_json(now))
            if not isinstance(new_id, _Busy):
                target_wake(target)
                return [Enqueued(new_id, True)]
        out = await target.write(_enqueue_sync, specs, now)
        target_wake(target)
        return out
    conn = await _connection(target)
    out = await conn.run_sync(_enqueue_sync, specs, now)
    _wake_after_commit(conn)
    return out


async def enqueue(
    target: Executor,
    kind: str,
    payload: Any = None,
    *,
    resource_key: str | None = None,
    priority: int = 0,
    run_at: datetime | None = None,
    delay: timedelta | None = None,
    max_attempts: int | None = None,
    unique_key: str | None = None,
    trace_id: str | None = None,
    now: datetime | None = None,
) -> Enqueued:
    """Enqueue one job.

    ``target`` is a :class:`Database` (the job commits on its own) or the caller's
    ``AsyncConnection``/``AsyncSession`` (the job commits or rolls back with the caller's
    writes). A ``unique_key`` naming an unfinished job returns that job instead of creating
    a second. A payload that is not JSON-serialisable raises :class:`PayloadError`.
    """
    spec = JobSpec(
        kind=kind,
        payload={} if payload is None else payload,
        resource_key=resource_key,
        priority=priority,
        run_at=run_at,
        delay=delay,
        max_attempts=max_attempts,
        unique_key=unique_key,
        trace_id=trace_id,
    )
    return (await enqueue_many(target, [spec], now=now))[0]


# Keyed jobs in one statement whatever their number (the scheduler's cycles): the rows
# travel as one array per column (PostgreSQL) or one JSON array (SQLite), so the text and
# the parameter count are the same for every batch, and a key naming an unfinished job
# is skipped by the partial unique index. The lanes of the jobs created are marked.
_SQLITE_DIALECT = sqlite.dialect()
# The text SQLite stores for a timestamp (json_each hands values over as they are).
_SQLITE_TS_TEXT: Any = jobs.c.run_at.type.dialect_impl(_SQLITE_DIALECT).bind_processor(
    _SQLITE_DIALECT
)
_NEW_COLUMNS = (
    "kind, payload, resource_key, status, priority, attempts, max_attempts, run_at,"
    " unique_key, trace_id, trace_parent, created_at, updated_at"
)
_PG_ENQUEUE_NEW: Any = text(
    "WITH v AS (SELECT * FROM unnest(CAST(:kind AS text[]), CAST(:payload AS text[]),"
    " CAST(:resource_key AS text[]), CAST(:priority AS int[]), CAST(:max_attempts AS int[]),"
    " CAST(:run_at AS timestamptz[]), CAST(:unique_key AS text[]), CAST(:trace_id AS text[]),"
    " CAST(:trace_parent AS text[])) WITH ORDINALITY AS u(k, p, r, pr, m, ra, uk, t, tp, ord)),"
    f" ins AS (INSERT INTO jobs ({_NEW_COLUMNS})"
    " SELECT k, p::jsonb, r, 'pending', pr, 0, m, ra, uk, t, tp, :now, :now FROM v ORDER BY ord"
    " ON CONFLICT (unique_key) WHERE status IN ('pending', 'running') DO NOTHING"
    " RETURNING unique_key, resource_key, run_at),"
    f" lane AS ({lanes.mark_lanes_from('ins')})"
    " SELECT unique_key FROM ins"
).bindparams(bindparam("now", type_=jobs.c.created_at.type))
_SQLITE_ENQUEUE_NEW: Any = text(
    f"INSERT INTO jobs ({_NEW_COLUMNS})"
    " SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),"
    " json_extract(value, '$[2]'), 'pending', json_extract(value, '$[3]'), 0,"
    " json_extract(value, '$[4]'), json_extract(value, '$[5]'), json_extract(value, '$[6]'),"
    " json_extract(value, '$[7]'), json_extract(value, '$[8]'), :now, :now"
    " FROM json_each(:rows) WHERE true"
    " ON CONFLICT (unique_key) WHERE status IN ('pending', 'running') DO NOTHING"
    " RETURNING unique_key"
)


def enqueue_new_sync(conn: Connection, specs: Sequence[JobSpec], now: datetime) -> list[str]:
    """Insert the jobs whose ``unique_key`` names no unfinished job; their keys.

    Every spec needs a unique key. One statement for any number of jobs (the caller
    bounds the batch), in the caller's transaction; workers are notified on PostgreSQL.
    """
    rows = [s.row_and_json(now) for s in specs]
    if not rows:
        return []
    if any(r["unique_key"] is None for r, _ in rows):
        raise JobError("enqueue_new needs a unique_key on every job")
    if conn.dialect.name == "postgresql":
        params: dict[str, Any] = {
            name: [r[name] for r, _ in rows]
            for name in (
                "kind",
                "resource_key",
                "priority",
                "max_attempts",
                "run_at",
                "unique_key",
                "trace_id",
                "trace_parent",
            )
        }
        params["payload"] = [p for _, p in rows]
        params["now"] = now
        created = [r[0] for r in conn.execute(_PG_ENQUEUE_NEW, params)]
        if created:
            conn.exec_driver_sql(f"NOTIFY {NOTIFY_CHANNEL}")
        return created
    packed = json.dumps(
        [
            [
                r["kind"],
                p,
                r["resource_key"],
                r["priority"],
                r["max_attempts"],
                _SQLITE_TS_TEXT(r["run_at"]),
                r["unique_key"],
                r["trace_id"],
                r["trace_parent"],
            ]
            for r, p in rows
        ]
    )
    stamp = _SQLITE_TS_TEXT(now)
    created = [r[0] for r in conn.execute(_SQLITE_ENQUEUE_NEW, {"rows": packed, "now": stamp})]
    made = set(created)
    lanes.mark_lanes_sync(conn, _earliest(r for r, _ in rows if r["unique_key"] in made), now)
    return created


async def enqueue_new(
    conn: AsyncConnection, specs: Sequence[JobSpec], *, now: datetime
) -> list[str]:
    """:func:`enqueue_new_sync` in the caller's transaction; wakes this process's workers
    once it commits."""
    created = await conn.run_sync(enqueue_new_sync, specs, now)
    if created:
        _wake_after_commit(conn)
    return created


# In-process wake-ups (SQLite has no LISTEN/NOTIFY), through the one waker registry
# (synckit.store.notify): workers of this process register an event for the job channel;
# an enqueue sets it once its transaction commits.


def register_waker(db: Database, event: asyncio.Event) -> None:
    notify.register(db, NOTIFY_CHANNEL, event)


def unregister_waker(db: Database, event: asyncio.Event) -> None:
    notify.unregister(db, NOTIFY_CHANNEL, event)


def target_wake(db: Database) -> None:
    notify.wake(db, NOTIFY_CHANNEL)


def _wake_after_commit(conn: AsyncConnection) -> None:
    notify.wake_after_commit(conn, NOTIFY_CHANNEL)


# --- claiming -----------------------------------------------------------------------


def _later(col: Any, now: Any) -> Any:
    """SQL: the timestamp ``col`` is set, readable and after ``now``. A value no datetime
    can hold ('garbage' on SQLite, year 20000 on PostgreSQL) reads as None everywhere
    (:func:`read_moment`), so here too it holds nothing back."""
    return and_(col.is_not(None), col > now, col <= literal_column(MOMENT_HI))


def _breaker_denies(r: Any, now: Any) -> Any:
    """SQL: the row ``r``'s breaker holds it (:func:`~synckit.errors.gate.gate`'s
    ``breaker`` and ``probe`` holds; a property test holds the claim and the gate
    together on both engines)."""
    return or_(
        and_(r.c.state == "open", _later(r.c.cooldown_until, now)),
        and_(
            r.c.state == "half_open",
            r.c.probe_job_id.is_not(None),
            _later(r.c.probe_expires_at, now),
        ),
    )


def _resource_blocked(r: Any, now: Any) -> Any:
    """SQL: the gate holds the resource row ``r`` until a moment (pacing, an open
    breaker, a live probe): :func:`~synckit.errors.gate.gate` for the database."""
    # Every term is NULL-safe, so that NOT (...) means "available" and never "unknown".
    return or_(_later(r.c.next_available_at, now), _breaker_denies(r, now))


@dataclass(frozen=True)
class Unreadable:
    """A claimed job whose row cannot be read: it is quarantined, not handed out."""

    id: int
    reason: str


# What a claim returns of each job: the fields of a ClaimedJob. The payload comes back as
# text and the run time guarded, both parsed per row (:func:`_claimed`), so one row that
# cannot be read is quarantined instead of failing every claim.
_CLAIMED_COLUMNS = (
    jobs.c.id,
    jobs.c.kind,
    # As text: the PostgreSQL driver decodes JSONB itself, where one bad row would fail all.
    cast(jobs.c.payload, Text).label("payload"),
    jobs.c.resource_key,
    jobs.c.attempts,
    jobs.c.max_attempts,
    jobs.c.priority,
    jobs.c.trace_id,
    jobs.c.trace_parent,
    guarded_moment(jobs.c.run_at),
)
_PG_CLAIMED_SQL = (
    "jobs.id, jobs.kind, CAST(jobs.payload AS text) AS payload, jobs.resource_key,"
    " jobs.attempts, jobs.max_attempts, jobs.priority, jobs.trace_id, jobs.trace_parent,"
    f" CASE WHEN jobs.run_at >= {MOMENT_LO} AND jobs.run_at"
    f" <= {MOMENT_HI} THEN jobs.run_at ELSE {OUT_OF_RANGE_SQL} END AS run_at"
)


def _claim_statement(keyed: bool) -> Any:
    """The claim of one lane, built once: parameters ``now``, ``lim``, ``lane``, ``worker``,
    ``token``, ``until`` (the lease's end), ``charge`` (1 when the claimed jobs start now,
    else 0) and ``started`` (``now`` or NULL). Prebuilt so that a claim costs no SQL
    construction or cache-key computation, only execution."""
    lane_cond = jobs.c.resource_key == bindparam("lane") if keyed else jobs.c.resource_key.is_(None)
    picked = (
        select(jobs.c.id)
        .where(jobs.c.status == _PENDING, jobs.c.run_at <= bindparam("now"), lane_cond)
        .order_by(jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id)
        .limit(bindparam("lim", type_=Integer))
        .with_for_update(skip_locked=True)
    )
    return _claiming(picked.scalar_subquery())


def _claiming(ids: Any) -> Any:
    """The claim's UPDATE of the jobs whose ids ``ids`` selects (parameters as for
    :func:`_claim_statement`), returning the claimed columns."""
    return (
        update(jobs)
        .where(jobs.c.id.in_(ids))
        .values(
            status="running",
            attempts=jobs.c.attempts + bindparam("charge", type_=Integer),
            **JOB_LEASE.holding(bindparam("token"), bindparam("until"), bindparam("worker")),
            heartbeat_at=bindparam("now"),
            started_at=bindparam("started", type_=jobs.c.started_at.type),
            updated_at=bindparam("now"),
        )
        .returning(*_CLAIMED_COLUMNS)
    )


_CLAIM_KEYED = _claim_statement(keyed=True)
_CLAIM_UNKEYED = _claim_statement(keyed=False)


def _claim_ones_statement() -> Any:
    """SQLite: the claim of one job in each of many lanes (``lanes``, a JSON array of
    keys), in one statement: each lane's first due job by the per-lane claim's order and
    index. Other parameters as for :func:`_claim_statement`. A claim over many tenants
    asks one job of most lanes; a statement per lane was ~10% of a SQLite worker's CPU
    (``bench.tenants``)."""
    lane = func.json_each(bindparam("lanes")).table_valued("value").alias("lane")
    j = jobs.alias("j")
    first = (
        select(j.c.id)
        .where(
            j.c.status == _PENDING, j.c.resource_key == lane.c.value, j.c.run_at <= bindparam("now")
        )
        .order_by(j.c.priority.desc(), j.c.run_at, j.c.id)
        .limit(1)
        .scalar_subquery()
    )
    return _claiming(select(first).select_from(lane))


_CLAIM_ONES_SQLITE = _claim_ones_statement()


def _claim_lane_rows(
    conn: Connection,
    *,
    lane: str | None,
    limit: int,
    now: datetime,
    worker_id: str,
    token: int,
    terms: dict[str, Any],
) -> list[Row[Any]]:
    params = {"now": now, "lim": limit, "worker": worker_id, "token": token, **terms}
    if lane is None:
        return list(conn.execute(_CLAIM_UNKEYED, params))
    return list(conn.execute(_CLAIM_KEYED, {**params, "lane": lane}))


def _lanes_statement() -> Any:
    """Lanes marked due whose resource allows a call now, least recently claimed first.

    The marked lanes are walked in fairness order through ``ix_resources_lanes`` (a partial
    index on ``last_claimed_at`` of the rows with a ``due_at``), so the LIMIT stops the walk
    early: the connection, parent and in-flight checks run per row walked, never over
    every lane. A lane whose mark is stale is returned and costs one empty look.

    Built once (parameters ``now`` and ``lim``): building it per claim cost more than
    running it.
    """
    now = bindparam("now", type_=jobs.c.run_at.type)
    parent = resources.alias("parent")
    running = (
        select(func.count())
        .select_from(jobs)
        .where(jobs.c.status == _RUNNING, jobs.c.resource_key == resources.c.resource_key)
        .scalar_subquery()
    )
    # OFFSET 0 keeps PostgreSQL from turning these checks into anti-joins: it expects few
    # blocked parents and inactive connections, so it would scan every resource and every
    # connection once per claim to find them. As subplans they are one index probe per
    # lane walked (the primary key, ix_connections_resource_key).
    parent_blocked = (
        select(literal_column("1"))
        .where(parent.c.resource_key == resources.c.parent_key, _resource_blocked(parent, now))
        .offset(literal_column("0"))
        .exists()
    )
    conn_inactive = (
        select(literal_column("1"))
        .where(
            connections.c.resource_key == resources.c.resource_key,
            connections.c.status != "active",
        )
        .offset(literal_column("0"))
        .exists()
    )
    return (
        select(
            resources.c.resource_key,
            resources.c.state,
            resources.c.cooldown_until,
            resources.c.max_in_flight,
            # Only a capped lane needs its running jobs counted.
            case((resources.c.max_in_flight.is_not(None), running)).label("running"),
        )
        .where(
            resources.c.due_at <= now,
            ~_resource_blocked(resources, now),
            ~parent_blocked,
            ~conn_inactive,
        )
        # Never-claimed lanes first: NULLS FIRST, as ix_resources_lanes is ordered.
        .order_by(resources.c.last_claimed_at.asc().nulls_first())
        .limit(bindparam("lim", type_=Integer))
        .with_for_update(skip_locked=True, of=resources)
    )


_LANES = _lanes_statement()


# PostgreSQL: many lanes' claims in one statement (and one round trip), each lane its own
# LIMIT under FOR UPDATE SKIP LOCKED. With a thousand tenants a claim used to cost a
# round trip per lane.
_CLAIM_LANES_PG: Any = (
    text(
        "UPDATE jobs SET status = 'running', attempts = jobs.attempts + :charge,"
        " locked_by = :worker, claim_token = :token, heartbeat_at = :now,"
        " lease_expires_at = :until, started_at = :started, updated_at = :now"
        " WHERE jobs.id IN (SELECT picked.id FROM unnest(CAST(:lanes AS varchar[]),"
        " CAST(:wants AS int[])) AS l(key, want) CROSS JOIN LATERAL (SELECT j.id FROM jobs j"
        " WHERE j.status = 'pending' AND j.resource_key = l.key AND j.run_at <= :now"
        " ORDER BY j.priority DESC, j.run_at, j.id LIMIT l.want FOR UPDATE SKIP LOCKED)"
        " AS picked) RETURNING " + _PG_CLAIMED_SQL
    )
    .bindparams(
        bindparam("now", type_=jobs.c.run_at.type),
        bindparam("until", type_=jobs.c.run_at.type),
        bindparam("started", type_=jobs.c.started_at.type),
        bindparam("charge", type_=Integer),
    )
    .columns(
        *_CLAIMED_COLUMNS[:2],
        column("payload", Text),
        *_CLAIMED_COLUMNS[3:-1],
        column("run_at", Text),
    )
)


def _claim_lanes(
    conn: Connection,
    wants: Sequence[tuple[str | None, int]],
    *,
    now: datetime,
    worker_id: str,
    token: int,
    terms: dict[str, Any],
) -> dict[str | None, list[Row[Any]]]:
    """Claim up to ``want`` due jobs of each lane; the rows claimed, per lane."""
    got: dict[str | None, list[Row[Any]]] = {key: [] for key, _ in wants}
    keyed = [(k, w) for k, w in wants if k is not None]
    batched = conn.dialect.name == "postgresql" and len(keyed) > 1
    if batched:
        params = {
            "now": now,
            **terms,
            "worker": worker_id,
            "token": token,
            "lanes": [k for k, _ in keyed],
            "wants": [w for _, w in keyed],
        }
        for row in conn.execute(_CLAIM_LANES_PG, params):
            got[row.resource_key].append(row)
        # RETURNING has no order: each lane's jobs in claim order, as one lane's claim.
        for rows in got.values():
            rows.sort(key=lambda r: (-r.priority, r.run_at, r.id))
    # SQLite: the lanes asked for one job each in one statement, the others one by one.
    one_each: set[str] = set()
    ones = [k for k, w in keyed if w == 1] if conn.dialect.name == "sqlite" else []
    if len(ones) > 1:
        params = {"now": now, "worker": worker_id, "token": token, **terms}
        for row in conn.execute(_CLAIM_ONES_SQLITE, {**params, "lanes": json.dumps(ones)}):
            got[row.resource_key].append(row)
        one_each = set(ones)
    for key, want in wants:
        if key is None or (not batched and key not in one_each):
            # SQLite: in-process statements, one per lane (but one for the one-job lanes)
            got[key] = _claim_lane_rows(
                conn, lane=key, limit=want, now=now, worker_id=worker_id, token=token, terms=terms
            )
    return got


def _available_lanes(conn: Connection, now: datetime, max_lanes: int) -> list[Row[Any]]:
    return list(conn.execute(_LANES, {"now": now, "lim": max_lanes}))


async def claim(
    db: Database,
    worker_id: str,
    limit: int,
    *,
    now: datetime | None = None,
    lease: timedelta = timedelta(seconds=60),
    start: int | None = None,
    start_lease: timedelta = START_LEASE,
    breaker_policy: BreakerPolicy | None = None,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` due jobs for ``worker_id``, fairly across lanes.

    Each claimed job is ``running`` with a fresh claim token. The first ``start`` of them
    (all when None) start now: their attempt is charged and their lease runs until
    ``now + lease``. The others are claimed ahead: attempt not charged, lease until
    ``now + start_lease``, until :func:`start_many` starts them. A resource whose breaker
    waits for a probe gives exactly one job, marked ``probe``, and the probe is presumed
    lost after ``breaker_policy.probe_timeout``.
    """
    if limit <= 0:
        return []
    now = now or utcnow()
    token = secrets.randbits(62)
    claimed, unreadable = await db.write(
        _claim_sync,
        worker_id,
        limit,
        now,
        lease,
        token,
        limit if start is None else max(0, start),
        start_lease,
        breaker_policy or BreakerPolicy(),
    )
    for u in unreadable:
        _log.warning("job.unreadable", job_id=u.id, reason=u.reason, status="dead")
    return claimed


def _claim_sync(
    conn: Connection,
    worker_id: str,
    limit: int,
    now: datetime,
    lease: timedelta,
    token: int,
    start: int,
    start_lease: timedelta,
    policy: BreakerPolicy,
) -> tuple[list[ClaimedJob], list[Unreadable]]:
    # Every job the claim may return starts now: charged in the claim statement itself.
    # Otherwise all are claimed ahead, and the first ``start`` are started below.
    all_start = start >= limit
    terms: dict[str, Any] = {
        "until": now + (lease if all_start else start_lease),
        "charge": 1 if all_start else 0,
        "started": now if all_start else None,
    }
    claimed: list[ClaimedJob] = []
    unreadable: list[Unreadable] = []
    lanes_rows = _available_lanes(conn, now, max_lanes=limit)
    # Room per lane, as the gate says: 1 for a breaker probe, else what max_in_flight
    # leaves (None: no cap). The lanes' SQL has already left out those held until a
    # moment (the same gate, written for the database), so only the state and the
    # in-flight count are read here.
    room_of: dict[str | None, int | None] = {}
    probes: set[str] = set()
    room_state: dict[str, str] = {}
    for r in lanes_rows:
        room_state[r.resource_key] = r.state
        g = gate(LaneFacts(r.state, max_in_flight=r.max_in_flight, running=r.running or 0), now)
        room_of[r.resource_key] = g.room
        if g.probe:
            probes.add(r.resource_key)
    room_of[None] = None  # the lane of jobs without a resource key
    served: set[str] = set()
    # Lanes that gave fewer jobs than asked: no due job left there now.
    short: set[str] = set()
    # Even shares first; lanes that filled their share split what is left, and so on.
    open_lanes = [k for k, room in room_of.items() if room is None or room > 0]
    while open_lanes and len(claimed) + len(unreadable) < limit:
        taken = len(claimed) + len(unreadable)
        share = max(1, math.ceil((limit - taken) / len(open_lanes)))
        # This round's wants: an even share each, within the batch and each lane's cap.
        wants: list[tuple[str | None, int]] = []
        budget = limit - taken
        for key in open_lanes:
            if budget <= 0:
                break
            cap = room_of[key]
            want = min(share, budget, cap if cap is not None else budget)
            wants.append((key, want))
            budget -= want
        got = _claim_lanes(conn, wants, now=now, worker_id=worker_id, token=token, terms=terms)
        still_open: list[str | None] = []
        for key, want in wants:
            rows = got[key]
            cap = room_of[key]
            if key is not None and len(rows) < want:
                short.add(key)
            if not rows:
                continue
            probe = key in probes
            if key is not None:
                served.add(key)
                if probe:
                    claimed_probe = breaker_claim_probe(
                        BreakerSnapshot(state=BreakerState(room_state[key])), now, policy
                    )
                    lanes.claim_probe_sync(conn, key, claimed_probe, job_id=rows[0].id, now=now)
            for r in rows:
                job = _claimed(r, token, probe, all_start)
                if isinstance(job, Unreadable):
                    unreadable.append(job)
                else:
                    claimed.append(job)
            if cap is not None:
                room_of[key] = cap - len(rows)
            if len(rows) == want and not probe and (cap is None or cap > len(rows)):
                still_open.append(key)
        open_lanes = still_open
    lanes.after_claim(conn, served, short, now)
    if unreadable:
        _quarantine(conn, unreadable, token, now)
    if not all_start and start and claimed:
        # The jobs the worker starts at once are charged in this same transaction.
        first = claimed[:start]
        marked = start_many_sync(conn, [(j.id, token) for j in first], now=now, lease=lease)
        claimed[: len(first)] = [
            replace(j, attempts=j.attempts + 1, started=True) if j.id in marked else j
            for j in first
        ]
    return claimed, unreadable


def _claimed(r: Row[Any], token: int, probe: bool, started: bool) -> ClaimedJob | Unreadable:
    try:
        payload = read_payload(r.payload)
    except ValueError as exc:
        return Unreadable(r.id, str(exc))
    try:
        run_at = read_moment(r.run_at)
    except ValueError as exc:
        return Unreadable(r.id, f"run_at: {exc}")
    assert run_at is not None  # NOT NULL
    return ClaimedJob(
        id=r.id,
        kind=r.kind,
        payload=payload,
        resource_key=r.resource_key,
        attempts=r.attempts,
        max_attempts=r.max_attempts,
        priority=r.priority,
        trace_id=r.trace_id,
        run_at=run_at,
        claim_token=token,
        probe=probe,
        started=started,
        trace_parent=r.trace_parent,
    )


def _fence(token: Any) -> ColumnElement[bool]:
    """The jobs still held under ``token`` (a value or a bound parameter): the token is on
    the row and the job is running. A rescue clears the token, so once another claim took
    the job over, a late holder's outcome matches no row."""
    return and_(leases.held(jobs, token, JOB_LEASE), jobs.c.status == _RUNNING)


_QUARANTINE: Any = (
    update(jobs)
    .where(jobs.c.id == bindparam("job_id"), leases.held(jobs, bindparam("token"), JOB_LEASE))
    .values(
        status="dead",
        last_error=bindparam("reason"),
        error_class="validation",
        **JOB_LEASE.released(),
        finished_at=bindparam("now"),
        updated_at=bindparam("now"),
    )
)


def _quarantine(conn: Connection, bad: Sequence[Unreadable], token: int, now: datetime) -> None:
    """Jobs whose row cannot be read end dead, in the claim's transaction, naming why
    (no dead letter: what it would hold is what cannot be read)."""
    conn.execute(
        _QUARANTINE,
        [
            {"job_id": u.id, "token": token, "reason": f"unreadable row: {u.reason}", "now": now}
            for u in bad
        ],
    )


# --- outcomes -----------------------------------------------------------------------


def complete_many_sync(
    conn: Connection,
    done: Sequence[tuple[int, int]],
    *,
    now: datetime,
) -> set[int]:
    """Mark ``(job id, claim token)`` pairs succeeded; return the ids whose claim still held."""
    if not done:
        return set()
    by_token: dict[int, list[int]] = {}
    for job_id, token in done:
        by_token.setdefault(token, []).append(job_id)
    held: set[int] = set()
    sqlite_ = conn.dialect.name == "sqlite"
    stmt = _COMPLETE_SQLITE if sqlite_ else _COMPLETE_PG
    for token, ids in by_token.items():
        param = json.dumps(ids) if sqlite_ else ids
        res = conn.execute(stmt, {"ids": param, "token": token, "now": now})
        held.update(r[0] for r in res)
    return held


def _complete_statement(ids_match: Any) -> Any:
    # Grouped by claim token (one per claim batch) so both engines use the primary key
    # index. The ids travel as one parameter (a JSON array on SQLite, an array on
    # PostgreSQL), so the SQL text is the same for every batch size: prepared once, and no
    # per-execution expansion of an IN list.
    return (
        update(jobs)
        .where(ids_match, _fence(bindparam("token")))
        .values(
            status="succeeded",
            finished_at=bindparam("now"),
            updated_at=bindparam("now"),
            **JOB_LEASE.released(keep_token=True),
        )
        .returning(jobs.c.id)
    )


_COMPLETE_SQLITE: Any = _complete_statement(
    jobs.c.id.in_(select(literal_column("value")).select_from(func.json_each(bindparam("ids"))))
)
_COMPLETE_PG: Any = _complete_statement(
    jobs.c.id == func.any(bindparam("ids", type_=ARRAY(BigInteger)))
)


def _start_statement(ids_match: Any) -> Any:
    # Same shape as the completes: one statement per claim token, ids as one parameter.
    return (
        update(jobs)
        .where(ids_match, _fence(bindparam("token")), jobs.c.started_at.is_(None))
        .values(
            attempts=jobs.c.attempts + 1,
            started_at=bindparam("now"),
            heartbeat_at=bindparam("now"),
            lease_expires_at=bindparam("until"),
            updated_at=bindparam("now"),
        )
        .returning(jobs.c.id)
    )


_START_SQLITE: Any = _start_statement(
    jobs.c.id.in_(select(literal_column("value")).select_from(func.json_each(bindparam("ids"))))
)
_START_PG: Any = _start_statement(jobs.c.id == func.any(bindparam("ids", type_=ARRAY(BigInteger))))


def start_many_sync(
    conn: Connection,
    held: Sequence[tuple[int, int]],
    *,
    now: datetime,
    lease: timedelta,
    async_commit: bool = False,
) -> set[int]:
    """Record that the claimed-ahead ``(job id, claim token)`` jobs start now: each
    attempt is charged and the lease runs until ``now + lease``. Returns the ids whose
    claim still held; a job missing from it must not run.

    ``async_commit``: on PostgreSQL the caller's whole transaction then commits without
    waiting for the WAL flush (see ``_PG_START_MANY``).
    """
    if not held:
        return set()
    if async_commit and conn.dialect.name == "postgresql":
        params = {
            "now": now,
            "until": now + lease,
            "ids": [i for i, _ in held],
            "tokens": [t for _, t in held],
        }
        return {int(r[0]) for r in conn.execute(_PG_START_MANY_SA, params)}
    by_token: dict[int, list[int]] = {}
    for job_id, token in held:
        by_token.setdefault(token, []).append(job_id)
    sqlite_ = conn.dialect.name == "sqlite"
    stmt = _START_SQLITE if sqlite_ else _START_PG
    started: set[int] = set()
    for token, ids in by_token.items():
        param = json.dumps(ids) if sqlite_ else ids
        res = conn.execute(stmt, {"ids": param, "token": token, "now": now, "until": now + lease})
        started.update(r[0] for r in res)
    return started


# PostgreSQL: the start marks of a batch of claimed-ahead jobs in one autocommitted
# statement (one round trip, any number of claim tokens), committed asynchronously: the
# set_config in FROM makes this one transaction's commit return without waiting for the
# WAL flush (it is evaluated for the rows it updates; being local, it ends with the
# transaction and never leaks into the pooled connection). A killed worker loses nothing
# by it, since the server has the commit; only a crash of the database server itself
# can lose the last moments' marks, and a lost mark only leaves that one attempt
# uncharged (the job's outcome or its lease rescue still follows).
_PG_START_SQL = (
    "UPDATE jobs SET attempts = jobs.attempts + 1, started_at = {now}, heartbeat_at = {now},"
    " lease_expires_at = {until}, updated_at = {now}"
    " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"
    # Each id with its own claim token (ids are unique in a batch). No status term: a
    # claim token is cleared whenever a job stops running, and only a started job can
    # succeed, so token and NULL started_at already mean "held, running, not started";
    # and with `status = 'running'` the planner took the partial index of running jobs
    # and filtered every one of them instead of using the primary key.
    " WHERE jobs.id = ANY({ids})"
    " AND jobs.claim_token = ({tokens})[array_position({ids}, jobs.id)]"
    " AND jobs.started_at IS NULL RETURNING jobs.id"
)
_PG_START_MANY = _PG_START_SQL.format(
    now="$1", until="$2", ids="$3::bigint[]", tokens="$4::bigint[]"
)
# The same in a transaction of the recorder's (SQLAlchemy), which it makes asynchronous.
_PG_START_MANY_SA: Any = text(
    _PG_START_SQL.format(
        now=":now", until=":until", ids="CAST(:ids AS bigint[])", tokens="CAST(:tokens AS bigint[])"
    )
).bindparams(
    bindparam("now", type_=jobs.c.started_at.type), bindparam("until", type_=jobs.c.started_at.type)
)

# SQLite: the same on a raw sqlite3 connection (see Database.try_inline), one statement
# per claim token, the ids as one JSON parameter.
_SQLITE_START_MANY = (
    "UPDATE jobs SET attempts = attempts + 1, started_at = ?, heartbeat_at = ?,"
    " lease_expires_at = ?, updated_at = ? WHERE id IN (SELECT value FROM json_each(?))"
    " AND claim_token = ? AND status = 'running' AND started_at IS NULL RETURNING id"
)


def _start_many_sqlite(
    conn: Any, held: Sequence[tuple[int, int]], now: datetime, lease: timedelta
) -> set[int]:
    at, until = _SQLITE_TIMESTAMP(now), _SQLITE_TIMESTAMP(now + lease)
    by_token: dict[int, list[int]] = {}
    for job_id, token in held:
        by_token.setdefault(token, []).append(job_id)
    started: set[int] = set()
    for token, ids in by_token.items():
        cur = conn.execute(_SQLITE_START_MANY, (at, at, until, at, json.dumps(ids), token))
        started.update(r[0] for r in cur.fetchall())
    return started


def try_start_inline(
    db: Database, held: Sequence[tuple[int, int]], *, now: datetime, lease: timedelta
) -> set[int] | None:
    """SQLite: :func:`start_many` right now on the caller's thread if the write lock is
    free this instant; None when it is not (or on PostgreSQL): use :func:`start_many`."""
    got = db.try_inline(_start_many_sqlite, held, now, lease)
    return None if isinstance(got, _Busy) else got


async def start_many(
    db: Database, held: Sequence[tuple[int, int]], *, now: datetime, lease: timedelta
) -> set[int]:
    """:func:`start_many_sync` in a transaction of its own, as cheap as the engine allows.

    PostgreSQL: one autocommitted statement whose commit does not wait for the WAL flush
    (durable against the worker's death, not the server's: see ``_PG_START_MANY``).
    SQLite: inline on the caller's thread when the write lock is free this instant, else
    the writer thread. Returns the ids whose claim still held.
    """
    if not held:
        return set()
    if db.is_postgres:
        async with db.raw_pg() as conn:
            rows = await conn.fetch(
                _PG_START_MANY, now, now + lease, [i for i, _ in held], [t for _, t in held]
            )
        return {int(r[0]) for r in rows}
    got = db.try_inline(_start_many_sqlite, held, now, lease)
    if isinstance(got, _Busy):
        return await db.write(lambda c: start_many_sync(c, held, now=now, lease=lease))
    return got


# The worker's commonest transaction: plain successes (no follow-ups, messages or
# breaker to update) and the start marks that wait on them, in one raw transaction. It
# writes what complete_many_sync and start_many_sync write, minus SQLAlchemy's work per
# execution and, on SQLite, the hop to the writer thread (these cost more than the
# statements when jobs are short).
_SQLITE_COMPLETE_MANY = (
    "UPDATE jobs SET status = 'succeeded', finished_at = ?, updated_at = ?, locked_by = NULL,"
    " lease_expires_at = NULL WHERE id IN (SELECT value FROM json_each(?))"
    " AND claim_token = ? AND status = 'running' RETURNING id"
)


def _complete_and_start_sqlite(
    conn: Any,
    done: Sequence[tuple[int, int]],
    held: Sequence[tuple[int, int]],
    now: datetime,
    lease: timedelta,
) -> tuple[set[int], set[int]]:
    at = _SQLITE_TIMESTAMP(now)
    by_token: dict[int, list[int]] = {}
    for job_id, token in done:
        by_token.setdefault(token, []).append(job_id)
    completed: set[int] = set()
    for token, ids in by_token.items():
        cur = conn.execute(_SQLITE_COMPLETE_MANY, (at, at, json.dumps(ids), token))
        completed.update(r[0] for r in cur.fetchall())
    return completed, _start_many_sqlite(conn, held, now, lease) if held else set()


# PostgreSQL: the same as one autocommitted statement (one round trip). Sibling CTEs
# update disjoint rows (a job waiting for its start mark has no outcome yet). With start
# marks, the start CTE's set_config makes the commit asynchronous, as _PG_START_MANY does.
_PG_COMPLETE_AND_START = (
    "WITH done AS (UPDATE jobs SET status = 'succeeded', finished_at = $1, updated_at = $1,"
    " locked_by = NULL, lease_expires_at = NULL"
    " WHERE jobs.id = ANY($3::bigint[])"
    " AND jobs.claim_token = ($4::bigint[])[array_position($3::bigint[], jobs.id)]"
    " AND jobs.status = 'running' RETURNING jobs.id), started AS ("
    + _PG_START_SQL.format(now="$1", until="$2", ids="$5::bigint[]", tokens="$6::bigint[]")
    + ") SELECT true AS done, id FROM done UNION ALL SELECT false, id FROM started"
)


def try_complete_and_start_inline(
    db: Database,
    done: Sequence[tuple[int, int]],
    held: Sequence[tuple[int, int]],
    *,
    now: datetime,
    lease: timedelta,
) -> tuple[set[int], set[int]] | None:
    """SQLite: complete the succeeded ``done`` jobs and start the ``held`` ones in one
    transaction, right now on the caller's thread if the write lock is free this instant;
    None when it is not (or on PostgreSQL). Returns the ids completed and started (those
    whose claim still held)."""
    got = db.try_inline(_complete_and_start_sqlite, done, held, now, lease)
    return None if isinstance(got, _Busy) else got


async def complete_and_start_pg(
    db: Database,
    done: Sequence[tuple[int, int]],
    held: Sequence[tuple[int, int]],
    *,
    now: datetime,
    lease: timedelta,
) -> tuple[set[int], set[int]]:
    """PostgreSQL: :func:`try_complete_and_start_inline` as one autocommitted statement,
    committed asynchronously when it starts jobs (see ``_PG_START_MANY``)."""
    async with db.raw_pg() as conn:
        rows = await conn.fetch(
            _PG_COMPLETE_AND_START,
            now,
            now + lease,
            [i for i, _ in done],
            [t for _, t in done],
            [i for i, _ in held],
            [t for _, t in held],
        )
    completed = {int(r[1]) for r in rows if r[0]}
    return completed, {int(r[1]) for r in rows if not r[0]}


# Gives back the attempt a started job was charged; a job claimed ahead was charged none.
_UNCHARGED: Any = jobs.c.attempts - case((jobs.c.started_at.is_(None), 0), else_=1)


def _append_error(conn: Connection, job_id: int, entry: dict[str, Any]) -> list[dict[str, Any]]:
    current = (conn.execute(select(jobs.c.errors).where(jobs.c.id == job_id))).scalar()
    # Only the newest attempt keeps its traceback: a history of 20 stays a few KiB each.
    history = [
        {k: v for k, v in e.items() if k != "traceback"} if isinstance(e, dict) else e
        for e in list(current or [])
    ]
    last = history[-1] if history and isinstance(history[-1], dict) else {}
    previous = last.get("run", len(history))
    entry["run"] = (previous if isinstance(previous, int) else len(history)) + 1
    history.append(entry)
    return history[-20:]  # a job that failed 10,000 times keeps its recent story


def fail_sync(
    conn: Connection,
    job: ClaimedJob,
    *,
    now: datetime,
    error_class: str,
    message: str,
    retry_at: datetime | None,
    traceback: str | None = None,
    count_attempt: bool = True,
    detail: str | None = None,
    max_attempts: int | None = None,
) -> str | None:
    """Record a failed attempt: back to pending at ``retry_at``, or dead when it is None.

    ``message`` is the one-line reason (``last_error``); the attempt's entry in ``errors``
    also keeps ``detail``, the error's full text, and ``traceback`` (the newest entry
    only), both as given (the caller redacts them). A dead job is written to
    ``dead_letters`` in the same transaction. Returns the new status, or None when the
    claim no longer held (the job was rescued or cancelled).

    Each entry says how this run was counted: ``run`` numbers the job's failed runs,
    ``attempt`` is the attempts counted once it failed (an uncounted run, paced or
    waiting for re-authorisation, repeats the number before it) and ``counted`` whether
    it spent one. ``max_attempts``, the limit the worker gives up by (a handler's own),
    is stored on the row, so that what the console and the CLI show is that limit.
    """
    spent = job.attempts if count_attempt or not job.started else job.attempts - 1
    entry: dict[str, Any] = {
        "attempt": spent,
        "counted": count_attempt,
        "at": now.isoformat(),
        "error_class": error_class,
        "message": message[:2000],
    }
    if max_attempts is not None:
        entry["of"] = max_attempts
    if detail and detail != message:
        entry["detail"] = detail[:4000]
    if traceback:
        entry["traceback"] = traceback[-4000:]
    history = _append_error(conn, job.id, entry)
    status = "pending" if retry_at is not None else "dead"
    values: dict[str, Any] = {
        "status": status,
        "last_error": message[:4000],
        "error_class": error_class,
        "errors": history,
        **JOB_LEASE.released(),
        "updated_at": now,
    }
    if retry_at is not None:
        values["run_at"] = retry_at
    else:
        values["finished_at"] = now
    if not count_attempt:
        values["attempts"] = _UNCHARGED
    if max_attempts is not None:
        values["max_attempts"] = max_attempts
    res = conn.execute(
        update(jobs)
        .where(jobs.c.id == job.id, _fence(job.claim_token))
        .values(**values)
        .returning(jobs.c.id)
    )
    if res.first() is None:
        return None
    if retry_at is not None and job.resource_key is not None:
        lanes.mark_lanes_sync(conn, {job.resource_key: retry_at}, now)
    if status == "dead":
        dead_letter_job_sync(
            conn,
            job_id=job.id,
            kind=job.kind,
            payload=job.payload,
            resource_key=job.resource_key,
            error_class=error_class,
            message=message,
            traceback=traceback,
            trace_id=job.trace_id,
            attempts=job.attempts,
            now=now,
        )
    return status


def dead_letter_job_sync(
    conn: Connection,
    *,
    job_id: int,
    kind: str,
    payload: Any,
    resource_key: str | None,
    error_class: str,
    message: str,
    traceback: str | None,
    trace_id: str | None,
    attempts: int,
    now: datetime,
) -> None:
    """Write a dead job into ``dead_letters`` through the DLQ's capture (one row per job;
    a job that dies again after a replay updates its row, adding to its count and history).
    """
    from synckit.store.dead_letters.capture import (
        capture_sync,  # the DLQ builds on the queue, not the reverse
    )

    tenant = connector = ""
    if isinstance(payload, Mapping):
        tenant = str(payload.get("tenant") or "")
        connector = str(payload.get("connector") or "")
    capture_sync(
        conn,
        tenant=tenant or (resource_key or ""),
        connector=connector,
        kind=kind,
        record_id=f"job:{job_id}",
        payload=payload,
        error_class=error_class,
        message=message,
        traceback=traceback,
        trace_id=trace_id,
        job_id=job_id,
        resource_key=resource_key,
        attempts=max(1, attempts),
        now=now,
        keep_replay_count=True,
    )


class ClaimStore(Protocol):
    """The operation the worker's claim loop takes jobs with: this module is one
    (:func:`claim`); a unit test's in-memory fake is another."""

    async def claim(
        self,
        db: Database,
        worker_id: str,
        limit: int,
        *,
        now: datetime | None = None,
        lease: timedelta = ...,
        start: int | None = None,
        start_lease: timedelta = ...,
        breaker_policy: BreakerPolicy | None = None,
    ) -> list[ClaimedJob]: ...


class OutcomeStore(Protocol):
    """The operations the worker's recorder writes a job's non-success outcome with: this
    module is one; a unit test's in-memory fake is another."""

    def fail_sync(
        self,
        conn: Connection,
        job: ClaimedJob,
        *,
        now: datetime,
        error_class: str,
        message: str,
        retry_at: datetime | None,
        traceback: str | None = None,
        count_attempt: bool = True,
        detail: str | None = None,
        max_attempts: int | None = None,
    ) -> str | None: ...

    def snooze_sync(
        self, conn: Connection, job: ClaimedJob, *, now: datetime, until: datetime
    ) -> bool: ...

    def finish_sync(
        self,
        conn: Connection,
        job: ClaimedJob,
        *,
        now: datetime,
        status: Literal["cancelled", "discarded"],
        reason: str,
    ) -> bool: ...


def snooze_sync(conn: Connection, job: ClaimedJob, *, now: datetime, until: datetime) -> bool:
    """Put the job back to pending until ``until`` without counting the attempt."""
    res = conn.execute(
        update(jobs)
        .where(jobs.c.id == job.id, _fence(job.claim_token))
        .values(
            status="pending",
            run_at=until,
            attempts=_UNCHARGED,
            **JOB_LEASE.released(),
            updated_at=now,
        )
        .returning(jobs.c.id)
    )
    if res.first() is None:
        return False
    if job.resource_key is not None:
        lanes.mark_lanes_sync(conn, {job.resource_key: until}, now)
    return True


def finish_sync(
    conn: Connection,
    job: ClaimedJob,
    *,
    now: datetime,
    status: Literal["cancelled", "discarded"],
    reason: str,
) -> bool:
    """End the job as cancelled or discarded by its handler, with the reason."""
    res = conn.execute(
        update(jobs)
        .where(jobs.c.id == job.id, _fence(job.claim_token))
        .values(
            status=status,
            last_error=reason,
            **JOB_LEASE.released(keep_token=True),
            finished_at=now,
            updated_at=now,
        )
        .returning(jobs.c.id)
    )
    return res.first() is not None


# Async forms of the outcome operations, for callers holding an AsyncConnection. The
# worker records outcomes with the synchronous forms in one hop (Database.write).


async def complete_many(
    conn: AsyncConnection, done: Sequence[tuple[int, int]], *, now: datetime
) -> set[int]:
    """Mark ``(job id, claim token)`` pairs succeeded; return the ids whose claim still held."""
    return await conn.run_sync(lambda c: complete_many_sync(c, done, now=now))


async def fail(conn: AsyncConnection, job: ClaimedJob, **kw: Any) -> str | None:
    """See :func:`fail_sync`."""
    return await conn.run_sync(lambda c: fail_sync(c, job, **kw))


async def dead_letter_job(conn: AsyncConnection, **kw: Any) -> None:
    """See :func:`dead_letter_job_sync`."""
    await conn.run_sync(lambda c: dead_letter_job_sync(c, **kw))


async def snooze(conn: AsyncConnection, job: ClaimedJob, *, now: datetime, until: datetime) -> bool:
    """See :func:`snooze_sync`."""
    return await conn.run_sync(lambda c: snooze_sync(c, job, now=now, until=until))


async def finish(
    conn: AsyncConnection,
    job: ClaimedJob,
    *,
    now: datetime,
    status: Literal["cancelled", "discarded"],
    reason: str,
) -> bool:
    """See :func:`finish_sync`."""
    return await conn.run_sync(lambda c: finish_sync(c, job, now=now, status=status, reason=reason))


# ``(job id, claim token)`` pairs as two arrays (PostgreSQL: each id with its own token,
# ids being unique) or one JSON text of pairs (SQLite): two parameters for any number.
_HELD: dict[str, Any] = {
    "postgresql": text(
        "jobs.id = ANY(CAST(:ids AS bigint[])) AND jobs.claim_token ="
        " (CAST(:tokens AS bigint[]))[array_position(CAST(:ids AS bigint[]), jobs.id)]"
    ),
    "sqlite": text(
        "(jobs.id, jobs.claim_token) IN (SELECT json_extract(value, '$[0]'),"
        " json_extract(value, '$[1]') FROM json_each(:held))"
    ),
}


def _held_params(dialect: str, held: Sequence[tuple[int, int]]) -> dict[str, Any]:
    if dialect == "postgresql":
        return {"ids": [i for i, _ in held], "tokens": [t for _, t in held]}
    return {"held": json.dumps([[i, t] for i, t in held])}


async def release(
    db: Database, held: Sequence[tuple[int, int]], *, now: datetime | None = None
) -> int:
    """Give claimed jobs back (shutdown): pending again, the attempt not counted."""
    if not held:
        return 0
    now = now or utcnow()
    async with db.begin() as conn:
        dialect = conn.dialect.name
        res = await conn.execute(
            update(jobs)
            .where(_HELD[dialect], jobs.c.status == _RUNNING)
            .values(
                status="pending",
                attempts=_UNCHARGED,
                **JOB_LEASE.released(),
                updated_at=now,
            )
            .returning(jobs.c.id, jobs.c.resource_key),
            _held_params(dialect, held),
        )
        released = list(res)
        await lanes.clear_probes(conn, released, now)
        await conn.run_sync(lanes.mark_lanes_of_sync, [r.id for r in released], now)
    return len(released)


async def heartbeat(
    db: Database,
    worker_id: str,
    held: Sequence[tuple[int, int]],
    *,
    lease: timedelta,
    now: datetime | None = None,
    start_lease: timedelta | None = None,
) -> set[int]:
    """Extend the leases of the jobs this worker still holds; return the ids it still holds.

    Started jobs get ``lease``; jobs claimed ahead and not started get ``start_lease``
    (default: ``lease``), so that a crash gives them to other workers soon.
    A job missing from the result was rescued or cancelled: its handler should stop.
    On PostgreSQL a job whose row another transaction holds right now is not waited
    for: it counts as held and its lease is extended at the next beat.
    """
    if not held:
        return set()
    now = now or utcnow()
    async with db.begin() as conn:
        dialect = conn.dialect.name
        busy: set[int] = set()
        if dialect == "postgresql":
            # Only the rows no other transaction holds. The worker's own page commits,
            # start marks and completions lock some of these rows while they write; an
            # UPDATE of them all, in whatever order the plan visits them, waited on one
            # while holding another that such a transaction wanted next: 'deadlock
            # detected' (each one a second of both transactions' time, some every few
            # seconds under load). A job whose row is held is still this worker's as far
            # as anyone can tell: its lease is extended at the next beat.
            ids = [i for i, _ in held]
            free = {int(r[0]) for r in await conn.execute(_PG_LOCK_FREE, {"ids": ids})}
            busy = set(ids) - free
            held = [(i, t) for i, t in held if i in free]
            if not held:
                return busy
        res = await conn.execute(
            update(jobs)
            .where(_HELD[dialect], jobs.c.status == _RUNNING, jobs.c.locked_by == worker_id)
            .values(
                heartbeat_at=now,
                lease_expires_at=case(
                    (jobs.c.started_at.is_(None), now + (start_lease or lease)), else_=now + lease
                ),
            )
            .returning(jobs.c.id),
            _held_params(dialect, held),
        )
        return {r[0] for r in res} | busy


_PG_LOCK_FREE: Any = text(
    "SELECT id FROM jobs WHERE id = ANY(CAST(:ids AS bigint[])) FOR UPDATE SKIP LOCKED"
)


async def rescue_expired(
    db: Database,
    *,
    now: datetime | None = None,
    limit: int = 500,
    max_attempts_by_kind: Mapping[str, int] | None = None,
) -> int:
    """Return jobs whose lease expired to pending (their attempt stays counted).

    A job that has used all its attempts ends dead instead (it keeps killing workers) and
    is dead-lettered in the same transaction. A job claimed ahead that never started was
    charged nothing: it goes back to pending as it was, never dead. ``max_attempts_by_kind``
    overrides the row's limit for those kinds, as a handler registered with
    ``max_attempts`` does for ordinary failures.
    """
    now = now or utcnow()
    limit_of: Any = jobs.c.max_attempts
    if max_attempts_by_kind:
        limit_of = case(
            {k: int(v) for k, v in max_attempts_by_kind.items()},
            value=jobs.c.kind,
            else_=jobs.c.max_attempts,
        )
    async with db.begin() as conn:
        expired = (
            select(jobs.c.id)
            .where(jobs.c.status == _RUNNING, leases.ended(jobs, now, JOB_LEASE))
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        message = "lease expired: the worker stopped heart-beating (crashed or hung)"
        unstarted = jobs.c.started_at.is_(None)
        dies = and_(~unstarted, jobs.c.attempts >= limit_of)
        res = await conn.execute(
            update(jobs)
            .where(jobs.c.id.in_(expired.scalar_subquery()))
            .values(
                status=case((dies, "dead"), else_="pending"),
                finished_at=case((dies, now), else_=None),
                run_at=case((unstarted, jobs.c.run_at), else_=now),
                **JOB_LEASE.released(),
                last_error=case((unstarted, jobs.c.last_error), else_=message),
                error_class=case((unstarted, jobs.c.error_class), else_="transient"),
                max_attempts=limit_of,  # the limit it was held to, shown as it
                updated_at=now,
            )
            .returning(
                jobs.c.id,
                jobs.c.status,
                jobs.c.kind,
                jobs.c.payload,
                jobs.c.resource_key,
                jobs.c.trace_id,
                jobs.c.attempts,
            )
        )
        rescued = list(res)
        for r in rescued:
            if r.status == "dead":
                await dead_letter_job(
                    conn,
                    job_id=r.id,
                    kind=r.kind,
                    payload=r.payload,
                    resource_key=r.resource_key,
                    error_class="transient",
                    message=message,
                    traceback=None,
                    trace_id=r.trace_id,
                    attempts=r.attempts,
                    now=now,
                )
        await lanes.clear_probes(conn, rescued, now)
        await conn.run_sync(lanes.mark_lanes_of_sync, [r.id for r in rescued], now)
    return len(rescued)


async def prune(
    db: Database,
    *,
    older_than: timedelta = timedelta(days=7),
    batch: int = 5000,
    now: datetime | None = None,
) -> int:
    """Delete finished jobs older than ``older_than``, in batches of ``batch``; return count."""
    now = now or utcnow()
    cutoff = now - older_than
    total = 0
    while True:
        async with db.begin() as conn:
            victims = (
                select(jobs.c.id)
                .where(jobs.c.finished_at < cutoff, jobs.c.status.in_(FINISHED))
                .limit(batch)
            )
            res = await conn.execute(delete(jobs).where(jobs.c.id.in_(victims.scalar_subquery())))
            n = res.rowcount or 0
        total += n
        if n < batch:
            return total


# --- working with jobs ----------------------------------------------------------------


@dataclass(frozen=True)
class JobInfo:
    """One job as the operator sees it. A value a corrupt row holds (a payload or error
    history that is not JSON, a timestamp no datetime holds) reads as None (``[]`` for
    ``errors``) and ``unreadable`` names it with the reason, so one row never fails a
    listing."""

    id: int
    kind: str
    status: str
    resource_key: str | None
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime | None
    created_at: datetime | None
    updated_at: datetime | None
    finished_at: datetime | None
    unique_key: str | None
    locked_by: str | None
    last_error: str | None
    error_class: str | None
    trace_id: str | None
    payload: Any = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_row(cls, r: Row[Any], *, full: bool) -> JobInfo:
        m = r._mapping
        bad: dict[str, str] = {}
        moments: dict[str, datetime | None] = {}
        for name in ("run_at", "created_at", "updated_at", "finished_at"):
            try:
                moments[name] = read_moment(m[name])
            except ValueError as exc:
                moments[name], bad[name] = None, str(exc)
        payload: Any = None
        errors: list[dict[str, Any]] = []
        if full:
            try:
                payload = read_payload(m["payload"])
            except ValueError as exc:
                bad["payload"] = str(exc)
            try:
                history = read_payload(m["errors"])
                errors = list(history) if isinstance(history, list) else []
            except ValueError as exc:
                bad["errors"] = str(exc)
        return cls(
            id=r.id,
            kind=r.kind,
            status=r.status,
            resource_key=r.resource_key,
            priority=r.priority,
            attempts=r.attempts,
            max_attempts=r.max_attempts,
            unique_key=r.unique_key,
            locked_by=r.locked_by,
            last_error=r.last_error,
            error_class=r.error_class,
            trace_id=r.trace_id,
            payload=payload,
            errors=errors,
            unreadable=bad,
            **moments,
        )


# ``jobs`` as the operator's views read it: JSON as text and timestamps guarded, parsed
# per row (:meth:`JobInfo.from_row`), so that one corrupt row cannot fail the listing.
_INFO: Any = select(*guarded_columns(jobs.c, as_text=("payload", "errors")))


async def list_jobs(
    db: Database,
    *,
    status: str | None = None,
    kind: str | None = None,
    resource_key: str | None = None,
    created_since: datetime | None = None,
    updated_since: datetime | None = None,
    limit: int = 100,
    before: int | None = None,
) -> list[JobInfo]:
    """Jobs matching every filter given, newest first; ``before``: only ids below it
    (the keyset of the next page: the last id of this one)."""
    stmt = _INFO.order_by(jobs.c.id.desc()).limit(limit)
    if before is not None:
        stmt = stmt.where(jobs.c.id < before)
    if status:
        stmt = stmt.where(jobs.c.status == status)
    if kind:
        stmt = stmt.where(jobs.c.kind == kind)
    if resource_key:
        stmt = stmt.where(jobs.c.resource_key == resource_key)
    if created_since:
        stmt = stmt.where(jobs.c.created_at >= created_since)
    if updated_since:
        stmt = stmt.where(jobs.c.updated_at >= updated_since)
    async with db.read() as conn:
        return [JobInfo.from_row(r, full=False) for r in await conn.execute(stmt)]


async def get_job(db: Database, job_id: int) -> JobInfo:
    """One job with its payload and error history; :class:`JobNotFound` if absent."""
    async with db.read() as conn:
        row = (await conn.execute(_INFO.where(jobs.c.id == job_id))).first()
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    return JobInfo.from_row(row, full=True)


async def _change(
    db: Database, job_id: int, action: str, values: dict[str, Any], *, allow_running: bool = False
) -> JobInfo:
    now = utcnow()
    values = {**values, "updated_at": now}
    async with db.begin() as conn:
        row = (
            await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id).with_for_update())
        ).first()
        if row is None:
            raise JobNotFound(f"no job with id {job_id}")
        if row.status == "running" and not allow_running:
            raise JobStateError(f"job {job_id} is running; cannot {action} it until it stops")
        try:
            await conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
        except IntegrityError as exc:
            raise JobStateError(
                f"cannot {action} job {job_id}: another unfinished job has its unique key"
            ) from exc
        if "run_at" in values:  # pending now (retry), or its time moved (reschedule)
            await conn.run_sync(lanes.mark_lanes_of_sync, [job_id], now)
    return await get_job(db, job_id)


async def cancel_job(db: Database, job_id: int, reason: str = "cancelled by operator") -> JobInfo:
    """Cancel a job; a running job's handler is told to stop at its next heartbeat."""
    info = await get_job(db, job_id)
    if info.status in FINISHED:
        raise JobStateError(f"job {job_id} already ended ({info.status})")
    return await _change(
        db,
        job_id,
        "cancel",
        {
            "status": "cancelled",
            "last_error": reason,
            "finished_at": utcnow(),
            **JOB_LEASE.released(),
        },
        allow_running=True,
    )


async def unfinished_with_key(db: Database, unique_key: str) -> JobInfo | None:
    """The pending or running job holding ``unique_key`` (at most one exists), or None."""
    stmt = _INFO.where(jobs.c.unique_key == unique_key, jobs.c.status.in_(["pending", "running"]))
    async with db.read() as conn:
        row = (await conn.execute(stmt.limit(1))).first()
    return JobInfo.from_row(row, full=False) if row is not None else None


async def retry_job(db: Database, job_id: int) -> JobInfo:
    """Run the job again now; an ended job starts over with fresh attempts."""
    info = await get_job(db, job_id)
    values: dict[str, Any] = {"status": "pending", "run_at": utcnow(), "finished_at": None}
    if info.status in FINISHED:
        values["attempts"] = 0
    if (parent := current_traceparent()) is not None:
        # Re-run inside a span (a DLQ replay, `synckit jobs retry` traced): its new run
        # continues that trace.
        values["trace_parent"] = parent
    return await _change(db, job_id, "retry", values)


async def reschedule_job(db: Database, job_id: int, run_at: datetime) -> JobInfo:
    """Move a job's next run to ``run_at``."""
    info = await get_job(db, job_id)
    if info.status in FINISHED:
        raise JobStateError(f"job {job_id} already ended ({info.status}); use retry")
    return await _change(db, job_id, "reschedule", {"run_at": run_at})


async def set_priority(db: Database, job_id: int, priority: int) -> JobInfo:
    """Change a job's priority (higher runs first)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise JobError(f"job {job_id}: priority must be a whole number")
    if not INT32[0] <= priority <= INT32[1]:
        raise JobError(
            f"job {job_id}: priority must be a whole number from {INT32[0]} to {INT32[1]}"
        )
    return await _change(db, job_id, "change the priority of", {"priority": priority})


async def replace_payload(db: Database, job_id: int, payload: Any) -> JobInfo:
    """Replace a job's payload (for example, to fix the data that made it fail)."""
    info = await get_job(db, job_id)
    _check_payload(info.kind, payload)
    return await _change(db, job_id, "replace the payload of", {"payload": payload})


async def count_by_status(db: Database) -> dict[str, int]:
    async with db.read() as conn:
        rows = await conn.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status))
        return {s: c for s, c in rows}


# --- pending jobs whose run_at cannot be read (synckit.runtime.unreadable_jobs) ---------

#: How much of a stored value a report quotes.
_QUOTED = 60


@dataclass(frozen=True)
class StuckJob:
    """A pending job whose ``run_at`` cannot be read, with the stored value as text."""

    id: int
    kind: str
    resource_key: str | None
    stored: str

    @property
    def reason(self) -> str:
        return f"run_at cannot be read: {self.stored[:_QUOTED]!r}"


# The guard's marker as SQL: a CASE that gives it back is a value out of range. A typed
# literal compares as time on PostgreSQL and as text on SQLite, as the guard's own does.
_MARKER: ColumnElement[Any] = literal_column(f"'{OUT_OF_RANGE.isoformat(sep=' ')}'")


def _unreadable(lane_keyed: bool) -> Any:
    """The predicate of one partial index of pending jobs (spelt as the index is, so a
    planner uses it) and a ``run_at`` the guard marks out of range."""
    lane = jobs.c.resource_key.is_not(None) if lane_keyed else jobs.c.resource_key.is_(None)
    # 'pending' as a literal: a bound parameter does not imply an index's predicate.
    pending = jobs.c.status == literal_column("'pending'")
    return (pending, lane, guarded_moment(jobs.c.run_at) == _MARKER)


def _stuck(lane_keyed: bool) -> Any:
    return select(
        jobs.c.id,
        jobs.c.kind,
        jobs.c.resource_key,
        cast(jobs.c.run_at, Text).label("stored"),
    ).where(*_unreadable(lane_keyed))


async def unreadable_run_at(conn: AsyncConnection, *, limit: int = 100) -> list[StuckJob]:
    """Up to ``limit`` pending jobs whose ``run_at`` cannot be read, by id."""
    found: list[StuckJob] = []
    for keyed in (False, True):
        # No ORDER BY in SQL: SQLite would walk the whole table in id order for it
        # instead of the partial index; there are few such jobs to sort here.
        rows = await conn.execute(_stuck(keyed).limit(limit))
        found += (StuckJob(int(r.id), r.kind, r.resource_key, str(r.stored)[:200]) for r in rows)
    return sorted(found, key=lambda j: j.id)[:limit]


async def count_unreadable_run_at(conn: AsyncConnection) -> int:
    """How many pending jobs have a ``run_at`` that cannot be read."""
    total = 0
    for keyed in (False, True):
        stmt = select(func.count()).select_from(jobs).where(*_unreadable(keyed))
        total += int((await conn.execute(stmt)).scalar_one())
    return total


# --- the operator's pages of jobs (the console) -------------------------------------------
# Keyset pages served by an index whatever the filter (see synckit.store.pages); the
# console reads jobs through these, `synckit jobs list` through list_jobs above.

JOB_STATUSES: tuple[JobStatus, ...] = (
    "pending",
    "running",
    "succeeded",
    "dead",
    "cancelled",
    "discarded",
)
#: The predicate of ``ix_jobs_finished_by_resource`` (migration 0009), spelt as the index
#: spells it: SQLite uses a partial index only for a query that states its predicate.
_FINISHED_BY_RESOURCE = (
    "status IN ('succeeded', 'dead', 'cancelled', 'discarded') AND resource_key IS NOT NULL"
)
#: The same for the partial indexes of unfinished jobs by resource (tables.py). Literals,
#: not parameters: PostgreSQL's generic plan for a parameter cannot use a partial index.
_UNFINISHED_BY_RESOURCE = {
    "pending": "status = 'pending' AND resource_key IS NOT NULL",
    "running": "status = 'running'",
}


async def job_kinds(conn: AsyncConnection, *, limit: int = 1000) -> list[str]:
    """The kinds of jobs in the table, by a loose index scan of ``ix_jobs_kind_status``:
    one index probe per kind, however many jobs each has."""
    rows = await conn.execute(
        text(
            "WITH RECURSIVE k(kind) AS ("
            " SELECT (SELECT min(kind) FROM jobs)"
            " UNION ALL"
            " SELECT (SELECT min(kind) FROM jobs WHERE kind > k.kind) FROM k"
            " WHERE k.kind IS NOT NULL"
            ") SELECT kind FROM k WHERE kind IS NOT NULL LIMIT :limit"
        ),
        {"limit": limit},
    )
    return [str(k) for (k,) in rows]


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a listing shows; ``hidden_kinds`` are left out unless ``kind`` names
    one (the console hides the runtime's own housekeeping jobs by default)."""

    kind: str | None = None
    status: str | None = None
    resource_key: str | None = None
    created_since: datetime | None = None
    created_until: datetime | None = None
    hidden_kinds: tuple[str, ...] = ()

    @property
    def hides(self) -> tuple[str, ...]:
        return () if self.kind else self.hidden_kinds


def _job_where(flt: JobFilter, kind: Any = jobs.c.kind) -> list[Any]:
    c = jobs.c
    where: list[Any] = []
    if flt.kind:
        where.append(kind == flt.kind)
    if flt.hides:
        where.append(kind.not_in(flt.hides))
    if flt.status:
        where.append(c.status == flt.status)
    if flt.resource_key:
        where.append(c.resource_key == flt.resource_key)
    if flt.created_since:
        where.append(c.created_at >= flt.created_since)
    if flt.created_until:
        where.append(c.created_at < flt.created_until)
    return where


def _job_select(
    flt: JobFilter,
    before_id: int | None,
    floor: int | None,
    size: int,
    *extra: Any,
    kind: Any = jobs.c.kind,
) -> Any:
    c = jobs.c
    stmt = _INFO.where(*extra, *_job_where(flt, kind)).order_by(c.id.desc()).limit(size + 1)
    if before_id is not None:
        stmt = stmt.where(c.id < before_id)
    if floor is not None:
        stmt = stmt.where(c.id >= floor)
    return stmt


async def _parts(conn: AsyncConnection, flt: JobFilter) -> list[list[Any]]:
    """The ways in: one statement's extra conditions per index that serves ``flt``.

    * a tenant's (resource's) jobs: its pending, running and finished jobs, each under
      the partial predicate of its index, which a query must state;
    * on SQLite, a state without a kind, or a kind without a state: ``(kind, status)``
      pair by pair (the kinds found by :func:`job_kinds`), each walked newest first.
      Without statistics SQLite would sort every job of a kind, or read the whole table
      for a rare state. PostgreSQL plans the one statement from its statistics (a walk
      back from the newest id, or ``(kind, status)`` read by its second column for a rare
      state), which measured faster than the pairs there;
    * anything else: one statement.
    """
    if flt.resource_key:
        wanted = [flt.status] if flt.status else list(JOB_STATUSES)
        parts: list[list[Any]] = [
            [text(_UNFINISHED_BY_RESOURCE[s])] for s in ("pending", "running") if s in wanted
        ]
        if any(s in FINISHED for s in wanted):
            parts.append([text(_FINISHED_BY_RESOURCE)])
        return parts
    if conn.dialect.name == "sqlite" and not flt.kind and (flt.status or flt.hides):
        # Hidden kinds too: the other kinds pair by pair, each walked newest first.
        kinds = [k for k in await job_kinds(conn) if k not in flt.hides]
        statuses = [flt.status] if flt.status else list(JOB_STATUSES)
        return [[jobs.c.kind == k, jobs.c.status == s] for k in kinds for s in statuses]
    if conn.dialect.name == "sqlite" and flt.kind and not flt.status:
        return [[jobs.c.status == s] for s in JOB_STATUSES]
    return [[]]


async def _rows(
    conn: AsyncConnection, flt: JobFilter, before_id: int | None, floor: int | None, size: int
) -> list[Any]:
    """The newest ``size + 1`` rows matching ``flt`` below ``before_id`` (and from
    ``floor``), each part read through its index and the parts merged."""
    # A tenant's jobs are reached by resource: a kind given too must not lead SQLite
    # to (kind, status) and every pending job of that kind.
    kind = off_index(conn, jobs.c.kind) if flt.resource_key else jobs.c.kind
    found: list[Any] = []
    for extra in await _parts(conn, flt):
        stmt = _job_select(flt, before_id, floor, size, *extra, kind=kind)
        found += list(await conn.execute(stmt))
    found.sort(key=lambda r: -int(r.id))
    return found[: size + 1]


async def job_page(
    db: Database, flt: JobFilter, *, before_id: int | None = None, limit: int = 50
) -> Page[JobInfo]:
    """Jobs matching ``flt``, newest first, with ids below ``before_id``.

    Each filter is served by an index: kind and state by ``(kind, status)``, a tenant's
    jobs by the indexes of its pending, running and finished jobs (see :func:`_parts`).
    Creation time has none: a page filtered by it reads at most :data:`SCAN_WINDOW` jobs
    below the cursor, and when that ends the page before it is full, ``searched`` says
    which ids were read and the next page goes on below them.
    """
    size = page_size(limit)
    async with db.read() as conn:
        floor, top = None, 0
        if flt.created_since or flt.created_until:
            floor, top = await scan_window(conn, jobs, before_id)
        raw = await _rows(conn, flt, before_id, floor, size)
    rows = [JobInfo.from_row(r, full=False) for r in raw]
    return paged(rows, size, lambda j: j.id, floor, top)


async def count_jobs(db: Database, flt: JobFilter, *, cap: int = COUNT_CAP) -> Count | None:
    """How many jobs match ``flt``, read through the indexes :func:`job_page` uses and no
    further than ``cap`` rows (see :class:`~synckit.store.pages.Count`); None for a
    creation-time filter, which no index serves (counting it could read every job)."""
    if flt.created_since or flt.created_until:
        return None
    async with db.read() as conn:
        kind = off_index(conn, jobs.c.kind) if flt.resource_key else jobs.c.kind
        total = Count(0)
        for extra in await _parts(conn, flt):
            if total.more:
                break
            total += await bounded(conn, jobs, *extra, *_job_where(flt, kind), cap=cap - total.n)
    return Count(min(total.n, cap), total.more or total.n > cap)


async def poll_jobs(
    db: Database, resource_key: str, tenant: str, *, kind: str, limit: int = 10
) -> list[JobInfo]:
    """The tenant's most recent poll cycles (its resource's jobs of ``kind``, the poll
    kind, whose unique key names the tenant), through the indexes of the resource's jobs."""
    flt = JobFilter(kind=kind, resource_key=resource_key)
    mine = jobs.c.unique_key.startswith(f"poll:{tenant}:", autoescape=True)
    async with db.read() as conn:
        found: list[Any] = []
        kind_column = off_index(conn, jobs.c.kind)
        for extra in await _parts(conn, flt):
            stmt = _job_select(flt, None, None, limit - 1, *extra, mine, kind=kind_column)
            found += list(await conn.execute(stmt))
    found.sort(key=lambda r: -int(r.id))
    return [JobInfo.from_row(r, full=True) for r in found[:limit]]


async def running_counts(db: Database, resource_keys: Sequence[str]) -> dict[str, int]:
    """Running jobs per resource key (the in-flight count a limit applies to)."""
    if not resource_keys:
        return {}
    c = jobs.c
    async with db.read() as conn:
        rows = await conn.execute(
            select(c.resource_key, func.count())
            .where(
                text(_UNFINISHED_BY_RESOURCE["running"]), c.resource_key.in_(list(resource_keys))
            )
            .group_by(c.resource_key)
        )
        return {k: int(n) for k, n in rows}


__all__ = [
    "FINISHED",
    "JOB_STATUSES",
    "NOTIFY_CHANNEL",
    "START_LEASE",
    "ClaimedJob",
    "Enqueued",
    "JobFilter",
    "JobInfo",
    "JobSpec",
    "StuckJob",
    "cancel_job",
    "claim",
    "count_jobs",
    "count_unreadable_run_at",
    "enqueue",
    "enqueue_many",
    "enqueue_new",
    "enqueue_new_sync",
    "get_job",
    "job_kinds",
    "job_page",
    "list_jobs",
    "poll_jobs",
    "prune",
    "replace_payload",
    "reschedule_job",
    "rescue_expired",
    "retry_job",
    "running_counts",
    "set_priority",
    "start_many",
    "start_many_sync",
    "unfinished_with_key",
    "unreadable_run_at",
]
