"""Alert rules over real tables, de-duplication in the database, sinks, the scheduled job."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from audit_rows import record_audit  # tests/
from sqlalchemy import func, insert, select
from structlog.testing import capture_logs

from synckit.clock import utcnow
from synckit.errors import RetryPolicy
from synckit.errors.exceptions import AlertDeliveryError
from synckit.runtime.jobs.handlers import Registry
from synckit.runtime.jobs.worker import Worker
from synckit.runtime.observe.alert_delivery import (
    AlertRouter,
    CallbackSink,
    WebhookSink,
    claim_deliveries,
    recent_alerts,
    record_alerts,
)
from synckit.runtime.observe.alert_rules import Alert, BudgetRule, RuleSet, Severity
from synckit.runtime.observe.alerts import (
    ALERTS_KIND,
    AlertEvaluator,
    load_alert_data,
    register_alerts,
)
from synckit.runtime.observe.budget import BudgetPolicy
from synckit.runtime.sync import cron
from synckit.store.db import Database
from synckit.store.tables import alerts, checkpoints, connections, dead_letters, jobs

NOW = datetime(2026, 3, 4, 12, 4, 30, tzinfo=UTC)


async def add_connection(
    db: Database,
    tenant: str,
    connector: str = "graph",
    *,
    status: str = "active",
    schedule: str | None = "every 5m",
    reason: str | None = None,
    now: datetime = NOW,
) -> None:
    async with db.begin() as conn:
        await conn.execute(
            insert(connections).values(
                tenant=tenant,
                connector=connector,
                resource_key=f"{connector}:{tenant}",
                schedule=schedule,
                status=status,
                status_reason=reason,
                created_at=now - timedelta(days=5),
                updated_at=now - timedelta(days=5),
            )
        )


async def add_checkpoint(db: Database, tenant: str, at: datetime, connector: str = "graph") -> None:
    async with db.begin() as conn:
        await conn.execute(
            insert(checkpoints).values(
                tenant=tenant,
                connector=connector,
                stream="messages",
                cursor={"d": 1},
                updated_at=at,
            )
        )


async def add_poll_job(db: Database, tenant: str, finished: datetime) -> None:
    async with db.begin() as conn:
        await conn.execute(
            insert(jobs).values(
                kind="synckit.poll",
                payload={"tenant": tenant, "connector": "graph"},
                resource_key=f"graph:{tenant}",
                status="succeeded",
                run_at=finished,
                created_at=finished,
                updated_at=finished,
                finished_at=finished,
            )
        )


async def add_dead_letters(
    db: Database,
    connector: str,
    ages: list[timedelta],
    *,
    status: str = "pending",
    tenant: str = "acme",
    error_class: str = "transient",
) -> None:
    async with db.begin() as conn:
        await conn.execute(
            insert(dead_letters),
            [
                {
                    "tenant": tenant,
                    "connector": connector,
                    "kind": "record:messages",
                    "record_id": f"{tenant}-{status}-r{i}",
                    "error_class": error_class,
                    "error_message": "bad",
                    "status": status,
                    "first_failed_at": NOW - age,
                    "last_attempt_at": NOW - age,
                }
                for i, age in enumerate(ages)
            ],
        )


async def seed_patterns(db: Database) -> None:
    """One instance of every pattern, next to healthy tenants that must stay quiet."""
    async with db.begin() as conn:
        # (a) + (b) + budget: acme of graph failing with 500s, beta and gamma fine.
        for m in range(3):
            at = NOW - timedelta(minutes=m)
            await record_audit(
                conn,
                "acme",
                "graph",
                at,
                1,
                {"server_error": 1},
                app_version="v1",
                retried_by_class={"server_error": 2},
            )
            await record_audit(conn, "beta", "graph", at, 40, {}, app_version="v1")
            await record_audit(
                conn,
                "gamma",
                "graph",
                at,
                30,
                {},
                app_version="v1",
                retried_by_class={"transient": 1} if m == 0 else None,
            )
        await record_audit(
            conn,
            "acme",
            "graph",
            NOW - timedelta(hours=3),
            60,
            {"server_error": 40},
            app_version="v1",
        )
        # (c) hubspot: validation errors jump after v2 replaced v1.
        for h in (5, 4, 3):
            await record_audit(
                conn,
                "delta",
                "hubspot",
                NOW - timedelta(hours=h),
                5000,
                {"validation": 1},
                app_version="v1",
            )
        await record_audit(
            conn,
            "delta",
            "hubspot",
            NOW - timedelta(minutes=40),
            150,
            {"validation": 30},
            app_version="v2",
        )
    # (d) 12 dead letters of graph in the last hour, 3 in the hour before.
    await add_dead_letters(
        db,
        "graph",
        [timedelta(minutes=5 * i + 1) for i in range(12)]
        + [timedelta(minutes=70 + i) for i in range(3)],
    )
    # (e) lag: beta's last checkpoint is 30 min old; gamma and acme polled recently.
    await add_connection(db, "acme")
    await add_connection(db, "beta")
    await add_connection(db, "gamma")
    await add_checkpoint(db, "acme", NOW - timedelta(minutes=2))
    await add_checkpoint(db, "beta", NOW - timedelta(minutes=30))
    await add_poll_job(db, "beta", NOW - timedelta(minutes=25))
    await add_checkpoint(db, "gamma", NOW - timedelta(minutes=40))
    await add_poll_job(db, "gamma", NOW - timedelta(minutes=1))
    # (f) epsilon must re-authorise.
    await add_connection(db, "epsilon", "hubspot", status="needs_reauth", reason="invalid_grant")
    # (g) two of zeta's records failed validation: straight to review, at capture.
    await add_dead_letters(
        db,
        "hubspot",
        [timedelta(days=2), timedelta(days=3)],
        status="review",
        tenant="zeta",
        error_class="validation",
    )


EXPECTED = {
    ("server_errors", "graph"),
    ("tenant_outlier", "acme"),
    ("deploy_regression", "hubspot:validation"),
    ("dlq_growth", "graph"),
    ("poll_lag", "beta"),
    ("needs_reauth", "epsilon"),
    ("error_budget", "acme"),
    ("dlq_review", "zeta:validation"),
}


@dataclass
class Collected:
    alerts: list[Alert] = field(default_factory=list)

    def router(self, db: Database | None = None) -> AlertRouter:
        return AlertRouter([CallbackSink(self.alerts.append)], db=db)


async def test_every_pattern_fires_from_the_tables(db: Database) -> None:
    """Seeded patterns each fire their rule, about the right subject, and nothing else."""
    await seed_patterns(db)
    got = Collected()
    fired = await AlertEvaluator(db, router=got.router()).evaluate(NOW)
    assert {(a.rule, a.subject) for a in fired} == EXPECTED
    assert {(a.rule, a.subject) for a in got.alerts} == EXPECTED
    lag = next(a for a in fired if a.rule == "poll_lag")
    assert lag.details["lag_seconds"] == 25 * 60  # the poll job is newer than the checkpoint
    review = next(a for a in fired if a.rule == "dlq_review")
    assert review.details["count"] == 2 and review.connector == "hubspot"


async def test_a_lone_transient_in_the_tables_fires_nothing(db: Database) -> None:
    """Healthy tenants and one transient failure: the evaluation delivers no alert."""
    await add_connection(db, "acme")
    await add_checkpoint(db, "acme", NOW - timedelta(minutes=1))
    async with db.begin() as conn:
        await record_audit(conn, "acme", "graph", NOW, 50, {}, retried_by_class={"transient": 1})
        await record_audit(conn, "beta", "graph", NOW, 50, {})
    await add_dead_letters(db, "graph", [timedelta(minutes=3)])
    assert await AlertEvaluator(db, router=Collected().router()).evaluate(NOW) == []


async def test_alerts_are_delivered_once_per_window_and_recorded(db: Database) -> None:
    """A second evaluation in the same window delivers nothing; the next window re-fires
    the lasting conditions, except a deploy regression (once per version)."""
    await seed_patterns(db)
    got = Collected()
    evaluator = AlertEvaluator(db, router=got.router())
    assert len(await evaluator.evaluate(NOW)) == len(EXPECTED)
    assert await evaluator.evaluate(NOW + timedelta(seconds=50)) == []
    async with db.begin() as conn:
        recorded = await recent_alerts(conn, since=NOW - timedelta(hours=1))
        count = (await conn.execute(select(func.count()).select_from(alerts))).scalar_one()
        as_jobs = (await conn.execute(select(func.count()).select_from(jobs))).scalar_one()
    assert count == len(EXPECTED)
    assert as_jobs == 2  # the seeded poll jobs: no alert is a job any more
    assert {(a.rule, a.subject) for a in recorded} == EXPECTED
    later = await evaluator.evaluate(NOW + timedelta(hours=1))
    assert ("deploy_regression", "hubspot:validation") not in {(a.rule, a.subject) for a in later}
    assert ("needs_reauth", "epsilon") not in {(a.rule, a.subject) for a in later}  # 6 h window
    assert ("poll_lag", "beta") in {(a.rule, a.subject) for a in later}


async def test_concurrent_evaluators_deliver_each_alert_once(db: Database) -> None:
    """Two workers evaluating at the same moment deliver every alert exactly once."""
    await seed_patterns(db)
    got = Collected()
    router = got.router()
    results = await asyncio.gather(
        *(AlertEvaluator(db, router=router).evaluate(NOW) for _ in range(3))
    )
    assert sum(len(r) for r in results) == len(EXPECTED)
    assert sorted((a.rule, a.subject) for a in got.alerts) == sorted(EXPECTED)


async def test_budget_alert_pauses_the_tenant(db: Database) -> None:
    """With pause_on_alert the budget alert pauses the tenant, with the alert as reason."""
    await seed_patterns(db)
    rules = RuleSet(error_budget=BudgetRule(BudgetPolicy(pause_on_alert=True)))
    await AlertEvaluator(db, rules=rules, router=Collected().router()).evaluate(NOW)
    async with db.begin() as conn:
        state = dict(
            (r.tenant, (r.status, r.status_reason)) for r in await conn.execute(select(connections))
        )
    assert state["acme"][0] == "paused"
    assert "error budget" in str(state["acme"][1])
    assert state["beta"] == ("active", None)


async def test_loaded_data_reads_last_success_on_both_engines(db: Database) -> None:
    """The newest of checkpoint and poll job is the last success, as an aware datetime."""
    await seed_patterns(db)
    async with db.begin() as conn:
        data = await load_alert_data(conn, now=NOW, rules=RuleSet())
    last = {c.tenant: c.last_success_at for c in data.connections}
    assert last["gamma"] == NOW - timedelta(minutes=1)
    assert last["beta"] == NOW - timedelta(minutes=25)
    assert last["epsilon"] is None
    versions = {(v.connector, v.app_version): v for v in data.versions}
    assert versions[("hubspot", "v2")].first_seen.tzinfo is not None


async def test_scheduled_job_evaluates_under_the_worker(db: Database) -> None:
    """register_alerts adds the recurring synckit.alerts job; without a database of its
    own it evaluates on the worker's (JobContext.db) and reaches the sinks."""
    now = utcnow()
    await add_connection(db, "zeta", status="needs_reauth", reason="refresh refused", now=now)
    got = Collected()
    reg = Registry()
    register_alerts(reg, router=got.router(), every=timedelta(minutes=1))
    await cron.sync_schedules(db, reg.schedules, now - timedelta(minutes=2))
    worker = Worker(db, reg, retry_policy=RetryPolicy.deterministic(), poll_interval=0.05)
    await worker.run_until_idle()
    assert [(a.rule, a.subject) for a in got.alerts] == [("needs_reauth", "zeta")]
    async with db.begin() as conn:
        statuses = [
            r.status for r in await conn.execute(select(jobs).where(jobs.c.kind == ALERTS_KIND))
        ]
    assert statuses == ["succeeded"]


# --- the webhook sink against a real HTTP server ----------------------------------------------


@dataclass
class Hook:
    statuses: list[int]
    bodies: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def hook_server() -> Iterator[Hook]:
    hook = Hook(statuses=[])

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            hook.bodies.append(json.loads(self.rfile.read(length)))
            status = hook.statuses.pop(0) if hook.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hook.url = f"http://127.0.0.1:{server.server_address[1]}/alerts"
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


async def test_webhook_delivers_json_and_retries_after_a_500(
    db: Database, hook_server: Hook
) -> None:
    """The webhook gets a JSON POST per alert; a 500 is retried with backoff."""
    await add_connection(db, "epsilon", "hubspot", status="needs_reauth", reason="invalid_grant")
    hook_server.statuses = [500]
    router = AlertRouter([WebhookSink(hook_server.url, backoff=0.05)], db=db)
    with capture_logs() as logs:
        fired = await AlertEvaluator(db, router=router).evaluate(NOW)
    assert [(a.rule, a.subject) for a in fired] == [("needs_reauth", "epsilon")]
    assert len(hook_server.bodies) == 2
    body = hook_server.bodies[-1]
    assert (body["rule"], body["subject"], body["severity"]) == (
        "needs_reauth",
        "epsilon",
        "critical",
    )
    assert "invalid_grant" in body["message"]
    events = [e["event"] for e in logs]
    assert events.count("alert.fired") == 1 and events.count("alert.webhook_retry") == 1
    assert not any(e["event"] == "alert.sink_failed" for e in logs)


async def test_webhook_that_keeps_failing_is_logged_not_raised(
    db: Database, hook_server: Hook
) -> None:
    """After its attempts, a failing webhook is logged as alert.sink_failed; the
    evaluation itself succeeds and the alert stays recorded, undelivered to that sink."""
    await add_connection(db, "epsilon", "hubspot", status="needs_reauth")
    hook_server.statuses = [500, 502, 503]
    router = AlertRouter([WebhookSink(hook_server.url, attempts=3, backoff=0.01)], db=db)
    with capture_logs() as logs:
        fired = await AlertEvaluator(db, router=router).evaluate(NOW)
    assert len(fired) == 1 and len(hook_server.bodies) == 3
    failed = [e for e in logs if e["event"] == "alert.sink_failed"]
    assert failed and "HTTP 503" in failed[0]["error"]
    async with db.begin() as conn:
        row = (await conn.execute(select(alerts))).one()
    assert row.finished_at is None and "HTTP 503" in row.last_error
    assert list(row.delivered) == ["LogSink"]


async def test_an_alert_the_webhook_missed_is_delivered_at_the_next_evaluation(
    db: Database, hook_server: Hook
) -> None:
    """At least once: with the webhook down, the alert is retried at the next evaluation
    to the webhook only (the log is not repeated), then never again."""
    await add_connection(db, "epsilon", "hubspot", status="needs_reauth")
    hook_server.statuses = [503]
    router = AlertRouter([WebhookSink(hook_server.url, attempts=1)], db=db)
    evaluator = AlertEvaluator(db, router=router)
    with capture_logs() as logs:
        assert len(await evaluator.evaluate(NOW)) == 1
        assert await evaluator.evaluate(NOW + timedelta(minutes=1)) == []
        assert await evaluator.evaluate(NOW + timedelta(minutes=2)) == []
    assert len(hook_server.bodies) == 2  # the refused POST, then the retry that took it
    assert hook_server.bodies[1]["subject"] == "epsilon"
    assert [e["event"] for e in logs].count("alert.fired") == 1
    async with db.begin() as conn:
        row = (await conn.execute(select(alerts))).one()
    assert row.finished_at is not None and row.last_error is None and row.attempts == 2
    assert sorted(row.delivered) == ["LogSink", f"webhook {hook_server.url[:-7]}"]


async def test_an_alert_whose_condition_cleared_is_still_delivered(
    db: Database, hook_server: Hook
) -> None:
    """The retry does not depend on the rule still firing: the record itself is retried."""
    await add_connection(db, "epsilon", "hubspot", status="needs_reauth")
    hook_server.statuses = [503]
    router = AlertRouter([WebhookSink(hook_server.url, attempts=1)], db=db)
    await AlertEvaluator(db, router=router).evaluate(NOW)
    async with db.begin() as conn:
        await conn.execute(connections.update().values(status="active"))
    await AlertEvaluator(db, router=router).evaluate(NOW + timedelta(minutes=1))
    assert [b["rule"] for b in hook_server.bodies].count("needs_reauth") == 2


async def test_router_without_database_retries_in_memory() -> None:
    """Without a database, a sink that failed gets the alert at the next emit."""
    calls: list[str] = []

    def flaky(alert: Alert) -> None:
        calls.append(alert.subject)
        if len(calls) == 1:
            raise RuntimeError("down")

    router = AlertRouter([CallbackSink(flaky)], log_sink=False)
    alert = Alert("r", "s", "m", NOW, "w")
    assert await router.emit_many([alert], now=NOW) == [alert]
    assert await router.emit_many([], now=NOW) == []
    assert await router.emit_many([alert], now=NOW) == []
    assert calls == ["s", "s"]


def test_webhook_sink_accepts_http_and_https_only() -> None:
    """file:, gopher: or a URL without a host is refused when the sink is made."""
    from synckit.errors.exceptions import ConfigurationError

    for url in ("file:///etc/passwd", "gopher://x/", "ftp://h/x", "http:///nohost"):
        with pytest.raises(ConfigurationError):
            WebhookSink(url)
    assert WebhookSink("https://hooks.example/T/B/secretpath").where == "https://hooks.example"


async def test_webhook_sink_can_refuse_private_addresses(hook_server: Hook) -> None:
    """allow_private=False refuses loopback, link-local (cloud metadata) and private
    hosts before sending anything; errors and logs name scheme and host, never the path."""
    for url in (
        hook_server.url + "/T000/B000/SeCrEtPaTh",
        "http://169.254.169.254/latest/meta-data/SeCrEtPaTh",
        "http://10.1.2.3/SeCrEtPaTh",
        "http://localhost:9/SeCrEtPaTh",
    ):
        sink = WebhookSink(url, allow_private=False, attempts=1)
        with pytest.raises(AlertDeliveryError, match="not a public address") as info:
            await sink(Alert("r", "s", "m", NOW, "w"))
        assert "SeCrEtPaTh" not in str(info.value)
    assert hook_server.bodies == []


async def test_webhook_failure_logs_never_show_the_url_path(db: Database) -> None:
    """A Slack-style secret path stays out of the sink_failed log and the stored error."""
    await add_connection(db, "epsilon", "hubspot", status="needs_reauth")
    router = AlertRouter(
        [WebhookSink("http://127.0.0.1:9/services/T0/B0/SeCrEt", attempts=1)], db=db
    )
    with capture_logs() as logs:
        await AlertEvaluator(db, router=router).evaluate(NOW)
    assert "SeCrEt" not in repr(logs)
    async with db.begin() as conn:
        stored = (await conn.execute(select(alerts))).all()
    assert stored and "SeCrEt" not in repr(stored)


# --- the alerts table: migration, unreadable rows, pruning, processes ------------------------


def _record(alert: Alert, delivered: dict[str, str], **columns: Any) -> dict[str, Any]:
    """A ``jobs`` row as alert records were before migration 0010."""
    return {
        "kind": "synckit.alert_record",
        "payload": {**alert.to_json(), "_delivered": delivered},
        "status": "succeeded",
        "run_at": alert.fired_at,
        "unique_key": f"alert:{alert.key}",
        "created_at": alert.fired_at,
        "updated_at": alert.fired_at,
        "attempts": 0,
        "last_error": None,
        "lease_expires_at": None,
        "finished_at": None,
        **columns,
    }


async def test_migration_0010_moves_alert_records_out_of_jobs(db_url: str) -> None:
    """Upgrading moves each alert record to `alerts` with its delivery state (a second
    record of one key and rows that are not records aside), the undelivered one is then
    retried to the sink that missed it only and the delivered one not at all;
    downgrading writes them back as records that read as the same alerts."""
    from sqlalchemy import text

    from synckit.store import migrate
    from synckit.store.db import open_database

    done = Alert(
        "needs_reauth",
        "epsilon",
        "tenant epsilon must re-authorise",
        NOW - timedelta(minutes=3),
        "2026-03-04T12:00:00+00:00",
        severity=Severity.CRITICAL,
        tenant="epsilon",
        connector="hubspot",
        details={"reason": "invalid_grant"},
    )
    owed = Alert("poll_lag", "beta", "beta is late", NOW - timedelta(minutes=2), "w1")
    took = {"LogSink": (NOW - timedelta(minutes=2)).isoformat()}
    d = open_database(db_url)
    try:
        await migrate.upgrade(d, "0009")
        async with d.begin() as conn:
            await conn.execute(
                insert(jobs),
                [
                    _record(done, took, attempts=1, finished_at=NOW - timedelta(minutes=2)),
                    _record(
                        owed,
                        took,
                        attempts=1,
                        last_error="webhook: HTTP 503",
                        lease_expires_at=NOW - timedelta(minutes=1),
                    ),
                    _record(done, {}),  # a second record of done's key
                    {
                        **_record(owed, {}),
                        "payload": ["not", "an", "alert"],
                        "unique_key": "alert:x",
                    },
                    {
                        **_record(owed, {}),
                        "kind": "sync.things",
                        "status": "pending",
                        "unique_key": "t",
                    },
                ],
            )
            if not d.is_postgres:
                await conn.execute(
                    insert(jobs), [{**_record(owed, {}), "unique_key": "alert:y", "payload": {}}]
                )
                await conn.execute(
                    text("UPDATE jobs SET payload = 'x{' WHERE unique_key = 'alert:y'")
                )
        await migrate.upgrade(d)
        async with d.begin() as conn:
            rows = {r.rule: r for r in await conn.execute(select(alerts).order_by(alerts.c.id))}
            left = sorted(
                (r.kind, r.unique_key)
                for r in await conn.execute(select(jobs.c.kind, jobs.c.unique_key))
            )
        assert sorted(rows) == ["needs_reauth", "poll_lag"]
        moved = rows["needs_reauth"]
        assert (moved.dedupe_key, moved.subject, moved.window_key, moved.severity) == (
            done.key,
            "epsilon",
            done.window,
            "critical",
        )
        assert (moved.tenant, moved.connector, moved.message) == (
            "epsilon",
            "hubspot",
            done.message,
        )
        assert moved.details == {"reason": "invalid_grant"} and moved.delivered == took
        assert moved.fired_at == done.fired_at and moved.finished_at == NOW - timedelta(minutes=2)
        waiting = rows["poll_lag"]
        assert waiting.finished_at is None and waiting.last_error == "webhook: HTTP 503"
        assert waiting.delivered == took and waiting.attempts == 1
        kept = [
            ("synckit.alert_record", "alert:x"),
            ("sync.things", "t"),
        ]
        if not d.is_postgres:
            kept.append(("synckit.alert_record", "alert:y"))
        assert left == sorted(kept)

        got = Collected()
        fresh = await got.router(d).emit_many([done, owed], now=NOW)
        assert fresh == [] and got.alerts == [owed]
        async with d.begin() as conn:
            assert (
                await conn.execute(select(alerts.c.finished_at).where(alerts.c.rule == "poll_lag"))
            ).scalar_one() == NOW

        await migrate.downgrade(d, "0009")
        async with d.begin() as conn:
            back = {
                r.unique_key: r
                for r in await conn.execute(
                    # The columns of 0009's jobs table: later migrations add others.
                    select(
                        jobs.c.unique_key,
                        jobs.c.kind,
                        jobs.c.status,
                        jobs.c.payload,
                        jobs.c.finished_at,
                    ).where(jobs.c.unique_key.in_([f"alert:{done.key}", f"alert:{owed.key}"]))
                )
            }
        assert {(r.kind, r.status) for r in back.values()} == {
            ("synckit.alert_record", "succeeded")
        }
        assert Alert.from_json(back[f"alert:{done.key}"].payload) == done
        assert Alert.from_json(back[f"alert:{owed.key}"].payload) == owed
        assert back[f"alert:{owed.key}"].payload["_delivered"] == {
            **took,
            "CallbackSink": NOW.isoformat(),
        }
        assert back[f"alert:{done.key}"].finished_at == NOW - timedelta(minutes=2)
    finally:
        await d.dispose()


async def test_an_unreadable_alert_row_is_passed_over_and_given_up(db: Database) -> None:
    """A row a hand edit broke (an unknown severity; on SQLite details that are not
    JSON) is left out of the recent alerts, and delivery names it and stops, while the
    alerts beside it are read and delivered."""
    from sqlalchemy import text

    good = Alert("poll_lag", "beta", "late", NOW, "w")
    async with db.begin() as conn:
        await record_alerts(
            conn,
            [good, Alert("r", "loud", "m", NOW, "w"), Alert("r", "garbled", "m", NOW, "w")],
            now=NOW - timedelta(hours=1),
        )
        await conn.execute(
            alerts.update().where(alerts.c.subject == "loud").values(severity="loud")
        )
        garble = "'not json'" if not db.is_postgres else "'[1]'"
        await conn.execute(text(f"UPDATE alerts SET details = {garble} WHERE subject = 'garbled'"))
    async with db.begin() as conn:
        recent = await recent_alerts(conn, since=NOW - timedelta(hours=2))
    assert recent == [good]
    got = Collected()
    with capture_logs() as logs:
        assert await got.router(db).emit_many([], now=NOW) == []
    assert got.alerts == [good]
    unreadable = sorted(e["error"] for e in logs if e["event"] == "alert.unreadable")
    garbled = "payload is not JSON: " if not db.is_postgres else "details is not a JSON object"
    assert len(unreadable) == 2 and unreadable[0] == "'loud' is not a valid Severity"
    assert unreadable[1].startswith(garbled)
    async with db.begin() as conn:
        columns = select(alerts.c.subject, alerts.c.finished_at, alerts.c.last_error)
        left = {r.subject: r for r in await conn.execute(columns)}
    assert left["loud"].finished_at == NOW and left["loud"].last_error.startswith("unreadable: ")
    assert left["garbled"].finished_at == NOW and left["beta"].finished_at == NOW


async def test_the_evaluation_prunes_finished_alerts_after_a_week(db: Database) -> None:
    """Finished alerts older than KEEP_ALERTS go at the next evaluation; one still owed
    to a sink stays, and so do recent ones."""
    quiet = RuleSet(**{f: None for f in RuleSet.__dataclass_fields__ if f != "poll_kind"})
    old, owed, recent = (
        Alert("r", "old", "m", NOW - timedelta(days=8), "w"),
        Alert("r", "owed", "m", NOW - timedelta(days=8), "w"),
        Alert("r", "recent", "m", NOW - timedelta(days=6), "w"),
    )
    async with db.begin() as conn:
        await record_alerts(conn, [old, owed, recent], now=NOW - timedelta(days=1))
        await conn.execute(
            alerts.update()
            .where(alerts.c.subject != "owed")
            .values(finished_at=NOW - timedelta(days=1))
        )
    router = AlertRouter([], db=db, log_sink=False)
    assert await AlertEvaluator(db, rules=quiet, router=router).evaluate(NOW) == []
    async with db.begin() as conn:
        assert sorted(r.subject for r in await conn.execute(select(alerts.c.subject))) == [
            "owed",
            "recent",
        ]


# One of several evaluating processes racing: in each of 8 rounds, 10 minutes apart (past
# the delivery lease), it records the same 60 new alerts and retries every alert some sink
# has not taken; the processes start each round together (a barrier of files), so that a
# lease runs out only between rounds, as on one clock. Its "up" sink takes every alert;
# its "down" sink refuses every one, so every alert is owed again in every round. Each
# sink notes what it was handed, in which round, and (down) from when to when.
_EVALUATOR = """
import asyncio, pathlib, sys, time
from datetime import UTC, datetime, timedelta
from synckit.runtime.observe.alert_delivery import AlertRouter
from synckit.runtime.observe.alert_rules import Alert
from synckit.store.db import open_database

async def main(url, out, me, n):
    db = open_database(url)
    base = datetime(2026, 3, 4, 12, 30, tzinfo=UTC)
    fresh = [Alert("race", f"new-{i}", "m", base, "w") for i in range(60)]
    current = [0]
    here = pathlib.Path(out).parent
    with open(out, "w") as f:
        async def up(alert):
            f.write(f"up {alert.subject} {current[0]}\\n")
        up.name = "up"
        async def down(alert):
            began = time.monotonic()
            await asyncio.sleep(0.001)
            f.write(f"down {alert.subject} {current[0]} {began} {time.monotonic()}\\n")
            raise RuntimeError("down")
        down.name = "down"
        router = AlertRouter([up, down], db=db, log_sink=False)
        try:
            for r in range(8):
                (here / f"round-{r}-{me}").touch()
                deadline = time.monotonic() + 120  # a peer that died never arrives
                while len(list(here.glob(f"round-{r}-*"))) < n:
                    if time.monotonic() > deadline:
                        sys.exit(f"round {r}: a peer never arrived (its error says why)")
                    time.sleep(0.005)
                current[0] = r
                await router.emit_many(fresh, now=base + timedelta(minutes=10 * r))
        finally:
            await db.dispose()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
"""


async def test_evaluating_processes_deliver_each_alert_once(
    migrated_url: str, db: Database, tmp_path: Any
) -> None:
    """Four OS processes recording the same alerts and retrying the same owed ones at
    once: the sink that works gets every alert exactly once, and the one that keeps
    failing is retried at most once per alert per round, never by two processes."""
    import itertools
    import sys

    owed = [Alert("race", f"owed-{i}", "m", NOW, "w") for i in range(60)]
    async with db.begin() as conn:
        await record_alerts(conn, owed, now=NOW)  # leased until NOW + 5 min
    outs = [tmp_path / f"took-{i}.txt" for i in range(4)]
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _EVALUATOR,
            migrated_url,
            str(out),
            str(i),
            str(len(outs)),
            stderr=asyncio.subprocess.PIPE,
        )
        for i, out in enumerate(outs)
    ]
    outcomes = [await p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e.decode()[-2000:] for _, e in outcomes]
    calls = [line.split() for out in outs for line in out.read_text().splitlines()]
    up = sorted(subject for sink, subject, *_ in calls if sink == "up")
    assert up == sorted([f"new-{i}" for i in range(60)] + [f"owed-{i}" for i in range(60)])
    down: dict[str, list[tuple[float, float]]] = {}
    for _sink, subject, _, began, ended in (c for c in calls if c[0] == "down"):
        down.setdefault(subject, []).append((float(began), float(ended)))
    assert sorted(down) == sorted(up) and {len(v) >= 8 for v in down.values()} == {True}
    for spans in down.values():  # a delivery in progress is never taken by another
        spans.sort()
        assert all(b[0] >= a[1] for a, b in itertools.pairwise(spans))


class _AtInsertBarrier:
    """An AsyncConnection whose first INSERT waits until every party has reached its own."""

    def __init__(self, conn: Any, barrier: asyncio.Barrier) -> None:
        self._conn, self._barrier, self._waited = conn, barrier, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(statement, "is_insert", False) and not self._waited:
            self._waited = True
            await self._barrier.wait()
        return await self._conn.execute(statement, *args, **kwargs)


async def test_two_evaluators_retrying_the_same_alerts_do_not_deadlock(db: Database) -> None:
    """Two evaluations at once whose retries are more than one batch (so each leases a
    half) and which fire the same alerts again (so each inserts keys on the other's
    half): each waits on the other only where no cycle can form. Taking the retries
    before the inserts failed one of them here with ``deadlock detected``."""
    if not db.is_postgres:
        pytest.skip("SQLite has one writer: a transaction never waits on another's rows")
    earlier = NOW - timedelta(minutes=10)  # leased until NOW - 5 min: due again at NOW
    again = [Alert("race", f"a-{i:04}", "m", earlier, "w") for i in range(800)]
    async with db.begin() as conn:
        await record_alerts(conn, again, now=earlier)
    barrier = asyncio.Barrier(2)

    async def evaluate() -> list[int]:
        async with db.begin() as conn:
            held = _AtInsertBarrier(conn, barrier)
            todo = await claim_deliveries(held, again, now=NOW, sinks=["up"])
        assert not any(d.new for d in todo)
        return [d.record_id for d in todo if d.record_id is not None]

    first, second = await asyncio.wait_for(asyncio.gather(evaluate(), evaluate()), 30)
    assert len(first) + len(second) == 800 and not set(first) & set(second)
    assert {len(first), len(second)} == {500, 300}  # one batch each, oldest first
