"""Error budgets: each tenant's error rate over a rolling window, against a budget.

:func:`budget_status` is the decision, pure: counts in, a frozen :class:`BudgetStatus`
out. The burn is the error rate divided by the budget (the default budget is 0.5% of
operations failing): below 100% the tenant is *healthy*, from 100% to 200% it is on
*watch*, above 200% it is in *alert*.

The rest reads the counts from ``audit_buckets`` (final outcomes only: a job that
succeeded on its third attempt is one success) and, when a :class:`BudgetPolicy` asks
for it, pauses a tenant in alert (``connections.status = 'paused'``), which stops its
jobs from being claimed until an operator sets it back to ``active``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

import structlog

from synckit.runtime.admin.audit import window_start
from synckit.store import connections
from synckit.store.audit import Totals, totals_by_tenant
from synckit.store.db import Conn

DEFAULT_BUDGET = 0.005
DEFAULT_WINDOW = timedelta(hours=24)

log = structlog.get_logger("synckit.budget")


class BudgetLevel(StrEnum):
    HEALTHY = "healthy"
    WATCH = "watch"
    ALERT = "alert"


@dataclass(frozen=True)
class BudgetStatus:
    """A tenant's budget: ``rate`` of operations failed, ``burn`` = rate / budget."""

    rate: float
    burn: float
    level: BudgetLevel
    ok: int = 0
    failed: int = 0
    budget: float = DEFAULT_BUDGET

    @property
    def operations(self) -> int:
        return self.ok + self.failed


def budget_status(ok: int, failed: int, budget: float = DEFAULT_BUDGET) -> BudgetStatus:
    """The budget status of ``failed`` failures among ``ok + failed`` operations.

    No operations is a rate of 0 (healthy). ``burn`` is rounded to 9 decimals so that
    exact boundaries (2 failures in 200 against 0.5% is exactly 200%) do not fall on the
    wrong side through floating-point noise.
    """
    if ok < 0 or failed < 0:
        raise ValueError("operation counts cannot be negative")
    if not 0 < budget <= 1:
        raise ValueError(f"budget must be a fraction in (0, 1], got {budget!r}")
    total = ok + failed
    rate = failed / total if total else 0.0
    burn = round(failed / (total * budget), 9) if total else 0.0
    if burn < 1:
        level = BudgetLevel.HEALTHY
    elif burn <= 2:
        level = BudgetLevel.WATCH
    else:
        level = BudgetLevel.ALERT
    return BudgetStatus(rate=rate, burn=burn, level=level, ok=ok, failed=failed, budget=budget)


@dataclass(frozen=True)
class BudgetPolicy:
    """How budgets are computed and what an alert does.

    ``pause_on_alert`` pauses a tenant whose budget is in alert, but only once it has
    at least ``min_operations`` operations in the window: three operations with one
    failure is a 33% error rate and says nothing yet.
    """

    budget: float = DEFAULT_BUDGET
    window: timedelta = DEFAULT_WINDOW
    pause_on_alert: bool = False
    min_operations: int = 100

    def __post_init__(self) -> None:
        if not 0 < self.budget <= 1:
            raise ValueError(f"budget must be a fraction in (0, 1], got {self.budget!r}")
        if self.window <= timedelta(0):
            raise ValueError("the budget window must be positive")

    def status(self, totals: Totals) -> BudgetStatus:
        return budget_status(totals.ok, totals.failed, self.budget)


async def tenant_budgets(
    conn: Conn, *, now: datetime, policy: BudgetPolicy | None = None
) -> dict[str, BudgetStatus]:
    """Every tenant with outcomes in the window ending at ``now``, with its budget status."""
    policy = policy or BudgetPolicy()
    totals = await totals_by_tenant(conn, since=window_start(now, policy.window))
    return {tenant: policy.status(t) for tenant, t in sorted(totals.items())}


async def pause_tenants(
    conn: Conn, tenants: Iterable[str], *, reason: str, now: datetime
) -> list[str]:
    """Pause the active connections of ``tenants``; return the tenants actually paused.

    A connection waiting for re-authorisation or already paused is left as it is.
    """
    paused = await connections.pause_active(conn, tenants, reason=reason, now=now)
    for tenant in paused:
        log.warning("budget.tenant_paused", tenant=tenant, reason=reason)
    return paused


__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_WINDOW",
    "BudgetLevel",
    "BudgetPolicy",
    "BudgetStatus",
    "budget_status",
    "pause_tenants",
    "tenant_budgets",
]
