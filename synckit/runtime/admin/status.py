"""What ``synckit status`` reports: a read-only snapshot of the runtime's tables.

At scale it pages: counts of tenants by status and of breakers by state are summed in
SQL, and only one page of tenants (by name, after a keyset cursor) is read in full. The
alert rules are evaluated on the spot up to ``ALERTS_ON_THE_SPOT`` tenants (they read
every tenant); beyond, the alerts the worker delivered are shown.

Per tenant: connection status, breaker state, next available time, last successful
poll and lag, error budget over the budget window, dead letters. Then queue depth by
kind and status, and alerts: those the rules call for right now (evaluated on the spot,
without delivering anything) and those fired recently (the ``alerts`` table, see
:mod:`synckit.runtime.observe.alerts`).

It builds no SQL: the counts are named reads of :mod:`synckit.store.views` (shared with
the metrics collector), the alert data and connections those of
:mod:`synckit.runtime.observe.alerts`. ``synckit status`` prints a :class:`Status` with
:func:`synckit.cli.status.render_status`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from synckit.clock import utcnow
from synckit.errors.gate import Gate, LaneFacts, gate
from synckit.redaction import redact_text
from synckit.runtime.admin.audit import window_start
from synckit.runtime.observe.alert_delivery import recent_alerts
from synckit.runtime.observe.alert_rules import Alert, RuleSet
from synckit.runtime.observe.alerts import load_alert_data
from synckit.runtime.observe.budget import BudgetPolicy
from synckit.store import subscriptions as subscription_store
from synckit.store.alerts import ConnectionState, load_connections
from synckit.store.audit import Totals, totals_by_tenant
from synckit.store.connections import CONNECTION_STATUSES
from synckit.store.db import Conn, Database
from synckit.store.jobs.admin import StuckJob, count_unreadable_run_at, unreadable_run_at
from synckit.store.moments import from_row
from synckit.store.views import (
    BreakerInfo,
    audit_totals_of,
    breaker_states,
    breakers_by_state,
    dead_letter_counts,
    dead_letter_totals,
    outbox_pending,
    queue_depth,
    tenants_by_status,
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
    #: What holds the tenant's jobs now, as the claim's gate decides from its breaker and
    #: pace (``breaker``, ``paced``, ``probe``), and until when; None: nothing does.
    held_by: str | None = None
    held_until: datetime | None = None


@dataclass(frozen=True)
class SubscriptionStatus:
    """A webhook subscription that is not active: its stream relies on polling alone."""

    tenant: str
    connector: str
    stream: str
    state: str
    failures: int
    expires_at: datetime | None
    #: When synckit tries again (creates it anew).
    next_at: datetime | None
    last_error: str | None = None


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
    #: Webhook subscriptions by state, and those lapsed or failed (their streams are
    #: polled on their schedules alone), the first ``SUBSCRIPTIONS_SHOWN``.
    subscriptions_by_state: dict[str, int] = field(default_factory=dict)
    subscriptions_down: list[SubscriptionStatus] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["alerts_firing"] = [a.to_json() for a in self.alerts_firing]
        data["alerts_recent"] = [a.to_json() for a in self.alerts_recent]
        for t in data["tenants"]:
            if t["unreadable"]:
                t["unreadable"] = dict(t["unreadable"])
            else:
                del t["unreadable"]
        jsonable: dict[str, Any] = _to_json_values(data)
        return jsonable


def _to_json_values(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _to_json_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_json_values(v) for v in value]
    return value


# --- the snapshot -----------------------------------------------------------------------


#: Up to this many tenants, ``read_status`` evaluates the alert rules on the spot.
ALERTS_ON_THE_SPOT = 10_000
#: How many of the jobs that never run (unreadable ``run_at``) a status names.
STUCK_SHOWN = 10
#: How many lapsed or failed webhook subscriptions a status names.
SUBSCRIPTIONS_SHOWN = 50


async def _subscriptions(
    conn: Conn,
) -> tuple[dict[str, int], list[SubscriptionStatus]]:
    """Subscriptions by state, and the first lapsed or failed ones (secrets redacted)."""
    by_state = await conn.run_sync(subscription_store.state_counts)
    if not (by_state.get("lapsed") or by_state.get("failed")):
        return by_state, []
    down = await conn.run_sync(
        lambda c: subscription_store.list_subscriptions(
            c, states=("lapsed", "failed"), limit=SUBSCRIPTIONS_SHOWN
        )
    )
    return by_state, [
        from_row(
            SubscriptionStatus,
            r,
            last_error=redact_text(r.last_error) if r.last_error else None,
        )
        for r in down
    ]


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
    async with db.read() as conn:  # a snapshot: no write lock held while it counts
        queue = await queue_depth(conn)
        dlq = await dead_letter_totals(conn)
        pending_messages = await outbox_pending(conn)
        by_status = await tenants_by_status(conn)
        by_state = await breakers_by_state(conn)
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
            totals = await audit_totals_of(conn, names, since=since)
        recent = await recent_alerts(conn, since=now - alerts_since)
        stuck_count = await count_unreadable_run_at(conn)
        stuck = await unreadable_run_at(conn, limit=STUCK_SHOWN) if stuck_count else []
        by_sub_state, down = await _subscriptions(conn)
    tenants = _tenants(states, breakers, totals, by_dlq, budget, now, only_known=limit is not None)
    return Status(
        database=db.display_url,
        queue=queue,
        dead_letters=dlq,
        outbox_pending=pending_messages,
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
        subscriptions_by_state=by_sub_state,
        subscriptions_down=down,
    )


async def _page(conn: Conn, *, limit: int, after: str | None) -> list[ConnectionState]:
    """One page of tenants by name with their last successful poll, as the alert rules
    see it."""
    return await load_connections(conn, limit=limit, after=after)


def _gate_of(b: BreakerInfo | None, now: datetime) -> Gate:
    """The claim's gate over what the report reads of a resource: its breaker state and
    next available time (an open breaker's cool-down end, or the pace's)."""
    if b is None:
        return Gate()
    cooldown = b.next_available_at if b.state == "open" else None
    return gate(LaneFacts(b.state, cooldown, b.next_available_at), now)


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
        held = _gate_of(b, now)
        out.append(
            TenantStatus(
                tenant=tenant,
                connector=s.connector if s else connector_of.get(tenant, ""),
                status=s.status if s else "-",
                breaker=b.state if b else "closed",
                next_available_at=b.next_available_at if b else None,
                dlq_pending=dl.get("pending", 0),
                dlq_review=dl.get("review", 0),
                # Stored before redaction, or by a path that missed it: shown masked.
                status_reason=redact_text(s.status_reason) if s and s.status_reason else None,
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
                held_by=held.why,
                held_until=held.until,
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
    "Status",
    "SubscriptionStatus",
    "TenantStatus",
    "read_status",
]
