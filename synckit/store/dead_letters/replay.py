"""Replaying dead letters: due rows, the replay claim and every outcome written back.

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

Also here: the operators' bulk changes (resolve, ignore, purge) and the resolution of the
outbox's retried messages.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Row,
    and_,
    delete,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.errors.dlq_policy import (
    blocked_until,
)
from synckit.store import leases
from synckit.store.batches import delete_in_batches
from synckit.store.db import Database
from synckit.store.dead_letters.reads import iter_ids
from synckit.store.dead_letters.rows import (
    _BASE_COLUMNS,
    _MESSAGE_LIMIT,
    _REASON_LIMIT,
    _TRACEBACK_LIMIT,
    DeadLetter,
    DlqFilter,
    _appended,
    _clean,
    _history_entry,
    _returned,
)
from synckit.store.leases import Lease
from synckit.store.tables import connections, dead_letters, resources

#: How long rows of a tenant whose connection is not active (needs re-auth, paused) wait
#: before their connection is looked at again.
INACTIVE_WAIT = timedelta(minutes=15)
# Literals, not bound parameters: a planner can only use the partial index
# ix_dead_letters_due when the query's predicate visibly implies the index's.
_PENDING: Any = literal_column("'pending'")


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
        .where(leases.picked(dead_letters.c.id, ids), dead_letters.c.next_retry_at <= now)
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
        leases.picked(dead_letters.c.id, picked),
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


def _fenced(
    ids: Sequence[int], token: str | None, unleased: ColumnElement[bool] | None = None
) -> list[ColumnElement[bool]]:
    """Rows ``ids`` still held under ``token`` (fencing); without a token (an operator's
    change), those where ``unleased`` holds."""
    c = dead_letters.c
    cond: list[ColumnElement[bool]] = [c.id.in_(list(ids))]
    if token is not None:
        cond += [c.status == "pending", leases.held(dead_letters, token)]
    elif unleased is not None:
        cond.append(unleased)
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
    cond = _fenced(ids, token, dead_letters.c.status == "pending")
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
    cond = _fenced(ids, token, dead_letters.c.status != "resolved")
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
    cond = _fenced(ids, token, dead_letters.c.status.in_(list(from_statuses)))
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
            *(r.c[name] for name in _WAIT_COLUMNS),
            *(p.c[name].label(f"p_{name}") for name in _WAIT_COLUMNS),
        )
        .select_from(r.outerjoin(p, p.c.resource_key == r.c.parent_key))
        .where(r.c.resource_key.in_(unique))
    )
    out: dict[str, tuple[datetime, str]] = {}
    for row in rows:
        own, parent = _wait(row, "", now), _wait(row, "p_", now)
        candidates = [w for w in (own, parent) if w is not None]
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


_WAIT_COLUMNS = (
    "resource_key",
    "state",
    "cooldown_until",
    "next_available_at",
    "probe_job_id",
    "probe_expires_at",
)


def _wait(row: Row[Any], prefix: str, now: datetime) -> tuple[datetime, str] | None:
    """(until when, why) if the resource in ``row``'s columns named ``prefix`` + a name of
    :data:`_WAIT_COLUMNS` (the row's own, or its parent's: ``p_``) cannot be called now."""
    m = row._mapping
    if m[f"{prefix}resource_key"] is None:  # no parent
        return None
    state = m[f"{prefix}state"]
    until = blocked_until(
        state=state,
        cooldown_until=m[f"{prefix}cooldown_until"],
        next_available_at=m[f"{prefix}next_available_at"],
        probe_in_flight=m[f"{prefix}probe_job_id"] is not None,
        probe_expires_at=m[f"{prefix}probe_expires_at"],
        now=now,
    )
    if until is None:
        return None
    return until, f"resource {m[f'{prefix}resource_key']} {_why(state)}"


def _why(state: str | None) -> str:
    return {"open": "breaker open", "half_open": "breaker probing"}.get(state or "", "paced")


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

    async def change(conn: AsyncConnection, ids: list[int]) -> list[int]:
        return await mark_resolved(conn, ids, now=now, reason=reason)

    return await _page_by_page(db, flt.narrowed(("pending", "review", "ignored")), batch, change)


async def ignore_matching(
    db: Database, flt: DlqFilter, *, reason: str, now: datetime, batch: int = 1000
) -> int:
    """Ignore every matching pending or review row, a page per transaction; return count."""

    async def change(conn: AsyncConnection, ids: list[int]) -> list[int]:
        return await mark_ignored(conn, ids, reason, now=now)

    return await _page_by_page(db, flt.narrowed(("pending", "review")), batch, change)


async def _page_by_page(
    db: Database,
    flt: DlqFilter,
    batch: int,
    change: Callable[[AsyncConnection, list[int]], Awaitable[list[int]]],
) -> int:
    """``change`` the matching rows a page (of ids) per transaction; how many it changed."""
    total = 0
    async for ids in iter_ids(db, flt, batch=batch):
        async with db.begin() as conn:
            total += len(await change(conn, ids))
    return total


async def purge(db: Database, *, older_than: timedelta, now: datetime, batch: int = 5000) -> int:
    """Delete resolved and ignored rows closed before ``now - older_than``, ``batch`` rows
    per transaction; return how many. Pending and review rows are never deleted."""
    c = dead_letters.c
    cutoff = now - older_than
    closed_before = or_(
        c.resolved_at < cutoff, and_(c.resolved_at.is_(None), c.last_attempt_at < cutoff)
    )
    victims = select(c.id).where(c.status.in_(["resolved", "ignored"]), closed_before).limit(batch)
    stmt = delete(dead_letters).where(leases.picked(c.id, victims))
    return await delete_in_batches(db, stmt, batch)


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
