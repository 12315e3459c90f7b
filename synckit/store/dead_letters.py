"""The dead-letter queue's persistence: every SQL statement on ``dead_letters``, named.

One row per failed thing, keyed by ``(tenant, connector, kind, record_id)``: a record of a
stream (kind ``record:<stream>``) or a dead job (kind = the job's kind, record id
``job:<id>``). Statuses:

* ``pending`` — waiting for an automatic replay at ``next_retry_at``;
* ``review`` — a human must look (validation/authorization errors, replays exhausted);
* ``resolved`` — replayed successfully, or resolved by an operator;
* ``ignored`` — cannot or should not be replayed; ``status_reason`` says why.

**Capture.** Poll cycles, dead jobs and the outbox all write failures through
:func:`capture_many`, in the caller's transaction: one rule for what a failure does to a
row (:func:`~synckit.errors.dlq_policy.decide_capture`: an operator's ``ignored`` stands), one
history shape (``at``, ``source``, ``error_class``, ``message``, ``attempt``,
``trace_id``), and set-based statements whose parameter count does not grow with the
number of failures. Text PostgreSQL cannot store (NUL, lone surrogates) is stored as
U+FFFD on both engines (:func:`storable_text`).

**Leases.** A replay processor claims due rows under the one lease
(:mod:`synckit.store.leases`: ``lease_token``, ``lease_expires_at``) and pushes
``next_retry_at`` forward to the lease's end, in one short transaction (``FOR UPDATE SKIP
LOCKED`` on PostgreSQL; SQLite serialises writers). The row stays ``pending``, so nothing
else sees a state it does not know, and is no longer due, so no other processor takes it
(and the due-row index walk never steps over held rows). Every outcome is written only
where the token still holds (fencing): a re-capture, a resolution or an operator's
change releases the lease, so such a row keeps its newer state. A processor that dies
leaves rows that simply come due again when the lease ends. No transaction is held while
a replay runs, so a replay may itself write to the database, on SQLite too.

**Streaming.** Listing and bulk operations walk the table by keyset pagination on ``id``
(pages of ``batch`` rows, each page its own short read), so 100,000 matching rows are
never in memory at once and no long transaction pins the database.

**Corrupt rows.** ``payload`` and ``history`` are read as text and parsed here, the
timestamps guarded (:func:`~synckit.store.moments.guarded_moment`) and parsed here too. A
payload that does not parse (text in SQLite, a JSONB number past Python's digit limit)
shows up as :attr:`DeadLetter.payload_error`; a history or timestamp that cannot be read
('garbage' in SQLite, year 20000 in PostgreSQL) is None; each is named in
:attr:`DeadLetter.unreadable`. Either way the row is read, not the query failed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as dataclass_replace
from datetime import datetime, timedelta
from typing import Any, Literal, overload

from sqlalchemy import (
    ColumnElement,
    Row,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal_column,
    or_,
    select,
    text,
    type_coerce,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.errors.dlq_policy import (
    DEAD_CYCLES_REASON,
    DEAD_CYCLES_TO_PAUSE,
    blocked_until,
    dead_cycle_streak,
    decide_capture,
)
from synckit.errors.exceptions import DeadLetterNotFound, DlqError
from synckit.redaction import redact_text
from synckit.store import leases
from synckit.store.connections import pause_lanes_sql
from synckit.store.db import Database
from synckit.store.leases import Lease
from synckit.store.moments import REPLACEMENT, guarded_moment, read_moment, storable_text
from synckit.store.pages import Page, off_index, page_size, paged, scan_window
from synckit.store.tables import connections, dead_letters, resources

__all__ = [
    "CAPTURE_CHUNK",
    "HISTORY_LIMIT",
    "INACTIVE_WAIT",
    "REPLACEMENT",
    "STATUSES",
    "Captured",
    "DeadLetter",
    "DlqFilter",
    "DlqGroup",
    "Failure",
    "GroupCount",
    "ReplayError",
    "capture",
    "capture_many",
    "capture_sync",
    "claim_due",
    "claim_ids",
    "count",
    "dead_job_record_id",
    "defer",
    "dlq_groups",
    "dlq_page",
    "due_rows",
    "get",
    "group_counts",
    "ignore_matching",
    "iter_ids",
    "iter_rows",
    "mark_ignored",
    "mark_resolved",
    "mark_review",
    "purge",
    "resolve_matching",
    "resolve_records",
    "resource_waits",
    "schedule_retry",
    "schedule_unscheduled",
    "still_held",
    "storable_text",
]

Status = Literal["pending", "resolved", "ignored", "review"]
STATUSES: tuple[Status, ...] = ("pending", "resolved", "ignored", "review")
#: History keeps the most recent entries only, so a record failing for months stays small.
HISTORY_LIMIT = 20
#: How long rows of a tenant whose connection is not active (needs re-auth, paused) wait
#: before their connection is looked at again.
INACTIVE_WAIT = timedelta(minutes=15)

_MESSAGE_LIMIT = 4000
_HISTORY_MESSAGE_LIMIT = 500
_TRACEBACK_LIMIT = 20_000
_REASON_LIMIT = 1000
# Literals, not bound parameters: a planner can only use the partial index
# ix_dead_letters_due when the query's predicate visibly implies the index's.
_PENDING: Any = literal_column("'pending'")
_KEY = ["tenant", "connector", "kind", "record_id"]
_GROUP_COLUMNS = {
    "tenant": dead_letters.c.tenant,
    "connector": dead_letters.c.connector,
    "kind": dead_letters.c.kind,
    "class": dead_letters.c.error_class,
    "status": dead_letters.c.status,
}


# --- rows -------------------------------------------------------------------------------


def _parse_json(raw: Any) -> tuple[Any, str | None]:
    """(value, None), or (None, why) when the stored text is not JSON."""
    if raw is None:
        return None, None
    if not isinstance(raw, str | bytes | bytearray):
        return raw, None  # a driver that already decoded it
    try:
        return json.loads(raw), None
    except (ValueError, RecursionError) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:200]


@dataclass(frozen=True)
class DeadLetter:
    """One row of ``dead_letters``, as the DLQ's callers and replayers see it.

    ``payload`` is the stored JSON value; when the stored text does not parse,
    ``payload`` is None and ``payload_error`` says why (``payload_raw`` keeps the text).
    A timestamp or the history that cannot be read is None (the history: empty).
    ``unreadable`` maps each column that could not be read (the payload too) to a
    one-line reason.
    ``traceback`` is only read where it is shown (``get``, exports), else None.
    """

    id: int
    tenant: str
    connector: str
    kind: str
    record_id: str
    job_id: int | None
    resource_key: str | None
    payload: Any
    error_class: str
    error_message: str
    trace_id: str | None
    attempt_count: int
    replay_attempts: int
    status: str
    status_reason: str | None
    first_failed_at: datetime | None
    last_attempt_at: datetime | None
    next_retry_at: datetime | None
    resolved_at: datetime | None
    history: list[dict[str, Any]] = field(default_factory=list)
    traceback: str | None = None
    payload_error: str | None = None
    payload_raw: str | None = None
    unreadable: dict[str, str] = field(default_factory=dict)
    #: The replay lease on the row (:mod:`synckit.store.leases`), if one holds it.
    lease_token: str | None = None
    lease_expires_at: datetime | None = None

    @property
    def is_job(self) -> bool:
        """A dead job (record id ``job:<id>``) rather than a record of a stream."""
        return self.record_id.startswith("job:")

    @property
    def leased(self) -> bool:
        """Held by a replay processor right now (as of the time the row was read)."""
        return self.status == "pending" and self.lease_token is not None

    @classmethod
    def from_row(cls, r: Row[Any]) -> DeadLetter:
        m = r._mapping
        bad: dict[str, str] = {}
        payload, payload_error = _parse_json(m["payload_text"])
        if payload_error is not None:
            bad["payload"] = payload_error
        history, history_error = _parse_json(m["history_text"])
        if history_error is not None:
            bad["history"] = history_error
        elif history is not None and not isinstance(history, list):
            bad["history"] = f"not a list: a JSON {type(history).__name__}"
        if not isinstance(history, list):
            history = []
        moments: dict[str, datetime | None] = {}
        for name in _MOMENTS:
            try:
                moments[name] = read_moment(m[name])
            except ValueError as exc:
                moments[name], bad[name] = None, str(exc)
        return cls(
            id=m["id"],
            tenant=m["tenant"],
            connector=m["connector"],
            kind=m["kind"],
            record_id=m["record_id"],
            job_id=m["job_id"],
            resource_key=m["resource_key"],
            payload=payload,
            error_class=m["error_class"],
            error_message=m["error_message"],
            trace_id=m["trace_id"],
            attempt_count=m["attempt_count"],
            replay_attempts=m["replay_attempts"],
            status=m["status"],
            status_reason=m["status_reason"],
            history=[h for h in history if isinstance(h, dict)],
            traceback=m.get("traceback"),
            payload_error=payload_error,
            payload_raw=m["payload_text"] if payload_error is not None else None,
            unreadable=bad,
            lease_token=m["lease_token"],
            **moments,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: timestamps as ISO 8601, payload and history as stored."""
        data: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            data[name] = value.isoformat() if isinstance(value, datetime) else value
        if self.payload_error is None:
            del data["payload_error"], data["payload_raw"]
        if not self.unreadable:
            del data["unreadable"]
        return data


_MOMENTS = (
    "first_failed_at",
    "last_attempt_at",
    "next_retry_at",
    "resolved_at",
    "lease_expires_at",
)


_BASE_COLUMNS: list[Any] = [
    dead_letters.c.id,
    dead_letters.c.tenant,
    dead_letters.c.connector,
    dead_letters.c.kind,
    dead_letters.c.record_id,
    dead_letters.c.job_id,
    dead_letters.c.resource_key,
    # As text, parsed by DeadLetter.from_row: corrupt JSON must not break the query.
    # CAST in SQL, not type_coerce: asyncpg decodes jsonb itself, and a payload that is a
    # JSON string came back as the bare string, which then failed to parse.
    cast(dead_letters.c.payload, Text).label("payload_text"),
    cast(dead_letters.c.history, Text).label("history_text"),
    dead_letters.c.error_class,
    dead_letters.c.error_message,
    dead_letters.c.trace_id,
    dead_letters.c.attempt_count,
    dead_letters.c.replay_attempts,
    dead_letters.c.status,
    dead_letters.c.status_reason,
    dead_letters.c.lease_token,
    # Guarded, parsed by DeadLetter.from_row: a value no datetime holds would fail the
    # whole fetch (the drivers raise while reading it), every listing and replay claim.
    *(guarded_moment(dead_letters.c[name]) for name in _MOMENTS),
]
_FULL_COLUMNS: list[Any] = [*_BASE_COLUMNS, dead_letters.c.traceback]
# For RETURNING on SQLite, whose RETURNING reads ``col IS NULL`` as false for a NULL
# column (3.40), so the guard would mark every empty time unreadable: the times come back
# as the stored text instead, which DeadLetter.from_row parses just the same (SQLite's
# driver fails on no value; only the datetime type's own parsing did).
_SQLITE_RETURNED: list[Any] = [
    type_coerce(dead_letters.c[c.name], Text).label(c.name) if c.name in _MOMENTS else c
    for c in _BASE_COLUMNS
]


def _returned(conn: AsyncConnection) -> list[Any]:
    """:data:`_BASE_COLUMNS` for a RETURNING clause on ``conn``'s engine."""
    return _BASE_COLUMNS if conn.dialect.name == "postgresql" else _SQLITE_RETURNED


# --- filters ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DlqFilter:
    """Which rows an operation applies to; every field given must match (empty: any).

    ``kinds`` entries ending in ``*`` match by prefix (``record:*``). ``since`` keeps
    rows whose last failure or replay was at or after that time.
    """

    ids: tuple[int, ...] = ()
    tenants: tuple[str, ...] = ()
    connectors: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    error_classes: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    since: datetime | None = None

    @property
    def is_empty(self) -> bool:
        return not (
            self.ids
            or self.tenants
            or self.connectors
            or self.kinds
            or self.error_classes
            or self.statuses
            or self.since
        )

    def clauses(self) -> list[ColumnElement[bool]]:
        c = dead_letters.c
        out: list[ColumnElement[bool]] = []
        if self.ids:
            out.append(c.id.in_(list(self.ids)))
        if self.tenants:
            out.append(c.tenant.in_(list(self.tenants)))
        if self.connectors:
            out.append(c.connector.in_(list(self.connectors)))
        if self.kinds:
            exact = [k for k in self.kinds if not k.endswith("*")]
            prefixes = [k[:-1] for k in self.kinds if k.endswith("*")]
            terms: list[ColumnElement[bool]] = []
            if exact:
                terms.append(c.kind.in_(exact))
            terms.extend(c.kind.startswith(p, autoescape=True) for p in prefixes)
            out.append(or_(*terms))
        if self.error_classes:
            out.append(c.error_class.in_(list(self.error_classes)))
        if self.statuses:
            out.append(c.status.in_(list(self.statuses)))
        if self.since is not None:
            out.append(c.last_attempt_at >= self.since)
        return out

    def narrowed(self, statuses: Sequence[str]) -> DlqFilter:
        """This filter, restricted to ``statuses`` (intersected with its own, if any)."""
        keep = tuple(s for s in statuses if not self.statuses or s in self.statuses)
        return DlqFilter(
            ids=self.ids,
            tenants=self.tenants,
            connectors=self.connectors,
            kinds=self.kinds,
            error_classes=self.error_classes,
            # No status is spelt so: the filter matches nothing. (A NUL sentinel was a
            # driver error on PostgreSQL, whose text cannot hold one.)
            statuses=keep or ("(none)",),
            since=self.since,
        )


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


def _clean(text: str | None, limit: int, *, tail: bool = False) -> str | None:
    """Stored text: redacted first (a secret cut in half would escape the patterns), made
    storable (:func:`storable_text`), then cut to ``limit``."""
    if text is None:
        return None
    text = storable_text(redact_text(text))
    return text[-limit:] if tail else text[:limit]


#: The kind of a poll cycle job (``synckit.runtime.poll.POLL_KIND``; not imported: the
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


def _history_entry(
    now: datetime,
    source: str,
    error_class: str,
    message: str,
    attempt: int,
    trace_id: str | None = None,
) -> dict[str, Any]:
    """One history entry; every writer of ``dead_letters.history`` (captures from poll
    cycles, jobs and the outbox, and replays) writes this shape."""
    return {
        "at": now.isoformat(),
        "source": source,
        "error_class": error_class,
        "message": message[:_HISTORY_MESSAGE_LIMIT],
        "attempt": attempt,
        "trace_id": trace_id,
    }


def _appended(history: Sequence[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [*history, entry][-HISTORY_LIMIT:]


_Key = tuple[str, str, str, str]


@dataclass(frozen=True)
class _Prepared:
    """A :class:`Failure` as it will be stored: texts made storable, payload as JSON."""

    key: _Key
    failure: Failure
    payload: str
    message: str
    traceback: str | None
    error_class: str


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


class _CaptureSql:
    """The capture's statements for one engine, built once. Rows travel as one array per
    column (PostgreSQL: ``unnest``) or one JSON array of rows (SQLite: ``json_each``):
    the parameter count never depends on how many rows a capture writes, and the text
    is the same for every call, so each statement is prepared once."""

    def __init__(self, postgres: bool) -> None:
        self.postgres = postgres
        ts = bindparam("now", type_=dead_letters.c.last_attempt_at.type)
        self.key_columns = (
            ("tenant", "text"),
            ("connector", "text"),
            ("kind", "text"),
            ("record_id", "text"),
        )
        keys = self._rows(*self.key_columns)
        history = "CAST(d.history AS text)" if postgres else "d.history"
        lock = " FOR UPDATE OF d" if postgres else ""
        self.lock = text(
            "SELECT d.id, d.tenant, d.connector, d.kind, d.record_id, d.status,"
            f" d.attempt_count, {history} AS history FROM {keys}"
            " JOIN dead_letters d ON d.tenant = v.tenant AND d.connector = v.connector"
            f" AND d.kind = v.kind AND d.record_id = v.record_id ORDER BY d.id{lock}"
        )
        self.insert_columns = (
            ("tenant", "text"),
            ("connector", "text"),
            ("kind", "text"),
            ("record_id", "text"),
            ("job_id", "bigint"),
            ("resource_key", "text"),
            ("payload", "text"),
            ("error_class", "text"),
            ("error_message", "text"),
            ("traceback", "text"),
            ("history", "text"),
            ("trace_id", "text"),
            ("attempts", "integer"),
            ("status", "text"),
            ("next_retry_at", "timestamptz"),
        )
        new = self._rows(*self.insert_columns)
        self.insert = text(
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
        ).bindparams(ts)
        self.merge_columns = (
            ("id", "bigint"),
            ("job_id", "bigint"),
            ("resource_key", "text"),
            ("payload", "text"),
            ("error_class", "text"),
            ("error_message", "text"),
            ("traceback", "text"),
            ("history", "text"),
            ("trace_id", "text"),
            ("attempt_count", "integer"),
            ("status", "text"),
            ("next_retry_at", "timestamptz"),
            ("reopen", "boolean"),
            ("reset", "boolean"),
        )
        merged = self._rows(*self.merge_columns)
        # A row kept as it is (an operator ignored it) keeps its reason, replay time,
        # resolution time and replay count; a reopened row ends any replay lease on it.
        self.merge = text(
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
        ).bindparams(ts)
        self.pause_columns = (("resource_key", "text"), ("reason", "text"))
        pauses = self._rows(*self.pause_columns)
        self.pause = pause_lanes_sql(pauses)
        ids = (
            "record_id = ANY(CAST(:ids AS text[]))"
            if postgres
            else "record_id IN (SELECT value FROM json_each(:ids))"
        )
        self.resolve = text(
            "UPDATE dead_letters SET status = 'resolved', status_reason = :reason,"
            " resolved_at = :now, next_retry_at = NULL, lease_token = NULL,"
            " lease_expires_at = NULL"
            " WHERE tenant = :tenant AND connector = :connector AND kind = :kind"
            f" AND status IN ('pending', 'review') AND {ids}"
        ).bindparams(bindparam("now", type_=dead_letters.c.resolved_at.type))

    def _json(self, column: str) -> str:
        # SQLite keeps JSON as text: the JSON text travels as a string and is stored as is.
        return f"CAST({column} AS jsonb)" if self.postgres else column

    def _rows(self, *cols: tuple[str, str]) -> str:
        names = ", ".join(n for n, _ in cols)
        if self.postgres:
            arrays = ", ".join(f"CAST(:{n} AS {t}[])" for n, t in cols)
            return f"unnest({arrays}) AS v({names})"
        picks = ", ".join(f"json_extract(value, '$[{i}]') AS {n}" for i, (n, _) in enumerate(cols))
        return f"(SELECT {picks} FROM json_each(:rows)) AS v"

    def rows(
        self, cols: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
    ) -> dict[str, Any]:
        if self.postgres:
            return {n: [r[i] for r in rows] for i, (n, _) in enumerate(cols)}
        return {"rows": json.dumps([[_sqlite_value(v) for v in r] for r in rows])}

    def ids(self, ids: Sequence[str]) -> Any:
        return list(ids) if self.postgres else json.dumps(list(ids))


_SQLITE = sqlite.dialect()
# The text a timestamp is stored as on SQLite (json_each hands values over as they are).
_SQLITE_TS: Any = dead_letters.c.next_retry_at.type.dialect_impl(_SQLITE).bind_processor(_SQLITE)


def _sqlite_value(value: Any) -> Any:
    return _SQLITE_TS(value) if isinstance(value, datetime) else value


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
                f.job_id,
                f.resource_key,
                p.payload,
                p.error_class,
                p.message,
                p.traceback,
                _json_text([entry]),
                f.trace_id,
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
        f.job_id,
        f.resource_key,
        p.payload,
        p.error_class,
        p.message,
        p.traceback,
        _json_text(_appended(kept, entry)),
        f.trace_id,
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


# --- due rows and leases ------------------------------------------------------------------


def _soonest_pending(limit: int, max_attempts: int | None = None) -> Any:
    """The ids of the ``limit`` pending rows with the soonest ``next_retry_at``.

    Callers keep those due (``next_retry_at <= now``) in the outer statement. Leaving the
    time out of this inner query is deliberate: with only ``status = 'pending'`` (a
    literal, implied by the partial index ix_dead_letters_due) and ``ORDER BY
    next_retry_at, id LIMIT n``, the one sensible plan is a walk of that index that stops
    after ``n`` entries, whatever the table holds. With ``next_retry_at <= now`` in it,
    PostgreSQL's estimate of that range (it assumes status and time independent) can fall
    far below the truth, and it then prefers fetching every due row and sorting them: fine
    for 1,000 due rows, slow for a backlog of 200,000. The soonest rows come first, so the
    due ones among the ``n`` are exactly the ``n`` soonest due rows (or all of them).
    """
    c = dead_letters.c
    stmt = (
        select(c.id)
        .where(c.status == _PENDING, c.next_retry_at.is_not(None))
        .order_by(c.next_retry_at, c.id)
        .limit(limit)
    )
    if max_attempts is not None:
        stmt = stmt.where(c.replay_attempts < max_attempts)
    return stmt


async def due_rows(
    conn: AsyncConnection, now: datetime, limit: int, *, max_attempts: int | None = None
) -> list[DeadLetter]:
    """Pending rows due at ``now``, soonest first, locked ``FOR UPDATE SKIP LOCKED`` on
    PostgreSQL until the caller's transaction ends (rows locked elsewhere are skipped).

    Read-only: it does not lease. ``max_attempts`` leaves out rows that have spent it.
    """
    ids = _soonest_pending(limit, max_attempts).with_for_update(skip_locked=True)
    stmt = (
        select(*_BASE_COLUMNS)
        .where(dead_letters.c.id.in_(ids.scalar_subquery()), dead_letters.c.next_retry_at <= now)
        .order_by(dead_letters.c.next_retry_at, dead_letters.c.id)
    )
    return [DeadLetter.from_row(r) for r in await conn.execute(stmt)]


async def claim_due(
    conn: AsyncConnection, *, now: datetime, limit: int, lease: Lease
) -> list[DeadLetter]:
    """Lease up to ``limit`` due pending rows (soonest first) under ``lease``.

    Leased rows stay ``pending`` with ``next_retry_at`` at the lease's end (so no one else
    finds them due) and the lease's token. Concurrent claimers never get the same row:
    PostgreSQL skips rows another claim has locked, SQLite runs claims one at a time.
    """
    picked = _soonest_pending(limit).with_for_update(skip_locked=True)
    stmt = leases.claim(
        dead_letters,
        lease,
        dead_letters.c.id.in_(picked.scalar_subquery()),
        dead_letters.c.next_retry_at <= now,
        now=now,
        values={"next_retry_at": lease.expires_at},
    ).returning(*_returned(conn))
    rows = [DeadLetter.from_row(r) for r in await conn.execute(stmt)]
    return sorted(rows, key=lambda r: r.id)


async def claim_ids(
    conn: AsyncConnection,
    ids: Sequence[int],
    *,
    now: datetime,
    lease: Lease,
    statuses: Sequence[str] = ("pending", "review"),
) -> list[DeadLetter]:
    """Lease the rows ``ids`` now, whenever they were due (an operator's replay).

    Only rows in ``statuses`` are taken, and never one another processor holds under an
    unexpired lease. A ``review`` row becomes ``pending`` for the lease (its replay
    outcome decides where it goes next).
    """
    if not ids:
        return []
    c = dead_letters.c
    stmt = leases.claim(
        dead_letters,
        lease,
        c.id.in_(list(ids)),
        c.status.in_(list(statuses)),
        now=now,
        values={"status": "pending", "next_retry_at": lease.expires_at},
    ).returning(*_returned(conn))
    rows = [DeadLetter.from_row(r) for r in await conn.execute(stmt)]
    return sorted(rows, key=lambda r: r.id)


async def still_held(conn: AsyncConnection, row_id: int, token: str) -> bool:
    """Lock row ``row_id`` for the caller's transaction if ``token`` still holds it."""
    c = dead_letters.c
    stmt = (
        select(c.id)
        .where(c.id == row_id, c.status == "pending", leases.held(dead_letters, token))
        .with_for_update()
    )
    return (await conn.execute(stmt)).first() is not None


async def schedule_unscheduled(conn: AsyncConnection, now: datetime) -> int:
    """Make pending rows without a ``next_retry_at`` due now; return how many.

    A pending row must have a replay time or it is never due. Writers outside this module
    can leave one without (the worker's dead-job upsert reopens a review row, whose time
    was cleared, as pending); the processor calls this before claiming.
    """
    c = dead_letters.c
    res = await conn.execute(
        update(dead_letters)
        .where(c.status == _PENDING, c.next_retry_at.is_(None))
        .values(next_retry_at=now)
    )
    return res.rowcount or 0


def _fenced(ids: Sequence[int], token: str | None) -> list[ColumnElement[bool]]:
    c = dead_letters.c
    cond: list[ColumnElement[bool]] = [c.id.in_(list(ids))]
    if token is not None:
        cond += [c.status == "pending", leases.held(dead_letters, token)]
    return cond


async def _update_returning_ids(
    conn: AsyncConnection, cond: list[ColumnElement[bool]], values: dict[str, Any]
) -> list[int]:
    """Write ``values`` where ``cond`` holds; every such write ends a replay lease on the
    row (a replay's own outcome, or an operator's change that fences the replay off)."""
    res = await conn.execute(
        update(dead_letters)
        .where(*cond)
        .values(**values, **leases.RELEASED)
        .returning(dead_letters.c.id)
    )
    return [int(r[0]) for r in res]


async def restore(conn: AsyncConnection, rows: Sequence[DeadLetter], *, token: str) -> list[int]:
    """Give rows an operator's replay leased back exactly as they were before the claim
    (status and replay time), lease released: a replay that could not run because of
    configuration (no key, a wrong key, no App) changes nothing."""
    done: list[int] = []
    for row in rows:
        done += await _update_returning_ids(
            conn,
            _fenced([row.id], token),
            {"status": row.status, "next_retry_at": row.next_retry_at},
        )
    return done


async def defer(
    conn: AsyncConnection,
    ids: Sequence[int],
    *,
    until: datetime,
    reason: str,
    token: str | None = None,
) -> list[int]:
    """Push pending rows to ``until`` without spending a replay attempt (resource waits)."""
    if not ids:
        return []
    cond = _fenced(ids, token)
    if token is None:
        cond.append(dead_letters.c.status == "pending")
    return await _update_returning_ids(
        conn, cond, {"next_retry_at": until, "status_reason": _clean(reason, _REASON_LIMIT)}
    )


async def mark_resolved(
    conn: AsyncConnection,
    ids: Sequence[int],
    *,
    now: datetime,
    reason: str | None = None,
    token: str | None = None,
    replayed: bool = False,
    next_retry_at: datetime | None = None,
) -> list[int]:
    """Mark rows resolved; return the ids changed.

    With ``token``, only rows still held under that lease change (fencing). ``replayed``
    counts the successful replay as an attempt. ``next_retry_at`` is kept on the row for
    a job that was re-run: should it die again, the worker reopens this row and its next
    replay waits until then.
    """
    if not ids:
        return []
    values: dict[str, Any] = {
        "status": "resolved",
        "status_reason": _clean(reason, _REASON_LIMIT) if reason else None,
        "resolved_at": now,
        "next_retry_at": next_retry_at,
    }
    if replayed:
        values["replay_attempts"] = dead_letters.c.replay_attempts + 1
        values["last_attempt_at"] = now
    cond = _fenced(ids, token)
    if token is None:
        cond.append(dead_letters.c.status != "resolved")
    return await _update_returning_ids(conn, cond, values)


async def mark_ignored(
    conn: AsyncConnection,
    ids: Sequence[int],
    reason: str,
    *,
    now: datetime,
    token: str | None = None,
    from_statuses: Sequence[str] = ("pending", "review"),
) -> list[int]:
    """Mark rows ignored with ``reason`` (kept in ``status_reason``); return the ids changed."""
    if not ids:
        return []
    cond = _fenced(ids, token)
    if token is None:
        cond.append(dead_letters.c.status.in_(list(from_statuses)))
    return await _update_returning_ids(
        conn,
        cond,
        {"status": "ignored", "status_reason": _clean(reason, _REASON_LIMIT), "resolved_at": now},
    )


@dataclass(frozen=True)
class ReplayError:
    """A failed replay, for :func:`schedule_retry` and :func:`mark_review`."""

    error_class: str
    message: str
    traceback: str | None = None


def _failure_values(
    row: DeadLetter, error: ReplayError | None, now: datetime, replayed: bool
) -> dict[str, Any]:
    if error is None:
        return {}
    attempt = row.replay_attempts + (1 if replayed else 0)
    message = _clean(error.message, _MESSAGE_LIMIT) or ""
    values: dict[str, Any] = {
        "error_class": error.error_class,
        "error_message": message,
        "history": _appended(
            row.history, _history_entry(now, "replay", error.error_class, message, attempt)
        ),
        "last_attempt_at": now,
    }
    if error.traceback is not None:
        values["traceback"] = _clean(error.traceback, _TRACEBACK_LIMIT, tail=True)
    if replayed:
        values["replay_attempts"] = attempt
    return values


async def schedule_retry(
    conn: AsyncConnection,
    row: DeadLetter,
    next_retry_at: datetime,
    *,
    now: datetime,
    error: ReplayError | None = None,
    token: str | None = None,
    replayed: bool = True,
) -> bool:
    """Keep ``row`` pending until ``next_retry_at``; with ``error``, record the failed
    replay (error, history, one more replay attempt when ``replayed``). False if fenced."""
    values = {
        "status": "pending",
        "status_reason": None,
        "next_retry_at": next_retry_at,
        **_failure_values(row, error, now, replayed),
    }
    return bool(await _update_returning_ids(conn, _fenced([row.id], token), values))


async def mark_review(
    conn: AsyncConnection,
    row: DeadLetter,
    reason: str,
    *,
    now: datetime,
    error: ReplayError | None = None,
    token: str | None = None,
    replayed: bool = True,
) -> bool:
    """Send ``row`` to manual review with ``reason``; with ``error``, record the failed
    replay as :func:`schedule_retry` does. False if fenced."""
    values = {
        "status": "review",
        "status_reason": _clean(reason, _REASON_LIMIT),
        "next_retry_at": None,
        **_failure_values(row, error, now, replayed),
    }
    return bool(await _update_returning_ids(conn, _fenced([row.id], token), values))


# --- resources --------------------------------------------------------------------------


async def resource_waits(
    conn: AsyncConnection, keys: Sequence[str], now: datetime
) -> dict[str, tuple[datetime, str]]:
    """For each of ``keys`` that cannot be called now: (until when, why).

    A resource waits for its own breaker and pacing, for those of its parent (the
    API-wide resource), and while its tenant's connection is not active.
    """
    unique = sorted(set(keys))
    if not unique:
        return {}
    r = resources
    p = resources.alias("parent")
    rows = await conn.execute(
        select(
            r.c.resource_key,
            r.c.state,
            r.c.cooldown_until,
            r.c.next_available_at,
            r.c.probe_job_id,
            r.c.probe_expires_at,
            p.c.resource_key.label("p_key"),
            p.c.state.label("p_state"),
            p.c.cooldown_until.label("p_cooldown_until"),
            p.c.next_available_at.label("p_next_available_at"),
            p.c.probe_job_id.label("p_probe_job_id"),
            p.c.probe_expires_at.label("p_probe_expires_at"),
        )
        .select_from(r.outerjoin(p, p.c.resource_key == r.c.parent_key))
        .where(r.c.resource_key.in_(unique))
    )
    out: dict[str, tuple[datetime, str]] = {}
    for row in rows:
        candidates: list[tuple[datetime, str]] = []
        own = blocked_until(
            state=row.state,
            cooldown_until=row.cooldown_until,
            next_available_at=row.next_available_at,
            probe_in_flight=row.probe_job_id is not None,
            probe_expires_at=row.probe_expires_at,
            now=now,
        )
        if own is not None:
            candidates.append((own, f"resource {row.resource_key} {_why(row.state)}"))
        if row.p_key is not None:
            parent = blocked_until(
                state=row.p_state,
                cooldown_until=row.p_cooldown_until,
                next_available_at=row.p_next_available_at,
                probe_in_flight=row.p_probe_job_id is not None,
                probe_expires_at=row.p_probe_expires_at,
                now=now,
            )
            if parent is not None:
                candidates.append((parent, f"resource {row.p_key} {_why(row.p_state)}"))
        if candidates:
            out[row.resource_key] = max(candidates)
    inactive = await conn.execute(
        select(connections.c.resource_key, connections.c.status).where(
            connections.c.resource_key.in_(unique), connections.c.status != "active"
        )
    )
    for key, status in inactive:
        until = now + INACTIVE_WAIT
        if key not in out or out[key][0] < until:
            out[key] = (until, f"connection {key} is {status}")
    return out


def _why(state: str | None) -> str:
    return {"open": "breaker open", "half_open": "breaker probing"}.get(state or "", "paced")


# --- reading ------------------------------------------------------------------------------


async def get(db: Database, row_id: int) -> DeadLetter:
    """One row with its traceback; :class:`DeadLetterNotFound` if there is none."""
    async with db.read() as conn:
        row = (
            await conn.execute(select(*_FULL_COLUMNS).where(dead_letters.c.id == row_id))
        ).first()
    if row is None:
        raise DeadLetterNotFound(f"no dead letter with id {row_id}")
    return DeadLetter.from_row(row)


async def iter_rows(
    db: Database,
    flt: DlqFilter = DlqFilter(),
    *,
    batch: int = 1000,
    newest_first: bool = False,
    limit: int | None = None,
    full: bool = False,
    after_id: int | None = None,
) -> AsyncIterator[DeadLetter]:
    """Stream matching rows in id order (``newest_first``: descending), ``batch`` at a time,
    starting after the id ``after_id`` in that order (a caller's next page: with
    ``newest_first``, the rows older than it).

    Each page is a short read of its own (keyset pagination on ``id``), so memory stays
    at one page and rows written meanwhile are simply included or not. ``full`` adds the
    traceback.
    """
    c = dead_letters.c
    cols = _FULL_COLUMNS if full else _BASE_COLUMNS
    clauses = flt.clauses()
    last: int | None = after_id
    yielded = 0
    while limit is None or yielded < limit:
        size = batch if limit is None else min(batch, limit - yielded)
        stmt = select(*cols).where(*clauses)
        if last is not None:
            stmt = stmt.where(c.id < last if newest_first else c.id > last)
        stmt = stmt.order_by(c.id.desc() if newest_first else c.id).limit(size)
        async with db.read() as conn:
            page = [DeadLetter.from_row(r) for r in await conn.execute(stmt)]
        for row in page:
            yield row
        yielded += len(page)
        if len(page) < size:
            return
        last = page[-1].id


async def iter_ids(
    db: Database, flt: DlqFilter = DlqFilter(), *, batch: int = 1000
) -> AsyncIterator[list[int]]:
    """Stream the ids of matching rows in ascending pages of at most ``batch``."""
    c = dead_letters.c
    clauses = flt.clauses()
    last = 0
    while True:
        stmt = select(c.id).where(*clauses, c.id > last).order_by(c.id).limit(batch)
        async with db.read() as conn:
            page = [int(r[0]) for r in await conn.execute(stmt)]
        if page:
            yield page
        if len(page) < batch:
            return
        last = page[-1]


async def count(db: Database, flt: DlqFilter = DlqFilter()) -> int:
    """How many rows match."""
    async with db.read() as conn:
        stmt = select(func.count()).select_from(dead_letters).where(*flt.clauses())
        return int((await conn.execute(stmt)).scalar_one())


@dataclass(frozen=True)
class GroupCount:
    """One group of :func:`group_counts`: its key values (in ``group_by`` order) and size."""

    key: tuple[str, ...]
    count: int


async def group_counts(
    db: Database, group_by: Sequence[str], flt: DlqFilter = DlqFilter()
) -> list[GroupCount]:
    """Counts of matching rows per group, largest first.

    ``group_by`` names columns among ``tenant``, ``connector``, ``kind``, ``class``
    (error class) and ``status``.
    """
    unknown = [g for g in group_by if g not in _GROUP_COLUMNS]
    if unknown or not group_by:
        raise DlqError(
            f"cannot group by {', '.join(unknown) or 'nothing'}: "
            f"choose among {', '.join(_GROUP_COLUMNS)}"
        )
    cols = [_GROUP_COLUMNS[g] for g in group_by]
    n = func.count().label("n")
    stmt = select(*cols, n).where(*flt.clauses()).group_by(*cols).order_by(n.desc(), *cols)
    async with db.read() as conn:
        return [
            GroupCount(tuple(str(v) for v in r[:-1]), int(r[-1])) for r in await conn.execute(stmt)
        ]


# --- operators' bulk changes ------------------------------------------------------------


async def resolve_matching(
    db: Database,
    flt: DlqFilter,
    *,
    reason: str | None = None,
    now: datetime,
    batch: int = 1000,
) -> int:
    """Resolve every matching row not resolved yet, a page per transaction; return count."""
    total = 0
    async for ids in iter_ids(db, flt.narrowed(("pending", "review", "ignored")), batch=batch):
        async with db.begin() as conn:
            total += len(await mark_resolved(conn, ids, now=now, reason=reason))
    return total


async def ignore_matching(
    db: Database, flt: DlqFilter, *, reason: str, now: datetime, batch: int = 1000
) -> int:
    """Ignore every matching pending or review row, a page per transaction; return count."""
    total = 0
    async for ids in iter_ids(db, flt.narrowed(("pending", "review")), batch=batch):
        async with db.begin() as conn:
            total += len(await mark_ignored(conn, ids, reason, now=now))
    return total


async def purge(db: Database, *, older_than: timedelta, now: datetime, batch: int = 5000) -> int:
    """Delete resolved and ignored rows closed before ``now - older_than``, ``batch`` rows
    per transaction; return how many. Pending and review rows are never deleted."""
    c = dead_letters.c
    cutoff = now - older_than
    closed_before = or_(
        c.resolved_at < cutoff, and_(c.resolved_at.is_(None), c.last_attempt_at < cutoff)
    )
    total = 0
    while True:
        victims = (
            select(c.id).where(c.status.in_(["resolved", "ignored"]), closed_before).limit(batch)
        )
        async with db.begin() as conn:
            res = await conn.execute(
                delete(dead_letters).where(c.id.in_(victims.scalar_subquery()))
            )
            n = res.rowcount or 0
        total += n
        if n < batch:
            return total


# --- the operator's pages of dead letters (the console) ----------------------------------
# Keyset pages and groups read at the cost of a page (see synckit.store.pages); the
# console reads dead letters through these, `synckit dlq list` through iter_rows above.


def _dlq_where(conn: AsyncConnection, flt: DlqFilter) -> list[Any]:
    """``flt``'s clauses, its states kept off SQLite's index choice: led by status,
    ``ix_dead_letters_status_last`` would yield every resolved row to be sorted by id
    (or grouped by tenant) where a walk in id (or tenant) order stops after a page."""
    clauses = dataclass_replace(flt, statuses=()).clauses()
    if flt.statuses:
        clauses.append(off_index(conn, dead_letters.c.status).in_(list(flt.statuses)))
    return clauses


async def dlq_page(
    db: Database, flt: DlqFilter, *, before_id: int | None = None, limit: int = 50
) -> Page[DeadLetter]:
    """Dead letters matching ``flt``, newest first, with ids below ``before_id``.

    Unfiltered, or by tenant (``ix_dead_letters_tenant_status``), a page reads its rows;
    any other filter is checked on the rows walked in id order, at most
    :data:`SCAN_WINDOW` of them below the cursor (``searched`` says which).
    """
    size = page_size(limit)
    d = dead_letters.c
    windowed = not flt.tenants and not flt.ids and not flt.is_empty
    async with db.read() as conn:
        floor, top = await scan_window(conn, dead_letters, before_id) if windowed else (None, 0)
        bounds = [d.id < before_id] if before_id is not None else []
        bounds += [d.id >= floor] if floor is not None else []
        stmt = (
            select(*_BASE_COLUMNS)
            .where(*_dlq_where(conn, flt), *bounds)
            .order_by(d.id.desc())
            .limit(size + 1)
        )
        rows = [DeadLetter.from_row(r) for r in await conn.execute(stmt)]
    return paged(rows, size, lambda r: r.id, floor, top)


@dataclass(frozen=True)
class DlqGroup:
    """Matching dead letters of one tenant and error class: how many, and how many of
    them last failed since the trend's start (the last 24 hours)."""

    tenant: str
    error_class: str
    count: int
    recent: int


async def dlq_groups(
    db: Database,
    flt: DlqFilter,
    *,
    after: str | None = None,
    tenants: int = 25,
    recent_since: datetime,
) -> Page[DlqGroup]:
    """Groups (tenant and error class) of the rows matching ``flt``, a page of tenants at a
    time by name after ``after``.

    Reads only the page's rows: the page's tenants by walking
    ``ix_dead_letters_tenant_status`` in tenant order, then their rows grouped. Largest
    first would read every matching row on each refresh; by name, a page costs what its
    rows cost however many dead letters there are.
    """
    d = dead_letters.c
    async with db.read() as conn:
        where = _dlq_where(conn, flt)
        names_stmt = (
            select(d.tenant).where(*where).group_by(d.tenant).order_by(d.tenant).limit(tenants + 1)
        )
        if after is not None:
            names_stmt = names_stmt.where(d.tenant > after)
        names = [str(t) for (t,) in await conn.execute(names_stmt)]
        more = len(names) > tenants
        names = names[:tenants]
        groups: list[DlqGroup] = []
        if names:
            recent = func.sum(case((d.last_attempt_at >= recent_since, 1), else_=0))
            rows = await conn.execute(
                select(d.tenant, d.error_class, func.count(), recent)
                .where(*where, d.tenant.in_(names))
                .group_by(d.tenant, d.error_class)
                .order_by(d.tenant, d.error_class)
            )
            groups = [DlqGroup(str(t), str(c), int(n), int(r or 0)) for t, c, n, r in rows]
    return Page(groups, names[-1] if more else None)


async def resolve_outbox_reviews(
    conn: AsyncConnection, message_ids: Sequence[str], *, now: datetime
) -> None:
    """Resolve the dead letters (in review) of outbox messages put back to pending: they
    are being handled, so the DLQ shows only what is open (store/outbox.py)."""
    await conn.execute(
        update(dead_letters)
        .where(
            dead_letters.c.tenant == "",
            dead_letters.c.connector == "outbox",
            dead_letters.c.record_id.in_(message_ids),
            dead_letters.c.status == "review",
        )
        .values(status="resolved", status_reason="outbox message retried", resolved_at=now)
    )
