"""What ``synckit status`` reports: a read-only snapshot of the runtime's tables.

At scale it pages: counts of tenants by status and of breakers by state are summed in
SQL, and only one page of tenants (by name, after a keyset cursor) is read in full. The
alert rules are evaluated on the spot up to ``ALERTS_ON_THE_SPOT`` tenants (they read
every tenant); beyond, the alerts the worker delivered are shown.

Per tenant: connection status, breaker state, next available time, last successful
poll and lag, error budget over the budget window, dead letters. Then queue depth by
kind and status, and alerts: those the rules call for right now (evaluated on the spot,
without delivering anything) and those fired recently (the ``alerts`` table, see
:mod:`synckit.runtime.alerts`).

The small named reads (:func:`queue_depth`, :func:`dead_letter_counts`,
:func:`breaker_states`) are shared with the metrics collector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.clock import utcnow
from synckit.runtime.alerts import (
    Alert,
    ConnectionState,
    RuleSet,
    among,
    load_alert_data,
    load_connections,
    recent_alerts,
)
from synckit.runtime.audit import Totals, totals_by_tenant, window_start
from synckit.runtime.budget import BudgetPolicy
from synckit.runtime.tenants import CONNECTION_STATUSES
from synckit.runtime.unreadable_jobs import (
    StuckJob,
    count_unreadable_run_at,
    unreadable_run_at,
)
from synckit.store.db import Database
from synckit.store.jobs import guarded_moment
from synckit.store.resources import BREAKER_STATES, read_moments
from synckit.store.tables import (
    audit_buckets,
    connections,
    dead_letters,
    jobs,
    outbox,
    resources,
)


@dataclass(frozen=True)
class TenantStatus:
    tenant: str
    connector: str
    status: str
    breaker: str
    next_available_at: datetime | None
    dlq_pending: int
    dlq_review: int = 0
    status_reason: str | None = None
    schedule: str | None = None
    last_success_at: datetime | None = None
    #: Seconds since the last successful poll (None: never polled successfully).
    lag_seconds: float | None = None
    #: Final outcomes in the budget window.
    ok: int = 0
    failed: int = 0
    error_rate: float = 0.0
    #: Error rate / budget: 1.0 is 100% of the budget.
    budget_burn: float = 0.0
    budget_level: str = "healthy"
    consecutive_failures: int = 0
    last_error_class: str | None = None
    #: ``(field, reason)`` of what the tenant's rows hold that could not be read: an
    #: unknown status or breaker state (shown as stored, marked), a corrupt timestamp.
    unreadable: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Status:
    database: str
    queue: dict[str, dict[str, int]] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)
    outbox_pending: int = 0
    tenants: list[TenantStatus] = field(default_factory=list)
    generated_at: datetime | None = None
    budget: float = 0.005
    budget_window_seconds: float = 86400.0
    #: What the alert rules call for now (evaluated at status time, not de-duplicated).
    alerts_firing: list[Alert] = field(default_factory=list)
    #: Alerts delivered in the last day, newest first.
    alerts_recent: list[Alert] = field(default_factory=list)
    #: Every tenant (connections row) by status, and resources by breaker state.
    tenants_by_status: dict[str, int] = field(default_factory=dict)
    breakers_by_state: dict[str, int] = field(default_factory=dict)
    #: The cursor of the next page of tenants (None: this was the last).
    next_after: str | None = None
    #: False when there were too many tenants to evaluate the alert rules on the spot.
    alerts_evaluated: bool = True
    #: Pending jobs whose ``run_at`` cannot be read (they never run), and the first few.
    unreadable_jobs: int = 0
    stuck_jobs: list[StuckJob] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["alerts_firing"] = [a.to_json() for a in self.alerts_firing]
        data["alerts_recent"] = [a.to_json() for a in self.alerts_recent]
        for t in data["tenants"]:
            if t["unreadable"]:
                t["unreadable"] = dict(t["unreadable"])
            else:
                del t["unreadable"]
        jsonable: dict[str, Any] = _jsonable(data)
        return jsonable


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


# --- named reads ------------------------------------------------------------------------


async def queue_depth(
    conn: AsyncConnection, *, statuses: tuple[str, ...] | None = None
) -> dict[str, dict[str, int]]:
    """Job counts by kind, then status."""
    stmt = select(jobs.c.kind, jobs.c.status, func.count()).group_by(jobs.c.kind, jobs.c.status)
    if statuses is not None:
        stmt = stmt.where(jobs.c.status.in_(statuses))
    out: dict[str, dict[str, int]] = {}
    for kind, status, count in await conn.execute(stmt):
        out.setdefault(kind, {})[status] = int(count)
    return out


async def dead_letter_counts(
    conn: AsyncConnection, *, tenants: Sequence[str] | None = None
) -> dict[tuple[str, str, str], int]:
    """Dead letters by ``(tenant, connector, status)`` (of ``tenants`` only, if given)."""
    stmt = select(
        dead_letters.c.tenant, dead_letters.c.connector, dead_letters.c.status, func.count()
    ).group_by(dead_letters.c.tenant, dead_letters.c.connector, dead_letters.c.status)
    if tenants is not None:
        stmt = stmt.where(among(conn, dead_letters.c.tenant, tenants))
    rows = await conn.execute(stmt)
    return {(t, c, s): int(n) for t, c, s, n in rows}


async def dead_letter_totals(conn: AsyncConnection) -> dict[str, int]:
    """Dead letters by status."""
    rows = await conn.execute(
        select(dead_letters.c.status, func.count()).group_by(dead_letters.c.status)
    )
    return {s: int(n) for s, n in rows}


@dataclass(frozen=True)
class BreakerInfo:
    resource_key: str
    state: str
    next_available_at: datetime | None
    consecutive_failures: int
    last_error_class: str | None
    #: ``(column, reason)`` of what a corrupt row holds (see ResourceInfo.unreadable).
    unreadable: tuple[tuple[str, str], ...] = ()


async def breaker_states(
    conn: AsyncConnection, *, keys: Sequence[str] | None = None
) -> dict[str, BreakerInfo]:
    """Every resource's breaker (of ``keys`` only, if given), by resource key."""
    stmt = select(
        resources.c.resource_key,
        resources.c.state,
        # Guarded in SQL: a value no datetime holds fails the driver's fetch otherwise.
        guarded_moment(resources.c.next_available_at),
        resources.c.consecutive_failures,
        resources.c.last_error_class,
    )
    if keys is not None:
        stmt = stmt.where(among(conn, resources.c.resource_key, keys))
    out: dict[str, BreakerInfo] = {}
    for r in await conn.execute(stmt):
        # Read as text and parsed here: one corrupt row must not fail the whole report.
        moments, bad = read_moments(r._mapping, ("next_available_at",))
        if r.state not in BREAKER_STATES:
            bad += (("state", f"unknown state {str(r.state)[:60]!r}"),)
        out[r.resource_key] = BreakerInfo(
            r.resource_key,
            r.state,
            moments["next_available_at"],
            r.consecutive_failures,
            r.last_error_class,
            bad,
        )
    return out


# --- the snapshot -----------------------------------------------------------------------


#: Up to this many tenants, ``read_status`` evaluates the alert rules on the spot.
ALERTS_ON_THE_SPOT = 10_000
#: How many of the jobs that never run (unreadable ``run_at``) a status names.
STUCK_SHOWN = 10


async def read_status(
    db: Database,
    *,
    now: datetime | None = None,
    budget: BudgetPolicy | None = None,
    rules: RuleSet | None = None,
    alerts_since: timedelta = timedelta(hours=24),
    limit: int | None = None,
    after: str | None = None,
) -> Status:
    """Tenants' health, queue depth by kind and status, dead letters, the outbox, alerts.

    ``limit`` reads one page of tenants (by name, after the tenant ``after``) and
    ``next_after`` names the next; without it every tenant is read, with the tenants
    that have outcomes or dead letters but no connection.
    """
    now = now or utcnow()
    budget = budget or BudgetPolicy()
    rules = rules or RuleSet()
    async with db.begin() as conn:
        queue = await queue_depth(conn)
        dlq = await dead_letter_totals(conn)
        outbox_pending = (
            await conn.execute(
                select(func.count()).select_from(outbox).where(outbox.c.status == "pending")
            )
        ).scalar_one()
        by_status = {
            st: int(n)
            for st, n in await conn.execute(
                select(connections.c.status, func.count()).group_by(connections.c.status)
            )
        }
        by_state = {
            st: int(n)
            for st, n in await conn.execute(
                select(resources.c.state, func.count()).group_by(resources.c.state)
            )
        }
        evaluate = sum(by_status.values()) <= ALERTS_ON_THE_SPOT
        data = await load_alert_data(conn, now=now, rules=rules) if evaluate else None
        since = window_start(now, budget.window)
        next_after: str | None = None
        if limit is None:
            by_dlq = await dead_letter_counts(conn)
            breakers = await breaker_states(conn)
            totals = await totals_by_tenant(conn, since=since)
            states = (
                data.connections
                if data is not None and data.connections
                else await load_connections(conn)
            )
        else:
            states = await _page(conn, limit=limit, after=after)
            names = [st.tenant for st in states]
            if len(states) == limit:
                next_after = names[-1]
            by_dlq = await dead_letter_counts(conn, tenants=names)
            breakers = await breaker_states(
                conn, keys=[st.resource_key or st.tenant for st in states]
            )
            totals = await _totals(conn, names, since)
        recent = await recent_alerts(conn, since=now - alerts_since)
        stuck_count = await count_unreadable_run_at(conn)
        stuck = await unreadable_run_at(conn, limit=STUCK_SHOWN) if stuck_count else []
    tenants = _tenants(states, breakers, totals, by_dlq, budget, now, only_known=limit is not None)
    return Status(
        database=db.display_url,
        queue=queue,
        dead_letters=dlq,
        outbox_pending=int(outbox_pending),
        tenants=tenants,
        generated_at=now,
        budget=budget.budget,
        budget_window_seconds=budget.window.total_seconds(),
        alerts_firing=rules.evaluate(data) if data is not None else [],
        alerts_recent=recent,
        tenants_by_status=by_status,
        breakers_by_state=by_state,
        next_after=next_after,
        alerts_evaluated=data is not None,
        unreadable_jobs=stuck_count,
        stuck_jobs=stuck,
    )


async def _page(conn: AsyncConnection, *, limit: int, after: str | None) -> list[ConnectionState]:
    """One page of tenants by name with their last successful poll, as the alert rules
    see it."""
    return await load_connections(conn, limit=limit, after=after)


async def _totals(
    conn: AsyncConnection, tenants: Sequence[str], since: datetime
) -> dict[str, Totals]:
    if not tenants:
        return {}
    rows = await conn.execute(
        select(
            audit_buckets.c.tenant,
            func.coalesce(func.sum(audit_buckets.c.ok), 0),
            func.coalesce(func.sum(audit_buckets.c.failed), 0),
        )
        .where(audit_buckets.c.minute >= since, among(conn, audit_buckets.c.tenant, tenants))
        .group_by(audit_buckets.c.tenant)
    )
    return {t: Totals(int(ok), int(failed)) for t, ok, failed in rows}


def _tenants(
    states: Sequence[ConnectionState],
    breakers: dict[str, BreakerInfo],
    totals: dict[str, Totals],
    by_dlq: dict[tuple[str, str, str], int],
    budget: BudgetPolicy,
    now: datetime,
    *,
    only_known: bool = False,
) -> list[TenantStatus]:
    dlq_of: dict[str, dict[str, int]] = {}
    connector_of: dict[str, str] = {}
    for (tenant, connector, status), n in by_dlq.items():
        per = dlq_of.setdefault(tenant, {})
        per[status] = per.get(status, 0) + n
        connector_of.setdefault(tenant, connector)
    known = {s.tenant: s for s in states}
    # Tenants with outcomes or dead letters but no connection row (plain queue users
    # whose jobs name only a resource key) are shown too.
    names = sorted(set(known) if only_known else set(known) | set(totals) | set(dlq_of))
    out: list[TenantStatus] = []
    for tenant in names:
        s = known.get(tenant)
        b = breakers.get((s.resource_key or tenant) if s else tenant)
        t = totals.get(tenant, Totals())
        bs = budget.status(t)
        dl = dlq_of.get(tenant, {})
        last = s.last_success_at if s else None
        bad = _unreadable(s, b)
        out.append(
            TenantStatus(
                tenant=tenant,
                connector=s.connector if s else connector_of.get(tenant, ""),
                status=s.status if s else "-",
                breaker=b.state if b else "closed",
                next_available_at=b.next_available_at if b else None,
                dlq_pending=dl.get("pending", 0),
                dlq_review=dl.get("review", 0),
                status_reason=s.status_reason if s else None,
                schedule=s.schedule if s else None,
                last_success_at=last,
                lag_seconds=round((now - last).total_seconds(), 3) if last else None,
                ok=t.ok,
                failed=t.failed,
                error_rate=bs.rate,
                budget_burn=bs.burn,
                budget_level=bs.level.value,
                consecutive_failures=b.consecutive_failures if b else 0,
                last_error_class=b.last_error_class if b else None,
                unreadable=bad,
            )
        )
    return out


def _unreadable(s: ConnectionState | None, b: BreakerInfo | None) -> tuple[tuple[str, str], ...]:
    bad: list[tuple[str, str]] = []
    if s is not None and s.status not in CONNECTION_STATUSES:
        bad.append(("status", f"unknown status {str(s.status)[:60]!r}"))
    if s is not None:
        bad.extend(s.unreadable)
    for name, reason in b.unreadable if b else ():
        bad.append(("breaker" if name == "state" else name, reason))
    return tuple(bad)


__all__ = [
    "ALERTS_ON_THE_SPOT",
    "BreakerInfo",
    "Status",
    "TenantStatus",
    "breaker_states",
    "dead_letter_counts",
    "dead_letter_totals",
    "queue_depth",
    "read_status",
]
