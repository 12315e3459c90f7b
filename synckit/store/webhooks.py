"""Every SQL statement on the webhook inbox (``webhook_events``, ``webhook_refusals``,
``webhook_triggers``), named; the runtime side is :mod:`synckit.runtime.webhooks`.

A verified delivery's events are inserted, with the job that processes them, in one
short transaction that commits before the provider gets its 2xx; an event id already
stored for that connector and tenant only counts a duplicate. Processing holds events
under the one lease (:mod:`synckit.store.leases`) and marks them processed with a fenced
write, so an event is processed once even when two workers look at it. Every function
takes a synchronous connection (run through :meth:`Database.write` or
:meth:`Database.run_read`): none of them does anything but SQL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, func, select, update

from synckit.store import leases
from synckit.store.jobs import JobSpec, enqueue_new_sync
from synckit.store.leases import Lease
from synckit.store.tables import (
    dialect_insert,
    jobs,
    webhook_events,
    webhook_refusals,
    webhook_triggers,
)

__all__ = [
    "PENDING",
    "STATUSES",
    "Stored",
    "WebhookCounts",
    "claim_pending",
    "count_refusal",
    "event_row",
    "fail_events",
    "finish_events",
    "lock_triggers",
    "pending_owners",
    "recent_events",
    "requeue",
    "set_trigger",
    "store_events",
    "webhook_counts",
]

PENDING, PROCESSED, FAILED, ORPHANED = "pending", "processed", "failed", "orphaned"
STATUSES = (PENDING, PROCESSED, FAILED, ORPHANED)


def _insert(conn: Connection) -> Any:
    return dialect_insert(conn)


@dataclass(frozen=True)
class Stored:
    """What storing a delivery did: events new to the inbox, and duplicates counted."""

    stored: int
    duplicates: int


def store_events(
    conn: Connection,
    *,
    connector: str,
    tenant: str,
    events: Sequence[tuple[str, bytes]],
    headers: Mapping[str, str],
    now: datetime,
    orphan_of: str | None = None,
    job: JobSpec | None = None,
) -> Stored:
    """Insert each ``(event id, body)`` once per connector and tenant (an orphan's
    ``tenant`` is '' and ``orphan_of`` what it named); a stored id counts a duplicate.
    ``job`` (the processing job, with a unique key) is enqueued in the same transaction
    when anything new was stored."""
    stored = duplicates = 0
    ins = _insert(conn)
    c = webhook_events.c
    for event_id, body in events:
        new = conn.execute(
            ins(webhook_events)
            .values(
                connector=connector,
                tenant=tenant,
                event_id=event_id,
                status=ORPHANED if orphan_of is not None else PENDING,
                claimed=orphan_of,
                headers=dict(headers),
                body=body,
                received_at=now,
            )
            .on_conflict_do_nothing(index_elements=["connector", "tenant", "event_id"])
            .returning(c.id)
        ).first()
        if new is not None:
            stored += 1
            continue
        duplicates += 1
        conn.execute(
            update(webhook_events)
            .where(c.connector == connector, c.tenant == tenant, c.event_id == event_id)
            .values(duplicates=c.duplicates + 1)
        )
    if stored and job is not None and not _pending(conn, job.unique_key):
        # A job still pending takes these events when it runs. One that is running may
        # have looked already: enqueue_new then finds it (its unique key) and does
        # nothing either, and the sweep re-enqueues the tenant's pending events.
        # Checking first spares a flood's transactions the wait on each other's
        # uncommitted insert of the same unique key.
        enqueue_new_sync(conn, [job], now)
    return Stored(stored, duplicates)


def _pending(conn: Connection, unique_key: str | None) -> bool:
    found = conn.execute(
        select(jobs.c.id).where(jobs.c.unique_key == unique_key, jobs.c.status == "pending")
    ).first()
    return found is not None


def count_refusal(
    conn: Connection, *, connector: str, tenant: str, reason: str, now: datetime
) -> None:
    """Count one refused delivery of ``connector`` for ``tenant`` ('' if none named)."""
    ins = _insert(conn)
    stmt = ins(webhook_refusals).values(
        connector=connector, tenant=tenant, count=1, last_reason=reason[:500], last_at=now
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["connector", "tenant"],
            set_={
                "count": webhook_refusals.c.count + 1,
                "last_reason": stmt.excluded.last_reason,
                "last_at": stmt.excluded.last_at,
            },
        )
    )


def claim_pending(
    conn: Connection, *, connector: str, tenant: str, lease: Lease, now: datetime, limit: int
) -> list[Row[Any]]:
    """Take up to ``limit`` pending events of the tenant no lease holds, oldest first."""
    c = webhook_events.c
    pick = (
        select(c.id)
        .where(c.status == PENDING, c.tenant == tenant, c.connector == connector)
        .where(leases.free(webhook_events, now))
        .order_by(c.id)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        pick = pick.with_for_update(skip_locked=True)
    stmt = leases.claim(
        webhook_events,
        lease,
        c.id.in_(pick.scalar_subquery()),
        c.status == PENDING,
        now=now,
        values={"attempts": c.attempts + 1},
    ).returning(*webhook_events.c)
    return sorted(conn.execute(stmt).all(), key=lambda r: r.id)


def finish_events(conn: Connection, ids: Sequence[int], token: str, now: datetime) -> list[int]:
    """Mark the events still held under ``token`` processed; the ids that were."""
    stmt = leases.fenced(
        webhook_events,
        token,
        webhook_events.c.id.in_(list(ids)),
        values={"status": PROCESSED, "processed_at": now, "last_error": None},
    ).returning(webhook_events.c.id)
    return [r[0] for r in conn.execute(stmt)]


def fail_events(
    conn: Connection, ids: Sequence[int], token: str, error: str, *, give_up: bool
) -> list[int]:
    """Release the events held under ``token`` with ``error``: pending again, or
    ``failed`` (an operator's to look at) when ``give_up``."""
    values: dict[str, Any] = {"last_error": error[:2000]}
    if give_up:
        values["status"] = FAILED
    stmt = leases.fenced(
        webhook_events, token, webhook_events.c.id.in_(list(ids)), values=values
    ).returning(webhook_events.c.id)
    return [r[0] for r in conn.execute(stmt)]


def lock_triggers(conn: Connection, tenant: str, streams: Sequence[str]) -> dict[str, datetime]:
    """When events last triggered each of ``streams`` of ``tenant`` (locked until the
    transaction ends on PostgreSQL; SQLite's writer is alone anyway)."""
    t = webhook_triggers.c
    stmt = select(t.stream, t.last_at).where(t.tenant == tenant, t.stream.in_(list(streams)))
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return {r.stream: r.last_at for r in conn.execute(stmt)}


def set_trigger(conn: Connection, tenant: str, stream: str, at: datetime) -> None:
    """Record that events triggered ``stream`` of ``tenant`` for ``at``."""
    stmt = _insert(conn)(webhook_triggers).values(tenant=tenant, stream=stream, last_at=at)
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["tenant", "stream"], set_={"last_at": stmt.excluded.last_at}
        )
    )


def pending_owners(conn: Connection, now: datetime, limit: int = 500) -> list[tuple[str, str]]:
    """(connector, tenant) of pending events no lease holds: what the sweep re-enqueues."""
    c = webhook_events.c
    stmt = (
        select(c.connector, c.tenant)
        .where(c.status == PENDING, leases.free(webhook_events, now))
        .group_by(c.connector, c.tenant)
        .order_by(c.connector, c.tenant)
        .limit(limit)
    )
    return [(r.connector, r.tenant) for r in conn.execute(stmt)]


@dataclass(frozen=True)
class WebhookCounts:
    """One connector and tenant's inbox, counted."""

    connector: str
    tenant: str
    received: int = 0
    duplicates: int = 0
    refused: int = 0
    orphaned: int = 0
    pending: int = 0
    processed: int = 0
    failed: int = 0


def webhook_counts(conn: Connection) -> list[WebhookCounts]:
    """Counts per connector and tenant (orphans and refusals naming none under '')."""
    c = webhook_events.c
    rows = conn.execute(
        select(
            c.connector,
            c.tenant,
            c.status,
            func.count().label("n"),
            func.coalesce(func.sum(c.duplicates), 0).label("dups"),
        ).group_by(c.connector, c.tenant, c.status)
    ).all()
    out: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        d = out.setdefault((r.connector, r.tenant), {})
        d["received"] = d.get("received", 0) + int(r.n)
        d["duplicates"] = d.get("duplicates", 0) + int(r.dups)
        d[r.status if r.status in (PENDING, PROCESSED, FAILED, ORPHANED) else FAILED] = int(r.n)
    for r in conn.execute(select(webhook_refusals)):
        out.setdefault((r.connector, r.tenant), {})["refused"] = int(r._mapping["count"])
    return [WebhookCounts(k[0], k[1], **v) for k, v in sorted(out.items())]


def event_row(conn: Connection, event: int) -> Row[Any] | None:
    """One stored event by its inbox id."""
    return conn.execute(select(webhook_events).where(webhook_events.c.id == event)).first()


def recent_events(
    conn: Connection,
    *,
    tenant: str | None = None,
    limit: int = 50,
    connector: str | None = None,
    status: str | None = None,
) -> list[Row[Any]]:
    """The newest stored events (without bodies), optionally of one tenant, connector
    and/or status."""
    c = webhook_events.c
    stmt = (
        select(
            c.id,
            c.connector,
            c.tenant,
            c.event_id,
            c.status,
            c.claimed,
            c.duplicates,
            c.attempts,
            c.last_error,
            c.received_at,
            c.processed_at,
        )
        .order_by(c.id.desc())
        .limit(limit)
    )
    if tenant is not None:
        stmt = stmt.where(c.tenant == tenant)
    if connector is not None:
        stmt = stmt.where(c.connector == connector)
    if status is not None:
        stmt = stmt.where(c.status == status)
    return list(conn.execute(stmt).all())


def requeue(conn: Connection, event: int, job: JobSpec, now: datetime) -> bool:
    """Put a stored event (processed or failed) back to pending with its processing job;
    False if there is no such event or it is an orphan (no tenant to process it for)."""
    c = webhook_events.c
    done = conn.execute(
        update(webhook_events)
        .where(c.id == event, c.tenant != "", c.status != ORPHANED)
        .values(status=PENDING, attempts=0, last_error=None, processed_at=None, **leases.RELEASED)
        .returning(c.id)
    ).first()
    if done is None:
        return False
    enqueue_new_sync(conn, [job], now)
    return True
