"""Prometheus metrics: counters kept by the process, gauges read from the database on scrape.

Counters and the latency histogram live in ``prometheus_client``'s default registry and
are fed by the worker (:func:`metrics_observer`, an outcome observer) and by connectors
(:func:`record_api_call`):

* ``synckit_jobs_total{kind, outcome}``: recorded outcomes (succeeded, retried, dead,
  snoozed, cancelled, discarded);
* ``synckit_job_latency_seconds{kind}``: from the moment a job was due to the moment its
  outcome was recorded (waiting plus running);
* ``synckit_api_calls_total{connector, status_class}``: ``2xx``...``5xx``, or ``error``
  when no response came back; fed by every request a connector's ``ctx.http`` sends;
* ``synckit_api_latency_seconds{connector, status_class}``: from a request leaving (after
  its pacing wait) to its response's headers, or to its failure;
* ``synckit_records_synced_total{connector, stream, outcome}``: records a poll cycle
  committed, ``ok`` or ``failed`` (dead-lettered);
* ``synckit_alerts_fired_total{rule}``;
* ``synckit_webhooks_total{connector, outcome}``: webhook events stored, duplicate,
  refused, orphaned, too_large (deliveries over the cap) and processed;
* ``synckit_webhook_subscriptions_total{connector, outcome}``: subscriptions created,
  renewed, recreated (after a 404), deleted, and failures (``retry``, ``lapsed``,
  ``failed``).

The gauges describe shared state, which only the database knows, so a custom collector
reads it on each scrape (:class:`DatabaseCollector`):

* ``synckit_queue_depth{kind, status}`` for pending and running jobs;
* ``synckit_breaker_state{resource_key, state}``, 1 for the current state, 0 otherwise;
* ``synckit_error_budget_burn{tenant}``: error rate / budget over the budget window
  (1.0 is 100%);
* ``synckit_dlq_size{tenant, connector, status}``;
* ``synckit_stream_lag_seconds{connector, stream}``: how long ago the stream's checkpoint
  last moved, for its tenant that is furthest behind (active tenants only);
* ``synckit_database_up``: whether the last scrape could read the database.

:func:`start_metrics_server` serves ``/metrics`` from the running event loop (no thread:
the database reads use the worker's own engine). ``prometheus_client`` is the
``synckit[metrics]`` extra; without it, the recording functions do nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, cast

import structlog

from synckit.clock import utcnow
from synckit.errors.exceptions import ConfigurationError, SynckitError
from synckit.runtime.jobs.recorder import OutcomeObserver, RecordedOutcome
from synckit.runtime.observe.budget import BudgetPolicy, BudgetStatus, tenant_budgets
from synckit.runtime.observe.instruments import (
    _LATENCY_OUTCOMES,
    _OUTCOME_NAMES,
    BREAKER_STATES,
    LATENCY_BUCKETS,
    _instruments,
    record_alert,
    record_api_call,
    record_api_latency,
    record_records,
    status_class,
)
from synckit.store.checkpoints import oldest_active_checkpoints
from synckit.store.db import Conn, Database, SyncConn
from synckit.store.moments import read_moment
from synckit.store.views import (
    BreakerInfo,
    breaker_states,
    dead_letter_counts,
    queue_depth,
)

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector, CollectorRegistry

log = structlog.get_logger("synckit.metrics")


def metrics_observer() -> OutcomeObserver:
    """An outcome observer that counts job outcomes and their latency.

    It runs inside the worker's recording transaction; if that transaction then fails,
    the worker records the batch again and these counters count it twice (counters are
    for rates and trends; ``audit_buckets`` holds the exact counts).
    """

    def observe(conn: SyncConn, outcomes: list[RecordedOutcome], now: datetime) -> None:
        m = _instruments()
        if m is None:
            return
        for o in outcomes:
            m.jobs.labels(kind=o.job.kind, outcome=_OUTCOME_NAMES.get(o.status, o.status)).inc()
            if o.status in _LATENCY_OUTCOMES:
                waited = max(0.0, (now - o.job.run_at).total_seconds())
                m.latency.labels(kind=o.job.kind).observe(waited)

    return observe


# --- gauges from the database -----------------------------------------------------------


@dataclass(frozen=True)
class DatabaseSnapshot:
    up: bool
    queue: dict[str, dict[str, int]] = field(default_factory=dict)
    breakers: dict[str, BreakerInfo] = field(default_factory=dict)
    budgets: dict[str, BudgetStatus] = field(default_factory=dict)
    dlq: dict[tuple[str, str, str], int] = field(default_factory=dict)
    #: (connector, stream) -> seconds since its furthest-behind active tenant's
    #: checkpoint last moved.
    lag: dict[tuple[str, str], float] = field(default_factory=dict)


async def stream_lag(conn: Conn, now: datetime) -> dict[tuple[str, str], float]:
    """Per connector and stream, how long ago the oldest checkpoint of an active tenant
    was stored. One grouped read; a stored moment that is not a timestamp (a corrupt
    row) leaves its stream out rather than failing the scrape."""
    rows = await oldest_active_checkpoints(conn)
    out: dict[tuple[str, str], float] = {}
    for connector, stream, raw in rows:
        try:
            moment = read_moment(raw)
        except ValueError as exc:
            log.warning(
                "metrics.unreadable_checkpoint", connector=connector, stream=stream, error=str(exc)
            )
            continue
        if moment is not None:
            out[(connector, stream)] = max((now - moment).total_seconds(), 0.0)
    return out


async def read_snapshot(
    db: Database, *, now: datetime | None = None, budget: BudgetPolicy | None = None
) -> DatabaseSnapshot:
    """What the gauges show, read in one transaction."""
    now = now or utcnow()
    async with db.read() as conn:
        return DatabaseSnapshot(
            up=True,
            queue=await queue_depth(conn, statuses=("pending", "running")),
            breakers=await breaker_states(conn),
            budgets=await tenant_budgets(conn, now=now, policy=budget),
            dlq=await dead_letter_counts(conn),
            lag=await stream_lag(conn, now),
        )


class DatabaseCollector:
    """A ``prometheus_client`` collector of the gauges; :meth:`refresh` reads the database.

    ``collect`` is synchronous (prometheus_client's contract) and the database is async,
    so the server awaits :meth:`refresh` before each exposition and ``collect`` renders
    the snapshot it left.
    """

    def __init__(
        self, db: Database, *, budget: BudgetPolicy | None = None, timeout: float = 10.0
    ) -> None:
        self.db = db
        self.budget = budget or BudgetPolicy()
        self.timeout = timeout
        self.snapshot = DatabaseSnapshot(up=False)

    async def refresh(self, now: datetime | None = None) -> DatabaseSnapshot:
        try:
            async with asyncio.timeout(self.timeout):
                self.snapshot = await read_snapshot(self.db, now=now, budget=self.budget)
        except (SynckitError, TimeoutError) as exc:
            log.warning("metrics.database_error", error=str(exc))
            self.snapshot = DatabaseSnapshot(up=False)
        return self.snapshot

    def describe(self) -> list[Metric]:
        # Names only, so that registering does not read a snapshot that is not there yet.
        return list(self._families(DatabaseSnapshot(up=False)))

    def collect(self) -> Iterator[Metric]:
        return self._families(self.snapshot)

    def _families(self, snap: DatabaseSnapshot) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily(
            "synckit_database_up", "Whether the last scrape could read the database"
        )
        up.add_metric([], 1.0 if snap.up else 0.0)
        yield up
        depth = GaugeMetricFamily(
            "synckit_queue_depth", "Unfinished jobs by kind and status", labels=["kind", "status"]
        )
        for kind, counts in sorted(snap.queue.items()):
            for status, n in sorted(counts.items()):
                depth.add_metric([kind, status], float(n))
        yield depth
        breakers = GaugeMetricFamily(
            "synckit_breaker_state",
            "Circuit breaker state per resource (1 for the current state)",
            labels=["resource_key", "state"],
        )
        for key, b in sorted(snap.breakers.items()):
            for state in BREAKER_STATES:
                breakers.add_metric([key, state], 1.0 if b.state == state else 0.0)
        yield breakers
        burn = GaugeMetricFamily(
            "synckit_error_budget_burn",
            "Error rate over the budget window divided by the budget (1.0 = 100%)",
            labels=["tenant"],
        )
        for tenant, s in sorted(snap.budgets.items()):
            burn.add_metric([tenant], s.burn)
        yield burn
        dlq = GaugeMetricFamily(
            "synckit_dlq_size",
            "Dead letters by tenant, connector and status",
            labels=["tenant", "connector", "status"],
        )
        for (tenant, connector, status), n in sorted(snap.dlq.items()):
            dlq.add_metric([tenant, connector, status], float(n))
        yield dlq
        lag = GaugeMetricFamily(
            "synckit_stream_lag_seconds",
            "Seconds since the stream's checkpoint last moved, for its furthest-behind "
            "active tenant",
            labels=["connector", "stream"],
        )
        for (connector, stream), seconds in sorted(snap.lag.items()):
            lag.add_metric([connector, stream], seconds)
        yield lag


class _Include:
    """Exposes another registry's metrics (the default one: synckit's counters, process
    and GC metrics, and whatever the application registered)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        return iter(self.registry.collect())


class MetricsServer:
    """``/metrics`` over HTTP/1.1 on the running event loop."""

    def __init__(
        self, server: asyncio.Server, collector: DatabaseCollector, registry: CollectorRegistry
    ) -> None:
        self.server = server
        self.collector = collector
        self.registry = registry

    @property
    def port(self) -> int:
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        self.server.close()
        with contextlib.suppress(Exception):
            await self.server.wait_closed()

    async def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        await self.collector.refresh()
        return generate_latest(self.registry)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST

        try:
            async with asyncio.timeout(10):
                request = (await reader.readline()).decode("latin-1").split()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
            method, target = [*request, "", ""][:2]
            path = target.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path != "/metrics":
                status, ctype, body = "404 Not Found", "text/plain", b"see /metrics\n"
            else:
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, await self.exposition()
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode("latin-1")
            writer.write(head if method == "HEAD" else head + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass  # a scraper that went away or sent garbage is not the worker's problem
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def start_metrics_server(
    port: int,
    db: Database,
    *,
    host: str = "127.0.0.1",
    budget: BudgetPolicy | None = None,
) -> MetricsServer:
    """Serve ``/metrics`` on ``host:port`` (``port=0`` picks a free port; see ``.port``).

    Loopback unless told: the metrics name every tenant, which is not for the network.

    Call from the running event loop; ``await server.close()`` to stop. Raises
    :class:`ConfigurationError` without the ``synckit[metrics]`` extra.
    """
    try:
        from prometheus_client import REGISTRY
        from prometheus_client.registry import CollectorRegistry
    except ImportError as exc:  # pragma: no cover - the metrics extra is not installed
        raise ConfigurationError(
            "metrics need prometheus-client: install synckit[metrics]"
        ) from exc
    _instruments()  # the counters exist (at zero) from the first scrape on
    collector = DatabaseCollector(db, budget=budget)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(cast("Collector", _Include(REGISTRY)))
    registry.register(cast("Collector", collector))
    holder: list[MetricsServer] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await holder[0]._handle(reader, writer)

    try:
        server = await asyncio.start_server(handle, host, port)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
    metrics_server = MetricsServer(server, collector, registry)
    holder.append(metrics_server)
    log.info("metrics.serving", host=host, port=metrics_server.port)
    return metrics_server


__all__ = [
    "LATENCY_BUCKETS",
    "DatabaseCollector",
    "DatabaseSnapshot",
    "MetricsServer",
    "metrics_observer",
    "read_snapshot",
    "record_alert",
    "record_api_call",
    "record_api_latency",
    "record_records",
    "start_metrics_server",
    "status_class",
]
