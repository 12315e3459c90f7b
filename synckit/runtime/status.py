"""What ``synckit status`` reports: a read-only snapshot of the runtime's tables.

Per tenant: connection status, breaker state, next available time, last successful
poll and lag, error budget over the budget window, dead letters. Then queue depth by
kind and status, and alerts: those the rules call for right now (evaluated on the spot,
without delivering anything) and those delivered recently (``synckit.alert_record``
rows, see :mod:`synckit.runtime.alerts`).

The small named reads (:func:`queue_depth`, :func:`dead_letter_counts`,
:func:`breaker_states`) are shared with the metrics collector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.runtime.alerts import (
    ALERT_RECORD_KIND,
    Alert,
    ConnectionState,
    RuleSet,
    load_alert_data,
    recent_alerts,
)
from synckit.runtime.audit import Totals, totals_by_tenant, window_start
from synckit.runtime.budget import BudgetPolicy
from synckit.runtime.db import Database
from synckit.runtime.jobs import utcnow
from synckit.runtime.schema import dead_letters, jobs, outbox, resources

if TYPE_CHECKING:
    from rich.console import Console


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

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["alerts_firing"] = [a.to_json() for a in self.alerts_firing]
        data["alerts_recent"] = [a.to_json() for a in self.alerts_recent]
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
    """Job counts by kind, then status (alert records left out: they are not work)."""
    stmt = (
        select(jobs.c.kind, jobs.c.status, func.count())
        .where(jobs.c.kind != ALERT_RECORD_KIND)
        .group_by(jobs.c.kind, jobs.c.status)
    )
    if statuses is not None:
        stmt = stmt.where(jobs.c.status.in_(statuses))
    out: dict[str, dict[str, int]] = {}
    for kind, status, count in await conn.execute(stmt):
        out.setdefault(kind, {})[status] = int(count)
    return out


async def dead_letter_counts(conn: AsyncConnection) -> dict[tuple[str, str, str], int]:
    """Dead letters by ``(tenant, connector, status)``."""
    rows = await conn.execute(
        select(
            dead_letters.c.tenant, dead_letters.c.connector, dead_letters.c.status, func.count()
        ).group_by(dead_letters.c.tenant, dead_letters.c.connector, dead_letters.c.status)
    )
    return {(t, c, s): int(n) for t, c, s, n in rows}


@dataclass(frozen=True)
class BreakerInfo:
    resource_key: str
    state: str
    next_available_at: datetime | None
    consecutive_failures: int
    last_error_class: str | None


async def breaker_states(conn: AsyncConnection) -> dict[str, BreakerInfo]:
    """Every resource's breaker, by resource key."""
    rows = await conn.execute(
        select(
            resources.c.resource_key,
            resources.c.state,
            resources.c.next_available_at,
            resources.c.consecutive_failures,
            resources.c.last_error_class,
        )
    )
    return {
        r.resource_key: BreakerInfo(
            r.resource_key,
            r.state,
            r.next_available_at,
            r.consecutive_failures,
            r.last_error_class,
        )
        for r in rows
    }


# --- the snapshot -----------------------------------------------------------------------


async def read_status(
    db: Database,
    *,
    now: datetime | None = None,
    budget: BudgetPolicy | None = None,
    rules: RuleSet | None = None,
    alerts_since: timedelta = timedelta(hours=24),
) -> Status:
    """Tenants' health, queue depth by kind and status, dead letters, the outbox, alerts."""
    now = now or utcnow()
    budget = budget or BudgetPolicy()
    rules = rules or RuleSet()
    async with db.begin() as conn:
        queue = await queue_depth(conn)
        by_dlq = await dead_letter_counts(conn)
        dlq: dict[str, int] = {}
        for (_t, _c, s), n in by_dlq.items():
            dlq[s] = dlq.get(s, 0) + n
        outbox_pending = (
            await conn.execute(
                select(func.count()).select_from(outbox).where(outbox.c.status == "pending")
            )
        ).scalar_one()
        breakers = await breaker_states(conn)
        totals = await totals_by_tenant(conn, since=window_start(now, budget.window))
        data = await load_alert_data(conn, now=now, rules=rules)
        recent = await recent_alerts(conn, since=now - alerts_since)
    tenants = _tenants(data.connections, breakers, totals, by_dlq, budget, now)
    return Status(
        database=db.display_url,
        queue=queue,
        dead_letters=dlq,
        outbox_pending=int(outbox_pending),
        tenants=tenants,
        generated_at=now,
        budget=budget.budget,
        budget_window_seconds=budget.window.total_seconds(),
        alerts_firing=rules.evaluate(data),
        alerts_recent=recent,
    )


def _tenants(
    states: Sequence[ConnectionState],
    breakers: dict[str, BreakerInfo],
    totals: dict[str, Totals],
    by_dlq: dict[tuple[str, str, str], int],
    budget: BudgetPolicy,
    now: datetime,
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
    names = sorted(set(known) | set(totals) | set(dlq_of))
    out: list[TenantStatus] = []
    for tenant in names:
        s = known.get(tenant)
        b = breakers.get((s.resource_key or tenant) if s else tenant)
        t = totals.get(tenant, Totals())
        bs = budget.status(t)
        dl = dlq_of.get(tenant, {})
        last = s.last_success_at if s else None
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
            )
        )
    return out


# --- rendering (``synckit status``) ------------------------------------------------------

_QUEUE_STATUSES = ("pending", "running", "succeeded", "dead", "cancelled", "discarded")


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def _when(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment else "-"


def render_status(status: Status, console: Console) -> None:
    """Print ``status`` as rich tables: tenants, queue, alerts, dead letters and outbox."""
    from rich.table import Table

    console.print(f"[bold]synckit[/bold] {status.database}  at {_when(status.generated_at)}")
    hours = status.budget_window_seconds / 3600
    tenants = Table(title="Tenants")
    for col in (
        "tenant",
        "connector",
        "status",
        "breaker",
        "next available",
        "last success",
        "lag",
        f"failed/ops ({hours:g}h)",
        f"budget burn ({status.budget:.2%})",
        "DLQ pending",
        "DLQ review",
    ):
        tenants.add_column(col)
    colour = {"healthy": "green", "watch": "yellow", "alert": "bold red"}
    for t in status.tenants:
        state = t.status if not t.status_reason else f"{t.status}: {t.status_reason[:40]}"
        breaker = t.breaker if t.breaker == "closed" else f"[bold red]{t.breaker}[/bold red]"
        burn = f"[{colour.get(t.budget_level, 'white')}]{t.budget_burn:.0%} {t.budget_level}[/]"
        tenants.add_row(
            t.tenant,
            t.connector or "-",
            state,
            breaker,
            _when(t.next_available_at),
            _when(t.last_success_at),
            _ago(t.lag_seconds),
            f"{t.failed}/{t.ok + t.failed}",
            burn,
            str(t.dlq_pending),
            str(t.dlq_review),
        )
    if not status.tenants:
        tenants.caption = "no tenants yet"
    console.print(tenants)
    queue = Table(title="Queue")
    queue.add_column("kind")
    for s in _QUEUE_STATUSES:
        queue.add_column(s, justify="right")
    for kind, counts in sorted(status.queue.items()):
        queue.add_row(kind, *(str(counts.get(s, 0)) for s in _QUEUE_STATUSES))
    if not status.queue:
        queue.caption = "no jobs yet"
    console.print(queue)
    alerts = Table(title="Alerts")
    for col in ("", "severity", "rule", "subject", "since", "message"):
        alerts.add_column(col)
    for a in status.alerts_firing:
        alerts.add_row("firing", a.severity.value, a.rule, a.subject, "now", a.message)
    for a in status.alerts_recent:
        alerts.add_row("sent", a.severity.value, a.rule, a.subject, _when(a.fired_at), a.message)
    if not status.alerts_firing and not status.alerts_recent:
        alerts.caption = "no alerts"
    console.print(alerts)
    dlq = ", ".join(f"{k} {v}" for k, v in sorted(status.dead_letters.items())) or "empty"
    console.print(f"Dead letters: {dlq}    Outbox pending: {status.outbox_pending}")


__all__ = [
    "BreakerInfo",
    "Status",
    "TenantStatus",
    "breaker_states",
    "dead_letter_counts",
    "queue_depth",
    "read_status",
    "render_status",
]
