"""The alert rules, pure: what each rule reads (:class:`AlertData`), fires
(:class:`Alert`, with its :class:`Severity`) and when (a window key per rule); the
:class:`RuleSet` of them all. Loading their data and delivering what they fire is
:mod:`synckit.runtime.observe.alerts` and :mod:`synckit.runtime.observe.alert_delivery`."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from synckit.clock import short_duration
from synckit.connectors.schedule import cached_schedule
from synckit.errors.exceptions import ConfigurationError
from synckit.runtime.admin.audit import window_start
from synckit.runtime.observe.budget import BudgetLevel, BudgetPolicy
from synckit.runtime.observe.logging import redact, redact_text
from synckit.store.alerts import (
    POLL_KIND,
    ConnectionState,
    DlqGrowth,
    ReviewGroup,
)
from synckit.store.audit import (
    AuditRow,
    Totals,
    VersionTotals,
)
from synckit.store.connections import UNREADABLE_ROW_REASON
from synckit.store.jobs.admin import StuckJob

__all__ = [
    "Alert",
    "AlertData",
    "AlertRule",
    "BudgetRule",
    "DeadCyclesRule",
    "DeployRegression",
    "DlqAcceleration",
    "DlqReview",
    "NeedsReauthRule",
    "PollLag",
    "RuleSet",
    "ServerErrorBurst",
    "Severity",
    "TenantOutlier",
    "UnreadableConnectionRule",
    "UnreadableRunAt",
    "dlq_review_alert",
    "poll_deadline",
    "window_key",
]

# Only the webhook sink speaks HTTP: ``synckit status`` evaluates the rules on the spot
# and must not pay for an HTTP client (tests/unit/test_command_imports.py).
if TYPE_CHECKING:
    pass


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True)
class Alert:
    """One alert: what rule fired, about what (``subject``), when and why."""

    rule: str
    subject: str
    message: str
    fired_at: datetime
    window: str
    severity: Severity = Severity.WARNING
    tenant: str | None = None
    connector: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The de-duplication key: one delivery per rule, subject and window."""
        return f"{self.rule}|{self.subject}|{self.window}"

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, with the message and details through the redaction step: a
        reason can quote an API's answer, and this is what webhooks and logs receive."""
        return {
            "rule": self.rule,
            "subject": self.subject,
            "message": redact_text(self.message),
            "fired_at": self.fired_at.isoformat(),
            "window": self.window,
            "severity": self.severity.value,
            "tenant": self.tenant,
            "connector": self.connector,
            "details": redact(dict(self.details)),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Alert:
        fired = datetime.fromisoformat(str(data["fired_at"]))
        return cls(
            rule=str(data["rule"]),
            subject=str(data["subject"]),
            message=str(data.get("message", "")),
            fired_at=fired if fired.tzinfo else fired.replace(tzinfo=UTC),
            window=str(data.get("window", "")),
            severity=Severity(data.get("severity", "warning")),
            tenant=data.get("tenant"),
            connector=data.get("connector"),
            details=dict(data.get("details") or {}),
        )


def window_key(now: datetime, every: timedelta) -> str:
    """The start of the epoch-aligned period of length ``every`` that contains ``now``."""
    step = every.total_seconds()
    if step <= 0:
        raise ValueError("a de-duplication window must be positive")
    start = math.floor(now.timestamp() / step) * step
    return datetime.fromtimestamp(start, tz=UTC).isoformat()


# --- what the rules read ----------------------------------------------------------------


@dataclass(frozen=True)
class AlertData:
    """Everything the rules look at, loaded at ``now`` (see :func:`load_alert_data`)."""

    now: datetime
    recent: Sequence[AuditRow] = ()
    versions: Sequence[VersionTotals] = ()
    tenant_totals: Mapping[str, Totals] = field(default_factory=dict)
    dlq: Sequence[DlqGrowth] = ()
    connections: Sequence[ConnectionState] = ()
    review: Sequence[ReviewGroup] = ()
    #: Pending jobs whose ``run_at`` cannot be read (see :mod:`~synckit.runtime.jobs.unreadable`).
    stuck_jobs: Sequence[StuckJob] = ()


class AlertRule(Protocol):
    @property
    def name(self) -> str: ...

    def evaluate(self, data: AlertData) -> list[Alert]: ...


class _Repeating:
    """A rule whose alerts repeat once per ``repeat_every`` window (its dataclass fields)."""

    name: str
    severity: Severity
    repeat_every: timedelta

    def _alert(self, data: AlertData, subject: str, message: str, **about: Any) -> Alert:
        """An alert about ``subject`` at ``data.now``, in the current window; ``about``:
        its ``tenant``, ``connector`` and ``details``."""
        return Alert(
            rule=self.name,
            subject=subject,
            message=message,
            fired_at=data.now,
            window=window_key(data.now, self.repeat_every),
            severity=self.severity,
            **about,
        )

    def _held(self, data: AlertData, c: ConnectionState, message: str) -> Alert:
        """An alert about a tenant its connection's status holds, with the reason."""
        details = {"reason": c.status_reason}
        return self._alert(
            data, c.tenant, message, tenant=c.tenant, connector=c.connector, details=details
        )


def _recent_rows(data: AlertData, window: timedelta) -> list[AuditRow]:
    start = window_start(data.now, window)
    return [r for r in data.recent if start <= r.minute <= data.now]


# --- the rules (pure) -----------------------------------------------------------------


#: How an alert names each class of failure it counts (a DNS failure, a refused
#: connection or a timeout is ``transient``: a network failure, not a server error).
_FAILURE_NAMES = {"server_error": "server errors", "transient": "network failures"}


def _failures_text(by_class: Counter[str]) -> str:
    """``8 network failures``, ``5 server errors``, ``5 server errors + 3 network failures``."""
    parts = [f"{n} {_FAILURE_NAMES.get(c, c + ' failures')}" for c, n in by_class.items() if n]
    return " + ".join(parts) or "0 failures"


@dataclass(frozen=True)
class ServerErrorBurst(_Repeating):
    """``threshold`` or more server-side failures within ``window`` for one connector.

    Every failed attempt counts, retried or final: five 500s matter even when the
    retries then succeed. A lone transient stays quiet.
    """

    threshold: int = 5
    window: timedelta = timedelta(minutes=5)
    classes: tuple[str, ...] = ("server_error", "transient")
    repeat_every: timedelta = timedelta(hours=1)
    severity: Severity = Severity.CRITICAL
    name: str = "server_errors"

    def evaluate(self, data: AlertData) -> list[Alert]:
        counts: dict[str, int] = defaultdict(int)
        by_class: dict[str, Counter[str]] = defaultdict(Counter)
        tenants: dict[str, set[str]] = defaultdict(set)
        for r in _recent_rows(data, self.window):
            attempts = r.classes.attempts()
            n = sum(attempts.get(c, 0) for c in self.classes)
            if n:
                counts[r.connector] += n
                tenants[r.connector].add(r.tenant)
                for c in self.classes:
                    by_class[r.connector][c] += attempts.get(c, 0)
        minutes = self.window.total_seconds() / 60
        return [
            self._alert(
                data,
                connector,
                f"{_failures_text(by_class[connector])} in {minutes:g} min on connector "
                f"{connector or '-'} ({len(tenants[connector])} tenant(s))",
                connector=connector,
                details={"count": n, "tenants": sorted(tenants[connector])},
            )
            for connector, n in sorted(counts.items())
            if n >= self.threshold
        ]


@dataclass(frozen=True)
class TenantOutlier(_Repeating):
    """A tenant failing while the other tenants of its connector are normal.

    A tenant fails when at least ``min_failures`` of its attempts in ``window`` failed
    and its failure rate is at least ``failing_rate``. The others are normal when there
    are at least ``min_peers`` of them with activity and at least ``normal_share`` of
    those have a failure rate at or below ``normal_rate``. When every tenant fails, the
    API is the problem and :class:`ServerErrorBurst` speaks instead.
    """

    window: timedelta = timedelta(minutes=15)
    min_failures: int = 5
    failing_rate: float = 0.5
    normal_rate: float = 0.05
    normal_share: float = 0.5
    min_peers: int = 1
    repeat_every: timedelta = timedelta(hours=1)
    severity: Severity = Severity.WARNING
    name: str = "tenant_outlier"

    def evaluate(self, data: AlertData) -> list[Alert]:
        stats: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        for r in _recent_rows(data, self.window):
            s = stats[r.connector][r.tenant]
            s[0] += r.ok
            s[1] += r.failed_attempts
        out: list[Alert] = []
        for connector, by_tenant in sorted(stats.items()):
            rates = {t: (f / (ok + f) if ok + f else 0.0) for t, (ok, f) in by_tenant.items()}
            for tenant, (_ok, failures) in sorted(by_tenant.items()):
                if failures < self.min_failures or rates[tenant] < self.failing_rate:
                    continue
                peers = [t for t, (o, f) in by_tenant.items() if t != tenant and o + f > 0]
                if len(peers) < max(1, self.min_peers):
                    continue
                normal = [t for t in peers if rates[t] <= self.normal_rate]
                if len(normal) < self.normal_share * len(peers):
                    continue
                out.append(
                    self._alert(
                        data,
                        tenant,
                        f"tenant {tenant} is failing ({failures} failures, "
                        f"{rates[tenant]:.0%}) while {len(normal)} of {len(peers)} other "
                        f"tenant(s) of {connector or '-'} are normal",
                        tenant=tenant,
                        connector=connector,
                        details={
                            "failures": failures,
                            "rate": round(rates[tenant], 4),
                            "peers": len(peers),
                            "normal_peers": len(normal),
                        },
                    )
                )
        return out


@dataclass(frozen=True)
class DeployRegression:
    """An error class whose rate jumped under the newest app version of a connector.

    Versions are ordered by when they first appear in the audit within ``lookback``;
    the newest is compared with the one before it. It fires when the class has at
    least ``min_count`` failed attempts under the new version, a rate of at least
    ``min_rate`` of its operations, and ``factor`` times the old version's rate. One
    alert per connector, class and new version.
    """

    lookback: timedelta = timedelta(hours=24)
    min_count: int = 5
    min_rate: float = 0.01
    factor: float = 3.0
    severity: Severity = Severity.CRITICAL
    name: str = "deploy_regression"

    def evaluate(self, data: AlertData) -> list[Alert]:
        by_connector: dict[str, list[VersionTotals]] = defaultdict(list)
        for v in data.versions:
            by_connector[v.connector].append(v)
        out: list[Alert] = []
        for connector, versions in sorted(by_connector.items()):
            if len(versions) < 2:
                continue
            versions.sort(key=lambda v: (v.first_seen, v.app_version))
            prev, new = versions[-2], versions[-1]
            if not new.operations or not prev.operations:
                continue
            for cls, n in sorted(new.attempts_by_class.items()):
                new_rate = n / new.operations
                old_rate = prev.attempts_by_class.get(cls, 0) / prev.operations
                if n < self.min_count or new_rate < self.min_rate:
                    continue
                if new_rate <= old_rate or new_rate < self.factor * old_rate:
                    continue
                out.append(
                    Alert(
                        rule=self.name,
                        subject=f"{connector}:{cls}",
                        message=(
                            f"{cls} errors on {connector or '-'} jumped after deploying "
                            f"{new.app_version or '(unversioned)'}: {new_rate:.1%} of "
                            f"operations, {old_rate:.1%} under "
                            f"{prev.app_version or '(unversioned)'}"
                        ),
                        fired_at=data.now,
                        window=f"version:{new.app_version}",
                        severity=self.severity,
                        connector=connector,
                        details={
                            "error_class": cls,
                            "new_version": new.app_version,
                            "previous_version": prev.app_version,
                            "new_rate": round(new_rate, 6),
                            "previous_rate": round(old_rate, 6),
                            "count": n,
                        },
                    )
                )
        return out


@dataclass(frozen=True)
class DlqAcceleration(_Repeating):
    """Dead letters accumulating faster: the last ``window`` created at least
    ``min_count`` rows and ``factor`` times as many as the window before."""

    window: timedelta = timedelta(hours=1)
    min_count: int = 10
    factor: float = 2.0
    repeat_every: timedelta = timedelta(hours=1)
    severity: Severity = Severity.WARNING
    name: str = "dlq_growth"

    def evaluate(self, data: AlertData) -> list[Alert]:
        return [
            self._alert(
                data,
                g.connector,
                f"dead letters of {g.connector or '-'} accelerating: {g.current} in the "
                f"last {_human(self.window)}, {g.previous} in the one before",
                connector=g.connector,
                details={"current": g.current, "previous": g.previous},
            )
            for g in sorted(data.dlq, key=lambda g: g.connector)
            if g.current >= self.min_count and g.current >= self.factor * g.previous
        ]


@dataclass(frozen=True)
class DlqReview:
    """Dead letters that wait for an operator (status ``review``), per tenant and class.

    The replay processor announces the rows it moves to review; rows that go there at
    capture (validation and authorization failures) are announced only by this rule.
    Both raise the same alert (rule, subject, window), so an operator gets one, repeated
    every ``repeat_every`` while rows wait.
    """

    repeat_every: timedelta = timedelta(hours=6)
    name: str = "dlq_review"

    def evaluate(self, data: AlertData) -> list[Alert]:
        return [
            dlq_review_alert(
                g.tenant,
                g.error_class,
                g.count,
                now=data.now,
                connector=g.connector,
                repeat_every=self.repeat_every,
            )
            for g in sorted(data.review, key=lambda g: (g.tenant, g.error_class, g.connector))
            if g.count > 0
        ]


def poll_deadline(
    schedule: str, last_success: datetime, factor: float = 2.0, grace: timedelta = timedelta(0)
) -> datetime | None:
    """When a tenant polled on ``schedule`` and last successful at ``last_success`` is late.

    The schedule is read as the poller reads it (:func:`~synckit.connectors.schedule.
    parse_schedule`). An interval schedule is late after ``factor`` intervals. A cron
    expression is late once ``ceil(factor)`` of its ticks passed without a success: a
    cron's gaps vary (weekends), so its cadence is counted in ticks, not in a fixed
    interval. ``None`` when the schedule cannot be read (the poller does not run it).
    """
    try:
        parsed = cached_schedule(schedule)
    except ConfigurationError:
        return None
    if parsed.every is not None:
        return last_success + parsed.every * factor + grace
    tick = last_success
    for _ in range(max(1, math.ceil(factor))):
        tick = parsed.next_after(tick)
    return tick + grace


@dataclass(frozen=True)
class PollLag(_Repeating):
    """An active tenant whose last successful poll is older than ``factor`` times its schedule.

    The last success is the newest of its checkpoints' ``updated_at`` and its last
    succeeded poll job; a tenant that never succeeded counts from its creation.
    """

    factor: float = 2.0
    grace: timedelta = timedelta(0)
    repeat_every: timedelta = timedelta(hours=1)
    severity: Severity = Severity.WARNING
    name: str = "poll_lag"

    def evaluate(self, data: AlertData) -> list[Alert]:
        out: list[Alert] = []
        for c in sorted(data.connections, key=lambda c: c.tenant):
            if c.status != "active" or not c.schedule:
                continue
            since = c.last_success_at or c.created_at
            if since is None:
                continue  # nothing readable to count from (named by `synckit status`)
            deadline = poll_deadline(c.schedule, since, self.factor, self.grace)
            if deadline is None or data.now <= deadline:
                continue
            lag = data.now - since
            out.append(
                self._alert(
                    data,
                    c.tenant,
                    f"tenant {c.tenant} has not polled successfully for {_human(lag)} "
                    f"(schedule {c.schedule!r})",
                    tenant=c.tenant,
                    connector=c.connector,
                    details={
                        "lag_seconds": round(lag.total_seconds(), 3),
                        "schedule": c.schedule,
                        "last_success_at": (
                            c.last_success_at.isoformat() if c.last_success_at else None
                        ),
                    },
                )
            )
        return out


@dataclass(frozen=True)
class NeedsReauthRule(_Repeating):
    """A connection that waits for its tenant to re-authorise."""

    repeat_every: timedelta = timedelta(hours=6)
    severity: Severity = Severity.CRITICAL
    name: str = "needs_reauth"

    def evaluate(self, data: AlertData) -> list[Alert]:
        return [
            self._held(
                data,
                c,
                f"tenant {c.tenant} ({c.connector}) must re-authorise: "
                f"{c.status_reason or 'credentials refused'}",
            )
            for c in sorted(data.connections, key=lambda c: c.tenant)
            if c.status == "needs_reauth"
        ]


@dataclass(frozen=True)
class DeadCyclesRule(_Repeating):
    """A tenant paused because a stream's poll cycles kept dying (see
    :data:`synckit.errors.dlq_policy.DEAD_CYCLES_TO_PAUSE`); resume with ``synckit tenants
    resume`` once the API is fixed."""

    repeat_every: timedelta = timedelta(hours=6)
    severity: Severity = Severity.CRITICAL
    name: str = "dead_cycles"

    def evaluate(self, data: AlertData) -> list[Alert]:
        from synckit.errors.dlq_policy import DEAD_CYCLES_REASON

        return [
            self._held(data, c, f"tenant {c.tenant} ({c.connector}) paused: {c.status_reason}")
            for c in data.connections
            if c.status == "paused" and (c.status_reason or "").startswith(DEAD_CYCLES_REASON)
        ]


@dataclass(frozen=True)
class UnreadableConnectionRule(_Repeating):
    """A tenant the worker held (paused) at start because its connection row cannot be
    read (see :func:`synckit.runtime.credentials.keys.hold_unreadable`); repair the row, then
    ``synckit tenants resume``."""

    repeat_every: timedelta = timedelta(hours=6)
    severity: Severity = Severity.CRITICAL
    name: str = "unreadable_connection"

    def evaluate(self, data: AlertData) -> list[Alert]:
        return [
            self._held(data, c, f"tenant {c.tenant} ({c.connector}) held: {c.status_reason}")
            for c in sorted(data.connections, key=lambda c: c.tenant)
            if c.status == "paused" and (c.status_reason or "").startswith(UNREADABLE_ROW_REASON)
        ]


@dataclass(frozen=True)
class BudgetRule(_Repeating):
    """A tenant whose error budget is in alert (more than 200% burnt) with enough volume
    (``policy.min_operations``) for the rate to mean something."""

    policy: BudgetPolicy = field(default_factory=BudgetPolicy)
    repeat_every: timedelta = timedelta(hours=1)
    severity: Severity = Severity.CRITICAL
    name: str = "error_budget"

    def evaluate(self, data: AlertData) -> list[Alert]:
        out: list[Alert] = []
        for tenant, totals in sorted(data.tenant_totals.items()):
            s = self.policy.status(totals)
            if s.level is not BudgetLevel.ALERT or s.operations < self.policy.min_operations:
                continue
            out.append(
                self._alert(
                    data,
                    tenant,
                    f"tenant {tenant} burnt {s.burn:.0%} of its error budget "
                    f"({s.failed} of {s.operations} operations failed in "
                    f"{_human(self.policy.window)})",
                    tenant=tenant,
                    details={
                        "rate": round(s.rate, 6),
                        "burn": s.burn,
                        "ok": s.ok,
                        "failed": s.failed,
                    },
                )
            )
        return out


@dataclass(frozen=True)
class UnreadableRunAt(_Repeating):
    """A pending job whose ``run_at`` no reader can read: no claim ever takes it (it
    compares as later than any time), so it would wait forever without a word. One
    alert per job, naming it, repeated every ``repeat_every`` while it stays so; fix it
    with ``synckit jobs reschedule ID --in 0s`` or ``synckit jobs cancel ID``."""

    #: At most this many jobs are read (and alerted) per evaluation, oldest first.
    limit: int = 100
    repeat_every: timedelta = timedelta(days=1)
    severity: Severity = Severity.WARNING
    name: str = "unreadable_run_at"

    def evaluate(self, data: AlertData) -> list[Alert]:
        return [
            self._alert(
                data,
                f"job:{j.id}",
                f"job {j.id} ({j.kind}) never runs: its {j.reason}",
                details={"job_id": j.id, "kind": j.kind, "resource_key": j.resource_key},
            )
            for j in data.stuck_jobs[: self.limit]
        ]


@dataclass(frozen=True)
class RuleSet:
    """The rules to evaluate; set one to ``None`` to turn it off."""

    server_errors: ServerErrorBurst | None = field(default_factory=ServerErrorBurst)
    tenant_outlier: TenantOutlier | None = field(default_factory=TenantOutlier)
    deploy_regression: DeployRegression | None = field(default_factory=DeployRegression)
    dlq_growth: DlqAcceleration | None = field(default_factory=DlqAcceleration)
    poll_lag: PollLag | None = field(default_factory=PollLag)
    needs_reauth: NeedsReauthRule | None = field(default_factory=NeedsReauthRule)
    dead_cycles: DeadCyclesRule | None = field(default_factory=DeadCyclesRule)
    unreadable_connection: UnreadableConnectionRule | None = field(
        default_factory=UnreadableConnectionRule
    )
    error_budget: BudgetRule | None = field(default_factory=BudgetRule)
    dlq_review: DlqReview | None = field(default_factory=DlqReview)
    unreadable_run_at: UnreadableRunAt | None = field(default_factory=UnreadableRunAt)
    #: The job kind whose success counts as a successful poll.
    poll_kind: str = POLL_KIND

    @property
    def rules(self) -> list[AlertRule]:
        candidates: list[AlertRule | None] = [
            self.server_errors,
            self.tenant_outlier,
            self.deploy_regression,
            self.dlq_growth,
            self.poll_lag,
            self.needs_reauth,
            self.dead_cycles,
            self.unreadable_connection,
            self.error_budget,
            self.dlq_review,
            self.unreadable_run_at,
        ]
        return [r for r in candidates if r is not None]

    @property
    def recent_window(self) -> timedelta | None:
        windows = [r.window for r in (self.server_errors, self.tenant_outlier) if r is not None]
        return max(windows) if windows else None

    def evaluate(self, data: AlertData) -> list[Alert]:
        """Every alert the data calls for (pure; no de-duplication)."""
        return [a for rule in self.rules for a in rule.evaluate(data)]


def dlq_review_alert(
    tenant: str,
    error_class: str,
    count: int,
    *,
    now: datetime,
    connector: str = "",
    repeat_every: timedelta = timedelta(hours=6),
) -> Alert:
    """The alert for dead letters that need an operator's review (from the DLQ)."""
    return Alert(
        rule="dlq_review",
        subject=f"{tenant}:{error_class}",
        message=(f"{count} dead letter(s) of tenant {tenant} ({error_class}) need review"),
        fired_at=now,
        window=window_key(now, repeat_every),
        severity=Severity.WARNING,
        tenant=tenant,
        connector=connector or None,
        details={"error_class": error_class, "count": count},
    )


def _human(delta: timedelta) -> str:
    return short_duration(delta.total_seconds())
