"""Enqueueing jobs: one, many, or only those whose unique key names no unfinished job,
and the in-process wake-ups that follow a commit."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy import bindparam, insert, select, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.clock import utcnow
from synckit.errors.exceptions import JobError
from synckit.store import notify
from synckit.store import resources as lanes
from synckit.store.db import Database
from synckit.store.jobs._base import DEFAULT_MAX_ATTEMPTS, INT32, SQLITE_TIMESTAMP, check_payload
from synckit.store.notify import NOTIFY_CHANNEL
from synckit.store.sqlite_writer import Busy
from synckit.store.tables import dialect_insert, jobs

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
from synckit.tracing import current_traceparent, trace_id_of

#: The text columns a spec fills, with the longest value each holds (``tables.jobs``).
_TEXT_LIMITS = (
    ("kind", 200),
    ("resource_key", 200),
    ("unique_key", 300),
    ("trace_id", 64),
    ("trace_parent", 64),
)


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
        payload_json = check_payload(self.kind, self.payload)
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
    params = _arrays(rows, payloads, _ARRAY_COLUMNS, now)
    return sorted(r[0] for r in conn.execute(_PG_INSERT_MANY, params))


#: The columns a batch of rows travels as, one array each (PostgreSQL), besides the
#: payloads (as JSON text) and ``now``.
_ARRAY_COLUMNS = (
    "kind",
    "resource_key",
    "priority",
    "max_attempts",
    "run_at",
    "trace_id",
    "trace_parent",
)


def _arrays(
    rows: Sequence[Mapping[str, Any]], payloads: list[str], columns: Sequence[str], now: datetime
) -> dict[str, Any]:
    """PostgreSQL: the parameters of a batch statement, one array per column."""
    params: dict[str, Any] = {name: [r[name] for r in rows] for name in columns}
    params["payload"] = payloads
    params["now"] = now
    return params


def _packed(rows: Sequence[Mapping[str, Any]], payloads: list[str], *, keyed: bool) -> str:
    """SQLite: a batch of rows as one JSON array of arrays, in the order the statements'
    ``json_extract`` reads them (``unique_key`` after ``run_at`` when ``keyed``)."""
    return json.dumps(
        [
            [
                r["kind"],
                p,
                r["resource_key"],
                r["priority"],
                r["max_attempts"],
                _SQLITE_TS_TEXT(r["run_at"]),
                *((r["unique_key"],) if keyed else ()),
                r["trace_id"],
                r["trace_parent"],
            ]
            for r, p in zip(rows, payloads, strict=True)
        ]
    )


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
    packed = _packed(rows, payloads, keyed=False)
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
                SQLITE_TIMESTAMP(row["created_at"]),
                SQLITE_TIMESTAMP(row["run_at"]),
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
            if not isinstance(new_id, Busy):
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
    jobs_ = [r for r, _ in rows]
    payloads = [p for _, p in rows]
    if conn.dialect.name == "postgresql":
        params = _arrays(jobs_, payloads, (*_ARRAY_COLUMNS, "unique_key"), now)
        created = [r[0] for r in conn.execute(_PG_ENQUEUE_NEW, params)]
        if created:
            conn.exec_driver_sql(f"NOTIFY {NOTIFY_CHANNEL}")
        return created
    packed = _packed(jobs_, payloads, keyed=True)
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


__all__ = [
    "Enqueued",
    "JobSpec",
    "enqueue",
    "enqueue_many",
    "enqueue_new",
    "enqueue_new_sync",
    "register_waker",
    "target_wake",
    "unregister_waker",
]
