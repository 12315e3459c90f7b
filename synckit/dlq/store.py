"""The dead-letter queue's persistence: every SQL statement on ``dead_letters``, named.

One row per failed thing, keyed by ``(tenant, connector, kind, record_id)``: a record of a
stream (kind ``record:<stream>``) or a dead job (kind = the job's kind, record id
``job:<id>``). Statuses:

* ``pending`` — waiting for an automatic replay at ``next_retry_at``;
* ``review`` — a human must look (validation/authorization errors, replays exhausted);
* ``resolved`` — replayed successfully, or resolved by an operator;
* ``ignored`` — cannot or should not be replayed; ``status_reason`` says why.

**Leases.** A replay processor claims due rows by pushing ``next_retry_at`` forward to
the end of a lease and writing a lease marker (``replaying:<token>``) into
``status_reason``, in one short transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL;
SQLite serialises writers). The row stays ``pending``, so nothing else sees a state it
does not know, and is no longer due, so no other processor takes it. Every outcome is
written only where the marker still matches (fencing): a row re-captured, resolved or
ignored meanwhile keeps its newer state. A processor that dies leaves rows that simply
come due again when the lease ends. No transaction is held while a replay runs, so a
replay may itself write to the database, on SQLite too.

**Streaming.** Listing and bulk operations walk the table by keyset pagination on ``id``
(pages of ``batch`` rows, each page its own short read), so 100,000 matching rows are
never in memory at once and no long transaction pins the database.

**Corrupt JSON.** ``payload`` and ``history`` are read as text and parsed here; a value
that does not parse (possible in SQLite) shows up as :attr:`DeadLetter.payload_error`
instead of breaking the query that read it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import (
    ColumnElement,
    Row,
    Text,
    and_,
    delete,
    func,
    literal_column,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.dlq.policy import (
    BASE_DELAY,
    DEAD_CYCLES_REASON,
    DEAD_CYCLES_TO_PAUSE,
    REVIEW_CLASSES,
    blocked_until,
    dead_cycle_streak,
)
from synckit.errors.exceptions import SynckitError
from synckit.runtime.db import Database
from synckit.runtime.jobs import _insert
from synckit.runtime.logging import redact_text
from synckit.runtime.schema import connections, dead_letters, resources

__all__ = [
    "HISTORY_LIMIT",
    "INACTIVE_WAIT",
    "LEASE_PREFIX",
    "STATUSES",
    "Captured",
    "DeadLetter",
    "DeadLetterNotFound",
    "DlqError",
    "DlqFilter",
    "Failure",
    "GroupCount",
    "ReplayError",
    "capture",
    "capture_many",
    "claim_due",
    "claim_ids",
    "count",
    "dead_job_record_id",
    "defer",
    "due_rows",
    "get",
    "group_counts",
    "ignore_matching",
    "iter_ids",
    "iter_rows",
    "mark_ignored",
    "mark_resolved",
    "mark_review",
    "new_lease_marker",
    "purge",
    "resolve_matching",
    "resource_waits",
    "schedule_retry",
    "schedule_unscheduled",
]

Status = Literal["pending", "resolved", "ignored", "review"]
STATUSES: tuple[Status, ...] = ("pending", "resolved", "ignored", "review")
#: History keeps the most recent entries only, so a record failing for months stays small.
HISTORY_LIMIT = 20
#: ``status_reason`` of a pending row a replay processor holds: ``replaying:<token>``.
LEASE_PREFIX = "replaying:"
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


class DlqError(SynckitError):
    """A dead-letter operation was refused."""


class DeadLetterNotFound(DlqError):
    """No dead letter has the given id."""


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
    first_failed_at: datetime
    last_attempt_at: datetime
    next_retry_at: datetime | None
    resolved_at: datetime | None
    history: list[dict[str, Any]] = field(default_factory=list)
    traceback: str | None = None
    payload_error: str | None = None
    payload_raw: str | None = None

    @property
    def is_job(self) -> bool:
        """A dead job (record id ``job:<id>``) rather than a record of a stream."""
        return self.record_id.startswith("job:")

    @property
    def leased(self) -> bool:
        """Held by a replay processor right now (as of the time the row was read)."""
        return self.status == "pending" and (self.status_reason or "").startswith(LEASE_PREFIX)

    @classmethod
    def from_row(cls, r: Row[Any]) -> DeadLetter:
        m = r._mapping
        payload, payload_error = _parse_json(m["payload_text"])
        history, history_error = _parse_json(m["history_text"])
        if history_error is not None or not isinstance(history, list):
            history = []
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
            first_failed_at=m["first_failed_at"],
            last_attempt_at=m["last_attempt_at"],
            next_retry_at=m["next_retry_at"],
            resolved_at=m["resolved_at"],
            history=[h for h in history if isinstance(h, dict)],
            traceback=m.get("traceback"),
            payload_error=payload_error,
            payload_raw=m["payload_text"] if payload_error is not None else None,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: timestamps as ISO 8601, payload and history as stored."""
        data: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            data[name] = value.isoformat() if isinstance(value, datetime) else value
        if self.payload_error is None:
            del data["payload_error"], data["payload_raw"]
        return data


_BASE_COLUMNS: list[Any] = [
    dead_letters.c.id,
    dead_letters.c.tenant,
    dead_letters.c.connector,
    dead_letters.c.kind,
    dead_letters.c.record_id,
    dead_letters.c.job_id,
    dead_letters.c.resource_key,
    # As text, parsed by DeadLetter.from_row: corrupt JSON must not break the query.
    type_coerce(dead_letters.c.payload, Text).label("payload_text"),
    type_coerce(dead_letters.c.history, Text).label("history_text"),
    dead_letters.c.error_class,
    dead_letters.c.error_message,
    dead_letters.c.trace_id,
    dead_letters.c.attempt_count,
    dead_letters.c.replay_attempts,
    dead_letters.c.status,
    dead_letters.c.status_reason,
    dead_letters.c.first_failed_at,
    dead_letters.c.last_attempt_at,
    dead_letters.c.next_retry_at,
    dead_letters.c.resolved_at,
]
_FULL_COLUMNS: list[Any] = [*_BASE_COLUMNS, dead_letters.c.traceback]


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
            statuses=keep or ("\x00none",),
            since=self.since,
        )


# --- capture ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """One failure to capture (see :func:`capture`)."""

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


@dataclass(frozen=True)
class Captured:
    """What a capture did: the row's id, whether it is new, and its status now."""

    id: int
    created: bool
    status: str


def _storable(payload: Any) -> Any:
    """The payload as a JSON value both engines can store.

    A capture must never fail because of the record it captures (one bad record never
    stops a batch), so a value JSON cannot hold is kept as its ``repr`` under
    ``_unserialisable``: replay then finds a payload of the wrong shape and ignores the
    row with that reason, and an operator can still read what it was.
    """
    try:
        json.dumps(payload, allow_nan=False)
        return payload
    except (TypeError, ValueError, RecursionError) as exc:
        try:
            text = repr(payload)
        except Exception:  # a broken __repr__ must not break the capture
            text = f"<unprintable {type(payload).__name__}>"
        return {"_unserialisable": text[:10_000], "_error": str(exc)[:200]}


def _clean(text: str | None, limit: int, *, tail: bool = False) -> str | None:
    """Stored text: redacted first (a secret cut in half would escape the patterns), NULs
    dropped (PostgreSQL refuses them), then cut to ``limit``."""
    if text is None:
        return None
    text = redact_text(text).replace("\x00", "")
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


def _pause_after_dead_cycles(
    conn: Connection,
    streak: int,
    resource_key: str | None,
    record_id: str,
    message: str,
    now: datetime,
) -> None:
    """Pause the tenant's connection once its stream has died DEAD_CYCLES_TO_PAUSE
    cycles in a row; the ``dead_cycles`` alert rule announces it. In the capture's
    transaction, so the pause and the dead letter commit together."""
    if streak < DEAD_CYCLES_TO_PAUSE or not resource_key:
        return
    stream = record_id[len(_CYCLE_PREFIX) :]
    reason = (
        f"{DEAD_CYCLES_REASON} stream {stream} died {streak} cycles in a row; last: {message}"
    )[:500]
    conn.execute(
        update(connections)
        .where(connections.c.resource_key == resource_key, connections.c.status == "active")
        .values(status="paused", status_reason=reason, updated_at=now)
    )


def _history_entry(
    now: datetime, source: str, error_class: str, message: str, attempt: int
) -> dict[str, Any]:
    return {
        "at": now.isoformat(),
        "source": source,
        "error_class": error_class,
        "message": message[:_HISTORY_MESSAGE_LIMIT],
        "attempt": attempt,
    }


def _appended(history: Sequence[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [*history, entry][-HISTORY_LIMIT:]


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
) -> Captured:
    """Write a failure into the DLQ, in the caller's transaction (atomic with its writes).

    One row per ``(tenant, connector, kind, record_id)``. A new row is ``pending`` with its
    first replay at ``retry_at`` (default: one minute from ``now``), or ``review`` at once
    for validation and authorization errors. A repeat updates the same row: the error,
    payload and trace become the latest, ``attempt_count`` grows by ``attempts``,
    ``history`` gains an entry (the last :data:`HISTORY_LIMIT` are kept), and the row is
    open again (``pending``/``review``) with a fresh replay budget; a row an operator
    ``ignored`` stays ignored. A repeat also ends any lease a replay processor holds on
    the row, so the newer failure wins over that replay's outcome.

    ``resource_key`` names the resource (tenant connection) whose breaker gates replays.
    ``keep_replay_count`` keeps the replays already spent (a dead job that died again
    after being re-run by a replay: its budget must run out, not start over).
    """
    message = _clean(message or "", _MESSAGE_LIMIT) or ""
    traceback = _clean(traceback, _TRACEBACK_LIMIT, tail=True) if traceback else traceback
    if job_id is not None and record_id == f"job:{job_id}":
        record_id = dead_job_record_id(kind, payload, job_id)
    stored = _storable(payload)
    review = error_class in REVIEW_CLASSES
    status: Status = "review" if review else "pending"
    next_retry_at = None if review else (retry_at or now + BASE_DELAY)
    entry = _history_entry(now, "capture", error_class, message, 1)
    row = {
        "tenant": tenant,
        "connector": connector,
        "kind": kind,
        "record_id": record_id,
        "job_id": job_id,
        "resource_key": resource_key,
        "payload": stored,
        "error_class": error_class,
        "error_message": message,
        "traceback": traceback,
        "history": [entry],
        "trace_id": trace_id,
        "attempt_count": attempts,
        "replay_attempts": 0,
        "status": status,
        "status_reason": None,
        "first_failed_at": now,
        "last_attempt_at": now,
        "next_retry_at": next_retry_at,
        "resolved_at": None,
    }
    cycle = record_id.startswith(_CYCLE_PREFIX)
    if cycle:
        entry["streak"] = 1
    ins = _insert(conn)(dead_letters).values(**row).on_conflict_do_nothing(index_elements=_KEY)
    new_id = conn.execute(ins.returning(dead_letters.c.id)).scalar()
    if new_id is not None:
        if cycle:
            _pause_after_dead_cycles(conn, 1, resource_key, record_id, message, now)
        return Captured(int(new_id), True, status)
    # The row exists: lock it (PostgreSQL; SQLite's writer lock already covers it), then
    # merge. ON CONFLICT DO NOTHING waited for any concurrent insert of the key to commit.
    key = and_(*(dead_letters.c[k] == row[k] for k in _KEY))
    old = (
        conn.execute(
            select(
                dead_letters.c.id,
                dead_letters.c.status,
                dead_letters.c.attempt_count,
                type_coerce(dead_letters.c.history, Text).label("history_text"),
            )
            .where(key)
            .with_for_update()
        )
    ).one()
    history, _ = _parse_json(old.history_text)
    if not isinstance(history, list):
        history = []
    attempt_count = int(old.attempt_count) + attempts
    entry["attempt"] = attempt_count
    if cycle:
        last = history[-1] if history and isinstance(history[-1], dict) else {}
        entry["streak"] = dead_cycle_streak(old.status, last.get("streak"))
        _pause_after_dead_cycles(conn, entry["streak"], resource_key, record_id, message, now)
    values: dict[str, Any] = {
        "payload": stored,
        "error_class": error_class,
        "error_message": message,
        "traceback": traceback,
        "history": _appended([h for h in history if isinstance(h, dict)], entry),
        "trace_id": trace_id,
        "attempt_count": attempt_count,
        "last_attempt_at": now,
    }
    if job_id is not None:
        values["job_id"] = job_id
    if resource_key is not None:
        values["resource_key"] = resource_key
    if old.status == "ignored":
        status = "ignored"
    else:
        values.update(
            status=status,
            status_reason=None,
            next_retry_at=next_retry_at,
            resolved_at=None,
        )
        if not keep_replay_count:
            values["replay_attempts"] = 0
    conn.execute(update(dead_letters).where(dead_letters.c.id == old.id).values(**values))
    return Captured(int(old.id), False, status)


async def capture(conn: AsyncConnection, **kw: Any) -> Captured:
    """:func:`capture_sync` in the caller's async transaction."""
    return await conn.run_sync(lambda c: capture_sync(c, **kw))


async def capture_many(
    conn: AsyncConnection, failures: Sequence[Failure], *, now: datetime
) -> list[Captured]:
    """Capture several failures in the caller's transaction (a page's failures, say)."""
    out = []
    for f in failures:
        out.append(
            await capture(
                conn,
                tenant=f.tenant,
                connector=f.connector,
                kind=f.kind,
                record_id=f.record_id,
                payload=f.payload,
                error_class=f.error_class,
                message=f.message,
                traceback=f.traceback,
                trace_id=f.trace_id,
                job_id=f.job_id,
                resource_key=f.resource_key,
                attempts=f.attempts,
                now=now,
            )
        )
    return out


# --- due rows and leases ------------------------------------------------------------------


def new_lease_marker() -> str:
    """A fresh lease marker for one claim (``replaying:<random token>``)."""
    return f"{LEASE_PREFIX}{secrets.token_hex(8)}"


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
    conn: AsyncConnection, *, now: datetime, limit: int, lease_until: datetime, marker: str
) -> list[DeadLetter]:
    """Lease up to ``limit`` due pending rows (soonest first) to the holder of ``marker``.

    Leased rows stay ``pending`` with ``next_retry_at = lease_until`` (so no one else
    finds them due) and ``status_reason = marker``. Concurrent claimers never get the same
    row: PostgreSQL skips rows another claim has locked, SQLite runs claims one at a time.
    """
    picked = _soonest_pending(limit).with_for_update(skip_locked=True)
    stmt = (
        update(dead_letters)
        .where(dead_letters.c.id.in_(picked.scalar_subquery()), dead_letters.c.next_retry_at <= now)
        .values(next_retry_at=lease_until, status_reason=marker)
        .returning(*_BASE_COLUMNS)
    )
    rows = [DeadLetter.from_row(r) for r in await conn.execute(stmt)]
    return sorted(rows, key=lambda r: r.id)


async def claim_ids(
    conn: AsyncConnection,
    ids: Sequence[int],
    *,
    now: datetime,
    lease_until: datetime,
    marker: str,
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
    not_leased = or_(
        c.status != "pending",
        c.status_reason.is_(None),
        ~c.status_reason.startswith(LEASE_PREFIX),
        c.next_retry_at.is_(None),
        c.next_retry_at <= now,
    )
    stmt = (
        update(dead_letters)
        .where(c.id.in_(list(ids)), c.status.in_(list(statuses)), not_leased)
        .values(status="pending", next_retry_at=lease_until, status_reason=marker)
        .returning(*_BASE_COLUMNS)
    )
    rows = [DeadLetter.from_row(r) for r in await conn.execute(stmt)]
    return sorted(rows, key=lambda r: r.id)


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


def _fenced(ids: Sequence[int], marker: str | None) -> list[ColumnElement[bool]]:
    c = dead_letters.c
    cond: list[ColumnElement[bool]] = [c.id.in_(list(ids))]
    if marker is not None:
        cond += [c.status == "pending", c.status_reason == marker]
    return cond


async def _update_returning_ids(
    conn: AsyncConnection, cond: list[ColumnElement[bool]], values: dict[str, Any]
) -> list[int]:
    res = await conn.execute(
        update(dead_letters).where(*cond).values(**values).returning(dead_letters.c.id)
    )
    return [int(r[0]) for r in res]


async def defer(
    conn: AsyncConnection,
    ids: Sequence[int],
    *,
    until: datetime,
    reason: str,
    marker: str | None = None,
) -> list[int]:
    """Push pending rows to ``until`` without spending a replay attempt (resource waits)."""
    if not ids:
        return []
    cond = _fenced(ids, marker)
    if marker is None:
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
    marker: str | None = None,
    replayed: bool = False,
    next_retry_at: datetime | None = None,
) -> list[int]:
    """Mark rows resolved; return the ids changed.

    With ``marker``, only rows still held under that lease change (fencing). ``replayed``
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
    cond = _fenced(ids, marker)
    if marker is None:
        cond.append(dead_letters.c.status != "resolved")
    return await _update_returning_ids(conn, cond, values)


async def mark_ignored(
    conn: AsyncConnection,
    ids: Sequence[int],
    reason: str,
    *,
    now: datetime,
    marker: str | None = None,
    from_statuses: Sequence[str] = ("pending", "review"),
) -> list[int]:
    """Mark rows ignored with ``reason`` (kept in ``status_reason``); return the ids changed."""
    if not ids:
        return []
    cond = _fenced(ids, marker)
    if marker is None:
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
    marker: str | None = None,
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
    return bool(await _update_returning_ids(conn, _fenced([row.id], marker), values))


async def mark_review(
    conn: AsyncConnection,
    row: DeadLetter,
    reason: str,
    *,
    now: datetime,
    error: ReplayError | None = None,
    marker: str | None = None,
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
    return bool(await _update_returning_ids(conn, _fenced([row.id], marker), values))


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
            p.c.resource_key.label("p_key"),
            p.c.state.label("p_state"),
            p.c.cooldown_until.label("p_cooldown_until"),
            p.c.next_available_at.label("p_next_available_at"),
            p.c.probe_job_id.label("p_probe_job_id"),
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
    async with db.begin() as conn:
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
) -> AsyncIterator[DeadLetter]:
    """Stream matching rows in id order (``newest_first``: descending), ``batch`` at a time.

    Each page is a short read of its own (keyset pagination on ``id``), so memory stays
    at one page and rows written meanwhile are simply included or not. ``full`` adds the
    traceback.
    """
    c = dead_letters.c
    cols = _FULL_COLUMNS if full else _BASE_COLUMNS
    clauses = flt.clauses()
    last: int | None = None
    yielded = 0
    while limit is None or yielded < limit:
        size = batch if limit is None else min(batch, limit - yielded)
        stmt = select(*cols).where(*clauses)
        if last is not None:
            stmt = stmt.where(c.id < last if newest_first else c.id > last)
        stmt = stmt.order_by(c.id.desc() if newest_first else c.id).limit(size)
        async with db.begin() as conn:
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
        async with db.begin() as conn:
            page = [int(r[0]) for r in await conn.execute(stmt)]
        if page:
            yield page
        if len(page) < batch:
            return
        last = page[-1]


async def count(db: Database, flt: DlqFilter = DlqFilter()) -> int:
    """How many rows match."""
    async with db.begin() as conn:
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
    async with db.begin() as conn:
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
