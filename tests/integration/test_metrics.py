"""The Prometheus endpoint, scraped over loopback, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from audit_rows import record_audit  # tests/
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert, update

from synckit.errors import RetryPolicy
from synckit.errors.exceptions import PermanentError
from synckit.runtime.admin.audit import audit_observer
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.runtime.observe.metrics import (
    metrics_observer,
    record_api_call,
    start_metrics_server,
    status_class,
)
from synckit.store.db import Database, open_database
from synckit.store.jobs import enqueueing
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.tables import connections, dead_letters, resources

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def scrape(port: int, path: str = "/metrics") -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.get(f"http://127.0.0.1:{port}{path}", timeout=10)


async def seed(db: Database) -> None:
    now = datetime.now(UTC)
    async with db.begin() as conn:
        await conn.execute(
            insert(connections).values(
                tenant="acme",
                connector="graph",
                resource_key="graph:acme",
                status="active",
                created_at=now,
                updated_at=now,
            )
        )
        await conn.execute(
            insert(dead_letters),
            [
                {
                    "tenant": "acme",
                    "connector": "graph",
                    "kind": "record:messages",
                    "record_id": f"r{i}",
                    "error_class": "validation",
                    "error_message": "bad",
                    "status": "review" if i < 2 else "pending",
                    "first_failed_at": now,
                    "last_attempt_at": now,
                }
                for i in range(5)
            ],
        )
        # acme: 3 failures in 100 operations = 3%, a burn of 6.
        await record_audit(conn, "acme", "graph", now, 97, {"server_error": 3})
    await enqueueing.enqueue_many(
        db,
        [JobSpec("later", {}, delay=timedelta(hours=1)) for _ in range(3)]
        + [JobSpec("later", {}, resource_key="graph:acme", delay=timedelta(hours=1))],
    )
    async with db.begin() as conn:
        await conn.execute(
            update(resources)
            .where(resources.c.resource_key == "graph:acme")
            .values(state="open", consecutive_failures=5)
        )


async def test_metrics_endpoint_serves_counters_and_database_gauges(db: Database) -> None:
    """Outcome counters, latency, API calls, queue depth, breakers, burn and DLQ size."""
    await seed(db)
    server = await start_metrics_server(0, db, host="127.0.0.1")
    try:
        before = parse((await scrape(server.port)).text)
        reg = Registry()

        @reg.handler("work")
        async def work(ctx: JobContext) -> None:
            if ctx.payload.get("bad"):
                raise PermanentError("no")

        await enqueueing.enqueue_many(
            db,
            [JobSpec("work", {"tenant": "acme"}) for _ in range(4)]
            + [JobSpec("work", {"bad": True})],
        )
        worker = Worker(
            db,
            reg,
            retry_policy=RetryPolicy.deterministic(),
            poll_interval=0.05,
            observers=[audit_observer(), metrics_observer()],
        )
        await worker.run_until_idle()
        for code in (200, 201, 503, 429):
            record_api_call("graph", code)
        record_api_call("graph", None)

        response = await scrape(server.port)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        after = parse(response.text)
    finally:
        await server.close()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("synckit_jobs_total", kind="work", outcome="succeeded") == 4
    assert delta("synckit_jobs_total", kind="work", outcome="dead") == 1
    assert delta("synckit_job_latency_seconds_count", kind="work") == 5
    assert delta("synckit_api_calls_total", connector="graph", status_class="2xx") == 2
    assert delta("synckit_api_calls_total", connector="graph", status_class="4xx") == 1
    assert delta("synckit_api_calls_total", connector="graph", status_class="5xx") == 1
    assert delta("synckit_api_calls_total", connector="graph", status_class="error") == 1
    assert value(after, "synckit_database_up") == 1
    assert value(after, "synckit_queue_depth", kind="later", status="pending") == 4
    assert (
        "synckit_queue_depth",
        frozenset({("kind", "work"), ("status", "pending")}),
    ) not in after
    assert value(after, "synckit_breaker_state", resource_key="graph:acme", state="open") == 1
    assert value(after, "synckit_breaker_state", resource_key="graph:acme", state="closed") == 0
    # 3 failed of 100 before the run, then 4 more successes (the bad job has no tenant).
    assert value(after, "synckit_error_budget_burn", tenant="acme") == pytest.approx(
        3 / 104 / 0.005
    )
    assert value(after, "synckit_dlq_size", tenant="acme", connector="graph", status="review") == 2
    assert value(after, "synckit_dlq_size", tenant="acme", connector="graph", status="pending") == 3


async def test_other_paths_and_methods_are_refused(db: Database) -> None:
    """Only GET /metrics is served: other paths are 404, other methods 405."""
    server = await start_metrics_server(0, db, host="127.0.0.1")
    try:
        assert (await scrape(server.port, "/")).status_code == 404
        async with httpx.AsyncClient() as client:
            posted = await client.post(f"http://127.0.0.1:{server.port}/metrics")
        assert posted.status_code == 405
    finally:
        await server.close()


async def test_an_unreachable_database_reports_down_not_an_error() -> None:
    """When the database cannot be read the scrape still answers, with database_up 0."""
    gone = open_database("postgresql://nobody@127.0.0.1:1/none")
    server = await start_metrics_server(0, gone, host="127.0.0.1")
    try:
        response = await scrape(server.port)
    finally:
        await server.close()
        await gone.dispose()
    assert response.status_code == 200
    samples = parse(response.text)
    assert value(samples, "synckit_database_up") == 0
    # The process's own counters are still served.
    assert "# TYPE synckit_jobs_total counter" in response.text


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (200, "2xx"),
        (204, "2xx"),
        (301, "3xx"),
        (404, "4xx"),
        (599, "5xx"),
        (None, "error"),
        (42, "other"),
    ],
)
def test_status_classes(code: int | None, expected: str) -> None:
    """Status codes are counted by class; no response is 'error'."""
    assert status_class(code) == expected


async def test_poll_cycles_feed_records_api_latency_and_stream_lag(db: Database) -> None:
    """A real cycle through ctx.http against a loopback API: records synced, API latency
    and the stream's lag appear on /metrics."""
    import flow_app  # tests/apps

    from synckit.testing.hostile import Behaviour, HostileAPI

    api = HostileAPI(Behaviour(pages=3, records=4, latency=0.0))
    server = await start_metrics_server(0, db, host="127.0.0.1")
    try:
        with api.serve_in_thread() as url:
            app = flow_app.make_app(url)
            before = parse((await scrape(server.port)).text)
            for tenant in ("m1", "m2"):
                await app.add_tenant(db, tenant, flow_app.CONNECTOR, {}, schedule="every 1d")
            await app.schedule(db)
            worker = app.worker(db, poll_interval=0.05, observers=[metrics_observer()])
            await worker.run_until_idle()
        after = parse((await scrape(server.port)).text)
    finally:
        await server.close()
        await app.aclose()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    ok = delta("synckit_records_synced_total", connector="flow", stream="default", outcome="ok")
    assert ok == 2 * 3 * 4
    calls = delta("synckit_api_latency_seconds_count", connector="flow", status_class="2xx")
    assert calls == 2 * 3
    assert delta("synckit_api_calls_total", connector="flow", status_class="2xx") == 2 * 3
    assert delta("synckit_api_latency_seconds_sum", connector="flow", status_class="2xx") > 0
    key = ("synckit_stream_lag_seconds", frozenset({("connector", "flow"), ("stream", "default")}))
    assert key in after, "no lag series for the stream"
    assert 0 <= after[key] < 60
