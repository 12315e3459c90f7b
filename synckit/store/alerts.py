"""The operations on the alerts' rows: what the rules read, and the fired alerts.

Two families, both for :mod:`synckit.runtime.observe.alerts` (which holds the rules, the
:class:`~synckit.runtime.observe.alert_rules.Alert` type, the sinks and the routing):

* what the rules read besides the audit counts (:mod:`synckit.store.audit`): the
  connections with their last successful poll (:func:`load_connections`, also read by
  ``synckit status``), dead letters created per window (:func:`dlq_growth`) and waiting in
  review (:func:`dlq_in_review`);
* the ``alerts`` table, one row per rule, subject and window (``dedupe_key``, unique):
  :func:`claim_deliveries` records new alerts as undelivered and takes a delivery lease on
  them and on the earlier ones some sink has not taken (the one lease of
  :mod:`synckit.store.leases`), :func:`finish_deliveries` notes which sinks took them,
  fenced by that lease's token, :func:`recent_alerts` reads them by ``fired_at`` and
  :func:`prune_alerts` deletes finished ones. Rows travel as :class:`AlertRow`, plain
  values; the runtime turns them into alerts.

Rows are read with their JSON as text and their times guarded, both parsed per row, so
one row a hand edit broke never fails a read: an unreadable alert is finished with the
reason when a delivery would take it, and passed over by :func:`recent_alerts`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import (
    ARRAY,
    any_,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import Text

from synckit.store.connections import STATUS_COLUMNS
from synckit.store.leases import RELEASED, Lease, claim, fenced, free, new_lease, picked
from synckit.store.moments import from_row, guarded_moment, read_moment, read_payload
from synckit.store.tables import alerts as alerts_table
from synckit.store.tables import checkpoints, connections, dead_letters, dialect_insert, jobs

log = structlog.get_logger("synckit.alerts")

POLL_KIND = "synckit.poll"
#: The severities an alert row may hold (``synckit.runtime.observe.alert_rules.Severity``'s values).
SEVERITIES = ("info", "warning", "critical")


# --- what the rules read ----------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionState:
    """A tenant's connection as the rules see it."""

    tenant: str
    connector: str
    status: str
    schedule: str | None
    #: None when the stored value is not a timestamp (named in ``unreadable``).
    created_at: datetime | None
    last_success_at: datetime | None = None
    status_reason: str | None = None
    resource_key: str | None = None
    #: ``(field, reason)`` of what the tenant's rows hold that could not be read: a
    #: ``created_at`` that is not a timestamp, or a last success whose only stored times
    #: are not (a checkpoint's ``updated_at``, a poll job's ``finished_at``).
    unreadable: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class DlqGrowth:
    """Dead letters of one connector created in the last window and the one before."""

    connector: str
    current: int
    previous: int


@dataclass(frozen=True)
class ReviewGroup:
    """Dead letters waiting in review for one tenant, connector and error class."""

    tenant: str
    connector: str
    error_class: str
    count: int


def among(conn: AsyncConnection, column: Any, values: Sequence[str]) -> Any:
    """``column`` is one of ``values``, as one array parameter whatever their number."""
    if conn.dialect.name == "postgresql":
        return column == any_(bindparam("among", list(values), type_=_TEXT_ARRAY, unique=True))
    return column.in_(
        select(literal_column("value")).select_from(
            func.json_each(bindparam("among", json.dumps(list(values)), unique=True))
        )
    )


_TEXT_ARRAY = ARRAY(Text())


async def load_connections(
    conn: AsyncConnection,
    *,
    poll_kind: str = POLL_KIND,
    limit: int | None = None,
    after: str | None = None,
) -> list[ConnectionState]:
    """Connections by tenant name with their last successful poll (a checkpoint write or
    a poll job's success): every one, or one keyset page (``limit`` after ``after``),
    whose checkpoints and poll jobs alone are then read.

    A corrupt row is read, not fatal: timestamps come back guarded and are parsed per
    row, so a ``created_at`` that is not a timestamp is None and named in
    ``ConnectionState.unreadable``, and a last success counts only stored times that
    read (a newer one that does not is passed over)."""
    stmt = select(
        *STATUS_COLUMNS,
        connections.c.schedule,
        guarded_moment(connections.c.created_at),
    ).order_by(connections.c.tenant)
    if after is not None:
        stmt = stmt.where(connections.c.tenant > after)
    if limit is not None:
        stmt = stmt.limit(limit)
    rows = list(await conn.execute(stmt))
    if not rows:
        return []
    paged = limit is not None or after is not None
    # The newest readable time: a value no datetime holds is guarded to a marker older
    # than any real one, so MAX passes over it unless it is all there is.
    checkpoint_stmt = select(
        checkpoints.c.tenant,
        checkpoints.c.connector,
        func.max(guarded_moment(checkpoints.c.updated_at)),
    ).group_by(checkpoints.c.tenant, checkpoints.c.connector)
    poll_stmt = (
        select(jobs.c.resource_key, func.max(guarded_moment(jobs.c.finished_at)))
        .where(
            jobs.c.status == "succeeded",
            jobs.c.kind == poll_kind,
            jobs.c.resource_key.is_not(None),
        )
        .group_by(jobs.c.resource_key)
    )
    if paged:
        checkpoint_stmt = checkpoint_stmt.where(
            among(conn, checkpoints.c.tenant, [r.tenant for r in rows])
        )
        poll_stmt = poll_stmt.where(
            among(conn, jobs.c.resource_key, [r.resource_key for r in rows])
        )
    last_checkpoint = {(t, c): at for t, c, at in await conn.execute(checkpoint_stmt)}
    last_poll = {key: at for key, at in await conn.execute(poll_stmt)}
    return [_connection_state(r, last_checkpoint, last_poll) for r in rows]


def _connection_state(
    r: Any, last_checkpoint: dict[Any, Any], last_poll: dict[Any, Any]
) -> ConnectionState:
    """One connection row as read, its unreadable stored times named, not fatal."""
    bad: list[tuple[str, str]] = []
    try:
        created = read_moment(r.created_at)
    except ValueError as exc:
        created = None
        bad.append(("created_at", str(exc)))
    seen: list[datetime] = []
    unread: list[str] = []
    for stored in (last_checkpoint.get((r.tenant, r.connector)), last_poll.get(r.resource_key)):
        try:
            moment = read_moment(stored)
        except ValueError as exc:
            unread.append(str(exc))
            continue
        if moment is not None:
            seen.append(moment)
    if unread:
        bad.append(("last_success_at", unread[0]))
    return from_row(
        ConnectionState,
        r,
        created_at=created,
        last_success_at=max(seen) if seen else None,
        unreadable=tuple(bad),
    )


async def dlq_growth(conn: AsyncConnection, *, now: datetime, window: timedelta) -> list[DlqGrowth]:
    """Dead letters created per connector in ``[now - window, now]`` and the window before."""
    start, middle = now - 2 * window, now - window
    created = dead_letters.c.first_failed_at
    rows = await conn.execute(
        select(
            dead_letters.c.connector,
            func.sum(case((created >= middle, 1), else_=0)),
            func.sum(case((created < middle, 1), else_=0)),
        )
        # last_attempt_at >= first_failed_at, and it is the indexed one of the two.
        .where(created >= start, created <= now, dead_letters.c.last_attempt_at >= start)
        .group_by(dead_letters.c.connector)
    )
    return [DlqGrowth(c, int(cur or 0), int(prev or 0)) for c, cur, prev in rows]


async def dlq_in_review(conn: AsyncConnection) -> list[ReviewGroup]:
    """Dead letters in review, counted per tenant, connector and error class."""
    rows = await conn.execute(
        select(
            dead_letters.c.tenant,
            dead_letters.c.connector,
            dead_letters.c.error_class,
            func.count(),
        )
        .where(dead_letters.c.status == literal_column("'review'"))
        .group_by(dead_letters.c.tenant, dead_letters.c.connector, dead_letters.c.error_class)
    )
    return [ReviewGroup(t, c, e, int(n)) for t, c, e, n in rows]


# --- records of fired alerts (the ``alerts`` table) ---------------------------------------

#: How long an undelivered alert keeps being retried before it is given up (logged).
GIVE_UP_AFTER = timedelta(days=2)
#: How long one evaluator holds an alert it is delivering; past it, another retries.
DELIVERY_LEASE = timedelta(minutes=5)
#: How long a finished alert is kept: while it is, its rule, subject and window do not fire
#: again (a ``deploy_regression`` window is its version, so this is how long that lasts).
KEEP_ALERTS = timedelta(days=7)
# Rows per INSERT: far below either engine's limit on a statement's parameters.
_INSERT_BATCH = 500
# Deliveries retried per evaluation, oldest first; the rest wait for the next one.
_RETRY_BATCH = 500


@dataclass(frozen=True)
class AlertRow:
    """What an ``alerts`` row says of its alert (message and details as stored: redacted)."""

    rule: str
    subject: str
    window_key: str
    severity: str
    tenant: str | None
    connector: str | None
    message: str
    details: Mapping[str, Any]
    fired_at: datetime


@dataclass(frozen=True)
class StoredAlert:
    """An alert row taken for delivery: its id, what it says, and the sinks that took it
    (sink name to ISO time)."""

    id: int
    row: AlertRow
    delivered: Mapping[str, str]


@dataclass(frozen=True)
class Claimed:
    """What :func:`claim_deliveries` took: earlier alerts owed to some sink (by id) and the
    alerts it recorded for the first time, as ``(id, dedupe_key)`` in id order, all held
    under ``lease`` (give its token to :func:`finish_deliveries`)."""

    lease: Lease
    owed: list[StoredAlert] = field(default_factory=list)
    new: list[tuple[int, str]] = field(default_factory=list)


# What a read of ``alerts`` returns: JSON as text and the time guarded, both parsed per
# row (:func:`_read_row`), so that one row a hand edit broke never fails the read.
_ROW = (
    alerts_table.c.id,
    alerts_table.c.rule,
    alerts_table.c.subject,
    alerts_table.c.window_key,
    alerts_table.c.severity,
    alerts_table.c.tenant,
    alerts_table.c.connector,
    alerts_table.c.message,
    cast(alerts_table.c.details, Text).label("details"),
    guarded_moment(alerts_table.c.fired_at),
    cast(alerts_table.c.delivered, Text).label("delivered"),
)


def _read_row(row: Any) -> tuple[AlertRow, dict[str, str]]:
    """The alert a row of ``alerts`` holds and the sinks that took it, or ``ValueError``
    naming what cannot be read."""
    fired = read_moment(row.fired_at)
    if fired is None:
        raise ValueError("fired_at is empty")
    details = read_payload(row.details)
    if details is not None and not isinstance(details, Mapping):
        raise ValueError("details is not a JSON object")
    delivered = read_payload(row.delivered)
    if not isinstance(delivered, Mapping):
        raise ValueError("delivered is not a JSON object")
    if row.severity not in SEVERITIES:
        raise ValueError(f"{row.severity!r} is not a valid Severity")
    alert = from_row(AlertRow, row, details=dict(details or {}), fired_at=fired)
    return alert, {str(k): str(v) for k, v in delivered.items()}


def _new_row(key: str, alert: AlertRow, *, now: datetime, lease: Lease) -> dict[str, Any]:
    return {
        "dedupe_key": key,
        "rule": alert.rule,
        "subject": alert.subject,
        "window_key": alert.window_key,
        "severity": alert.severity,
        "tenant": alert.tenant,
        "connector": alert.connector,
        "message": alert.message,
        "details": dict(alert.details),
        "fired_at": alert.fired_at,
        "recorded_at": now,
        "delivered": {},
        "attempts": 0,
        **lease.values(),
    }


async def claim_deliveries(
    conn: AsyncConnection,
    new: Mapping[str, AlertRow],
    *,
    now: datetime,
    lease: timedelta = DELIVERY_LEASE,
    give_up_after: timedelta = GIVE_UP_AFTER,
) -> Claimed:
    """Record the alerts of ``new`` (by ``dedupe_key``) not recorded yet as undelivered,
    and take a delivery lease on them and on every earlier alert some sink has not
    taken. Nothing is marked delivered here; alerts owed for longer than
    ``give_up_after`` are finished (logged ``alert.delivery_given_up``), unreadable ones
    too (``alert.unreadable``).

    Safe under concurrent evaluators on either engine: the unique key decides which
    insert records an alert, and a retry takes only rows no other transaction holds
    (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite has one writer) and no live lease
    holds (:mod:`synckit.store.leases`: the rows are held under one fresh lease,
    ``Claimed.lease``).

    The inserts come first, before this transaction locks any row. On PostgreSQL an
    insert whose key is on a row another transaction has updated and not committed
    waits for that transaction. Inserting after taking the retries let two evaluators
    each wait for the other: each held the leases of its half of the owed alerts (the
    same alerts fire again every evaluation, so their keys are among those inserted)
    and waited on the other's half (``deadlock detected``). Inserting first, a
    transaction holds only rows nobody else can see while it may wait; the statements
    after the inserts never wait (``SKIP LOCKED``), so no cycle can form."""
    c = alerts_table.c
    out = Claimed(new_lease(lease, now=now))
    # In key order, so that two evaluators inserting the same new alerts wait for each
    # other in one order.
    keys = sorted(new)
    for start in range(0, len(keys), _INSERT_BATCH):
        batch = keys[start : start + _INSERT_BATCH]
        inserted = await conn.execute(
            _insert_new(conn)
            .values([_new_row(k, new[k], now=now, lease=out.lease) for k in batch])
            .returning(c.id, c.dedupe_key)
        )
        out.new.extend((int(rid), str(key)) for rid, key in sorted(inserted.all()))
    await _give_up_overdue(conn, now=now, give_up_after=give_up_after)
    unfinished = c.finished_at.is_(None)
    # The alerts inserted above are leased until now + lease: not taken again here.
    due = (
        select(c.id)
        .where(unfinished, free(alerts_table, now))
        .order_by(c.id)
        .limit(_RETRY_BATCH)
        .with_for_update(skip_locked=True)
    )
    taken = await conn.execute(
        claim(alerts_table, out.lease, picked(c.id, due), now=now).returning(*_ROW)
    )
    for row in sorted(taken.all(), key=lambda r: int(r.id)):
        try:
            alert, done = _read_row(row)
        except ValueError as exc:
            # A hand-edited row: nothing that can be delivered. Named, and not retried.
            log.error("alert.unreadable", id=row.id, error=str(exc))
            await conn.execute(
                update(alerts_table)
                .where(c.id == row.id)
                .values(finished_at=now, **RELEASED, last_error=f"unreadable: {exc}")
            )
            continue
        out.owed.append(StoredAlert(int(row.id), alert, done))
    return out


async def _give_up_overdue(
    conn: AsyncConnection, *, now: datetime, give_up_after: timedelta
) -> None:
    """Finish the alerts owed longer than ``give_up_after``, each logged
    ``alert.delivery_given_up``; a row another evaluator holds is given up at the next
    evaluation."""
    c = alerts_table.c
    overdue = (
        select(c.id)
        .where(c.finished_at.is_(None), c.recorded_at < now - give_up_after)
        .with_for_update(skip_locked=True)
    )
    stale = await conn.execute(
        update(alerts_table)
        .where(picked(c.id, overdue))
        .values(finished_at=now, **RELEASED)
        .returning(c.dedupe_key, c.last_error)
    )
    for key, error in stale:
        log.error("alert.delivery_given_up", record=key, error=error)


def _insert_new(conn: AsyncConnection) -> Any:
    """An INSERT into ``alerts`` that passes over a key already recorded."""
    return dialect_insert(conn)(alerts_table).on_conflict_do_nothing(
        index_elements=[alerts_table.c.dedupe_key]
    )


@dataclass(frozen=True)
class DeliveryOutcome:
    """What one delivery of a recorded alert came to: every sink that has it now (name to
    ISO time), whether that is all of them, and the sinks' errors if not."""

    record_id: int
    delivered: Mapping[str, str]
    complete: bool
    error: str | None = None


async def finish_deliveries(
    conn: AsyncConnection, outcomes: Sequence[DeliveryOutcome], *, now: datetime, token: str
) -> list[int]:
    """Note which sinks took each alert and finish the alerts every sink now has, on the
    rows the lease ``token`` still holds (``Claimed.lease``), releasing them. Returns the
    ids it could not note: another evaluator took them over once this lease ran out
    (logged ``alert.delivery_fenced``; the new holder's outcome stands)."""
    c = alerts_table.c
    lost: list[int] = []
    for o in outcomes:
        noted = await conn.execute(
            fenced(
                alerts_table,
                token,
                c.id == o.record_id,
                values={
                    "delivered": dict(o.delivered),
                    "finished_at": now if o.complete else None,
                    "attempts": c.attempts + 1,
                    "last_error": None if o.complete else (o.error or "")[:1000],
                },
            )
        )
        if noted.rowcount == 0:
            lost.append(o.record_id)
    if lost:
        log.warning("alert.delivery_fenced", ids=lost[:20], count=len(lost))
    return lost


async def recent_alerts(
    conn: AsyncConnection, *, since: datetime, limit: int = 100
) -> list[AlertRow]:
    """Alerts fired since ``since`` (delivered or still being delivered), newest first,
    read through ``ix_alerts_fired_at``; a row that cannot be read is passed over."""
    rows = await conn.execute(
        select(*_ROW)
        .where(alerts_table.c.fired_at >= since)
        .order_by(alerts_table.c.fired_at.desc(), alerts_table.c.id.desc())
        .limit(limit)
    )
    out: list[AlertRow] = []
    for row in rows:
        try:
            out.append(_read_row(row)[0])
        except ValueError:
            continue  # a hand-edited row must not break `synckit status` or the console
    return out


async def prune_alerts(conn: AsyncConnection, *, before: datetime, limit: int = 1000) -> int:
    """Delete up to ``limit`` finished alerts fired before ``before``; return how many.
    An alert still owed to a sink is kept (it is given up after :data:`GIVE_UP_AFTER`)."""
    c = alerts_table.c
    victims = select(c.id).where(c.fired_at < before, c.finished_at.is_not(None)).limit(limit)
    result = await conn.execute(delete(alerts_table).where(picked(c.id, victims)))
    return int(result.rowcount or 0)


__all__ = [
    "DELIVERY_LEASE",
    "GIVE_UP_AFTER",
    "KEEP_ALERTS",
    "POLL_KIND",
    "SEVERITIES",
    "AlertRow",
    "Claimed",
    "ConnectionState",
    "DeliveryOutcome",
    "DlqGrowth",
    "ReviewGroup",
    "StoredAlert",
    "among",
    "claim_deliveries",
    "dlq_growth",
    "dlq_in_review",
    "finish_deliveries",
    "load_connections",
    "prune_alerts",
    "recent_alerts",
]
