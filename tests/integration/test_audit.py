"""Audit counts, budgets over them, and the worker's observers, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from audit_rows import record_audit  # tests/
from sqlalchemy import insert
from structlog.testing import capture_logs

from synckit.errors import RetryPolicy
from synckit.errors.exceptions import PermanentError, RetryableError
from synckit.runtime.admin.audit import audit_observer
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.runtime.observe.budget import BudgetLevel, BudgetPolicy, tenant_budgets
from synckit.runtime.observe.logging import configure_logging, shared_processors
from synckit.store.audit import (
    AuditCounts,
    AuditRow,
    read_audit,
    record_audit_many_sync,
    totals_by_version,
)
from synckit.store.db import Database
from synckit.store.jobs import enqueueing
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.tables import audit_buckets, connections

NOW = datetime(2026, 3, 4, 12, 4, 30, tzinfo=UTC)


async def rows(db: Database) -> list[AuditRow]:
    async with db.begin() as conn:
        return await read_audit(conn, since=NOW - timedelta(days=30))


async def test_record_audit_adds_counts_and_merges_classes(db: Database) -> None:
    """Two writes to one minute add up; classes merge; retried attempts stay apart."""
    async with db.begin() as conn:
        await record_audit(conn, "acme", "graph", NOW, 3, {"validation": 1}, app_version="v1")
    async with db.begin() as conn:
        await record_audit(
            conn,
            "acme",
            "graph",
            NOW + timedelta(seconds=20),
            2,
            {"validation": 2, "server_error": 1},
            app_version="v1",
            retried_by_class={"transient": 4},
        )
        await record_audit(
            conn, "acme", "graph", NOW + timedelta(minutes=1), 5, {}, app_version="v1"
        )
        await record_audit(conn, "acme", "graph", NOW, 1, {}, app_version="v2")
        await record_audit(conn, "acme", "graph", NOW, 0, {})  # nothing to count: no row
    got = await rows(db)
    assert [(r.minute.minute, r.app_version, r.ok, r.failed) for r in got] == [
        (4, "v1", 5, 4),
        (4, "v2", 1, 0),
        (5, "v1", 5, 0),
    ]
    first = got[0]
    assert first.failed_by_class == {
        "retried:transient": 4,
        "server_error": 1,
        "validation": 3,
    }
    assert first.classes.final == {"server_error": 1, "validation": 3}
    assert first.failed_attempts == 8
    assert got[1].failed_by_class == {}
    async with db.begin() as conn:
        with_failures = await read_audit(conn, since=NOW - timedelta(days=1), only_failures=True)
    assert [(r.minute.minute, r.app_version) for r in with_failures] == [(4, "v1")]


async def test_concurrent_writers_lose_no_count(db: Database) -> None:
    """Many transactions adding to one bucket at once: every count survives."""

    async def add(i: int) -> None:
        async with db.begin() as conn:
            await record_audit(
                conn, "acme", "graph", NOW, 1, {"transient": 1, f"c{i % 3}": 1}, app_version=""
            )

    await asyncio.gather(*(add(i) for i in range(24)))
    [r] = await rows(db)
    assert (r.ok, r.failed) == (24, 48)
    assert r.failed_by_class == {"transient": 24, "c0": 8, "c1": 8, "c2": 8}


async def test_many_buckets_add_in_one_call_plain_and_classed_alike(db: Database) -> None:
    """record_audit_many_sync: plain successes (one statement for all) and buckets with
    classes add to what is there exactly as one record_audit each would."""
    async with db.begin() as conn:
        await record_audit(conn, "b", "graph", NOW, 2, {"validation": 1}, app_version="v1")
    counts = [
        AuditCounts("c", "graph", 4),
        AuditCounts("a", "graph", 1),
        AuditCounts("b", "graph", 3, {"validation": 1}, {"transient": 2}),
        AuditCounts("d", "graph", 0),  # nothing to count: no row
        AuditCounts("a", "crm", 5),
    ]
    async with db.begin() as conn:
        await conn.run_sync(lambda c: record_audit_many_sync(c, counts, NOW, app_version="v1"))
        await conn.run_sync(
            lambda c: record_audit_many_sync(
                c, [AuditCounts("c", "graph", 1)], NOW, app_version="v1"
            )
        )
    got = {(r.tenant, r.connector): r for r in await rows(db)}
    assert {k: (r.ok, r.failed) for k, r in got.items()} == {
        ("a", "crm"): (5, 0),
        ("a", "graph"): (1, 0),
        ("b", "graph"): (5, 2),
        ("c", "graph"): (5, 0),
    }
    assert got[("b", "graph")].failed_by_class == {"validation": 2, "retried:transient": 2}
    assert got[("c", "graph")].failed_by_class == {}
    async with db.begin() as conn:
        with pytest.raises(ValueError, match="negative"):
            await conn.run_sync(
                lambda c: record_audit_many_sync(c, [AuditCounts("e", "graph", -1)], NOW)
            )


async def test_version_totals_merge_classes_per_version(db: Database) -> None:
    """Per connector and version: summed counts, merged classes, first appearance."""
    async with db.begin() as conn:
        for minute in range(3):
            at = NOW - timedelta(minutes=10 - minute)
            await record_audit(conn, "acme", "graph", at, 10, {}, app_version="v1")
            await record_audit(conn, "beta", "graph", at, 5, {"auth": 1}, app_version="v2")
        await record_audit(
            conn, "acme", "graph", NOW, 0, {}, app_version="v2", retried_by_class={"auth": 2}
        )
        totals = await totals_by_version(conn, since=NOW - timedelta(hours=1))
    by = {t.app_version: t for t in totals}
    assert (by["v1"].ok, by["v1"].failed, by["v1"].attempts_by_class) == (30, 0, {})
    assert (by["v2"].ok, by["v2"].failed, by["v2"].attempts_by_class) == (15, 3, {"auth": 5})
    assert by["v1"].first_seen == NOW.replace(second=0) - timedelta(minutes=10)
    assert by["v2"].operations == 20


async def seed_budget_data(db: Database) -> None:
    """acme: 4% failing (alert), beta: 0.7% (watch), gamma: 0.1% (healthy), all in 24 h;
    an old failure storm of gamma outside the window must not count."""
    async with db.begin() as conn:
        await conn.execute(
            insert(audit_buckets),
            [
                {
                    "tenant": "acme",
                    "connector": "graph",
                    "minute": NOW - timedelta(hours=1),
                    "app_version": "",
                    "ok": 480,
                    "failed": 20,
                    "failed_by_class": {"server_error": 20},
                },
                {
                    "tenant": "acme",
                    "connector": "graph",
                    "minute": NOW - timedelta(hours=23),
                    "app_version": "",
                    "ok": 480,
                    "failed": 20,
                    "failed_by_class": {"validation": 20},
                },
                {
                    "tenant": "beta",
                    "connector": "graph",
                    "minute": NOW - timedelta(hours=2),
                    "app_version": "v2",
                    "ok": 993,
                    "failed": 7,
                    "failed_by_class": {"transient": 7},
                },
                {
                    "tenant": "gamma",
                    "connector": "hubspot",
                    "minute": NOW - timedelta(hours=3),
                    "app_version": "",
                    "ok": 999,
                    "failed": 1,
                    "failed_by_class": {"auth": 1},
                },
                {
                    "tenant": "gamma",
                    "connector": "hubspot",
                    "minute": NOW - timedelta(hours=25),
                    "app_version": "",
                    "ok": 0,
                    "failed": 500,
                    "failed_by_class": {"auth": 500},
                },
            ],
        )
        for tenant, connector, status in (
            ("acme", "graph", "active"),
            ("beta", "graph", "active"),
            ("gamma", "hubspot", "needs_reauth"),
        ):
            await conn.execute(
                insert(connections).values(
                    tenant=tenant,
                    connector=connector,
                    resource_key=f"{connector}:{tenant}",
                    status=status,
                    created_at=NOW - timedelta(days=10),
                    updated_at=NOW - timedelta(days=10),
                )
            )


async def test_budget_figures_over_the_rolling_window(db: Database) -> None:
    """Rates, burns and levels per tenant from audit rows of the last 24 hours only."""
    await seed_budget_data(db)
    async with db.begin() as conn:
        budgets = await tenant_budgets(conn, now=NOW)
    assert {t: (s.ok, s.failed, s.level) for t, s in budgets.items()} == {
        "acme": (960, 40, BudgetLevel.ALERT),
        "beta": (993, 7, BudgetLevel.WATCH),
        "gamma": (999, 1, BudgetLevel.HEALTHY),
    }
    assert budgets["acme"].rate == pytest.approx(0.04)
    assert budgets["acme"].burn == pytest.approx(8.0)
    assert budgets["beta"].burn == pytest.approx(1.4)
    async with db.begin() as conn:
        narrow = await tenant_budgets(conn, now=NOW, policy=BudgetPolicy(window=timedelta(hours=2)))
    assert {t: (s.ok, s.failed) for t, s in narrow.items()} == {"acme": (480, 20)}


def worker(db: Database, registry: Registry, **kw: Any) -> Worker:
    kw.setdefault("retry_policy", RetryPolicy.deterministic())
    kw.setdefault("poll_interval", 0.05)
    return Worker(db, registry, **kw)


async def test_audit_observer_counts_final_outcomes_from_the_worker(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Succeeded counts ok, dead counts failed by class, retries count apart, all under
    the app version; jobs without any tenant are not counted."""
    monkeypatch.setenv("SYNCKIT_APP_VERSION", "2.4.1")
    reg = Registry()
    flaky_seen: set[int] = set()

    @reg.handler("sync")
    async def sync(ctx: JobContext) -> None:
        mode = ctx.payload.get("mode")
        if mode == "bad":
            raise PermanentError("record 17 has no id")
        if mode == "flaky" and ctx.job.id not in flaky_seen:
            flaky_seen.add(ctx.job.id)
            raise RetryableError("connection reset")

    await enqueueing.enqueue_many(
        db,
        [
            JobSpec("sync", {"tenant": "acme", "connector": "graph"}),
            JobSpec("sync", {"tenant": "acme", "connector": "graph"}),
            JobSpec("sync", {"tenant": "acme", "connector": "graph", "mode": "bad"}),
            JobSpec("sync", {"tenant": "acme", "connector": "graph", "mode": "flaky"}),
            JobSpec("sync", {"mode": "flaky"}, resource_key="hubspot:beta"),
            JobSpec("sync", {}),
        ],
    )
    await worker(db, reg, observers=[audit_observer()]).run_until_idle()
    got = await rows(db)
    totals: dict[tuple[str, str, str], list[Any]] = {}
    for r in got:
        t = totals.setdefault((r.tenant, r.connector, r.app_version), [0, 0, {}])
        t[0] += r.ok
        t[1] += r.failed
        for k, v in r.failed_by_class.items():
            t[2][k] = t[2].get(k, 0) + v
    assert totals == {
        ("acme", "graph", "2.4.1"): [3, 1, {"validation": 1, "retried:transient": 1}],
        ("hubspot:beta", "", "2.4.1"): [1, 0, {"retried:transient": 1}],
    }


async def test_no_secret_reaches_any_log_line(db: Database) -> None:
    """A worker over jobs whose payloads hold tokens and whose failures quote a Bearer
    token: neither the rendered JSON lines nor the captured events contain a secret."""
    access, bearer, refresh = "AT-s3cr3t-7781", "BEARER-s3cr3t-9120", "RT-s3cr3t-4410"
    reg = Registry()

    @reg.handler("push")
    async def push(ctx: JobContext) -> None:
        ctx.log.info("push.started", payload=ctx.payload)
        if ctx.payload["n"] % 2:
            raise RuntimeError(
                f"API said 401 to 'Authorization: Bearer {bearer}' "
                f'(refresh_token={refresh}, body={{"access_token": "{access}"}})'
            )
        structlog.get_logger("app").info(
            "push.sent",
            headers={"Authorization": f"Bearer {bearer}"},
            url=f"/x?access_token={access}",
        )

    payload = {
        "tenant": "acme",
        "connector": "graph",
        "access_token": access,
        "token_set": {"refresh_token": refresh},
    }
    await enqueueing.enqueue_many(
        db, [JobSpec("push", {**payload, "n": n}, max_attempts=2) for n in range(4)]
    )
    out = io.StringIO()
    configure_logging(json_lines=True, stream=out)
    try:
        with capture_logs(processors=shared_processors()) as captured:
            await worker(db, reg, observers=[audit_observer()]).run_until_idle()
        await enqueueing.enqueue(db, "push", {**payload, "n": 1}, max_attempts=1)
        await worker(db, reg).run_until_idle()
    finally:
        structlog.reset_defaults()
    events = {e["event"] for e in captured}
    assert {"push.started", "push.sent", "job.retry_scheduled", "job.dead"} <= events
    rendered = [json.loads(line) for line in out.getvalue().splitlines()]
    assert {"push.started", "job.dead"} <= {e["event"] for e in rendered}
    for line in [*map(repr, captured), out.getvalue()]:
        for secret in (access, bearer, refresh):
            assert secret not in line
