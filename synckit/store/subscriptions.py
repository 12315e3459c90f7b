"""Every SQL statement on ``webhook_subscriptions``, named; the runtime side is
:mod:`synckit.runtime.sync.subscriptions`.

One row per tenant and subscribed stream: the provider's subscription id, its expiry,
its state (``pending``, ``active``, ``lapsed``, ``failed``) and ``next_at``, when the
runtime acts on it next. The sweep inserts the rows of active tenants that have none
(``add_missing``), finds the due ones and those of tenants no longer active; the
subscription job reads one row, calls the provider with no transaction open, and writes
what happened (``record_active``, ``record_failure``, ``delete``). Every function takes a
synchronous connection (run through :meth:`Database.write` or :meth:`Database.run_read`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, func, literal, literal_column, or_, select, update
from sqlalchemy import delete as sql_delete

from synckit.store.moments import MOMENT_HI, from_row, guarded_columns, read_moments
from synckit.store.tables import connections, dialect_insert, webhook_subscriptions

__all__ = [
    "SubscriptionRow",
    "add_missing",
    "delete",
    "due",
    "get",
    "list_subscriptions",
    "not_active",
    "record_active",
    "record_failure",
    "state_counts",
]

_S = webhook_subscriptions.c


@dataclass(frozen=True)
class SubscriptionRow:
    """One subscription as stored (``tenant_status``: its tenant's connection status)."""

    tenant: str
    stream: str
    connector: str
    subscription_id: str | None
    state: str
    expires_at: datetime | None
    renewed_at: datetime | None
    next_at: datetime | None
    failures: int
    last_error: str | None
    last_error_class: str | None
    updated_at: datetime | None
    tenant_status: str | None = None
    #: ``(column, reason)`` of each stored timestamp that could not be read (it reads as
    #: None): a corrupt row holds only itself, and the job's next write replaces it.
    unreadable: tuple[tuple[str, str], ...] = ()


_MOMENTS = ("expires_at", "renewed_at", "next_at", "updated_at")


def _row(r: Any) -> SubscriptionRow:
    m = r._mapping
    bad: dict[str, str] = {}
    moments = read_moments(m, _MOMENTS, bad)
    return from_row(
        SubscriptionRow,
        r,
        failures=int(m["failures"]),
        tenant_status=m.get("tenant_status"),
        unreadable=tuple(bad.items()),
        **moments,
    )


def _select() -> Any:
    return select(
        *guarded_columns(webhook_subscriptions.c), connections.c.status.label("tenant_status")
    ).join(connections, connections.c.tenant == _S.tenant)


def add_missing(
    conn: Connection, *, connector: str, stream: str, now: datetime, limit: int = 500
) -> int:
    """Insert a ``pending`` row, due now, for up to ``limit`` active tenants of
    ``connector`` that have none for ``stream``; how many were inserted."""
    c = connections.c
    lacking = (
        select(
            c.tenant,
            literal(stream).label("stream"),
            c.connector,
            literal("pending").label("state"),
            literal(now, webhook_subscriptions.c.next_at.type).label("next_at"),
            literal(now, webhook_subscriptions.c.created_at.type).label("created_at"),
            literal(now, webhook_subscriptions.c.updated_at.type).label("updated_at"),
        )
        .where(c.connector == connector, c.status == "active")
        .where(~select(_S.tenant).where(_S.tenant == c.tenant, _S.stream == stream).exists())
        .order_by(c.tenant)
        .limit(limit)
    )
    stmt = (
        dialect_insert(conn)(webhook_subscriptions)
        .from_select(
            ["tenant", "stream", "connector", "state", "next_at", "created_at", "updated_at"],
            lacking,
        )
        .on_conflict_do_nothing(index_elements=["tenant", "stream"])
    )
    return int(conn.execute(stmt).rowcount or 0)


def due(
    conn: Connection, now: datetime, connectors: Sequence[str], limit: int = 500
) -> list[tuple[str, str, str]]:
    """(tenant, connector, stream) of the rows of ``connectors`` due by ``now``, soonest
    first."""
    # A stored next_at no datetime can hold (past any time) is due too, so the job reads
    # the row and its next write replaces it; a corrupt row never silently lapses.
    stmt = (
        select(_S.tenant, _S.connector, _S.stream)
        .where(
            or_(_S.next_at <= now, _S.next_at > literal_column(MOMENT_HI)),
            _S.connector.in_(list(connectors)),
        )
        .order_by(_S.next_at)
        .limit(limit)
    )
    return [(r.tenant, r.connector, r.stream) for r in conn.execute(stmt)]


def not_active(
    conn: Connection, connectors: Sequence[str], limit: int = 500
) -> list[tuple[str, str, str]]:
    """(tenant, connector, stream) of the rows of ``connectors`` whose tenant is no longer
    active (paused, re-authorising): their subscriptions are to be deleted."""
    stmt = (
        select(_S.tenant, _S.connector, _S.stream)
        .join(connections, connections.c.tenant == _S.tenant)
        .where(connections.c.status != "active", _S.connector.in_(list(connectors)))
        .order_by(_S.tenant, _S.stream)
        .limit(limit)
    )
    return [(r.tenant, r.connector, r.stream) for r in conn.execute(stmt)]


def get(conn: Connection, tenant: str, stream: str) -> SubscriptionRow | None:
    """One row with its tenant's status, or None."""
    r = conn.execute(_select().where(_S.tenant == tenant, _S.stream == stream)).first()
    return _row(r) if r is not None else None


def record_active(
    conn: Connection,
    *,
    tenant: str,
    stream: str,
    subscription_id: str,
    expires_at: datetime,
    next_at: datetime,
    now: datetime,
) -> bool:
    """The subscription was created or renewed at ``now``: active, failures cleared.
    False if the row is gone (its tenant was removed meanwhile)."""
    done = conn.execute(
        update(webhook_subscriptions)
        .where(_S.tenant == tenant, _S.stream == stream)
        .values(
            subscription_id=subscription_id[:500],
            state="active",
            expires_at=expires_at,
            renewed_at=now,
            next_at=next_at,
            failures=0,
            last_error=None,
            last_error_class=None,
            updated_at=now,
        )
        .returning(_S.tenant)
    ).first()
    return done is not None


def record_failure(
    conn: Connection,
    *,
    tenant: str,
    stream: str,
    state: str,
    failures: int,
    next_at: datetime,
    error: str,
    error_class: str,
    now: datetime,
    forget_id: bool = False,
) -> bool:
    """A create or renewal failed: the state and retry time decided, the error kept
    (``forget_id``: the provider no longer knows the stored id). False if the row is
    gone."""
    values: dict[str, Any] = {
        "state": state,
        "failures": failures,
        "next_at": next_at,
        "last_error": error[:2000],
        "last_error_class": error_class[:64],
        "updated_at": now,
    }
    if forget_id:
        values |= {"subscription_id": None, "expires_at": None}
    done = conn.execute(
        update(webhook_subscriptions)
        .where(_S.tenant == tenant, _S.stream == stream)
        .values(**values)
        .returning(_S.tenant)
    ).first()
    return done is not None


def delete(conn: Connection, tenant: str, stream: str) -> bool:
    """Forget the tenant's subscription for ``stream``; False if there was none."""
    done = conn.execute(
        sql_delete(webhook_subscriptions)
        .where(_S.tenant == tenant, _S.stream == stream)
        .returning(_S.tenant)
    ).first()
    return done is not None


def list_subscriptions(
    conn: Connection,
    *,
    tenants: Sequence[str] | None = None,
    states: Sequence[str] | None = None,
    limit: int = 200,
) -> list[SubscriptionRow]:
    """Rows by tenant and stream, optionally of some tenants and/or states."""
    stmt = _select().order_by(_S.tenant, _S.stream).limit(limit)
    conds = []
    if tenants is not None:
        conds.append(_S.tenant.in_(list(tenants)))
    if states is not None:
        conds.append(_S.state.in_(list(states)))
    if conds:
        stmt = stmt.where(and_(*conds))
    return [_row(r) for r in conn.execute(stmt)]


def state_counts(conn: Connection) -> dict[str, int]:
    """Subscriptions counted by state."""
    stmt = select(_S.state, func.count().label("n")).group_by(_S.state)
    return {r.state: int(r.n) for r in conn.execute(stmt)}
