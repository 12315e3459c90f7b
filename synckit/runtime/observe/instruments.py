"""The process's Prometheus instruments: counters and histograms that the worker, the
HTTP client and poll cycles feed (:mod:`synckit.runtime.observe.metrics` serves them).

A module of its own, importing nothing of synckit's, so that the hot paths that count
(``ctx.http``'s transport, poll cycles) need not import the worker or the readers the
``/metrics`` server uses. Without ``prometheus_client`` (the ``synckit[metrics]`` extra)
every recording function does nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
API_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BREAKER_STATES = ("closed", "half_open", "open")
_OUTCOME_NAMES = {"pending": "retried"}
_LATENCY_OUTCOMES = frozenset({"succeeded", "pending", "dead", "cancelled", "discarded"})


@dataclass(frozen=True)
class _Instruments:
    jobs: Counter
    latency: Histogram
    api_calls: Counter
    api_latency: Histogram
    records: Counter
    alerts: Counter
    webhooks: Counter
    subscriptions: Counter


@functools.cache
def _instruments() -> _Instruments | None:
    """The process's counters, created once in the default registry; None without the extra."""
    try:
        from prometheus_client import Counter, Histogram
    except ImportError:  # pragma: no cover - the metrics extra is not installed
        return None
    return _Instruments(
        jobs=Counter("synckit_jobs", "Job outcomes recorded", ["kind", "outcome"]),
        latency=Histogram(
            "synckit_job_latency_seconds",
            "Seconds from a job being due to its outcome being recorded",
            ["kind"],
            buckets=LATENCY_BUCKETS,
        ),
        api_calls=Counter(
            "synckit_api_calls", "Calls to third-party APIs", ["connector", "status_class"]
        ),
        api_latency=Histogram(
            "synckit_api_latency_seconds",
            "Seconds from a request leaving to its response's headers (or its failure)",
            ["connector", "status_class"],
            buckets=API_LATENCY_BUCKETS,
        ),
        records=Counter(
            "synckit_records_synced",
            "Records committed by poll cycles",
            ["connector", "stream", "outcome"],
        ),
        alerts=Counter("synckit_alerts_fired", "Alerts delivered", ["rule"]),
        webhooks=Counter("synckit_webhooks", "Webhook events by outcome", ["connector", "outcome"]),
        subscriptions=Counter(
            "synckit_webhook_subscriptions",
            "Webhook subscription operations by outcome",
            ["connector", "outcome"],
        ),
    )


def prepare() -> None:
    """Create the process's instruments now rather than at the first recording."""
    _instruments()


def status_class(status_code: int | None) -> str:
    """``"2xx"`` for 204, ``"5xx"`` for 503, ``"error"`` for no response at all."""
    if status_code is None:
        return "error"
    if 100 <= status_code <= 599:
        return f"{status_code // 100}xx"
    return "other"


def record_api_call(connector: str, status_code: int | None) -> None:
    """Count one call to ``connector``'s API (``None``: no response, e.g. a timeout)."""
    if (m := _instruments()) is not None:
        m.api_calls.labels(connector=connector, status_class=status_class(status_code)).inc()


def record_api_latency(connector: str, status_code: int | None, seconds: float) -> None:
    """Count one call to ``connector``'s API and observe how long it took."""
    if (m := _instruments()) is not None:
        klass = status_class(status_code)
        m.api_calls.labels(connector=connector, status_class=klass).inc()
        m.api_latency.labels(connector=connector, status_class=klass).observe(max(seconds, 0.0))


def record_records(connector: str, stream: str, ok: int, failed: int) -> None:
    """Count one committed page's records of ``connector``'s ``stream``."""
    if (m := _instruments()) is not None:
        if ok:
            m.records.labels(connector=connector, stream=stream, outcome="ok").inc(ok)
        if failed:
            m.records.labels(connector=connector, stream=stream, outcome="failed").inc(failed)


def record_alert(rule: str) -> None:
    """Count one delivered alert of ``rule``."""
    if (m := _instruments()) is not None:
        m.alerts.labels(rule=rule).inc()


def record_webhook(connector: str, outcome: str, n: int = 1) -> None:
    """Count ``n`` webhook events of ``connector`` by outcome (stored, duplicate, refused,
    orphaned, too_large, processed)."""
    if n and (m := _instruments()) is not None:
        m.webhooks.labels(connector=connector, outcome=outcome).inc(n)


def record_subscription(connector: str, outcome: str) -> None:
    """Count one webhook subscription operation of ``connector`` by outcome (created,
    renewed, recreated, deleted, retry, lapsed, failed)."""
    if (m := _instruments()) is not None:
        m.subscriptions.labels(connector=connector, outcome=outcome).inc()
