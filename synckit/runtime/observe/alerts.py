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

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import structlog

from synckit.clock import utcnow
from synckit.errors.exceptions import SynckitError
from synckit.runtime.admin.audit import window_start
from synckit.runtime.observe.alert_delivery import AlertRouter, get_alert_router
from synckit.runtime.observe.alert_rules import Alert, AlertData, RuleSet
from synckit.runtime.observe.budget import pause_tenants
from synckit.store.alerts import (
    KEEP_ALERTS,
    ConnectionState,
    DlqGrowth,
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
from synckit.store.db import Conn, Database
from synckit.store.jobs.admin import StuckJob, unreadable_run_at

# Only the webhook sink speaks HTTP: ``synckit status`` evaluates the rules on the spot
# and must not pay for an HTTP client (tests/unit/test_command_imports.py), nor for the
# job registry (and the outbox it imports), which only a worker's evaluator needs.
if TYPE_CHECKING:
    from synckit.runtime.jobs.handlers import JobContext, Registry

ALERTS_KIND = "synckit.alerts"

log = structlog.get_logger("synckit.alerts")


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
    "AlertEvaluator",
    "load_alert_data",
    "register_alerts",
]
