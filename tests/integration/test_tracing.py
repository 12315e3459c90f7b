"""OpenTelemetry traces on both engines (issue 38), exported by the SDK's in-memory
exporter (in this process) or a file exporter (worker subprocesses, tests/otel_spans.py):
the span tree of a poll cycle with a 429, a retried page and a failed record; a follow-up
job's span continuing its parent's trace across two worker processes; ``traceparent`` on
a message consumed from RabbitMQ; no secret in any span."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from loopback import LoopbackServer, Request  # tests/
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from otel_spans import as_dict, in_memory_tracing, read_spans  # tests/
from pydantic import BaseModel
from services import service_unavailable
from sqlalchemy import select
from waits import EVENT_TIMEOUT, PROCESS_TIMEOUT, await_until  # tests/

from synckit import App, BearerToken, Connector, Page, PermanentError, SyncContext
from synckit.clock import utcnow
from synckit.errors import RetryPolicy
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.runtime.writes.outbox import OutboxRelay, RabbitPublisher
from synckit.store.db import Database
from synckit.store.jobs import admin, enqueueing
from synckit.store.tables import jobs, outbox

#: A secret in the shapes an API or a connector lets slip: in a query string, an error.
SECRET = "sk_live_Zq8Tt3Kp0Lm9Xv2Rw7Yb"
TESTS = Path(__file__).parent.parent


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with in_memory_tracing() as exporter:
        yield exporter


def exported(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    return [as_dict(s) for s in exporter.get_finished_spans()]


def children(all_spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(
        (s for s in all_spans if s["parent_id"] == parent["span_id"]),
        key=lambda s: s["start"],
    )


def assert_no_secret(all_spans: list[dict[str, Any]], *secrets: str) -> None:
    text = json.dumps([[s["name"], s["attributes"], s["events"]] for s in all_spans], default=str)
    for secret in secrets:
        assert secret not in text


# --- a poll cycle -------------------------------------------------------------------------


class Config(BaseModel):
    api_token: str


class Items(Connector[Config]):
    """Pages of three records; its query carries an API key, as some APIs want."""

    name = "items"
    auth = BearerToken("api_token")

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        page = (checkpoint or {}).get("page", 0) + 1
        while True:
            got = await ctx.http.get("/items", params={"page": page, "api_key": SECRET})
            body = got.json()
            yield Page(body["items"], checkpoint={"page": page})
            if body["next"] is None:
                return
            page = body["next"]

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        if record["id"] == "i1-1":
            raise PermanentError(f"refused: Authorization: Bearer {SECRET}")


class Api:
    """Page 1 answers 429 the first time, page 2 answers 503 the first time."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, req: Request) -> tuple[int, dict[str, str], bytes]:
        page = req.path.split("page=")[1].split("&")[0]
        n = self.seen[page] = self.seen.get(page, 0) + 1
        if page == "1" and n == 1:
            return 429, {"Retry-After": "0"}, b"{}"
        if page == "2" and n == 1:
            return 503, {}, b'{"error": "busy"}'
        items = [{"id": f"i{page}-{i}"} for i in range(3)]
        return (
            200,
            {"Content-Type": "application/json"},
            json.dumps({"items": items, "next": 2 if page == "1" else None}).encode(),
        )


async def test_the_span_tree_of_a_poll_cycle_with_a_429_a_retried_page_and_a_failed_record(
    db: Database, spans: InMemorySpanExporter
) -> None:
    """The scheduler's span parents both attempts' job spans (and they link to it); under
    each, the poll cycle; under it each request (the 429 resent inline, the 503 that
    fails the attempt) and each page, the failed record's DLQ capture under its page."""
    server = LoopbackServer(Api())
    try:
        cls = type("Items", (Items,), {"base_url": server.url})
        app = App([cls])
        await app.add_tenant(db, "acme", "items", {"api_token": f"tok-{SECRET}"})
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("test.schedule") as root:
            assert await app.schedule(db) == ["poll:acme:default"]
        worker = app.worker(db, retry_policy=RetryPolicy.deterministic(), poll_interval=0.05)
        await worker.run_until_idle()
    finally:
        server.close()
    all_spans = exported(spans)
    [top] = [s for s in all_spans if s["name"] == "test.schedule"]
    assert top["span_id"] == f"{root.get_span_context().span_id:016x}"
    job_spans = sorted(
        (s for s in all_spans if s["name"] == "synckit.job synckit.poll"),
        key=lambda s: s["start"],
    )
    # Page 1 committed before the 503: progress, so the retry spends no attempt.
    assert [s["attributes"]["synckit.job.attempt"] for s in job_spans] == [1, 1]
    assert len({s["attributes"]["synckit.job.id"] for s in job_spans}) == 1
    for s in job_spans:
        assert s["kind"] == "CONSUMER"
        assert (s["trace_id"], s["parent_id"]) == (top["trace_id"], top["span_id"])
        assert s["links"] == [{"trace_id": top["trace_id"], "span_id": top["span_id"]}]
        assert s["attributes"]["synckit.tenant"] == "acme"
        assert s["attributes"]["synckit.connector"] == "items"
        assert s["attributes"]["synckit.stream"] == "default"
    first, second = job_spans
    assert first["status"] == "ERROR"
    assert first["attributes"]["synckit.job.outcome"] == "failure"
    assert first["attributes"]["synckit.job.status"] == "pending"
    assert first["attributes"]["synckit.error_class"] == "transient"
    # The breaker's decision on that failure: one failure leaves it closed.
    assert first["attributes"]["synckit.breaker.state"] == "closed"
    assert second["attributes"]["synckit.job.status"] == "succeeded"
    assert second["status"] == "UNSET"

    [cycle1] = children(all_spans, first)
    assert cycle1["name"] == "synckit.poll default" and cycle1["status"] == "ERROR"
    steps = [
        (s["name"], s["attributes"].get("http.response.status_code"))
        for s in children(all_spans, cycle1)
    ]
    assert steps == [("GET", 429), ("GET", 200), ("synckit.page", None), ("GET", 503)]
    refused, resent, page1, failed = children(all_spans, cycle1)
    assert refused["kind"] == "CLIENT" and refused["status"] == "ERROR"
    assert refused["attributes"]["synckit.pace.outcome"] == "resend"
    assert refused["attributes"]["error.type"] == "429"
    assert refused["attributes"]["url.full"] == f"{server.url}/items"
    assert refused["attributes"]["http.request.method"] == "GET"
    assert resent["attributes"]["http.request.resend_count"] == 1
    assert "http.request.resend_count" not in refused["attributes"]
    assert page1["attributes"]["synckit.page"] == 1
    assert page1["attributes"]["synckit.records"] == 2
    assert page1["attributes"]["synckit.failed"] == 1
    assert page1["attributes"]["synckit.checkpoint.committed"] is True
    [capture] = children(all_spans, page1)
    assert capture["name"] == "synckit.dlq.capture"
    assert capture["attributes"]["synckit.records"] == 1
    assert list(capture["attributes"]["synckit.error_class"]) == ["validation"]
    assert failed["status"] == "ERROR" and failed["attributes"]["error.type"] in (
        "503",
        "ApiRetryableError",
    )

    [cycle2] = children(all_spans, second)
    steps = [
        (s["name"], s["attributes"].get("http.response.status_code"))
        for s in children(all_spans, cycle2)
    ]
    assert steps == [("GET", 200), ("synckit.page", None)]
    assert cycle2["attributes"]["synckit.pages"] == 1
    assert cycle2["attributes"]["synckit.records"] == 3
    assert_no_secret(all_spans, SECRET)


# --- a follow-up across two worker processes -----------------------------------------------


def run_burst(url: str, spans_file: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(TESTS / "apps"), str(TESTS), os.environ.get("PYTHONPATH", "")]
        ),
        "TRACED_APP_SPANS": str(spans_file),
        "SYNCKIT_LOG_FORMAT": "json",
    }
    done = subprocess.run(
        [
            *(sys.executable, "-m", "synckit.cli", "worker"),
            *("--app", "traced_app:registry", "--database-url", url, "--burst"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr


async def test_a_follow_ups_span_continues_its_parents_trace_across_two_worker_processes(
    db: Database, migrated_url: str, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """A job enqueued in a span runs in one worker process; the follow-up it enqueues runs
    in another; each job's span is a child of (and links to) the span it was enqueued in,
    all one trace, which the rows' trace ids name too."""
    spans_file = tmp_path / "spans.jsonl"
    with trace.get_tracer("test").start_as_current_span("test.enqueue") as root:
        parent_id = (await enqueueing.enqueue(db, "parent")).id
    ctx = root.get_span_context()
    run_burst(migrated_url, spans_file, tmp_path)
    [child] = await admin.list_jobs(db, kind="child")
    await admin.reschedule_job(db, child.id, utcnow())  # due now, for the next process
    run_burst(migrated_url, spans_file, tmp_path)

    got = read_spans(spans_file)
    [parent_span] = [s for s in got if s["name"] == "synckit.job parent"]
    [child_span] = [s for s in got if s["name"] == "synckit.job child"]
    assert parent_span["pid"] != child_span["pid"]
    root_trace, root_span = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
    assert parent_span["trace_id"] == child_span["trace_id"] == root_trace
    assert parent_span["parent_id"] == root_span
    assert parent_span["attributes"]["synckit.job.id"] == parent_id
    assert child_span["parent_id"] == parent_span["span_id"]
    assert child_span["links"] == [{"trace_id": root_trace, "span_id": parent_span["span_id"]}]
    assert child_span["attributes"]["synckit.job.status"] == "succeeded"
    async with db.begin() as conn:
        rows = {r.kind: r for r in await conn.execute(select(jobs))}
    assert rows["child"].trace_id == root_trace == rows["parent"].trace_id
    assert rows["child"].trace_parent.startswith(f"00-{root_trace}-{parent_span['span_id']}-")


# --- traceparent on RabbitMQ ---------------------------------------------------------------

RABBIT = "amqp://guest:guest@" + os.environ.get("SYNCKIT_TEST_RABBIT_HOST", "127.0.0.1") + ":5672/"


@pytest.fixture
async def rabbit() -> AsyncIterator[tuple[str, aio_pika.abc.AbstractQueue]]:
    try:
        connection = await aio_pika.connect(RABBIT, timeout=5)
    except Exception as exc:  # whatever aio-pika raises, the broker is not usable here
        service_unavailable("RabbitMQ", repr(exc))
        raise
    name = f"synckit-test-{uuid.uuid4().hex[:12]}"
    channel = await connection.channel()
    exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
    queue = await channel.declare_queue(name, durable=False)
    await queue.bind(exchange, routing_key="orders.#")
    try:
        yield name, queue
    finally:
        cleanup = await connection.channel()
        await cleanup.queue_delete(name)
        await cleanup.exchange_delete(name)
        await connection.close()


@pytest.mark.rabbitmq
async def test_a_message_consumed_from_rabbitmq_carries_its_publish_spans_traceparent(
    db: Database,
    spans: InMemorySpanExporter,
    rabbit: tuple[str, aio_pika.abc.AbstractQueue],
) -> None:
    """A job publishes a message; the relay's publish span (up to the confirm) is a child
    of the job's span, and the consumed message's ``traceparent`` names it, so the
    consumer's span joins the same trace."""
    exchange, queue = rabbit
    registry = Registry()

    @registry.handler("emit")
    async def emit(ctx: JobContext) -> None:
        ctx.publish("orders.created", {"order": 1, "note": f"token={SECRET}"})

    await enqueueing.enqueue(db, "emit")
    await Worker(db, registry, poll_interval=0.05).run_until_idle()
    publisher = RabbitPublisher(RABBIT, exchange=exchange)
    try:
        assert await OutboxRelay(db, publisher).run_until_empty() == 1
    finally:
        await publisher.close()
    got: list[aio_pika.abc.AbstractIncomingMessage] = []

    async def arrived() -> bool:
        message = await queue.get(no_ack=True, fail=False)
        if message is not None:
            got.append(message)
        return bool(got)

    await await_until(arrived, lambda: "no message arrived", timeout=EVENT_TIMEOUT)
    headers = {k: str(v) for k, v in (got[0].headers or {}).items()}
    consumer = trace.get_tracer("test").start_span(
        "orders.created process",
        context=TraceContextTextMapPropagator().extract(headers),
    )
    consumer.end()

    all_spans = exported(spans)
    [job] = [s for s in all_spans if s["name"] == "synckit.job emit"]
    [publish] = [s for s in all_spans if s["name"] == "orders.created publish"]
    assert publish["kind"] == "PRODUCER"
    assert (publish["trace_id"], publish["parent_id"]) == (job["trace_id"], job["span_id"])
    assert publish["attributes"]["messaging.destination.name"] == "orders.created"
    assert publish["attributes"]["synckit.outbox.confirmed"] is True
    assert headers["traceparent"].startswith(f"00-{publish['trace_id']}-{publish['span_id']}-")
    [consumed] = [s for s in exported(spans) if s["name"] == "orders.created process"]
    assert (consumed["trace_id"], consumed["parent_id"]) == (job["trace_id"], publish["span_id"])
    async with db.begin() as conn:
        [row] = list(await conn.execute(select(outbox.c.trace_parent)))
    assert row.trace_parent.startswith(f"00-{job['trace_id']}-{job['span_id']}-")
    assert_no_secret(all_spans, SECRET)


@pytest.mark.rabbitmq
async def test_a_relay_without_tracing_forwards_the_stored_traceparent(
    db: Database, rabbit: tuple[str, aio_pika.abc.AbstractQueue]
) -> None:
    """A message written in a span and published by a process that does not trace keeps
    the writer's ``traceparent``: the consumer still joins that trace."""
    from synckit.runtime.writes import outbox as relay_outbox

    exchange, queue = rabbit
    with in_memory_tracing():
        with trace.get_tracer("test").start_as_current_span("test.write") as span:
            async with db.begin() as conn:
                await relay_outbox.add_many(
                    conn, [relay_outbox.NewMessage("orders.created", {"n": 1})]
                )
        ctx = span.get_span_context()
    publisher = RabbitPublisher(RABBIT, exchange=exchange)
    try:
        assert await OutboxRelay(db, publisher).run_until_empty() == 1
    finally:
        await publisher.close()
    got: list[aio_pika.abc.AbstractIncomingMessage] = []

    async def arrived() -> bool:
        message = await queue.get(no_ack=True, fail=False)
        if message is not None:
            got.append(message)
        return bool(got)

    await await_until(arrived, lambda: "no message arrived", timeout=EVENT_TIMEOUT)
    assert str((got[0].headers or {})["traceparent"]).startswith(
        f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-"
    )


async def test_tracing_off_leaves_rows_and_trace_ids_as_they_were(db: Database) -> None:
    """No provider: no traceparent stored, and the job's own trace id as before."""
    enqueued = await enqueueing.enqueue(db, "plain", trace_id="t-given")
    other = await enqueueing.enqueue(db, "plain")
    async with db.begin() as conn:
        rows = {r.id: r for r in await conn.execute(select(jobs))}
    assert rows[enqueued.id].trace_parent is None
    assert rows[enqueued.id].trace_id == "t-given"
    assert rows[other.id].trace_parent is None and len(rows[other.id].trace_id) == 32


async def test_an_intents_span_says_whether_it_created_or_found_what_was_stored(
    db: Database, spans: InMemorySpanExporter
) -> None:
    """The first run creates (its create's request a child of the intent's span); the
    second returns the stored result without calling the API."""
    from synckit.runtime.writes.intents import RemoteRecord, run_intent

    calls = []

    async def create(idempotency_key: str) -> RemoteRecord:
        with trace.get_tracer("test").start_as_current_span("test.create"):
            calls.append(idempotency_key)
        return RemoteRecord(f"r-{len(calls)}")

    for _ in range(2):
        await run_intent(db, tenant="acme", connector="items", key="copy:1", create=create)
    assert len(calls) == 1
    got = exported(spans)
    intents = sorted((s for s in got if s["name"] == "synckit.intent"), key=lambda s: s["start"])
    assert [s["attributes"]["synckit.intent.outcome"] for s in intents] == ["created", "stored"]
    assert all(s["attributes"]["synckit.tenant"] == "acme" for s in intents)
    [made] = [s for s in got if s["name"] == "test.create"]
    assert made["parent_id"] == intents[0]["span_id"]
