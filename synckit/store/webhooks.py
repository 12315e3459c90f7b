"""Every SQL statement on the webhook inbox (``webhook_events``, ``webhook_refusals``,
``webhook_triggers``), named; the runtime side is :mod:`synckit.runtime.sync.webhooks`.

A verified delivery's events are inserted, with the job that processes them, in one
short transaction that commits before the provider gets its 2xx; an event id already
stored for that connector and tenant only counts a duplicate. Processing holds events
under the one lease (:mod:`synckit.store.leases`) and marks them processed with a fenced
write, so an event is processed once even when two workers look at it. Every function
takes a synchronous connection (run through :meth:`Database.write` or
:meth:`Database.run_read`): none of them does anything but SQL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, LargeBinary, Row, bindparam, func, select, text, update

from synckit.store import leases
from synckit.store.jobs.enqueueing import JobSpec, enqueue_new_sync
from synckit.store.leases import Lease
from synckit.store.tables import (
    dialect_insert,
    webhook_events,
    webhook_refusals,
    webhook_triggers,
)

__all__ = [
    "PENDING",
    "STATUSES",
    "Stored",
    "Verified",
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
    "store_verified",
    "webhook_counts",
]

PENDING, PROCESSED, FAILED, ORPHANED = "pending", "processed", "failed", "orphaned"
STATUSES = (PENDING, PROCESSED, FAILED, ORPHANED)


def _insert(conn: Connection) -> Any:
    return dialect_insert(conn)


#: The statements of a delivery's storing, built once (text with typed parameters: no
#: statement is compiled per delivery, as an ``insert().values(...)`` of each was).
_TS = webhook_events.c.received_at.type
_INSERT_EVENT: Any = text(
    "INSERT INTO webhook_events"
    " (connector, tenant, event_id, status, claimed, headers, body, duplicates, received_at)"
    " VALUES (:connector, :tenant, :event_id, :status, :claimed, :headers, :body, 0, :now)"
    " ON CONFLICT (connector, tenant, event_id) DO NOTHING RETURNING id"
).bindparams(
    bindparam("headers", type_=webhook_events.c.headers.type),
    bindparam("body", type_=LargeBinary()),
    bindparam("now", type_=_TS),
)
_COUNT_DUPLICATE: Any = text(
    "UPDATE webhook_events SET duplicates = duplicates + 1"
    " WHERE connector = :connector AND tenant = :tenant AND event_id = :event_id"
)
_PENDING_JOBS: Any = text(
    "SELECT unique_key FROM jobs WHERE unique_key IN :keys AND status = 'pending'"
).bindparams(bindparam("keys", expanding=True))
_CONFIG_IS: Any = text(
    "SELECT 1 FROM connections"
    " WHERE tenant = :tenant AND connector = :connector AND CAST(config AS TEXT) = :config"
)
# PostgreSQL: a group's deliveries in one statement. Each row is stored only while its
# tenant's config is still the text its delivery was verified with (the join); a stored
# event id counts the group's repeats of it as duplicates (one row per id in the
# statement: ON CONFLICT DO UPDATE may touch a row once). ``xmax = 0``: the row is new.
_PG_STORE_VERIFIED: Any = text(
    "WITH v AS (SELECT * FROM unnest(CAST(:connector AS text[]), CAST(:tenant AS text[]),"
    " CAST(:config AS text[]), CAST(:event_id AS text[]), CAST(:headers AS text[]),"
    " CAST(:body AS bytea[]), CAST(:repeats AS int[]), CAST(:now AS timestamptz[]))"
    " AS u(connector, tenant, config, event_id, headers, body, repeats, now)),"
    " ins AS (INSERT INTO webhook_events"
    " (connector, tenant, event_id, status, headers, body, duplicates, received_at)"
    " SELECT v.connector, v.tenant, v.event_id, 'pending', v.headers::jsonb, v.body,"
    " v.repeats, v.now FROM v JOIN connections c ON c.tenant = v.tenant"
    " AND c.connector = v.connector AND CAST(c.config AS text) = v.config"
    # One order in every group: two web processes' groups lock rows in the same order.
    " ORDER BY v.connector, v.tenant, v.event_id"
    " ON CONFLICT (connector, tenant, event_id) DO UPDATE"
    " SET duplicates = webhook_events.duplicates + excluded.duplicates + 1"
    " RETURNING connector, tenant, event_id, xmax = 0 AS new),"
    # And which of the processing jobs are pending already (no round trip of its own).
    " pending AS (SELECT coalesce(array_agg(unique_key), '{}') AS keys FROM jobs"
    " WHERE unique_key = ANY(CAST(:job_keys AS text[])) AND status = 'pending')"
    " SELECT ins.*, pending.keys AS pending FROM ins, pending"
)


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
    kept = dict(headers)
    for event_id, body in events:
        key = {"connector": connector, "tenant": tenant, "event_id": event_id}
        new = conn.execute(
            _INSERT_EVENT,
            {
                **key,
                "status": ORPHANED if orphan_of is not None else PENDING,
                "claimed": orphan_of,
                "headers": kept,
                "body": body,
                "now": now,
            },
        ).first()
        if new is not None:
            stored += 1
            continue
        duplicates += 1
        conn.execute(_COUNT_DUPLICATE, key)
    if stored and job is not None:
        _enqueue_unless_pending(conn, [job], now)
    return Stored(stored, duplicates)


def _enqueue_unless_pending(
    conn: Connection,
    jobs_: Sequence[JobSpec],
    now: datetime,
    pending: set[str | None] | None = None,
) -> None:
    # A job still pending takes these events when it runs. One that is running may
    # have looked already: enqueue_new then finds it (its unique key) and does
    # nothing either, and the sweep re-enqueues the tenant's pending events.
    # Checking first spares a flood's transactions the wait on each other's
    # uncommitted insert of the same unique key.
    if pending is None:
        keys = sorted({j.unique_key for j in jobs_ if j.unique_key is not None})
        pending = {r[0] for r in conn.execute(_PENDING_JOBS, {"keys": keys})}
    todo = {j.unique_key: j for j in jobs_ if j.unique_key not in pending}
    if todo:
        enqueue_new_sync(conn, [todo[k] for k in sorted(todo, key=str)], now)


@dataclass(frozen=True)
class Verified:
    """A delivery verified with the secret of its tenant's config as it was read
    (``config_text``, the stored text), to store while that config is unchanged."""

    connector: str
    tenant: str
    config_text: str
    events: tuple[tuple[str, bytes], ...]
    headers: Mapping[str, str]
    now: datetime
    job: JobSpec


def store_verified(conn: Connection, deliveries: Sequence[Verified]) -> list[Stored | None]:
    """Store each delivery as :func:`store_events` does, when its tenant's config is
    still the text it was verified with; None for one whose config changed or whose
    tenant is gone (verify it again). On PostgreSQL one statement stores them all."""
    if conn.dialect.name != "postgresql":
        out: list[Stored | None] = []
        for d in deliveries:
            params = {"tenant": d.tenant, "connector": d.connector, "config": d.config_text}
            if conn.execute(_CONFIG_IS, params).first() is None:
                out.append(None)
                continue
            out.append(
                store_events(
                    conn,
                    connector=d.connector,
                    tenant=d.tenant,
                    events=d.events,
                    headers=d.headers,
                    now=d.now,
                    job=d.job,
                )
            )
        return out
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    skip: set[int] = set()  # a repeat verified with another config text: alone, later
    for i, d in enumerate(deliveries):
        for event_id, body in d.events:
            row = rows.get((d.connector, d.tenant, event_id))
            if row is None:
                rows[(d.connector, d.tenant, event_id)] = {"d": d, "body": body, "repeats": 0}
            elif row["d"].config_text != d.config_text:
                skip.add(i)
            else:
                row["repeats"] += 1
    new: dict[tuple[str, str, str], bool] = {}
    pending: set[str | None] = set()
    if rows:
        cols: dict[str, list[Any]] = {
            k: [] for k in ("connector", "tenant", "config", "event_id", "headers", "body")
        }
        cols["repeats"], cols["now"] = [], []
        cols["job_keys"] = sorted({d.job.unique_key for d in deliveries if d.job.unique_key})
        for (connector, tenant, event_id), row in rows.items():
            d = row["d"]
            cols["connector"].append(connector)
            cols["tenant"].append(tenant)
            cols["config"].append(d.config_text)
            cols["event_id"].append(event_id)
            cols["headers"].append(json.dumps(dict(d.headers)))
            cols["body"].append(row["body"])
            cols["repeats"].append(row["repeats"])
            cols["now"].append(d.now)
        for r in conn.execute(_PG_STORE_VERIFIED, cols):
            new[(r.connector, r.tenant, r.event_id)] = bool(r.new)
            pending = set(r.pending)
    results: list[Stored | None] = []
    firsts: set[tuple[str, str, str]] = set()
    jobs_: list[JobSpec] = []
    for i, d in enumerate(deliveries):
        keys = [(d.connector, d.tenant, event_id) for event_id, _ in d.events]
        if i in skip or any(k not in new for k in keys):
            results.append(None)
            continue
        stored = 0
        for k in keys:
            if new[k] and k not in firsts:
                firsts.add(k)
                stored += 1
        results.append(Stored(stored, len(keys) - stored))
        if stored:
            jobs_.append(d.job)
    if jobs_:
        _enqueue_unless_pending(conn, jobs_, max(d.now for d in deliveries), pending)
    return results


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
        leases.picked(c.id, pick),
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
