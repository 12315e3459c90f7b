"""What happens to a fired alert: its record in ``alerts`` (deduplicated by window,
:mod:`synckit.store.alerts`), its delivery to each sink under the one lease (a webhook
sink refuses private hosts and backs off as the receiver asks), and routing
(:class:`AlertRouter`)."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import random
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import structlog

from synckit.clock import utcnow
from synckit.errors.backoff import backoff_delay
from synckit.errors.exceptions import AlertDeliveryError, ConfigurationError
from synckit.errors.headers import server_wait
from synckit.runtime.observe.alert_rules import Alert, Severity, dlq_review_alert
from synckit.runtime.observe.logging import redact_text
from synckit.store import alerts as store_alerts
from synckit.store.alerts import (
    DELIVERY_LEASE,
    GIVE_UP_AFTER,
    AlertRow,
)
from synckit.store.db import Conn, Database
from synckit.store.moments import from_row

__all__ = [
    "AlertRouter",
    "AlertSink",
    "CallbackSink",
    "Delivery",
    "LogSink",
    "WebhookSink",
    "claim_deliveries",
    "dedupe_key",
    "emit_alert",
    "finish_deliveries",
    "get_alert_router",
    "recent_alerts",
    "record_alerts",
    "set_alert_router",
]

# Only the webhook sink speaks HTTP: ``synckit status`` evaluates the rules on the spot
# and must not pay for an HTTP client (tests/unit/test_command_imports.py).
if TYPE_CHECKING:
    import httpx

log = structlog.get_logger("synckit.alerts")


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
    return from_row(
        Alert,
        row,
        window=row.window_key,
        severity=Severity(row.severity),
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
        from synckit.runtime.http.transports import tls_context

        # The process's TLS context (building one costs ~50 ms of CPU per alert).
        async with httpx.AsyncClient(
            timeout=self.timeout,
            transport=self.transport,
            follow_redirects=False,
            verify=tls_context(),
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
        from synckit.runtime.observe.metrics import record_alert  # metrics imports this module

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
