"""The one capture: every failure reaches ``dead_letters`` through :func:`capture_many`.

Poll cycles, dead jobs and the outbox all write failures through it, in the caller's
transaction: one rule for what a failure does to a row
(:func:`~synckit.errors.dlq_policy.decide_capture`: an operator's ``ignored`` stands), one
history shape (``at``, ``source``, ``error_class``, ``message``, ``attempt``,
``trace_id``), and set-based statements whose parameter count does not grow with the
number of failures. Text PostgreSQL cannot store (NUL, lone surrogates) is stored as
U+FFFD on both engines (:func:`~synckit.store.moments.storable_text`).

:func:`resolve_records` is the other side of a cycle's outcome: the open rows of records
that succeeded after all are resolved, in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, overload

from sqlalchemy import (
    TextClause,
    bindparam,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.errors.dlq_policy import (
    DEAD_CYCLES_REASON,
    DEAD_CYCLES_TO_PAUSE,
    dead_cycle_streak,
    decide_capture,
)
from synckit.store.connections import pause_lanes_sql
from synckit.store.dead_letters.rows import (
    _MESSAGE_LIMIT,
    _REASON_LIMIT,
    _TRACEBACK_LIMIT,
    _appended,
    _clean,
    _history_entry,
    _parse_json,
)
from synckit.store.moments import storable_text
from synckit.store.row_arrays import RowStatements, list_param
from synckit.store.tables import dead_letters

_Key = tuple[str, str, str, str]
_NOW = bindparam("now", type_=dead_letters.c.last_attempt_at.type)

# --- capture ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """One failure to capture (:func:`capture_many`).

    ``source`` names where it came from (``poll``, ``job``, ``outbox``; ``capture`` for
    a direct call) and is kept in the row's history. ``attempts`` is how many attempts
    this failure stands for (a dead job's attempts; 1 for a record). ``retry_at`` is the
    first replay of a row this failure opens (default: :data:`~synckit.errors.dlq_policy.BASE_DELAY`
    from now); ``keep_replay_count`` keeps the replays a reopened row has already spent.
    """

    tenant: str
    connector: str
    kind: str
    record_id: str
    payload: Any
    error_class: str
    message: str
    traceback: str | None = None
    trace_id: str | None = None
    job_id: int | None = None
    resource_key: str | None = None
    attempts: int = 1
    source: str = "capture"
    retry_at: datetime | None = None
    keep_replay_count: bool = False


@dataclass(frozen=True)
class Captured:
    """What a capture did: the row's id, whether it is new, and its status now."""

    id: int
    created: bool
    status: str


def _scrubbed(value: Any) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_text(k): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    return value


def _json_text(payload: Any) -> str:
    """A payload (or a history) as JSON text both engines store.

    A capture must never fail because of the record it captures (one bad record never
    stops a batch), so a value JSON cannot hold is kept as its ``repr`` under
    ``_unserialisable``: replay then finds a payload of the wrong shape and ignores the
    row with that reason, and an operator can still read what it was. NULs and lone
    surrogates in strings and keys, at any depth, become U+FFFD (:func:`storable_text`).
    """
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        try:
            shown = repr(payload)
        except Exception:  # a broken __repr__ must not break the capture
            shown = f"<unprintable {type(payload).__name__}>"
        kept = {"_unserialisable": shown[:10_000], "_error": str(exc)[:200]}
        text = json.dumps(kept, ensure_ascii=False)
    # json.dumps writes NUL as the escape \u0000 (which jsonb refuses) and leaves lone
    # surrogates as they are; the walk runs only for a payload holding either.
    if "\\u0000" in text or not _encodes(text):
        text = json.dumps(_scrubbed(json.loads(text)), ensure_ascii=False)
    return text


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: DLQ sits below the scheduler).
_POLL_KIND = "synckit.poll"


def dead_job_record_id(kind: str, payload: Any, job_id: int) -> str:
    """The record id a dead job is captured under: ``job:<id>``, except a poll cycle,
    keyed by its stream (``job:poll:<stream>``) so a tenant failing every tick has one
    dead letter per stream, counting its cycles, not one per tick."""
    if kind == _POLL_KIND and isinstance(payload, dict):
        stream = payload.get("stream")
        if isinstance(stream, str) and stream:
            return f"job:poll:{stream[:200]}"
    return f"job:{job_id}"


_CYCLE_PREFIX = "job:poll:"


@dataclass(frozen=True)
class _Prepared:
    """A :class:`Failure` as it will be stored: texts made storable, payload as JSON."""

    key: _Key
    failure: Failure
    payload: str
    message: str
    traceback: str | None
    error_class: str

    def failure_values(self, history: str) -> tuple[Any, ...]:
        """The values of :data:`_FAILURE_COLUMNS`, with ``history`` (JSON text)."""
        f = self.failure
        return (
            f.job_id,
            f.resource_key,
            self.payload,
            self.error_class,
            self.message,
            self.traceback,
            history,
            f.trace_id,
        )


def _prepare(f: Failure) -> _Prepared:
    record_id = f.record_id
    if f.job_id is not None and record_id == f"job:{f.job_id}":
        record_id = dead_job_record_id(f.kind, f.payload, f.job_id)
    key = (
        storable_text(f.tenant),
        storable_text(f.connector),
        storable_text(f.kind),
        storable_text(record_id),
    )
    return _Prepared(
        key=key,
        failure=f,
        payload=_json_text(f.payload),
        message=_clean(f.message or "", _MESSAGE_LIMIT) or "",
        traceback=_clean(f.traceback, _TRACEBACK_LIMIT, tail=True),
        error_class=storable_text(f.error_class)[:32],
    )


#: The columns each statement's rows carry, in order, with their PostgreSQL array types.
_KEY_COLUMNS = (("tenant", "text"), ("connector", "text"), ("kind", "text"), ("record_id", "text"))
# What a failure writes, on a new row and on one it lands on alike.
_FAILURE_COLUMNS = (
    ("job_id", "bigint"),
    ("resource_key", "text"),
    ("payload", "text"),
    ("error_class", "text"),
    ("error_message", "text"),
    ("traceback", "text"),
    ("history", "text"),
    ("trace_id", "text"),
)
_INSERT_COLUMNS = (
    *_KEY_COLUMNS,
    *_FAILURE_COLUMNS,
    ("attempts", "integer"),
    ("status", "text"),
    ("next_retry_at", "timestamptz"),
)
_MERGE_COLUMNS = (
    ("id", "bigint"),
    *_FAILURE_COLUMNS,
    ("attempt_count", "integer"),
    ("status", "text"),
    ("next_retry_at", "timestamptz"),
    ("reopen", "boolean"),
    ("reset", "boolean"),
)
_PAUSE_COLUMNS = (("resource_key", "text"), ("reason", "text"))


class _CaptureSql(RowStatements):
    """The capture's statements for one engine, built once. Rows travel as one array per
    column (PostgreSQL: ``unnest``) or one JSON array of rows (SQLite: ``json_each``):
    the parameter count never depends on how many rows a capture writes, and the text
    is the same for every call, so each statement is prepared once."""

    key_columns = _KEY_COLUMNS
    insert_columns = _INSERT_COLUMNS
    merge_columns = _MERGE_COLUMNS
    pause_columns = _PAUSE_COLUMNS

    def __init__(self, postgres: bool) -> None:
        super().__init__(postgres)
        self.lock = self._lock_sql()
        self.insert = self._insert_sql()
        self.merge = self._merge_sql()
        self.pause = pause_lanes_sql(self.source(_PAUSE_COLUMNS))
        self.resolve = self._resolve_sql()

    def _lock_sql(self) -> TextClause:
        keys = self.source(_KEY_COLUMNS)
        history = "CAST(d.history AS text)" if self.postgres else "d.history"
        lock = " FOR UPDATE OF d" if self.postgres else ""
        return text(
            "SELECT d.id, d.tenant, d.connector, d.kind, d.record_id, d.status,"
            f" d.attempt_count, {history} AS history FROM {keys}"
            " JOIN dead_letters d ON d.tenant = v.tenant AND d.connector = v.connector"
            f" AND d.kind = v.kind AND d.record_id = v.record_id ORDER BY d.id{lock}"
        )

    def _insert_sql(self) -> TextClause:
        new = self.source(_INSERT_COLUMNS)
        return text(
            "INSERT INTO dead_letters (tenant, connector, kind, record_id, job_id,"
            " resource_key, payload, error_class, error_message, traceback, history,"
            " trace_id, attempt_count, replay_attempts, status, status_reason,"
            " first_failed_at, last_attempt_at, next_retry_at, resolved_at)"
            " SELECT v.tenant, v.connector, v.kind, v.record_id, v.job_id, v.resource_key,"
            f" {self._json('v.payload')}, v.error_class, v.error_message, v.traceback,"
            f" {self._json('v.history')}, v.trace_id, v.attempts, 0, v.status, NULL,"
            f" :now, :now, v.next_retry_at, NULL FROM {new} WHERE true"
            " ON CONFLICT (tenant, connector, kind, record_id) DO NOTHING"
            " RETURNING id, tenant, connector, kind, record_id"
        ).bindparams(_NOW)

    def _merge_sql(self) -> TextClause:
        merged = self.source(_MERGE_COLUMNS)
        # A row kept as it is (an operator ignored it) keeps its reason, replay time,
        # resolution time and replay count; a reopened row ends any replay lease on it.
        return text(
            f"UPDATE dead_letters SET payload = {self._json('v.payload')},"
            " error_class = v.error_class, error_message = v.error_message,"
            f" traceback = v.traceback, history = {self._json('v.history')},"
            " trace_id = v.trace_id, attempt_count = v.attempt_count, last_attempt_at = :now,"
            " job_id = COALESCE(v.job_id, dead_letters.job_id),"
            " resource_key = COALESCE(v.resource_key, dead_letters.resource_key),"
            " status = v.status,"
            " status_reason = CASE WHEN v.reopen THEN NULL ELSE dead_letters.status_reason END,"
            " lease_token = CASE WHEN v.reopen THEN NULL ELSE dead_letters.lease_token END,"
            " lease_expires_at = CASE WHEN v.reopen THEN NULL"
            " ELSE dead_letters.lease_expires_at END,"
            " next_retry_at = CASE WHEN v.reopen THEN v.next_retry_at"
            " ELSE dead_letters.next_retry_at END,"
            " resolved_at = CASE WHEN v.reopen THEN NULL ELSE dead_letters.resolved_at END,"
            " replay_attempts = CASE WHEN v.reset THEN 0 ELSE dead_letters.replay_attempts END"
            f" FROM {merged} WHERE dead_letters.id = v.id"
        ).bindparams(_NOW)

    def _resolve_sql(self) -> TextClause:
        ids = (
            "record_id = ANY(CAST(:ids AS text[]))"
            if self.postgres
            else "record_id IN (SELECT value FROM json_each(:ids))"
        )
        return text(
            "UPDATE dead_letters SET status = 'resolved', status_reason = :reason,"
            " resolved_at = :now, next_retry_at = NULL, lease_token = NULL,"
            " lease_expires_at = NULL"
            " WHERE tenant = :tenant AND connector = :connector AND kind = :kind"
            f" AND status IN ('pending', 'review') AND {ids}"
        ).bindparams(bindparam("now", type_=dead_letters.c.resolved_at.type))

    def _json(self, column: str) -> str:
        # SQLite keeps JSON as text: the JSON text travels as a string and is stored as is.
        return f"CAST({column} AS jsonb)" if self.postgres else column

    def ids(self, ids: Sequence[str]) -> Any:
        return list_param(self.postgres, ids)


_SQL = {True: _CaptureSql(True), False: _CaptureSql(False)}
#: Rows per statement of one capture: bounds a statement's size, not its parameter count.
CAPTURE_CHUNK = 1000


@dataclass(frozen=True)
class _Merge:
    """A failure landing on a row that exists, as it will be written (``values`` in
    :attr:`_CaptureSql.merge_columns` order); ``streak`` for a dead poll cycle."""

    p: _Prepared
    row_id: int
    status: str
    values: tuple[Any, ...]
    streak: int | None


@overload
def capture_many(
    conn: Connection, failures: Sequence[Failure], *, now: datetime
) -> list[Captured]: ...


@overload
def capture_many(
    conn: AsyncConnection, failures: Sequence[Failure], *, now: datetime
) -> Awaitable[list[Captured]]: ...


def capture_many(
    conn: Connection | AsyncConnection, failures: Sequence[Failure], *, now: datetime
) -> list[Captured] | Awaitable[list[Captured]]:
    """Write failures into the DLQ in the caller's transaction; one :class:`Captured` per
    failure, in order. The one capture of poll cycles, dead jobs and the outbox.

    One row per ``(tenant, connector, kind, record_id)`` (a key twice in ``failures``:
    the last counts). What happens to a row is :func:`~synckit.errors.dlq_policy.decide_capture`:
    a new row is ``pending`` (first replay at ``retry_at``, default one minute from
    ``now``) or ``review`` at once for validation and authorization errors. A repeat
    updates the same row: error, payload and trace become the latest, ``attempt_count``
    grows by ``attempts``, ``history`` gains an entry (the last :data:`HISTORY_LIMIT` are
    kept; the same shape from every source), and the row is open again with a fresh
    replay budget (``keep_replay_count``: the spent replays stay) and any replay lease on
    it ended, so the newer failure wins over that replay's outcome. A row an operator
    ``ignored`` stays ignored, with its reason: the failure is recorded, not acted on.

    Texts are redacted and cut; NULs and lone surrogates in texts, keys and payloads
    (nested strings and keys too) become U+FFFD (:func:`storable_text`), so the capture
    never fails on either engine because of what the record holds. A dead poll cycle
    (``job:poll:<stream>``) counts its streak and pauses the tenant's connection after
    :data:`~synckit.errors.dlq_policy.DEAD_CYCLES_TO_PAUSE` in a row, in this transaction.

    Set-based: a handful of statements per :data:`CAPTURE_CHUNK` rows, each with a fixed
    number of parameters, whatever the number of failures.

    ``conn`` is a synchronous connection (:meth:`~synckit.store.db.Database.write`, the
    worker's recording); given an :class:`AsyncConnection`, the same capture runs through
    ``run_sync`` and this returns its awaitable.
    """
    if isinstance(conn, AsyncConnection):
        return conn.run_sync(_capture_many, failures, now=now)
    return _capture_many(conn, failures, now=now)


def _capture_many(
    conn: Connection, failures: Sequence[Failure], *, now: datetime
) -> list[Captured]:
    prepared = [_prepare(f) for f in failures]
    # In key order: concurrent captures then insert (and so wait for each other's keys)
    # in the same order, and cannot deadlock on them.
    unique = sorted({p.key: p for p in prepared}.values(), key=lambda p: p.key)
    sql = _SQL[conn.dialect.name == "postgresql"]
    done: dict[_Key, Captured] = {}
    for start in range(0, len(unique), CAPTURE_CHUNK):
        done.update(_capture_chunk(conn, sql, unique[start : start + CAPTURE_CHUNK], now))
    return [done[p.key] for p in prepared]


def _capture_chunk(
    conn: Connection, sql: _CaptureSql, chunk: Sequence[_Prepared], now: datetime
) -> dict[_Key, Captured]:
    out: dict[_Key, Captured] = {}
    streaks: list[tuple[_Prepared, int]] = []
    existing = _lock(conn, sql, [p.key for p in chunk])
    fresh = [p for p in chunk if p.key not in existing]
    if fresh:
        out.update(_insert_fresh(conn, sql, fresh, now))
        streaks += [(p, 1) for p in fresh if p.key in out and _is_cycle(p)]
        # ON CONFLICT DO NOTHING waited for a concurrent insert of a key to commit: that
        # row exists now, and this failure is a repeat on it.
        lost = [p.key for p in fresh if p.key not in out]
        if lost:
            existing.update(_lock(conn, sql, lost))
    merges = [_merge(p, existing[p.key], now) for p in chunk if p.key not in out]
    if merges:
        values = [m.values for m in merges]
        conn.execute(sql.merge, {**sql.rows(sql.merge_columns, values), "now": now})
        for m in merges:
            out[m.p.key] = Captured(m.row_id, False, m.status)
            if m.streak is not None:
                streaks.append((m.p, m.streak))
    pauses = [
        (p.failure.resource_key, _pause_reason(p, streak))
        for p, streak in streaks
        if streak >= DEAD_CYCLES_TO_PAUSE and p.failure.resource_key
    ]
    if pauses:
        # The dead_cycles alert rule announces the pause; in the capture's transaction,
        # so the pause and the dead letter commit together.
        conn.execute(sql.pause, {**sql.rows(sql.pause_columns, pauses), "now": now})
    return out


def _is_cycle(p: _Prepared) -> bool:
    return p.key[3].startswith(_CYCLE_PREFIX)


def _lock(conn: Connection, sql: _CaptureSql, keys: Sequence[_Key]) -> dict[_Key, Any]:
    """The rows of ``keys`` that exist, locked until the transaction ends (PostgreSQL;
    SQLite's writer lock already covers them)."""
    rows = conn.execute(sql.lock, sql.rows(sql.key_columns, keys))
    return {(r.tenant, r.connector, r.kind, r.record_id): r for r in rows}


def _insert_fresh(
    conn: Connection, sql: _CaptureSql, fresh: Sequence[_Prepared], now: datetime
) -> dict[_Key, Captured]:
    rows = []
    statuses: dict[_Key, str] = {}
    for p in fresh:
        f = p.failure
        decision = decide_capture(None, p.error_class, now=now, retry_at=f.retry_at)
        entry = _history_entry(now, f.source, p.error_class, p.message, f.attempts, f.trace_id)
        if _is_cycle(p):
            entry["streak"] = 1
        statuses[p.key] = decision.status
        rows.append(
            (
                *p.key,
                *p.failure_values(_json_text([entry])),
                f.attempts,
                decision.status,
                decision.next_retry_at,
            )
        )
    res = conn.execute(sql.insert, {**sql.rows(sql.insert_columns, rows), "now": now})
    out = {}
    for r in res:
        key = (r.tenant, r.connector, r.kind, r.record_id)
        out[key] = Captured(int(r.id), True, statuses[key])
    return out


def _merge(p: _Prepared, old: Any, now: datetime) -> _Merge:
    f = p.failure
    history, _ = _parse_json(old.history)
    kept = [h for h in history if isinstance(h, dict)] if isinstance(history, list) else []
    attempt_count = int(old.attempt_count) + f.attempts
    decision = decide_capture(
        old.status,
        p.error_class,
        now=now,
        retry_at=f.retry_at,
        keep_replay_count=f.keep_replay_count,
    )
    entry = _history_entry(now, f.source, p.error_class, p.message, attempt_count, f.trace_id)
    streak = None
    if _is_cycle(p):
        last = kept[-1] if kept else {}
        streak = entry["streak"] = dead_cycle_streak(old.status, last.get("streak"))
    values = (
        int(old.id),
        *p.failure_values(_json_text(_appended(kept, entry))),
        attempt_count,
        decision.status,
        decision.next_retry_at,
        decision.reopen,
        decision.reset_replays,
    )
    return _Merge(p, int(old.id), decision.status, values, streak)


def _pause_reason(p: _Prepared, streak: int) -> str:
    stream = p.key[3][len(_CYCLE_PREFIX) :]
    return (
        f"{DEAD_CYCLES_REASON} stream {stream} died {streak} cycles in a row; last: {p.message}"
    )[:500]


def capture_sync(
    conn: Connection,
    *,
    tenant: str,
    connector: str,
    kind: str,
    record_id: str,
    payload: Any,
    error_class: str,
    message: str,
    now: datetime,
    traceback: str | None = None,
    trace_id: str | None = None,
    job_id: int | None = None,
    resource_key: str | None = None,
    attempts: int = 1,
    retry_at: datetime | None = None,
    keep_replay_count: bool = False,
    source: str | None = None,
) -> Captured:
    """One failure through :func:`capture_many`, in the caller's transaction.

    ``source`` defaults to ``job`` for a dead job (``record_id`` ``job:<job_id>``, as
    the worker captures them) and ``capture`` otherwise.
    """
    if source is None:
        source = "job" if job_id is not None and record_id == f"job:{job_id}" else "capture"
    failure = Failure(
        tenant=tenant,
        connector=connector,
        kind=kind,
        record_id=record_id,
        payload=payload,
        error_class=error_class,
        message=message,
        traceback=traceback,
        trace_id=trace_id,
        job_id=job_id,
        resource_key=resource_key,
        attempts=attempts,
        source=source,
        retry_at=retry_at,
        keep_replay_count=keep_replay_count,
    )
    return capture_many(conn, [failure], now=now)[0]


async def capture(conn: AsyncConnection, **kw: Any) -> Captured:
    """:func:`capture_sync` in the caller's async transaction."""
    return await conn.run_sync(lambda c: capture_sync(c, **kw))


def resolve_records(
    conn: Connection,
    *,
    tenant: str,
    connector: str,
    kind: str,
    record_ids: Sequence[str],
    now: datetime,
    reason: str,
) -> int:
    """Resolve the open (pending or review) rows of ``record_ids``, in the caller's
    transaction; return how many. Ignored rows stay ignored. One statement, the ids as
    one parameter (record ids made storable as :func:`capture_many` stores them)."""
    ids = sorted({storable_text(r) for r in record_ids})
    if not ids:
        return 0
    sql = _SQL[conn.dialect.name == "postgresql"]
    res = conn.execute(
        sql.resolve,
        {
            "tenant": tenant,
            "connector": connector,
            "kind": kind,
            "ids": sql.ids(ids),
            "reason": _clean(reason, _REASON_LIMIT),
            "now": now,
        },
    )
    return res.rowcount or 0
