"""Alert rules (pure), schedules, windows, and routing without a database."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from synckit.connectors.schedule import parse_schedule
from synckit.errors.backoff import backoff_delay
from synckit.errors.exceptions import AlertDeliveryError, ConfigurationError
from synckit.runtime.observe.alert_delivery import (
    AlertRouter,
    CallbackSink,
    WebhookSink,
    emit_alert,
    get_alert_router,
    set_alert_router,
)
from synckit.runtime.observe.alert_rules import (
    Alert,
    AlertData,
    BudgetRule,
    DeployRegression,
    DlqAcceleration,
    NeedsReauthRule,
    PollLag,
    RuleSet,
    ServerErrorBurst,
    Severity,
    TenantOutlier,
    poll_deadline,
    window_key,
)
from synckit.runtime.observe.budget import BudgetPolicy
from synckit.store.alerts import ConnectionState, DlqGrowth
from synckit.store.audit import AuditRow, Totals, VersionTotals

NOW = datetime(2026, 3, 4, 12, 4, 30, tzinfo=UTC)  # a Wednesday


def row(
    minutes_ago: int,
    *,
    tenant: str = "acme",
    connector: str = "graph",
    ok: int = 0,
    final: dict[str, int] | None = None,
    retried: dict[str, int] | None = None,
    version: str = "",
) -> AuditRow:
    minute = NOW.replace(second=0, microsecond=0) - timedelta(minutes=minutes_ago)
    classes = dict(final or {})
    classes.update({f"retried:{k}": v for k, v in (retried or {}).items()})
    return AuditRow(tenant, connector, minute, version, ok, sum((final or {}).values()), classes)


def conn(
    tenant: str = "acme",
    *,
    status: str = "active",
    schedule: str | None = "every 5m",
    last: datetime | None = None,
    created: datetime | None = None,
    reason: str | None = None,
) -> ConnectionState:
    return ConnectionState(
        tenant=tenant,
        connector="graph",
        status=status,
        schedule=schedule,
        created_at=created or NOW - timedelta(days=30),
        last_success_at=last,
        status_reason=reason,
    )


LONE_TRANSIENT = AlertData(
    now=NOW,
    recent=[
        row(1, ok=40, retried={"transient": 1}),
        row(2, tenant="beta", ok=50),
    ],
    versions=[
        VersionTotals("graph", "v1", NOW - timedelta(hours=5), 2000, 0, {}),
        VersionTotals("graph", "v2", NOW - timedelta(minutes=30), 90, 0, {"transient": 1}),
    ],
    tenant_totals={"acme": Totals(ok=5000, failed=1), "beta": Totals(ok=4000)},
    dlq=[DlqGrowth("graph", 1, 0)],
    connections=[conn(last=NOW - timedelta(minutes=3)), conn("beta", last=NOW)],
)


def test_every_rule_stays_quiet_on_a_lone_transient() -> None:
    """One transient failure among healthy traffic fires no rule at all."""
    assert RuleSet().evaluate(LONE_TRANSIENT) == []


# --- (a) server errors in a short window -------------------------------------------------


def test_five_server_errors_in_five_minutes_fire_for_the_connector() -> None:
    """Five 5xx-class failures (retried or final) within five minutes alert once."""
    data = AlertData(
        now=NOW,
        recent=[
            row(0, retried={"server_error": 2}),
            row(2, tenant="beta", final={"server_error": 1}),
            row(4, retried={"transient": 2}, ok=3),
        ],
    )
    [alert] = ServerErrorBurst().evaluate(data)
    assert (alert.rule, alert.subject, alert.connector) == ("server_errors", "graph", "graph")
    assert alert.severity is Severity.CRITICAL
    assert alert.details == {"count": 5, "tenants": ["acme", "beta"]}
    assert alert.message.startswith("3 server errors + 2 network failures in 5 min")


def test_a_dns_failure_burst_is_named_a_network_failure() -> None:
    """Issue 34: DNS failures (transient) fire the burst as network failures, not as
    server errors."""
    data = AlertData(now=NOW, recent=[row(1, retried={"transient": 8})])
    [alert] = ServerErrorBurst().evaluate(data)
    assert alert.message.startswith("8 network failures in 5 min on connector graph")
    assert "server error" not in alert.message


def test_server_errors_quiet_below_threshold_outside_window_or_split() -> None:
    """Four errors, errors older than the window, or errors split over two APIs: quiet."""
    rule = ServerErrorBurst()
    four = AlertData(now=NOW, recent=[row(1, retried={"server_error": 4})])
    old = AlertData(now=NOW, recent=[row(5, retried={"server_error": 9})])
    split = AlertData(
        now=NOW,
        recent=[
            row(1, retried={"server_error": 3}),
            row(1, connector="hubspot", retried={"server_error": 3}),
        ],
    )
    other_classes = AlertData(now=NOW, recent=[row(1, final={"validation": 9})])
    for data in (four, old, split, other_classes):
        assert rule.evaluate(data) == []


# --- (b) one tenant failing, the others normal -------------------------------------------


def test_one_tenant_failing_while_peers_are_normal_fires_for_that_tenant() -> None:
    """A tenant at 80% failures alerts when the other tenants of its API are healthy."""
    data = AlertData(
        now=NOW,
        recent=[
            row(3, ok=2, retried={"auth": 4}, final={"validation": 4}),
            row(3, tenant="beta", ok=100),
            row(2, tenant="gamma", ok=60, retried={"transient": 1}),
        ],
    )
    [alert] = TenantOutlier().evaluate(data)
    assert (alert.rule, alert.subject, alert.tenant) == ("tenant_outlier", "acme", "acme")
    assert alert.details["failures"] == 8
    assert alert.details["peers"] == 2


def test_tenant_outlier_quiet_when_everyone_fails_or_alone_or_minor() -> None:
    """No peers, every tenant failing, or a small failure count: quiet."""
    rule = TenantOutlier()
    alone = AlertData(now=NOW, recent=[row(1, final={"server_error": 9})])
    everyone = AlertData(
        now=NOW,
        recent=[row(1, final={"server_error": 9}), row(1, tenant="beta", final={"transient": 9})],
    )
    minor = AlertData(
        now=NOW, recent=[row(1, ok=1, final={"validation": 3}), row(1, tenant="beta", ok=50)]
    )
    for data in (alone, everyone, minor):
        assert rule.evaluate(data) == []


# --- (c) error class jumping after a deploy --------------------------------------------


def test_error_class_jumping_under_the_new_version_fires_once_per_version() -> None:
    """validation at 10% under v2 against 0.2% under v1 is a regression of v2."""
    data = AlertData(
        now=NOW,
        versions=[
            VersionTotals("graph", "v1", NOW - timedelta(hours=6), 998, 2, {"validation": 2}),
            VersionTotals("graph", "v2", NOW - timedelta(hours=1), 180, 20, {"validation": 20}),
        ],
    )
    [alert] = DeployRegression().evaluate(data)
    assert (alert.subject, alert.window) == ("graph:validation", "version:v2")
    assert alert.details["previous_version"] == "v1"
    assert alert.details["new_rate"] == pytest.approx(0.1)


def test_deploy_regression_quiet_without_a_jump() -> None:
    """Same rate under both versions, a single version, or too few errors: quiet."""
    rule = DeployRegression()
    same = AlertData(
        now=NOW,
        versions=[
            VersionTotals("graph", "v1", NOW - timedelta(hours=6), 900, 100, {"transient": 100}),
            VersionTotals("graph", "v2", NOW - timedelta(hours=1), 90, 10, {"transient": 10}),
        ],
    )
    single = AlertData(
        now=NOW,
        versions=[VersionTotals("graph", "v2", NOW, 0, 50, {"server_error": 50})],
    )
    few = AlertData(
        now=NOW,
        versions=[
            VersionTotals("graph", "v1", NOW - timedelta(hours=6), 1000, 0, {}),
            VersionTotals("graph", "v2", NOW - timedelta(hours=1), 10, 4, {"auth": 4}),
        ],
    )
    for data in (same, single, few):
        assert rule.evaluate(data) == []


def test_versions_are_ordered_by_first_appearance_not_by_name() -> None:
    """The newest version is the one that appeared last, whatever its name sorts like."""
    data = AlertData(
        now=NOW,
        versions=[
            VersionTotals("graph", "zeta", NOW - timedelta(hours=6), 100, 30, {"auth": 30}),
            VersionTotals("graph", "alpha", NOW - timedelta(hours=1), 1000, 0, {}),
        ],
    )
    assert DeployRegression().evaluate(data) == []


# --- (d) DLQ growth that accelerates ---------------------------------------------------------


def test_dlq_growth_acceleration() -> None:
    """30 new dead letters after 5 fires; steady growth or a trickle does not."""
    rule = DlqAcceleration()
    fired = rule.evaluate(AlertData(now=NOW, dlq=[DlqGrowth("graph", 30, 5)]))
    assert [(a.rule, a.subject) for a in fired] == [("dlq_growth", "graph")]
    assert fired[0].details == {"current": 30, "previous": 5}
    assert rule.evaluate(AlertData(now=NOW, dlq=[DlqGrowth("graph", 12, 10)])) == []
    assert rule.evaluate(AlertData(now=NOW, dlq=[DlqGrowth("graph", 3, 0)])) == []


# --- (e) poll lag ------------------------------------------------------------------------------


def test_schedules_are_read_as_the_poller_reads_them() -> None:
    """Interval forms give twice their interval; a form the poller refuses ("every 30
    seconds", "2h", "cron: ...") gives no deadline, as nonsense does."""
    last = datetime(2026, 2, 27, 9, 0, 5, tzinfo=UTC)
    assert poll_deadline("every 5m", last) == last + timedelta(minutes=10)
    assert poll_deadline(" EVERY 1.5h ", last) == last + timedelta(hours=3)
    assert poll_deadline("*/5 * * * *", last) == datetime(2026, 2, 27, 9, 10, tzinfo=UTC)
    for refused in ("every 30 seconds", "2h", "cron: */5 * * * *", "whenever", "every 0s", ""):
        assert poll_deadline(refused, last) is None, refused


_SCHEDULE_TEXT = st.one_of(
    st.sampled_from(["every 5m", "every 1d", "5m", "every 5 minutes", "0 9 * * 1-5", "@daily"]),
    st.from_regex(r"\s*(every\s*)?\d{1,3}(\.\d)?\s*[smhdx]?\s*", fullmatch=True),
    st.text(max_size=20),
)


@given(_SCHEDULE_TEXT)
def test_poll_lag_reads_exactly_the_schedules_the_poller_runs(text: str) -> None:
    """One grammar: a deadline exists exactly when parse_schedule reads the text."""
    last = datetime(2026, 2, 27, 9, 0, 5, tzinfo=UTC)
    try:
        parsed = parse_schedule(text)
    except ConfigurationError:
        assert poll_deadline(text, last) is None
        return
    deadline = poll_deadline(text, last)
    assert deadline is not None and deadline > last
    if parsed.every is not None:
        assert deadline == last + 2 * parsed.every


def test_poll_deadline_interval_and_cron() -> None:
    """Interval: last + 2 intervals. Cron: the second tick after the last success."""
    last = datetime(2026, 2, 27, 9, 0, 5, tzinfo=UTC)  # a Friday
    assert poll_deadline("every 5m", last) == last + timedelta(minutes=10)
    # Weekdays at 09:00: Monday's tick is the first, Tuesday's the second.
    assert poll_deadline("0 9 * * 1-5", last) == datetime(2026, 3, 3, 9, 0, tzinfo=UTC)
    assert poll_deadline("not a schedule", last) is None


def test_poll_lag_over_twice_the_schedule_fires() -> None:
    """Eleven minutes since the last poll on 'every 5m' is late; nine is not."""
    rule = PollLag()
    late = AlertData(now=NOW, connections=[conn(last=NOW - timedelta(minutes=11))])
    [alert] = rule.evaluate(late)
    assert (alert.rule, alert.subject) == ("poll_lag", "acme")
    assert alert.details["lag_seconds"] == 660
    fine = AlertData(now=NOW, connections=[conn(last=NOW - timedelta(minutes=9))])
    assert rule.evaluate(fine) == []


def test_poll_lag_cron_weekend_is_not_lag() -> None:
    """A weekday cron polled on Friday is not late on Sunday, and is late on Tuesday."""
    last = datetime(2026, 2, 27, 9, 0, 5, tzinfo=UTC)
    c = conn(schedule="0 9 * * 1-5", last=last)
    sunday = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    tuesday = datetime(2026, 3, 3, 9, 1, tzinfo=UTC)
    assert PollLag().evaluate(AlertData(now=sunday, connections=[c])) == []
    assert len(PollLag().evaluate(AlertData(now=tuesday, connections=[c]))) == 1


def test_poll_lag_never_polled_paused_or_unreadable() -> None:
    """Never polled counts from creation; paused or unreadable schedules are skipped."""
    never = conn(created=NOW - timedelta(hours=1))
    paused = conn("beta", status="paused", last=NOW - timedelta(days=3))
    odd = conn("gamma", schedule="sometimes", last=NOW - timedelta(days=3))
    fired = PollLag().evaluate(AlertData(now=NOW, connections=[never, paused, odd]))
    assert [a.subject for a in fired] == ["acme"]


# --- (f) re-auth ---------------------------------------------------------------------------------


def test_connection_needing_reauth_fires() -> None:
    """A needs_reauth connection is a critical alert naming the reason."""
    data = AlertData(
        now=NOW,
        connections=[conn(status="needs_reauth", reason="invalid_grant"), conn("beta")],
    )
    [alert] = NeedsReauthRule().evaluate(data)
    assert (alert.subject, alert.severity) == ("acme", Severity.CRITICAL)
    assert "invalid_grant" in alert.message


# --- error budget ------------------------------------------------------------------------------


def test_budget_rule_fires_in_alert_with_enough_volume() -> None:
    """10% failures over 1,000 operations alerts; 3 of 8 (too few) and 1 of 10,001 do not."""
    data = AlertData(
        now=NOW,
        tenant_totals={
            "acme": Totals(900, 100),
            "beta": Totals(5, 3),
            "gamma": Totals(10_000, 1),
        },
    )
    [alert] = BudgetRule().evaluate(data)
    assert (alert.subject, alert.details["burn"]) == ("acme", 20.0)
    assert BudgetRule(BudgetPolicy(min_operations=1)).evaluate(data)[1].subject == "beta"


# --- windows and routing -------------------------------------------------------------------------


def test_window_key_is_stable_within_a_window() -> None:
    """Two moments of the same hour share a key; the next hour has another."""
    hour = timedelta(hours=1)
    assert window_key(NOW, hour) == window_key(NOW + timedelta(minutes=50), hour)
    assert window_key(NOW, hour) != window_key(NOW + timedelta(hours=1), hour)
    assert window_key(NOW, hour) == "2026-03-04T12:00:00+00:00"


def test_alert_json_round_trip() -> None:
    """An alert survives to_json/from_json (how it is stored and sent)."""
    [alert] = NeedsReauthRule().evaluate(
        AlertData(now=NOW, connections=[conn(status="needs_reauth")])
    )
    assert Alert.from_json(json.loads(json.dumps(alert.to_json()))) == alert


def _alert(subject: str = "graph", at: datetime = NOW) -> Alert:
    return Alert(
        rule="server_errors",
        subject=subject,
        message="5 server errors",
        fired_at=at,
        window=window_key(at, timedelta(hours=1)),
    )


async def test_router_delivers_once_per_rule_subject_and_window() -> None:
    """Without a database the router de-duplicates in memory; a new window re-fires."""
    got: list[Alert] = []
    router = AlertRouter([CallbackSink(got.append)])
    with capture_logs() as logs:
        assert await router.emit(_alert())
        assert not await router.emit(_alert(at=NOW + timedelta(minutes=10)))
        assert await router.emit(_alert("hubspot"))
        assert await router.emit(_alert(at=NOW + timedelta(hours=1)))
    assert [a.subject for a in got] == ["graph", "hubspot", "graph"]
    fired = [e for e in logs if e["event"] == "alert.fired"]
    assert len(fired) == 3
    assert fired[0]["rule"] == "server_errors" and fired[0]["subject"] == "graph"


async def test_a_failing_sink_does_not_silence_the_others() -> None:
    """An exception in one sink is logged; the other sinks still get the alert."""
    got: list[Alert] = []

    async def broken(alert: Alert) -> None:
        raise RuntimeError("sink down")

    router = AlertRouter([broken, CallbackSink(got.append)])
    with capture_logs() as logs:
        assert await router.emit(_alert())
    assert len(got) == 1
    assert any(e["event"] == "alert.sink_failed" for e in logs)


async def test_dlq_review_alerts_through_the_default_router() -> None:
    """The DLQ calls emit_alert / router.dlq_review with (tenant, class, count)."""
    got: list[Alert] = []
    previous = get_alert_router()
    set_alert_router(AlertRouter([CallbackSink(got.append)], log_sink=False))
    try:
        assert await get_alert_router().dlq_review("acme", "validation", 12, now=NOW)
        assert not await get_alert_router().dlq_review("acme", "validation", 13, now=NOW)
        assert await emit_alert(_alert())
    finally:
        set_alert_router(previous)
    assert [(a.rule, a.subject) for a in got] == [
        ("dlq_review", "acme:validation"),
        ("server_errors", "graph"),
    ]
    assert got[0].details == {"error_class": "validation", "count": 12}


async def test_webhook_retries_server_errors_and_gives_up_on_client_errors() -> None:
    """5xx and transport errors are retried; a 400 fails at once with a clear error."""
    answers: list[httpx.Response | Exception] = [
        httpx.ConnectError("refused"),
        httpx.Response(503),
        httpx.Response(200),
    ]
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    sink = WebhookSink(
        "http://hooks.test/alerts", backoff=0.001, transport=httpx.MockTransport(handler)
    )
    await sink(_alert())
    assert len(bodies) == 3 and bodies[-1]["rule"] == "server_errors"

    calls: list[int] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(400)

    sink = WebhookSink(
        "http://hooks.test/alerts", backoff=0.001, transport=httpx.MockTransport(refuse)
    )
    with pytest.raises(AlertDeliveryError, match="HTTP 400"):
        await sink(_alert())
    assert len(calls) == 1


async def test_webhook_waits_are_the_shared_backoff() -> None:
    """Between attempts the sink waits backoff_delay's doubling from ``backoff``, capped
    at ``max_backoff``, less a fifth at most, with its draw; nothing after the last."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    sink = WebhookSink(
        "http://hooks.test/alerts",
        attempts=5,
        backoff=0.5,
        max_backoff=1.5,
        transport=httpx.MockTransport(lambda request: httpx.Response(503)),
        sleep=sleep,
        rng=lambda: 0.5,
    )
    with pytest.raises(AlertDeliveryError, match="HTTP 503"):
        await sink(_alert())
    assert slept == [0.45, 0.9, 1.35, 1.35]  # 0.5, 1, 2 -> 1.5, 1.5, each less 10%
    expected = [
        backoff_delay(
            n, 0.5, base=timedelta(seconds=0.5), cap=timedelta(seconds=1.5), jitter=0.2
        ).total_seconds()
        for n in range(1, 5)
    ]
    assert slept == expected


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), 1e300])
def test_webhook_backoff_that_cannot_be_a_wait_is_refused(bad: float) -> None:
    """A negative, NaN, infinite or absurd backoff fails when the sink is made."""
    with pytest.raises(ValueError, match="backoff"):
        WebhookSink("http://hooks.test/alerts", backoff=bad)
    with pytest.raises(ValueError, match="backoff"):
        WebhookSink("http://hooks.test/alerts", max_backoff=bad)


def test_stored_severities_are_the_severity_enum() -> None:
    """The store accepts exactly the severities an Alert can have, no more, no fewer."""
    from synckit.store.alerts import SEVERITIES

    assert sorted(SEVERITIES) == sorted(s.value for s in Severity)


async def test_evaluator_without_any_database_says_so() -> None:
    """An evaluator given no database and run outside a worker refuses by name; there is
    no process-wide registry to bind one through."""
    from synckit.errors.exceptions import SynckitError
    from synckit.runtime.jobs.handlers import Registry
    from synckit.runtime.observe.alerts import register_alerts

    evaluator = register_alerts(Registry(), router=AlertRouter(log_sink=False))
    with pytest.raises(SynckitError, match="has no database"):
        await evaluator.evaluate(NOW)
