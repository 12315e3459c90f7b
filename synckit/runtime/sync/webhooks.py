"""Webhooks received and processed: the inbox's runtime side.

**Receiving** (:func:`receive`, called by :mod:`synckit.web.webhooks` with the raw
body): the connector's :class:`~synckit.connectors.webhooks.Webhooks` declaration says
whose the delivery is and how it is signed; the tenant's secret is read from its sealed
config; a delivery that does not verify is counted (``webhook_refusals``) and answered
401, never stored. A verified one is stored, with the job that processes it, in one
short transaction, and only then answered 2xx: a provider never gets a 2xx for an event
that is not stored. An event id already stored for the tenant is a duplicate (2xx,
counted, stored once). With ``Webhooks(secret_env=...)`` (one secret for the endpoint,
as Stripe Connect or a GitHub App sign) a verified delivery naming no known tenant is
kept as an orphan (``tenant`` '') for operators to see.

**Processing** (the ``synckit.webhooks`` job, one per connector and tenant, coalesced
by its unique key): pending events are claimed under the one lease; the connector's
``on_webhook(ctx, events)`` hook runs if it has one, else each triggered stream gets a
cycle now, at most one per :attr:`~synckit.connectors.base.Stream.webhook_window`
(:func:`trigger_at`), enqueued in the same transaction that marks the events
processed. A recurring sweep (``synckit.webhooks.sweep``) re-enqueues the processing of
pending events whose job was lost to a race or a crash. No transaction is held across
the hook's network I/O.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from synckit.connectors.webhooks import (
    GraphNotifications,
    TenantFromBody,
    WebhookEvent,
    Webhooks,
)
from synckit.errors.exceptions import ConfigurationError, Discard, TenantNotFound
from synckit.runtime.admin.tenants import get_tenant, opened_config
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.observe.instruments import record_webhook
from synckit.runtime.sync.poll import record_failure
from synckit.runtime.sync.records import land, prepare
from synckit.runtime.sync.scheduler import poll_job_spec
from synckit.store import connections as connection_store
from synckit.store import webhooks as inbox
from synckit.store.db import Database, SyncConn
from synckit.store.dead_letters import capture as dlq_store
from synckit.store.jobs.enqueueing import JobSpec, enqueue_new_sync
from synckit.store.leases import new_lease
from synckit.store.moments import from_row

if TYPE_CHECKING:
    from synckit.runtime.sync.context import ConnectorHost

__all__ = [
    "PROCESS_KIND",
    "SWEEP_KIND",
    "Answer",
    "dead_letter_kind",
    "process_events",
    "process_job_spec",
    "receive",
    "register_webhooks",
    "replay_event",
    "trigger_at",
    "webhooks_of",
]

PROCESS_KIND = "synckit.webhooks"
SWEEP_KIND = "synckit.webhooks.sweep"
SWEEP_NAME = "synckit.webhooks-sweep"
#: Events claimed per batch (held for ``Webhooks.lease``), and the attempts an event gets
#: at ``on_webhook`` before it is left ``failed`` for an operator.
BATCH = 100
MAX_EVENT_ATTEMPTS = 5
#: The Graph validation token echoed is at most this long (Graph's are ~100 characters).
MAX_TOKEN = 1024


@dataclass(frozen=True)
class Answer:
    """The HTTP answer to one delivery."""

    status: int
    text: str
    content_type: str = "text/plain; charset=utf-8"


def webhooks_of(app: ConnectorHost, connector: str) -> Webhooks | None:
    """The connector's declaration, or None (no such connector, or it takes none)."""
    cls = app.connectors.get(connector)
    decl = getattr(cls, "webhooks", None) if cls is not None else None
    return decl if isinstance(decl, Webhooks) else None


def process_job_spec(connector: str, tenant: str) -> JobSpec:
    """The job that processes a tenant's pending events (one unfinished at a time)."""
    return JobSpec(
        kind=PROCESS_KIND,
        payload={"connector": connector, "tenant": tenant},
        unique_key=f"webhooks:{connector}:{tenant}",
        max_attempts=10,
    )


def trigger_at(last: datetime | None, window: timedelta, now: datetime) -> datetime:
    """When events arriving at ``now`` should run a stream's cycle, given the time of the
    last cycle they triggered: now, or once ``window`` has passed since that one."""
    if last is None or last + window <= now:
        return now
    return last + window


# --- receiving ------------------------------------------------------------------------------


async def _refuse(
    db: Database, connector: str, tenant: str, reason: str, now: datetime, log: Any
) -> Answer:
    def tx(conn: SyncConn) -> None:
        inbox.count_refusal(conn, connector=connector, tenant=tenant, reason=reason, now=now)

    await db.write(tx)
    record_webhook(connector, "refused")
    if log is not None:
        log.warning("webhook.refused", connector=connector, tenant=tenant, reason=reason)
    return Answer(401, "refused\n")


async def _attribute(
    db: Database, connector: str, decl: Webhooks, path_tenant: str | None, body: bytes
) -> tuple[str | None, str | None]:
    """(the tenant the delivery names, what it named): the tenant is None when no
    known tenant of ``connector`` matches."""
    named = path_tenant
    if isinstance(decl.tenant, TenantFromBody):
        named = decl.tenant.value(body)
    if not named:
        return None, named
    field = decl.tenant.config_field if isinstance(decl.tenant, TenantFromBody) else None

    def read(conn: SyncConn) -> str | None:
        name: str | None = named
        if field is not None:
            # Matched on a config field that is no secret, in SQL: nothing is decrypted.
            name = connection_store.tenant_by_config_field(conn, connector, field, named)
        row = connection_store.webhook_tenant_row(conn, name) if name else None
        return row.tenant if row is not None and row.connector == connector else None

    return await db.run_read(read), named


#: Verifier secrets opened from tenants' sealed configs, by (tenant, field, the config's
#: stored text): a config changed (a new secret, a resealed one) is a new key, so
#: nothing stale is used; Fernet opens a config once, not on every delivery.
_SECRETS: dict[tuple[str, str, str], str] = {}
_MAX_SECRETS = 10_000


def _secret(row: Any, field: str) -> str:
    """The tenant's verifier secret (cached), or ConfigurationError saying why not."""
    key = (str(row.tenant), field, str(row.config_text))
    found = _SECRETS.get(key)
    if found is not None:
        return found
    secret = opened_config(row.tenant, row.config_text).get(field)
    if not isinstance(secret, str) or not secret:
        raise ConfigurationError(f"tenant's config has no {field!r}")
    if len(_SECRETS) >= _MAX_SECRETS:
        _SECRETS.clear()
    _SECRETS[key] = secret
    return secret


@dataclass(frozen=True)
class _Known:
    """A tenant's verifier secret as a delivery last read it, with the config text it
    came from: a delivery that verifies with it is stored only while the tenant's config
    is still that text (:func:`synckit.store.webhooks.store_verified` checks it in the
    statement that stores), so nothing stale is ever used; any doubt takes the reading
    path again."""

    tenant: str
    config_text: str
    secret: str


#: By (connector, the tenant the delivery named).
_KNOWN: dict[tuple[str, str], _Known] = {}


def _know(connector: str, named: str, known: _Known) -> None:
    if len(_KNOWN) >= _MAX_SECRETS:
        _KNOWN.clear()
    _KNOWN[(connector, named)] = known


async def _store_known(
    db: Database,
    decl: Webhooks,
    connector: str,
    named: str,
    known: _Known,
    headers: Mapping[str, str],
    kept: Mapping[str, str],
    body: bytes,
    now: datetime,
) -> inbox.Stored | Answer | None:
    """The steady state: the delivery verified with the secret read before, stored in
    one statement shared by the group's deliveries (no tenant read). None: it did not
    verify with that secret, or the tenant's config changed since: take the reading path
    (which refuses, or learns the new secret)."""
    try:
        if decl.verify.check(headers, body, known.secret, now) is not None:
            return None
    except ConfigurationError:
        return None
    events = decl.verify.events(headers, body)
    if not events:
        return Answer(400, "no events in the delivery\n")
    delivery = inbox.Verified(
        connector=connector,
        tenant=known.tenant,
        config_text=known.config_text,
        events=tuple(events),
        headers=kept,
        now=now,
        job=process_job_spec(connector, known.tenant),
    )
    stored = await db.write_grouped(
        _store_one, delivery, order=(connector, named), many=inbox.store_verified, pipeline=True
    )
    if stored is None:
        _KNOWN.pop((connector, named), None)
    return stored


def _store_one(conn: SyncConn, delivery: inbox.Verified) -> inbox.Stored | None:
    return inbox.store_verified(conn, [delivery])[0]


@dataclass(frozen=True)
class _Refused:
    tenant: str
    reason: str


async def _verify_and_store(
    db: Database,
    decl: Webhooks,
    connector: str,
    named: str,
    headers: Mapping[str, str],
    body: bytes,
    now: datetime,
    log: Any,
) -> Answer:
    """The common case (each tenant's own secret). With the tenant's secret known
    (:func:`_store_known`), verify and store in one statement shared by the group; else
    read the tenant, verify, and store or count the refusal, all in one short transaction
    that concurrent deliveries share (:meth:`Database.write_grouped`: one commit for many
    on PostgreSQL), learning the secret for the next delivery."""
    field = decl.tenant.config_field if isinstance(decl.tenant, TenantFromBody) else None
    kept = {k: headers[k][:500] for k in decl.verify.kept_headers if k in headers}
    known = _KNOWN.get((connector, named))
    if known is not None:
        stored = await _store_known(db, decl, connector, named, known, headers, kept, body, now)
        if stored is not None:
            return stored if isinstance(stored, Answer) else _stored(connector, stored, "", log)

    def tx(conn: SyncConn) -> inbox.Stored | _Refused | None:
        name: str | None = named
        if field is not None:
            name = connection_store.tenant_by_config_field(conn, connector, field, named)
        row = connection_store.webhook_tenant_row(conn, name) if name else None
        if row is None or row.connector != connector:
            why = _Refused("", f"no tenant {named!r}")
        else:
            try:
                secret = _secret(row, decl.verify.secret_field)
                reason = decl.verify.check(headers, body, secret, now)
            except ConfigurationError as exc:  # no secret, or one not of the scheme's shape
                reason = str(exc)
            else:
                _know(connector, named, _Known(str(row.tenant), str(row.config_text), secret))
            if reason is None:
                events = decl.verify.events(headers, body)
                if not events:
                    return None
                return inbox.store_events(
                    conn,
                    connector=connector,
                    tenant=row.tenant,
                    events=events,
                    headers=kept,
                    now=now,
                    job=process_job_spec(connector, row.tenant),
                )
            why = _Refused(row.tenant, reason)
        inbox.count_refusal(
            conn, connector=connector, tenant=why.tenant, reason=why.reason, now=now
        )
        return why

    done = await db.write_grouped(tx, order=(connector, named))
    if done is None:
        return Answer(400, "no events in the delivery\n")
    if isinstance(done, _Refused):
        record_webhook(connector, "refused")
        if log is not None:
            log.warning(
                "webhook.refused", connector=connector, tenant=done.tenant, reason=done.reason
            )
        return Answer(401, "refused\n")
    return _stored(connector, done, "", log)


def _stored(connector: str, stored: inbox.Stored, orphan_of: str | None, log: Any) -> Answer:
    record_webhook(connector, "orphaned" if orphan_of else "stored", stored.stored)
    record_webhook(connector, "duplicate", stored.duplicates)
    if log is not None and orphan_of:
        log.info("webhook.orphaned", connector=connector, tenant=orphan_of, stored=stored.stored)
    return Answer(
        200, f'{{"stored": {stored.stored}, "duplicates": {stored.duplicates}}}', "application/json"
    )


async def receive(
    db: Database,
    app: ConnectorHost,
    connector: str,
    *,
    path_tenant: str | None,
    headers: Mapping[str, str],
    query: Mapping[str, str],
    body: bytes,
    now: datetime,
    log: Any = None,
) -> Answer:
    """Verify, attribute and store one delivery; the answer to give (see the module
    docstring). ``headers`` are lower-cased; ``body`` is the raw body, already capped."""
    decl = webhooks_of(app, connector)
    if decl is None:
        return Answer(404, "no webhooks for this connector\n")
    if isinstance(decl.verify, GraphNotifications) and "validationToken" in query:
        token = query["validationToken"]
        if len(token) > MAX_TOKEN:
            return Answer(400, "validationToken too long\n")
        return Answer(200, token)
    if decl.secret_env is None:
        named = decl.tenant.value(body) if isinstance(decl.tenant, TenantFromBody) else path_tenant
        if not named:
            # Without a tenant there is no secret: the delivery cannot be verified.
            return await _refuse(db, connector, "", f"no tenant {named!r}", now, log)
        return await _verify_and_store(db, decl, connector, named, headers, body, now, log)
    endpoint_secret = os.environ.get(decl.secret_env)
    if not endpoint_secret:
        if log is not None:
            log.error("webhook.no_secret", connector=connector, env=decl.secret_env)
        return Answer(503, "webhook secret not configured\n")
    reason = decl.verify.check(headers, body, endpoint_secret, now)
    if reason is not None:
        return await _refuse(db, connector, path_tenant or "", reason, now, log)
    tenant, named = await _attribute(db, connector, decl, path_tenant, body)
    if tenant is None:
        return await _store(db, decl, connector, "", headers, body, now, log, orphan_of=named or "")
    return await _store(db, decl, connector, tenant, headers, body, now, log)


async def _store(
    db: Database,
    decl: Webhooks,
    connector: str,
    tenant: str,
    headers: Mapping[str, str],
    body: bytes,
    now: datetime,
    log: Any,
    *,
    orphan_of: str | None = None,
) -> Answer:
    events = decl.verify.events(headers, body)
    if not events:
        return Answer(400, "no events in the delivery\n")
    kept = {k: headers[k][:500] for k in decl.verify.kept_headers if k in headers}
    job = None if orphan_of is not None else process_job_spec(connector, tenant)

    def tx(conn: SyncConn) -> inbox.Stored:
        return inbox.store_events(
            conn,
            connector=connector,
            tenant=tenant,
            events=events,
            headers=kept,
            now=now,
            orphan_of=orphan_of,
            job=job,
        )

    stored = await db.write_grouped(tx, order=(connector, tenant))
    return _stored(connector, stored, orphan_of, log)


# --- processing -----------------------------------------------------------------------------


def _event(r: Any) -> WebhookEvent:
    return from_row(WebhookEvent, r, headers=dict(r.headers or {}), body=bytes(r.body))


async def process_events(
    db: Database, app: ConnectorHost, connector: str, tenant: str, *, log: Any = None
) -> int:
    """Process the tenant's pending events until none is left; how many were processed."""
    cls = app.connectors.get(connector)
    decl = webhooks_of(app, connector)
    if cls is None or decl is None:
        raise Discard(f"connector {connector!r} takes no webhooks in this app")
    done = 0
    while True:
        lease = new_lease(decl.lease, now=app.clock())
        now = app.clock()

        def claim(conn: SyncConn, now: datetime = now, token: Any = lease) -> list[Any]:
            return inbox.claim_pending(
                conn, connector=connector, tenant=tenant, lease=token, now=now, limit=BATCH
            )

        rows = await db.write(claim)
        if not rows:
            return done
        if decl.records is not None:
            n = await _land(db, app, cls, decl.records, tenant, rows, lease.token, log)
        elif getattr(cls, "on_webhook", None) is not None:
            n = await _run_hook(db, app, tenant, rows, lease.token, log)
        else:
            n = await _trigger(db, app, cls, decl, tenant, rows, lease.token)
        record_webhook(connector, "processed", n)
        done += n


async def _trigger(
    db: Database,
    app: ConnectorHost,
    cls: Any,
    decl: Webhooks,
    tenant: str,
    rows: Sequence[Any],
    token: str,
) -> int:
    try:
        t = await get_tenant(db, tenant, reveal=False)
    except TenantNotFound:
        t = None
    streams = [s for s in cls.declared_streams() if decl.streams is None or s.name in decl.streams]
    now = app.clock()
    ids = [r.id for r in rows]

    def tx(conn: SyncConn) -> list[int]:
        if t is not None and t.connector == cls.name and t.status == "active" and streams:
            last = inbox.lock_triggers(conn, tenant, [s.name for s in streams])
            for s in streams:
                at = trigger_at(last.get(s.name), s.webhook_window, now)
                spec = dataclasses.replace(
                    poll_job_spec(tenant, t.connector, s.name, t.resource_key), run_at=at
                )
                # A cycle already queued for the stream takes these events too.
                if enqueue_new_sync(conn, [spec], now):
                    inbox.set_trigger(conn, tenant, s.name, at)
        # A tenant gone, paused or re-authorising: nothing to trigger; polling resumes
        # with the tenant and catches up what these events announced.
        return inbox.finish_events(conn, ids, token, now)

    return len(await db.write(tx))


def dead_letter_kind(connector: str) -> str:
    """The dead-letter kind of a connector's failed webhook events."""
    return f"webhook:{connector}"


class _LeaseLost(Exception):
    """Another worker holds some of the batch's events now: nothing of it lands here."""


async def _event_records(
    ctx: Any,
    events: Sequence[Any],
    raws: list[Any],
    owner: list[int],
    errors: dict[int, Exception],
) -> None:
    """Each event's records (the connector's ``webhook_records``, else the body) into
    ``raws``, the index of its event into ``owner``; an event that fails into ``errors``."""
    hook = getattr(ctx.connector, "webhook_records", None)
    for i, e in enumerate(events):
        try:
            got = list(await hook(ctx, e)) if hook is not None else [e.json()]
        except Exception as exc:  # connector code or a body that is no JSON
            errors[i] = exc
            continue
        raws.extend(got)
        owner.extend([i] * len(got))


def _failures(
    connector: Any,
    connector_name: str,
    tenant: str,
    kind: str,
    events: Sequence[Any],
    bad: Mapping[int, Exception],
    now: Any,
) -> list[dlq_store.Failure]:
    """One dead letter for each failed event."""
    out = []
    for i, exc in sorted(bad.items()):
        e = events[i]
        f = record_failure(connector, f"event:{e.event_id}", e.event_id, exc, now)
        out.append(
            dlq_store.Failure(
                tenant=tenant,
                connector=connector_name,
                kind=kind,
                record_id=f.record_id,
                payload={"event": e.id, "event_id": e.event_id},
                error_class=f.error_class,
                message=f.message,
                traceback=f.traceback,
                source="webhook",
            )
        )
    return out


async def _land(
    db: Database,
    app: ConnectorHost,
    cls: Any,
    stream_name: str,
    tenant: str,
    rows: Sequence[Any],
    token: str,
    log: Any,
) -> int:
    """Land the events' records in the stream's table, the batch in one transaction with
    the events' processed marks; a failed event becomes one dead letter."""
    stream = cls.stream(stream_name)
    decl = stream.records
    if decl is None:
        raise Discard(
            f"connector {cls.name!r}: Webhooks(records={stream_name!r}) names a stream "
            "without Records"
        )
    events = [_event(r) for r in rows]
    raws: list[Any] = []
    owner: list[int] = []  # the event each record came from
    errors: dict[int, Exception] = {}
    async with app.context(db, tenant, stream=stream_name, log=log) as ctx:
        connector = ctx.connector
        await _event_records(ctx, events, raws, owner, errors)
        index = {id(r): i for i, r in enumerate(raws)}

        def failure_of(raw: Any, exc: Exception) -> tuple[int, Exception]:
            return owner[index[id(raw)]], exc

        landing, refused, _ = prepare(decl, tenant, stream_name, raws, failure_of)
        for i, why in refused:
            errors.setdefault(i, why)
        now = app.clock()
        kind = dead_letter_kind(cls.name)

        def tx(conn: SyncConn) -> int:
            bad = dict(errors)
            if any(b.rows or b.deletes for b in landing.batches):
                land(conn, landing, now)  # the database's refusals: their events fail
                for i, why in landing.refused:
                    bad.setdefault(i, why)
            ok = [e.id for i, e in enumerate(events) if i not in bad]
            failed_ids = [events[i].id for i in bad]
            if len(inbox.finish_events(conn, ok, token, now)) != len(ok) or len(
                inbox.fail_events(conn, failed_ids, token, "see the dead letter", give_up=True)
            ) != len(failed_ids):
                raise _LeaseLost
            if bad:
                dlq_store.capture_many(
                    conn, _failures(connector, cls.name, tenant, kind, events, bad, now), now=now
                )
            if ok:
                dlq_store.resolve_records(
                    conn,
                    tenant=tenant,
                    connector=cls.name,
                    kind=kind,
                    record_ids=[
                        f"event:{e.event_id}" for i, e in enumerate(events) if i not in bad
                    ],
                    now=now,
                    reason="the event was processed",
                )
            return len(ok)

        try:
            n = await db.write(tx)
        except _LeaseLost:
            if log is not None:
                log.warning("webhook.lease_lost", tenant=tenant, events=len(events))
            return 0
    if errors and log is not None:
        log.warning("webhook.failed", tenant=tenant, events=len(errors))
    return n


async def _run_hook(
    db: Database, app: ConnectorHost, tenant: str, rows: Sequence[Any], token: str, log: Any
) -> int:
    events = [_event(r) for r in rows]
    failed: dict[int, str] = {}
    async with app.context(db, tenant, log=log) as ctx:
        hook = ctx.connector.on_webhook  # type: ignore[attr-defined]  # an optional hook
        try:
            await hook(ctx, events)
        except Exception as exc:
            if len(events) == 1:
                failed[events[0].id] = f"{type(exc).__name__}: {exc}"
            else:
                for e in events:  # one at a time: a bad event fails alone
                    try:
                        await hook(ctx, [e])
                    except Exception as one:
                        failed[e.id] = f"{type(one).__name__}: {one}"
                    else:
                        now = app.clock()
                        await db.write(
                            lambda c, i=e.id, n=now: inbox.finish_events(c, [i], token, n)
                        )
                if not failed:
                    return len(events)
                ok = len(events) - len(failed)
                await _fail(db, rows, failed, token)
                return ok
    if failed:
        await _fail(db, rows, failed, token)
        return 0
    now = app.clock()
    return len(await db.write(lambda c: inbox.finish_events(c, [e.id for e in events], token, now)))


async def _fail(db: Database, rows: Sequence[Any], failed: Mapping[int, str], token: str) -> None:
    def tx(conn: SyncConn) -> None:
        for r in rows:
            if r.id in failed:
                give_up = r.attempts >= MAX_EVENT_ATTEMPTS
                inbox.fail_events(conn, [r.id], token, failed[r.id], give_up=give_up)

    await db.write(tx)
    # The job fails so that its retry (with backoff) tries the events again.
    raise _HookFailed(
        f"on_webhook failed for {len(failed)} event(s): {next(iter(failed.values()))}"
    )


async def replay_event(db: Database, app: ConnectorHost, payload: Any, now: datetime) -> None:
    """Put a dead-lettered event (its payload ``{"event": inbox id}``) back to pending
    with its processing job: processed again, it lands or is dead-lettered again."""
    from synckit.errors.exceptions import Unreplayable

    event = payload.get("event") if isinstance(payload, Mapping) else None
    if not isinstance(event, int):
        raise Unreplayable(f"not a webhook event's dead letter: {str(payload)[:200]}")

    def tx(conn: SyncConn) -> bool:
        row = inbox.event_row(conn, event)
        if row is None or not row.tenant:
            return False
        return inbox.requeue(conn, event, process_job_spec(row.connector, row.tenant), now)

    if not await db.write(tx):
        raise Unreplayable(f"webhook event {event} is no longer in the inbox")


class _HookFailed(Exception):
    """Some events failed in ``on_webhook``; they stay pending (or failed) in the inbox."""


def register_webhooks(registry: Registry, app: ConnectorHost, *, sweep_every: timedelta) -> None:
    """The processing job and the recurring sweep, on ``app``'s registry."""

    async def process(jctx: JobContext) -> None:
        p = jctx.payload
        if not (
            isinstance(p, Mapping)
            and all(isinstance(p.get(k), str) for k in ("connector", "tenant"))
        ):
            raise Discard(f"malformed webhooks payload: {str(p)[:200]}")
        db = jctx.db if jctx.db is not None else await app.database()
        n = await process_events(db, app, p["connector"], p["tenant"], log=jctx.log)
        if n:
            jctx.log.info("webhook.processed", events=n)

    async def sweep(jctx: JobContext) -> None:
        db = jctx.db if jctx.db is not None else await app.database()
        now = app.clock()

        def tx(conn: SyncConn) -> list[str]:
            owners = inbox.pending_owners(conn, now)
            specs = [process_job_spec(c, t) for c, t in owners if t]
            return enqueue_new_sync(conn, specs, now) if specs else []

        enqueued = await db.write(tx)
        if enqueued:
            jctx.log.info("webhook.sweep_enqueued", jobs=len(enqueued))

    registry.add(PROCESS_KIND, process, timeout=600.0)
    registry.add(SWEEP_KIND, sweep, timeout=120.0)
    registry.recurring(SWEEP_NAME, SWEEP_KIND, every=sweep_every)
