"""Webhook subscriptions kept alive: created on first need, renewed before they expire,
recreated when the provider forgot them, deleted when their tenant stops.

A connector whose ``Webhooks(subscription=Subscription(...))`` says the provider needs
one (:mod:`synckit.connectors.subscriptions`) gets, per active tenant and subscribed
stream, a row in ``webhook_subscriptions`` (:mod:`synckit.store.subscriptions`).

* **The sweep** (``synckit.webhooks.subscriptions``, recurring every minute) inserts a
  ``pending`` row, due now, for each active tenant that has none, and enqueues one
  ``synckit.webhooks.subscription`` job (unique per tenant and stream) for each row that
  is due and each row whose tenant is no longer active.
* **The job** reads its row (a short read), calls the connector's hook with no
  transaction open, and writes what happened (a short write):

  - tenant no longer active: ``delete_subscription``, then the row is deleted (a
    failing delete is logged; the provider expires the subscription on its own);
  - active and due: ``renew_subscription``; a renewal the provider answers 404 (it no
    longer knows the subscription) creates a new one at once;
  - pending, lapsed or failed: ``create_subscription`` (an unexpired lapsed one is
    deleted first, best effort, so that two do not notify);
  - success: ``active``, next renewal at :func:`~synckit.connectors.subscriptions.renew_at`;
    failure: :func:`~synckit.connectors.subscriptions.after_failure` decides the state
    and the retry. A subscription that becomes ``lapsed`` or ``failed`` enqueues its
    stream's poll cycle in the same transaction: polling, whose schedule never stops,
    catches up what notifications would have announced.

The notification URL is ``{webhook_url}/{connector}/{tenant}`` (or ``{webhook_url}/
{connector}`` for a connector that finds the tenant in the body), ``webhook_url`` being
the App's (``App(webhook_url=...)`` or ``$SYNCKIT_WEBHOOK_URL``: where ``synckit web``'s
``/webhooks`` is reachable from the provider). Without one, no subscription is made.
The ``clientState`` sent is the tenant's verifier secret (its sealed config's
``secret_field``), the one each notification is checked against.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from synckit.connectors.subscriptions import (
    ACTIVE,
    FAILED,
    LAPSED,
    ProviderSubscription,
    Subscription,
    SubscriptionRequest,
    after_failure,
    renew_at,
)
from synckit.connectors.webhooks import TenantFromBody, Webhooks
from synckit.errors import ErrorClass
from synckit.errors.exceptions import ConfigurationError, Discard, TenantNotFound
from synckit.runtime.admin.tenants import get_tenant
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.observe.instruments import record_subscription
from synckit.runtime.observe.logging import redact_text
from synckit.runtime.sync.scheduler import poll_job_spec
from synckit.store import subscriptions as subs
from synckit.store.db import Database, SyncConn
from synckit.store.jobs.enqueueing import JobSpec, enqueue_new_sync

if TYPE_CHECKING:
    from synckit.runtime.sync.context import ConnectorHost

__all__ = [
    "JOB_KIND",
    "SWEEP_KIND",
    "maintain_subscription",
    "notification_url",
    "register_subscriptions",
    "subscribed_streams",
    "subscription_job_spec",
    "sweep_subscriptions",
    "webhook_base_url",
]

SWEEP_KIND = "synckit.webhooks.subscriptions"
SWEEP_NAME = "synckit.webhooks-subscriptions"
JOB_KIND = "synckit.webhooks.subscription"
#: The environment variable naming the public base URL of ``synckit web``'s ``/webhooks``.
URL_ENV = "SYNCKIT_WEBHOOK_URL"


def webhook_base_url(app: ConnectorHost) -> str | None:
    """Where providers reach the receiver (``.../webhooks``), or None: no subscriptions."""
    url = getattr(app, "webhook_url", None) or os.environ.get(URL_ENV) or None
    return url.rstrip("/") if url else None


def notification_url(base: str, connector: str, tenant: str, decl: Webhooks) -> str:
    """The URL a tenant's notifications are sent to (its own, unless the connector finds
    the tenant in the body)."""
    if isinstance(decl.tenant, TenantFromBody):
        return f"{base}/{connector}"
    return f"{base}/{connector}/{tenant}"


def subscribed_streams(cls: Any, decl: Webhooks) -> list[str]:
    """The streams of ``cls`` that get a subscription each."""
    assert decl.subscription is not None
    names = decl.subscription.streams or decl.streams
    declared = [s.name for s in cls.declared_streams()]
    return [s for s in declared if names is None or s in names]


def subscription_job_spec(tenant: str, connector: str, stream: str) -> JobSpec:
    """The job that creates, renews or deletes one subscription (one at a time)."""
    return JobSpec(
        kind=JOB_KIND,
        payload={"tenant": tenant, "connector": connector, "stream": stream},
        unique_key=f"subscription:{tenant}:{stream}",
        max_attempts=3,
    )


def _declared(app: ConnectorHost) -> list[tuple[str, Any, Webhooks]]:
    out = []
    for name, cls in app.connectors.items():
        decl = getattr(cls, "webhooks", None)
        if isinstance(decl, Webhooks) and decl.subscription is not None:
            out.append((name, cls, decl))
    return out


async def sweep_subscriptions(db: Database, app: ConnectorHost) -> list[str]:
    """Add the rows of active tenants lacking one, and enqueue the job of every row due
    or whose tenant stopped; the ids of the jobs enqueued."""
    declared = _declared(app)
    if not declared or webhook_base_url(app) is None:
        return []
    now = app.clock()

    def tx(conn: SyncConn) -> list[str]:
        for name, cls, decl in declared:
            for stream in subscribed_streams(cls, decl):
                subs.add_missing(conn, connector=name, stream=stream, now=now)
        # Only this App's connectors: another App may share the database.
        names = [name for name, _, _ in declared]
        work = set(subs.due(conn, now, names)) | set(subs.not_active(conn, names))
        specs = [subscription_job_spec(t, c, s) for t, c, s in sorted(work)]
        return enqueue_new_sync(conn, specs, now) if specs else []

    return await db.write(tx)


def _error_class(exc: BaseException) -> str:
    classification = getattr(exc, "classification", None)
    found = getattr(classification, "error_class", None)
    return found.value if isinstance(found, ErrorClass) else type(exc).__name__


def _not_found(exc: BaseException) -> bool:
    classification = getattr(exc, "classification", None)
    return getattr(classification, "error_class", None) is ErrorClass.NOT_FOUND


def _message(exc: BaseException) -> str:
    return redact_text(f"{type(exc).__name__}: {exc}")[:2000]


async def _request(
    db: Database,
    base: str | None,
    connector: str,
    tenant: str,
    stream: str,
    decl: Webhooks,
    policy: Any,
    now: Any,
) -> tuple[Any, SubscriptionRequest]:
    """The tenant and the subscription to ask the provider for (raises
    :class:`ConfigurationError` without a webhook URL or the tenant's clientState)."""
    if base is None:
        raise ConfigurationError(f"no webhook URL: set App(webhook_url=...) or ${URL_ENV}")
    t = await get_tenant(db, tenant)
    secret = t.config.get(decl.verify.secret_field)
    if not isinstance(secret, str) or not secret:
        raise ConfigurationError(
            f"tenant's config has no {decl.verify.secret_field!r} (the clientState)"
        )
    request = SubscriptionRequest(
        tenant=tenant,
        stream=stream,
        notification_url=notification_url(base, connector, tenant, decl),
        client_state=secret,
        expires_at=now + policy.lifetime,
    )
    return t, request


async def maintain_subscription(
    db: Database, app: ConnectorHost, tenant: str, stream: str, *, log: Any = None
) -> str:
    """Do what one subscription needs now (see the module docstring); what was done:
    ``created``, ``renewed``, ``recreated``, ``deleted``, ``failed`` (a failure recorded),
    ``not due`` or ``gone``."""
    now = app.clock()
    row = await db.run_read(lambda c: subs.get(c, tenant, stream))
    if row is None:
        return "gone"
    cls = app.connectors.get(row.connector)
    decl = getattr(cls, "webhooks", None) if cls is not None else None
    policy = decl.subscription if isinstance(decl, Webhooks) else None
    if cls is None:
        raise Discard(f"connector {row.connector!r} is not in this app")
    if row.tenant_status != "active" or policy is None:
        return await _delete(db, app, row, log)
    assert isinstance(decl, Webhooks)
    if row.next_at is not None and row.next_at > now:
        return "not due"
    base = webhook_base_url(app)
    forgotten = False
    try:
        t, request = await _request(db, base, row.connector, tenant, stream, decl, policy, now)
        async with app.context(db, t, stream=stream, log=log) as ctx:
            hooks: Any = ctx.connector
            did = "created"
            got: ProviderSubscription | None = None
            if row.state == ACTIVE and row.subscription_id:
                current = ProviderSubscription(row.subscription_id, row.expires_at or now)
                try:
                    got = await hooks.renew_subscription(ctx, current, request.expires_at)
                    did = "renewed"
                except Exception as exc:
                    if not _not_found(exc):
                        raise
                    did, forgotten = "recreated", True  # the provider forgot it: a new one
                    if log is not None:
                        log.warning("subscription.not_found", tenant=tenant, stream=stream)
            elif row.subscription_id and row.expires_at is not None and row.expires_at > now:
                # A lapsed subscription may still notify: delete it before a new one.
                try:
                    await hooks.delete_subscription(
                        ctx, ProviderSubscription(row.subscription_id, row.expires_at)
                    )
                except Exception as exc:
                    if log is not None:
                        log.info("subscription.delete_failed", error=_message(exc))
            if got is None:
                got = await hooks.create_subscription(ctx, request)
    except Exception as exc:  # the provider, the hook or the config: recorded, retried
        return await _failed(db, app, row, policy, exc, log, forgotten=forgotten)
    done_at = app.clock()
    next_at = renew_at(done_at, got.expires_at, policy)

    def tx(conn: SyncConn) -> bool:
        return subs.record_active(
            conn,
            tenant=tenant,
            stream=stream,
            subscription_id=got.id,
            expires_at=got.expires_at,
            next_at=next_at,
            now=done_at,
        )

    if not await db.write(tx):
        return "gone"
    record_subscription(row.connector, did)
    if log is not None:
        log.info(
            f"subscription.{did}",
            tenant=tenant,
            stream=stream,
            subscription_id=got.id,
            expires_at=got.expires_at.isoformat(),
            renew_at=next_at.isoformat(),
        )
    return did


async def _failed(
    db: Database,
    app: ConnectorHost,
    row: subs.SubscriptionRow,
    policy: Subscription,
    exc: Exception,
    log: Any,
    *,
    forgotten: bool,
) -> str:
    now = app.clock()
    failures = row.failures + 1
    # A subscription the provider forgot (404 on renewal) whose new one failed is over.
    expires_at = now if forgotten else row.expires_at
    decided = after_failure(row.state, failures, expires_at, now, random.random(), policy)
    fell_back = decided.state in (LAPSED, FAILED) and row.state not in (LAPSED, FAILED)
    try:
        t = await get_tenant(db, row.tenant, reveal=False)
    except TenantNotFound:
        return "gone"
    forget = forgotten or _not_found(exc) or row.state not in (ACTIVE, LAPSED)

    def tx(conn: SyncConn) -> bool:
        done = subs.record_failure(
            conn,
            tenant=row.tenant,
            stream=row.stream,
            state=decided.state,
            failures=failures,
            next_at=decided.retry_at,
            error=_message(exc),
            error_class=_error_class(exc),
            now=now,
            forget_id=forget,
        )
        if done and fell_back:
            # Notifications stop: a cycle now catches up, and the schedule goes on.
            enqueue_new_sync(
                conn, [poll_job_spec(row.tenant, row.connector, row.stream, t.resource_key)], now
            )
        return done

    if not await db.write(tx):
        return "gone"
    record_subscription(row.connector, decided.state if fell_back else "retry")
    if log is not None:
        event = f"subscription.{decided.state}" if fell_back else "subscription.retry"
        log.warning(
            event,
            tenant=row.tenant,
            stream=row.stream,
            failures=failures,
            retry_at=decided.retry_at.isoformat(),
            error=_message(exc),
        )
    return "failed"


async def _delete(db: Database, app: ConnectorHost, row: subs.SubscriptionRow, log: Any) -> str:
    if row.subscription_id and row.tenant_status is not None:
        try:
            async with app.context(db, row.tenant, stream=row.stream, log=log) as ctx:
                hooks: Any = ctx.connector
                await hooks.delete_subscription(
                    ctx, ProviderSubscription(row.subscription_id, row.expires_at or app.clock())
                )
        except Exception as exc:  # it expires on its own at the provider
            if log is not None:
                log.warning(
                    "subscription.delete_failed",
                    tenant=row.tenant,
                    stream=row.stream,
                    error=_message(exc),
                )
    await db.write(lambda c: subs.delete(c, row.tenant, row.stream))
    record_subscription(row.connector, "deleted")
    if log is not None:
        log.info("subscription.deleted", tenant=row.tenant, stream=row.stream)
    return "deleted"


def register_subscriptions(registry: Registry, app: ConnectorHost, *, every: timedelta) -> None:
    """The sweep (recurring) and the per-subscription job, on ``app``'s registry."""

    async def sweep(jctx: JobContext) -> None:
        db = jctx.db if jctx.db is not None else await app.database()
        enqueued = await sweep_subscriptions(db, app)
        if enqueued:
            jctx.log.info("subscription.sweep_enqueued", jobs=len(enqueued))

    async def job(jctx: JobContext) -> None:
        p = jctx.payload
        if not (
            isinstance(p, Mapping) and all(isinstance(p.get(k), str) for k in ("tenant", "stream"))
        ):
            raise Discard(f"malformed subscription payload: {str(p)[:200]}")
        db = jctx.db if jctx.db is not None else await app.database()
        await maintain_subscription(db, app, p["tenant"], p["stream"], log=jctx.log)

    registry.add(SWEEP_KIND, sweep, timeout=120.0)
    registry.add(JOB_KIND, job, timeout=300.0)
    registry.recurring(SWEEP_NAME, SWEEP_KIND, every=every)
