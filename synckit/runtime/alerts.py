"""Pattern alerts: rules over the runtime's tables, evaluated on a schedule, de-duplicated,
and routed to sinks.

One failure is not news; a pattern is. Each rule is a frozen dataclass holding its
thresholds, with a pure ``evaluate(data) -> list[Alert]`` over an :class:`AlertData`
snapshot; :func:`load_alert_data` is the only part that reads the database. The rules:

=====================  ===========================================================
``server_errors``      N or more server errors (``server_error``/``transient``
                       attempts, retried or final) in a few minutes for one connector
``tenant_outlier``     one tenant failing while most tenants of its connector are fine
``deploy_regression``  an error class whose rate jumped under the newest app version
                       compared with the version before it
``dlq_growth``         dead letters created in the last window outpace the window
                       before by a factor
``poll_lag``           a tenant whose last successful poll is older than twice its
                       schedule
``needs_reauth``       a connection waiting for re-authorisation
``dead_cycles``        a tenant paused after its poll cycles kept dying
``unreadable_connection``  a tenant held (paused) because its connection row cannot
                       be read (config not JSON or not an object, damaged tokens)
``error_budget``       a tenant whose error budget is in alert (optionally paused)
``unreadable_run_at``  a pending job whose ``run_at`` cannot be read, so no claim ever
                       takes it (one alert per job, daily)
=====================  ===========================================================

De-duplication
    An alert names a window (:attr:`Alert.window`): the start of the fixed,
    epoch-aligned period of its rule's ``repeat_every`` (the new version's name for
    ``deploy_regression``). At most one alert per rule, subject and window is delivered,
    so a lasting condition is re-announced once per window, not once per evaluation.
    Alerts are recorded in the ``alerts`` table, one row per rule, subject and window
    (``dedupe_key``, unique): the unique key decides which of two evaluators records an
    alert, so two workers never deliver the same one. ``synckit status`` and the console
    read them by ``fired_at``; finished alerts are kept :data:`KEEP_ALERTS` (7 days),
    then pruned by the evaluation. A router without a database de-duplicates in memory.

Delivery
    At least once, per sink. The alert is recorded first as *undelivered*
    (``finished_at`` NULL, a short delivery lease in ``lease_expires_at``), the sinks
    are called outside any transaction, and then the row notes each sink that took
    the alert (``delivered``: sink name to time); it is finished once every sink has it.
    An evaluation first retries the alerts some sink has not taken (the webhook was
    down, the worker died mid-delivery) to those sinks only, for up to
    :data:`GIVE_UP_AFTER`; a retry takes only rows whose lease ran out and that no other
    transaction holds. Sinks: the log (event ``alert.fired``), a webhook
    (:class:`WebhookSink`, JSON POST retried with backoff) and Python callbacks
    (:class:`CallbackSink`). A failing sink is logged and does not stop the others.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import math
import random
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from synckit.clock import utcnow
from synckit.connectors.schedule import cached_schedule
from synckit.errors.backoff import backoff_delay
from synckit.errors.exceptions import AlertDeliveryError, ConfigurationError, SynckitError
from synckit.errors.headers import server_wait
from synckit.runtime.audit import window_start
from synckit.runtime.budget import BudgetLevel, BudgetPolicy, pause_tenants
from synckit.runtime.handlers import JobContext, Registry
from synckit.runtime.logging import redact, redact_text
from synckit.store import alerts as store_alerts
from synckit.store.alerts import (
    DELIVERY_LEASE,
    GIVE_UP_AFTER,
    KEEP_ALERTS,
    POLL_KIND,
    AlertRow,
    ConnectionState,
    DlqGrowth,
    ReviewGroup,
    dlq_growth,
    dlq_in_review,
    load_connections,
    prune_alerts,
)
from synckit.store.audit import (
    AuditRow,
    Totals,
    VersionTotals,
    read_audit,
    totals_by_tenant,
    totals_by_version,
)
from synckit.store.connections import UNREADABLE_ROW_REASON
from synckit.store.db import Conn, Database
from synckit.store.jobs.admin import StuckJob, unreadable_run_at

# Only the webhook sink speaks HTTP: ``synckit status`` evaluates the rules on the spot
# and must not pay for an HTTP client (tests/unit/test_command_imports.py).
if TYPE_CHECKING:
    import httpx

ALERTS_KIND = "synckit.alerts"

log = structlog.get_logger("synckit.alerts")


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
    #: Pending jobs whose ``run_at`` cannot be read (see :mod:`~synckit.runtime.unreadable_jobs`).
    stuck_jobs: Sequence[StuckJob] = ()


class AlertRule(Protocol):
    @property
    def name(self) -> str: ...

    def evaluate(self, data: AlertData) -> list[Alert]: ...


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
class ServerErrorBurst:
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
            Alert(
                rule=self.name,
                subject=connector,
                message=(
                    f"{_failures_text(by_class[connector])} in {minutes:g} min on connector "
                    f"{connector or '-'} ({len(tenants[connector])} tenant(s))"
                ),
                fired_at=data.now,
                window=window_key(data.now, self.repeat_every),
                severity=self.severity,
                connector=connector,
                details={"count": n, "tenants": sorted(tenants[connector])},
            )
            for connector, n in sorted(counts.items())
            if n >= self.threshold
        ]


@dataclass(frozen=True)
class TenantOutlier:
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
                    Alert(
                        rule=self.name,
                        subject=tenant,
                        message=(
                            f"tenant {tenant} is failing ({failures} failures, "
                            f"{rates[tenant]:.0%}) while {len(normal)} of {len(peers)} other "
                            f"tenant(s) of {connector or '-'} are normal"
                        ),
                        fired_at=data.now,
                        window=window_key(data.now, self.repeat_every),
                        severity=self.severity,
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
class DlqAcceleration:
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
            Alert(
                rule=self.name,
                subject=g.connector,
                message=(
                    f"dead letters of {g.connector or '-'} accelerating: {g.current} in the "
                    f"last {_human(self.window)}, {g.previous} in the one before"
                ),
                fired_at=data.now,
                window=window_key(data.now, self.repeat_every),
                severity=self.severity,
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
class PollLag:
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
                Alert(
                    rule=self.name,
                    subject=c.tenant,
                    message=(
                        f"tenant {c.tenant} has not polled successfully for {_human(lag)} "
                        f"(schedule {c.schedule!r})"
                    ),
                    fired_at=data.now,
                    window=window_key(data.now, self.repeat_every),
                    severity=self.severity,
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
class NeedsReauthRule:
    """A connection that waits for its tenant to re-authorise."""

    repeat_every: timedelta = timedelta(hours=6)
    severity: Severity = Severity.CRITICAL
    name: str = "needs_reauth"

    def evaluate(self, data: AlertData) -> list[Alert]:
        return [
            Alert(
                rule=self.name,
                subject=c.tenant,
                message=(
                    f"tenant {c.tenant} ({c.connector}) must re-authorise: "
                    f"{c.status_reason or 'credentials refused'}"
                ),
                fired_at=data.now,
                window=window_key(data.now, self.repeat_every),
                severity=self.severity,
                tenant=c.tenant,
                connector=c.connector,
                details={"reason": c.status_reason},
            )
            for c in sorted(data.connections, key=lambda c: c.tenant)
            if c.status == "needs_reauth"
        ]


@dataclass(frozen=True)
class DeadCyclesRule:
    """A tenant paused because a stream's poll cycles kept dying (see
    :data:`synckit.errors.dlq_policy.DEAD_CYCLES_TO_PAUSE`); resume with ``synckit tenants
    resume`` once the API is fixed."""

    repeat_every: timedelta = timedelta(hours=6)
    severity: Severity = Severity.CRITICAL
    name: str = "dead_cycles"

    def evaluate(self, data: AlertData) -> list[Alert]:
        from synckit.errors.dlq_policy import DEAD_CYCLES_REASON

        return [
            Alert(
                rule=self.name,
                subject=c.tenant,
                message=f"tenant {c.tenant} ({c.connector}) paused: {c.status_reason}",
                fired_at=data.now,
                window=window_key(data.now, self.repeat_every),
                severity=self.severity,
                tenant=c.tenant,
                connector=c.connector,
                details={"reason": c.status_reason},
            )
            for c in data.connections
            if c.status == "paused" and (c.status_reason or "").startswith(DEAD_CYCLES_REASON)
        ]


@dataclass(frozen=True)
class UnreadableConnectionRule:
    """A tenant the worker held (paused) at start because its connection row cannot be
    read (see :func:`synckit.runtime.keys.hold_unreadable`); repair the row, then
    ``synckit tenants resume``."""

    repeat_every: timedelta = timedelta(hours=6)
    severity: Severity = Severity.CRITICAL
    name: str = "unreadable_connection"

    def evaluate(self, data: AlertData) -> list[Alert]:
        return [
            Alert(
                rule=self.name,
                subject=c.tenant,
                message=f"tenant {c.tenant} ({c.connector}) held: {c.status_reason}",
                fired_at=data.now,
                window=window_key(data.now, self.repeat_every),
                severity=self.severity,
                tenant=c.tenant,
                connector=c.connector,
                details={"reason": c.status_reason},
            )
            for c in sorted(data.connections, key=lambda c: c.tenant)
            if c.status == "paused" and (c.status_reason or "").startswith(UNREADABLE_ROW_REASON)
        ]


@dataclass(frozen=True)
class BudgetRule:
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
                Alert(
                    rule=self.name,
                    subject=tenant,
                    message=(
                        f"tenant {tenant} burnt {s.burn:.0%} of its error budget "
                        f"({s.failed} of {s.operations} operations failed in "
                        f"{_human(self.policy.window)})"
                    ),
                    fired_at=data.now,
                    window=window_key(data.now, self.repeat_every),
                    severity=self.severity,
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
class UnreadableRunAt:
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
            Alert(
                rule=self.name,
                subject=f"job:{j.id}",
                message=f"job {j.id} ({j.kind}) never runs: its {j.reason}",
                fired_at=data.now,
                window=window_key(data.now, self.repeat_every),
                severity=self.severity,
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
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


# --- loading (the store's reads; see synckit.store.alerts) ------------------------------


async def load_alert_data(conn: Conn, *, now: datetime, rules: RuleSet) -> AlertData:
    """Read what ``rules`` need, as of ``now``."""
    recent: list[AuditRow] = []
    if (window := rules.recent_window) is not None:
        recent = await read_audit(conn, since=window_start(now, window))
    versions: list[VersionTotals] = []
    if rules.deploy_regression is not None:
        versions = await totals_by_version(conn, since=now - rules.deploy_regression.lookback)
    tenant_totals: dict[str, Totals] = {}
    if rules.error_budget is not None:
        since = window_start(now, rules.error_budget.policy.window)
        tenant_totals = await totals_by_tenant(conn, since=since)
    dlq: list[DlqGrowth] = []
    if rules.dlq_growth is not None:
        dlq = await dlq_growth(conn, now=now, window=rules.dlq_growth.window)
    states: list[ConnectionState] = []
    if (
        rules.poll_lag is not None
        or rules.needs_reauth is not None
        or rules.dead_cycles
        or rules.unreadable_connection
    ):
        states = await load_connections(conn, poll_kind=rules.poll_kind)
    review = await dlq_in_review(conn) if rules.dlq_review is not None else []
    stuck: list[StuckJob] = []
    if (unreadable := rules.unreadable_run_at) is not None:
        stuck = await unreadable_run_at(conn, limit=unreadable.limit)
    return AlertData(
        now=now,
        recent=recent,
        versions=versions,
        tenant_totals=tenant_totals,
        dlq=dlq,
        connections=states,
        review=review,
        stuck_jobs=stuck,
    )


# --- records of fired alerts (the ``alerts`` table, synckit.store.alerts) -----------------

# Up to 294 characters a key is stored as it is, as the records before migration 0010
# were ("alert:" + key within 300): a window in progress across the upgrade stays one.
_PLAIN_KEY_MAX = 294


def dedupe_key(alert: Alert) -> str:
    """The ``alerts.dedupe_key`` of ``alert``: :attr:`Alert.key`, or for a long key its
    rule and a digest of it (the column holds 300 characters)."""
    key = alert.key
    if len(key) <= _PLAIN_KEY_MAX:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:40]
    return f"{alert.rule[:200]}|#{digest}"


@dataclass
class Delivery:
    """An alert to hand to ``sinks`` (the names of the sinks that do not have it yet)."""

    record_id: int | None
    alert: Alert
    sinks: list[str]
    new: bool
    delivered: dict[str, str] = field(default_factory=dict)
    #: The delivery lease's token the row is held under (None: not recorded).
    lease_token: str | None = None


def _row_of(alert: Alert) -> AlertRow:
    """What the ``alerts`` row of ``alert`` holds: message and details redacted, what
    sinks and logs receive."""
    body = alert.to_json()
    return AlertRow(
        rule=alert.rule,
        subject=alert.subject,
        window_key=alert.window,
        severity=alert.severity.value,
        tenant=alert.tenant,
        connector=alert.connector,
        message=body["message"],
        details=body["details"],
        fired_at=alert.fired_at,
    )


def _alert_of(row: AlertRow) -> Alert:
    return Alert(
        rule=row.rule,
        subject=row.subject,
        message=row.message,
        fired_at=row.fired_at,
        window=row.window_key,
        severity=Severity(row.severity),
        tenant=row.tenant,
        connector=row.connector,
        details=dict(row.details),
    )


async def claim_deliveries(
    conn: Conn,
    alerts: Sequence[Alert],
    *,
    now: datetime,
    sinks: Sequence[str],
    lease: timedelta = DELIVERY_LEASE,
    give_up_after: timedelta = GIVE_UP_AFTER,
) -> list[Delivery]:
    """Record the alerts not recorded yet (by rule, subject and window) as undelivered,
    and take a delivery lease on them and on every earlier alert some sink has not
    taken; return what each needs (:func:`synckit.store.alerts.claim_deliveries`)."""
    unique: dict[str, Alert] = {}
    for a in alerts:
        unique.setdefault(dedupe_key(a), a)
    claimed = await store_alerts.claim_deliveries(
        conn,
        {k: _row_of(a) for k, a in unique.items()},
        now=now,
        lease=lease,
        give_up_after=give_up_after,
    )
    out = [
        Delivery(
            s.id,
            _alert_of(s.row),
            [n for n in sinks if n not in s.delivered],
            False,
            dict(s.delivered),
            claimed.lease.token,
        )
        for s in claimed.owed
    ]
    out.extend(
        Delivery(rid, unique[key], list(sinks), True, lease_token=claimed.lease.token)
        for rid, key in claimed.new
    )
    return out


async def finish_deliveries(
    conn: Conn,
    done: Sequence[tuple[Delivery, list[str], str | None]],
    *,
    now: datetime,
    sinks: Sequence[str],
) -> None:
    """Note which sinks took each alert; finish the alerts every sink now has. Only
    under the lease the deliveries were claimed with: an alert another evaluator took
    over once it ran out is left to that one."""
    by_token: dict[str, list[store_alerts.DeliveryOutcome]] = {}
    for d, took, error in done:
        if d.record_id is None or d.lease_token is None:
            continue
        delivered = {**d.delivered, **{n: now.isoformat() for n in took}}
        complete = all(n in delivered for n in sinks)
        outcome = store_alerts.DeliveryOutcome(d.record_id, delivered, complete, error)
        by_token.setdefault(d.lease_token, []).append(outcome)
    for token, outcomes in by_token.items():
        await store_alerts.finish_deliveries(conn, outcomes, now=now, token=token)


async def record_alerts(conn: Conn, alerts: Sequence[Alert], *, now: datetime) -> list[Alert]:
    """Record the alerts not recorded yet, as delivered to no sink; return those."""
    claimed = await claim_deliveries(conn, alerts, now=now, sinks=())
    return [d.alert for d in claimed if d.new]


async def recent_alerts(conn: Conn, *, since: datetime, limit: int = 100) -> list[Alert]:
    """Alerts fired since ``since`` (delivered or still being delivered), newest first; a
    row that cannot be read is passed over."""
    return [_alert_of(r) for r in await store_alerts.recent_alerts(conn, since=since, limit=limit)]


# --- sinks and routing ------------------------------------------------------------------

AlertSink = Callable[[Alert], Awaitable[None]]


class LogSink:
    """Logs each alert as the structlog event ``alert.fired``."""

    async def __call__(self, alert: Alert) -> None:
        log.warning("alert.fired", **alert.to_json())


class CallbackSink:
    """Calls ``func(alert)``; ``func`` may be a plain function or a coroutine function."""

    def __init__(self, func: Callable[[Alert], Any]) -> None:
        self.func = func

    async def __call__(self, alert: Alert) -> None:
        result = self.func(alert)
        if inspect.isawaitable(result):
            await result


#: The share of a webhook retry's wait that jitter may take off.
_WEBHOOK_JITTER = 0.2


class WebhookSink:
    """POSTs each alert as JSON to ``url``.

    Transport errors, 5xx and 429 are retried up to ``attempts`` times in all, waiting
    ``backoff`` seconds doubling, capped at ``max_backoff``, less up to a fifth in jitter
    (:func:`~synckit.errors.backoff.backoff_delay`), and never less than the wait the
    server asks for (``Retry-After``); a wait longer than ``max_backoff`` ends the
    delivery at once (the next evaluation tries again). Any other non-2xx answer fails at
    once. Failing raises :class:`AlertDeliveryError`. ``sleep`` is what waits and ``rng``
    the jitter's draw in [0, 1) (a test passes a fixed draw and a sleep that records).
    """

    def __init__(
        self,
        url: str,
        *,
        attempts: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        allow_private: bool = True,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        # The waits' knobs as backoff_delay takes them: a bad value fails here, not in
        # the middle of a delivery.
        waits: tuple[timedelta, timedelta] | None
        try:
            waits = (timedelta(seconds=backoff), timedelta(seconds=max_backoff))
        except (OverflowError, ValueError):  # NaN, infinite, past what a timedelta holds
            waits = None
        if waits is None or min(waits) < timedelta(0):
            raise ValueError("backoff and max_backoff must be non-negative, finite seconds")
        self._waits = waits
        import httpx

        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ConfigurationError(
                f"webhook URL must be http(s)://host/...; got scheme {parsed.scheme!r}"
            )
        #: What logs and errors may show: the path of a webhook URL is often its secret.
        self.where = f"{parsed.scheme}://{parsed.host}" + (f":{parsed.port}" if parsed.port else "")
        self.name = f"webhook {self.where}"
        self.allow_private = allow_private
        self.url = url
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.timeout = timeout
        self.headers = dict(headers or {})
        self.transport = transport
        self.sleep = sleep
        self.rng = rng

    async def __call__(self, alert: Alert) -> None:
        import httpx

        body = alert.to_json()
        problem = ""
        if not self.allow_private:
            await _refuse_private(httpx.URL(self.url).host, self.where)
        async with httpx.AsyncClient(
            timeout=self.timeout, transport=self.transport, follow_redirects=False
        ) as client:
            for attempt in range(1, self.attempts + 1):
                asked: timedelta | None = None
                try:
                    response = await client.post(self.url, json=body, headers=self.headers)
                except httpx.TransportError as exc:
                    # httpx puts the URL in some messages: name the type only.
                    problem = type(exc).__name__
                else:
                    if response.is_success:
                        return
                    problem = f"HTTP {response.status_code}"
                    if response.status_code != 429 and response.status_code < 500:
                        break
                    asked = server_wait(response.headers, utcnow())
                if asked is not None and asked > self._waits[1]:
                    # Longer than this delivery may wait: retrying sooner would only be
                    # refused again. The alert stays undelivered to this sink and the next
                    # evaluation tries again.
                    problem += f" (Retry-After {asked.total_seconds():g} s)"
                    break
                if attempt < self.attempts:
                    delay = backoff_delay(
                        attempt,
                        self.rng(),
                        base=self._waits[0],
                        cap=self._waits[1],
                        jitter=_WEBHOOK_JITTER,
                    )
                    if asked is not None:
                        delay = max(delay, asked)  # the server's wait, never less
                    log.info("alert.webhook_retry", rule=alert.rule, attempt=attempt, error=problem)
                    await self.sleep(delay.total_seconds())
        raise AlertDeliveryError(f"webhook {self.where} refused alert {alert.key}: {problem}")


async def _refuse_private(host: str, where: str) -> None:
    """Refuse a host that is, or resolves to, a private, loopback, link-local (cloud
    metadata: 169.254.169.254) or otherwise non-global address."""
    import ipaddress
    import socket

    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None)
        except socket.gaierror as exc:
            raise AlertDeliveryError(f"webhook {where}: cannot resolve host ({exc})") from None
        addresses = [ipaddress.ip_address(str(i[4][0]).split("%")[0]) for i in infos]
    for address in addresses:
        if not address.is_global:
            raise AlertDeliveryError(
                f"webhook {where}: {address} is not a public address (allow_private=False)"
            )


class AlertRouter:
    """De-duplicates alerts and hands the new ones to every sink.

    With a database (given here or per call) de-duplication is recorded in ``alerts`` and
    holds across processes; without one it is kept in this process's memory.
    """

    def __init__(
        self,
        sinks: Sequence[AlertSink] = (),
        *,
        db: Database | None = None,
        log_sink: bool = True,
        memory: timedelta = timedelta(days=2),
    ) -> None:
        self.sinks: list[AlertSink] = ([LogSink()] if log_sink else []) + list(sinks)
        self.db = db
        self.memory = memory
        self._seen: dict[str, datetime] = {}
        self._alerts: dict[str, Alert] = {}
        self._delivered: defaultdict[str, set[str]] = defaultdict(set)

    def add_sink(self, sink: AlertSink) -> None:
        self.sinks.append(sink)

    async def emit(self, alert: Alert, *, db: Database | None = None) -> bool:
        """Deliver ``alert`` unless its rule, subject and window were delivered; say which."""
        return bool(await self.emit_many([alert], db=db))

    def sink_names(self) -> list[str]:
        """A stable name per sink (``webhook https://host``), what delivery is noted by."""
        names: list[str] = []
        for sink in self.sinks:
            base = str(getattr(sink, "name", None) or type(sink).__name__)
            name, n = base, 1
            while name in names:
                n += 1
                name = f"{base}#{n}"
            names.append(name)
        return names

    async def emit_many(
        self, alerts: Sequence[Alert], *, db: Database | None = None, now: datetime | None = None
    ) -> list[Alert]:
        """Deliver the alerts not delivered yet, and retry earlier ones some sink did not
        take; return the alerts recorded for the first time by this call."""
        now = now or utcnow()
        target = db or self.db
        names = self.sink_names()
        if target is not None:
            async with target.begin() as conn:
                todo = await claim_deliveries(conn, alerts, now=now, sinks=names)
        else:
            todo = self._remember(alerts, now, names)
        if not todo:
            return []
        results = [await self._deliver(d, names) for d in todo]
        if target is not None:
            async with target.begin() as conn:
                await finish_deliveries(conn, results, now=now, sinks=names)
        else:
            for d, took, _error in results:
                self._delivered[d.alert.key].update(took)
        return [d.alert for d in todo if d.new]

    async def dlq_review(
        self,
        tenant: str,
        error_class: str,
        count: int,
        *,
        connector: str = "",
        now: datetime | None = None,
        db: Database | None = None,
    ) -> bool:
        """Alert that ``count`` dead letters of ``tenant`` (``error_class``) need review."""
        alert = dlq_review_alert(
            tenant, error_class, count, now=now or utcnow(), connector=connector
        )
        return await self.emit(alert, db=db)

    def _remember(self, alerts: Sequence[Alert], now: datetime, names: list[str]) -> list[Delivery]:
        for key, at in list(self._seen.items()):
            if now - at > self.memory:
                del self._seen[key], self._delivered[key], self._alerts[key]
        todo: list[Delivery] = []
        for a in alerts:
            if a.key not in self._seen:
                self._seen[a.key] = now
                self._alerts[a.key] = a
                todo.append(Delivery(None, a, list(names), True))
        fresh = {d.alert.key for d in todo}
        for key, a in self._alerts.items():
            missing = [n for n in names if n not in self._delivered[key]]
            if key not in fresh and missing:
                todo.append(Delivery(None, a, missing, False))
        return todo

    async def _deliver(
        self, d: Delivery, names: list[str]
    ) -> tuple[Delivery, list[str], str | None]:
        """Hand ``d.alert`` to the sinks named in ``d.sinks``; say which took it."""
        from synckit.runtime.metrics import record_alert  # metrics imports this module

        if d.new:
            record_alert(d.alert.rule)
        chosen = [(n, s) for n, s in zip(names, self.sinks, strict=True) if n in d.sinks]
        results = await asyncio.gather(*(s(d.alert) for _, s in chosen), return_exceptions=True)
        took: list[str] = []
        errors: list[str] = []
        for (name, _sink), result in zip(chosen, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                # One broken sink (a webhook down) must not silence the others; it is
                # tried again at the next evaluation.
                error = redact_text(str(result))[:300]
                errors.append(f"{name}: {error}")
                log.error(
                    "alert.sink_failed",
                    rule=d.alert.rule,
                    subject=d.alert.subject,
                    sink=name,
                    error=error,
                    retry="at the next evaluation",
                )
            else:
                took.append(name)
        return d, took, "; ".join(errors) or None


_router = AlertRouter()


def get_alert_router() -> AlertRouter:
    """The process's default router (log sink only, in-memory de-duplication)."""
    return _router


def set_alert_router(router: AlertRouter) -> None:
    """Make ``router`` the default one that :func:`emit_alert` uses."""
    global _router
    _router = router


async def emit_alert(alert: Alert) -> bool:
    """Deliver ``alert`` through the default router; False if it was a duplicate."""
    return await _router.emit(alert)


# --- the scheduled evaluation -------------------------------------------------------------

DatabaseSource = Database | Callable[[], Database]


class AlertEvaluator:
    """Loads, evaluates and routes the rules; the ``synckit.alerts`` job runs it."""

    def __init__(
        self,
        database: DatabaseSource | None = None,
        *,
        rules: RuleSet | None = None,
        router: AlertRouter | None = None,
        keep: timedelta = KEEP_ALERTS,
    ) -> None:
        self._database = database
        self.rules = rules or RuleSet()
        self.router = router or get_alert_router()
        self.keep = keep

    def database(self, db: Database | None = None) -> Database:
        """The database to evaluate on: the one given at creation, else ``db`` (the
        worker's, handed to the job as ``JobContext.db``)."""
        source = self._database
        if source is None:
            if db is None:
                raise SynckitError(
                    "the alert evaluator has no database: pass one to register_alerts() or "
                    "run it under a worker, whose database the job is given"
                )
            return db
        return source if isinstance(source, Database) else source()

    async def evaluate(
        self, now: datetime | None = None, *, db: Database | None = None
    ) -> list[Alert]:
        """Evaluate every rule now; deliver and return the alerts that are new. ``db`` is
        used when no database was given at creation."""
        now = now or utcnow()
        db = self.database(db)
        async with db.begin() as conn:
            data = await load_alert_data(conn, now=now, rules=self.rules)
            # A batch a minute keeps up with any rate the rules can fire at.
            await prune_alerts(conn, before=now - self.keep)
        candidates = self.rules.evaluate(data)
        fired = await self.router.emit_many(candidates, db=db, now=now)
        budget = self.rules.error_budget
        if budget is not None and budget.policy.pause_on_alert:
            to_pause = [a for a in fired if a.rule == budget.name and a.tenant]
            if to_pause:
                async with db.begin() as conn:
                    for a in to_pause:
                        assert a.tenant is not None
                        await pause_tenants(conn, [a.tenant], reason=a.message, now=now)
        log.info("alerts.evaluated", candidates=len(candidates), fired=len(fired))
        return fired

    async def handle(self, ctx: JobContext) -> None:
        await self.evaluate(db=ctx.db)


def register_alerts(
    registry: Registry,
    database: DatabaseSource | None = None,
    *,
    rules: RuleSet | None = None,
    router: AlertRouter | None = None,
    every: timedelta = timedelta(minutes=1),
    kind: str = ALERTS_KIND,
) -> AlertEvaluator:
    """Evaluate the alert rules every ``every`` as the recurring job ``kind``.

    ``database`` is a :class:`Database` or a factory of one; left out, the job evaluates
    on the database of the worker that runs it (``JobContext.db``).
    """
    evaluator = AlertEvaluator(database, rules=rules, router=router)
    registry.add(kind, evaluator.handle, timeout=120, max_attempts=2)
    registry.recurring(kind, kind, every=every)
    return evaluator


__all__ = [
    "ALERTS_KIND",
    "Alert",
    "AlertData",
    "AlertEvaluator",
    "AlertRouter",
    "AlertRule",
    "AlertSink",
    "BudgetRule",
    "CallbackSink",
    "DeadCyclesRule",
    "Delivery",
    "DeployRegression",
    "DlqAcceleration",
    "DlqReview",
    "LogSink",
    "NeedsReauthRule",
    "PollLag",
    "RuleSet",
    "ServerErrorBurst",
    "Severity",
    "TenantOutlier",
    "UnreadableConnectionRule",
    "UnreadableRunAt",
    "WebhookSink",
    "claim_deliveries",
    "dedupe_key",
    "dlq_review_alert",
    "emit_alert",
    "finish_deliveries",
    "get_alert_router",
    "load_alert_data",
    "poll_deadline",
    "recent_alerts",
    "record_alerts",
    "register_alerts",
    "set_alert_router",
    "window_key",
]
