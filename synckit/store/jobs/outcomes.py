"""A claimed job's outcomes: its start (the attempt charged), success, failure and
retry, snooze, and an end by its handler (cancelled, discarded), each fenced on the
claim's token."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from sqlalchemy import ARRAY, BigInteger, bindparam, func, literal_column, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.store import resources as lanes
from synckit.store.db import Database
from synckit.store.jobs._base import JOB_LEASE, SQLITE_TIMESTAMP, UNCHARGED, ClaimedJob, fence
from synckit.store.sqlite_writer import Busy
from synckit.store.tables import jobs


def _by_token(pairs: Sequence[tuple[int, int]]) -> dict[int, list[int]]:
    """``(job id, claim token)`` pairs grouped by token: one statement per claim batch,
    its ids as one parameter, so both engines use the primary key."""
    by_token: dict[int, list[int]] = {}
    for job_id, token in pairs:
        by_token.setdefault(token, []).append(job_id)
    return by_token


def complete_many_sync(
    conn: Connection,
    done: Sequence[tuple[int, int]],
    *,
    now: datetime,
) -> set[int]:
    """Mark ``(job id, claim token)`` pairs succeeded; return the ids whose claim still held."""
    if not done:
        return set()
    by_token = _by_token(done)
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
        .where(ids_match, fence(bindparam("token")))
        .values(
            status="succeeded",
            finished_at=bindparam("now"),
            updated_at=bindparam("now"),
            **JOB_LEASE.released(keep_token=True),
        )
        .returning(jobs.c.id)
    )


# The batch's ids as one parameter: a JSON array on SQLite, an array on PostgreSQL.
_IDS_SQLITE: Any = jobs.c.id.in_(
    select(literal_column("value")).select_from(func.json_each(bindparam("ids")))
)
_IDS_PG: Any = jobs.c.id == func.any(bindparam("ids", type_=ARRAY(BigInteger)))
_COMPLETE_SQLITE: Any = _complete_statement(_IDS_SQLITE)
_COMPLETE_PG: Any = _complete_statement(_IDS_PG)


def _start_statement(ids_match: Any) -> Any:
    # Same shape as the completes: one statement per claim token, ids as one parameter.
    return (
        update(jobs)
        .where(ids_match, fence(bindparam("token")), jobs.c.started_at.is_(None))
        .values(
            attempts=jobs.c.attempts + 1,
            started_at=bindparam("now"),
            heartbeat_at=bindparam("now"),
            lease_expires_at=bindparam("until"),
            updated_at=bindparam("now"),
        )
        .returning(jobs.c.id)
    )


_START_SQLITE: Any = _start_statement(_IDS_SQLITE)
_START_PG: Any = _start_statement(_IDS_PG)


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
    by_token = _by_token(held)
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
    f" {JOB_LEASE.expires_at} = {{until}}, updated_at = {{now}}"
    " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"
    # Each id with its own claim token (ids are unique in a batch). No status term: a
    # claim token is cleared whenever a job stops running, and only a started job can
    # succeed, so token and NULL started_at already mean "held, running, not started";
    # and with `status = 'running'` the planner took the partial index of running jobs
    # and filtered every one of them instead of using the primary key.
    " WHERE jobs.id = ANY({ids})"
    f" AND jobs.{JOB_LEASE.token} = ({{tokens}})[array_position({{ids}}, jobs.id)]"
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
    f" {JOB_LEASE.expires_at} = ?, updated_at = ? WHERE id IN (SELECT value FROM json_each(?))"
    f" AND {JOB_LEASE.token} = ? AND status = 'running' AND started_at IS NULL RETURNING id"
)


def _start_many_sqlite(
    conn: Any, held: Sequence[tuple[int, int]], now: datetime, lease: timedelta
) -> set[int]:
    at, until = SQLITE_TIMESTAMP(now), SQLITE_TIMESTAMP(now + lease)
    by_token = _by_token(held)
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
    return None if isinstance(got, Busy) else got


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
    if isinstance(got, Busy):
        return await db.write(lambda c: start_many_sync(c, held, now=now, lease=lease))
    return got


# The worker's commonest transaction: plain successes (no follow-ups, messages or
# breaker to update) and the start marks that wait on them, in one raw transaction. It
# writes what complete_many_sync and start_many_sync write, minus SQLAlchemy's work per
# execution and, on SQLite, the hop to the writer thread (these cost more than the
# statements when jobs are short).
_SQLITE_COMPLETE_MANY = (
    "UPDATE jobs SET status = 'succeeded', finished_at = ?, updated_at = ?, "
    + JOB_LEASE.released_sql(keep_token=True)
    + " WHERE id IN (SELECT value FROM json_each(?))"
    f" AND {JOB_LEASE.token} = ? AND status = 'running' RETURNING id"
)


def _complete_and_start_sqlite(
    conn: Any,
    done: Sequence[tuple[int, int]],
    held: Sequence[tuple[int, int]],
    now: datetime,
    lease: timedelta,
) -> tuple[set[int], set[int]]:
    at = SQLITE_TIMESTAMP(now)
    by_token = _by_token(done)
    completed: set[int] = set()
    for token, ids in by_token.items():
        cur = conn.execute(_SQLITE_COMPLETE_MANY, (at, at, json.dumps(ids), token))
        completed.update(r[0] for r in cur.fetchall())
    return completed, _start_many_sqlite(conn, held, now, lease) if held else set()


# PostgreSQL: the same as one autocommitted statement (one round trip). Sibling CTEs
# update disjoint rows (a job waiting for its start mark has no outcome yet). With start
# marks, the start CTE's set_config makes the commit asynchronous, as _PG_START_MANY does.
_PG_COMPLETE_AND_START = (
    "WITH done AS (UPDATE jobs SET status = 'succeeded', finished_at = $1, updated_at = $1, "
    + JOB_LEASE.released_sql(keep_token=True)
    + " WHERE jobs.id = ANY($3::bigint[])"
    f" AND jobs.{JOB_LEASE.token} = ($4::bigint[])[array_position($3::bigint[], jobs.id)]"
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
    return None if isinstance(got, Busy) else got


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


def _error_entry(
    job: ClaimedJob,
    now: datetime,
    error_class: str,
    message: str,
    traceback: str | None,
    count_attempt: bool,
    detail: str | None,
    max_attempts: int | None,
) -> dict[str, Any]:
    """The failed attempt's entry in the job's ``errors`` (see :func:`fail_sync`)."""
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
    return entry


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
    entry = _error_entry(
        job, now, error_class, message, traceback, count_attempt, detail, max_attempts
    )
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
        values["attempts"] = UNCHARGED
    if max_attempts is not None:
        values["max_attempts"] = max_attempts
    res = conn.execute(
        update(jobs)
        .where(jobs.c.id == job.id, fence(job.claim_token))
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
        .where(jobs.c.id == job.id, fence(job.claim_token))
        .values(
            status="pending",
            run_at=until,
            attempts=UNCHARGED,
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
        .where(jobs.c.id == job.id, fence(job.claim_token))
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


__all__ = [
    "OutcomeStore",
    "complete_and_start_pg",
    "complete_many",
    "complete_many_sync",
    "dead_letter_job",
    "dead_letter_job_sync",
    "fail",
    "fail_sync",
    "finish",
    "finish_sync",
    "snooze",
    "snooze_sync",
    "start_many",
    "start_many_sync",
    "try_complete_and_start_inline",
    "try_start_inline",
]
