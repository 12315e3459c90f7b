"""Intent-first creates: a create on a remote API that happens once, whatever fails.

:func:`run_intent` persists the intent (``pending``, with a fingerprint of the request)
before calling the API, and the remote id (``done``) before returning. On any later run
with the same key:

* a ``done`` intent returns its stored result without calling the API;
* a ``pending`` intent whose last attempt has an unknown outcome (it timed out, lost its
  response, or its worker died) first asks ``find`` whether the resource exists, records
  what it finds, and creates again only if nothing is found;
* the same key with a different request fingerprint is an :class:`IntentConflict`,
  never a silent reuse of the other request's result.

``create(idempotency_key)`` receives a key that is the same on every attempt of the
intent; send it where the API supports idempotency keys (see :func:`idempotency_headers`
and :func:`idempotency_request_hook`), and the API itself deduplicates retries too.

Serialising one intent across processes
---------------------------------------
Two workers running the same intent must not both create. Each run touches the intent's
row only in two short transactions (:mod:`synckit.store.intents`): one that claims the
one lease on it (:mod:`synckit.store.leases`: ``lease_token``, ``lease_expires_at``) and
one that records the outcome. A run that finds the intent under another live lease waits
for the intent to finish or the lease to expire. The API call itself runs outside any
transaction: on SQLite a transaction held across a slow create would hold the one write
lock of the whole database and stall every worker; on PostgreSQL it would pin a pooled
connection idle-in-transaction per in-flight create. The lease is ``call_timeout`` plus a
margin, and the call is cancelled at ``call_timeout``, so a lease outlives the call it covers;
lease expiry is judged by each host's clock, so hosts' clocks must agree to within the
margin (:data:`LEASE_MARGIN`). A worker killed mid-create leaves its lease to expire;
the next run then asks ``find``.

A failed call (an exception from ``find`` or ``create``) releases the lease at once and
leaves the intent pending, so the retry starts with ``find``; a call that timed out
(``TimeoutError``, ``httpx.TimeoutException``) keeps its lease until it expires, since the
request may still land.

Writes as jobs
--------------
:func:`write_job` makes the job (kind :data:`WRITE_KIND`) and :func:`write_job_handler`
the handler that runs it through :func:`run_write`: a write survives restarts and
retries, and its create still happens once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol, runtime_checkable

import httpx
import structlog

from synckit import tracing
from synckit.clock import utcnow
from synckit.connectors.intents import Create, Find, IntentOutcome, IntentResult, RemoteRecord
from synckit.errors.exceptions import (
    DatabaseError,
    IntentBusy,
    IntentConflict,
    PermanentError,
)
from synckit.runtime.jobs.handlers import Handler, JobContext
from synckit.runtime.observe.logging import redact_text
from synckit.store import intents as intent_store
from synckit.store.db import Database
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.leases import new_lease

log = structlog.get_logger("synckit.intents")

DEFAULT_IDEMPOTENCY_HEADER = "Idempotency-Key"
#: How much longer than the call's timeout a lease lasts by default: room for clock skew
#: between hosts and for the database round trips around the call.
LEASE_MARGIN = timedelta(seconds=5)
WRITE_KIND = "synckit.write"

_IDEMPOTENT_METHODS = frozenset({"POST", "PUT", "PATCH"})
_NAMESPACE = uuid.UUID("8a0f7c1e-56b4-4c36-9d0b-6a1d2f3e4b5c")


# --- pure helpers ------------------------------------------------------------------------


def _canonical_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def canonical_json(value: Any) -> str:
    """``value`` as canonical JSON: sorted keys, no whitespace, UTF-8 text."""
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
        default=_canonical_default,
    )


def fingerprint(request: Any) -> str:
    """sha256 (hex) of the canonical JSON of ``request``; key order does not matter."""
    try:
        text = canonical_json(request)
    except (TypeError, ValueError) as exc:
        raise PermanentError(f"intent request is not JSON-serialisable: {exc}") from exc
    return hashlib.sha256(text.encode()).hexdigest()


def idempotency_key(tenant: str, connector: str, key: str) -> str:
    """The idempotency key sent for an intent: a UUID, stable for (tenant, connector, key)."""
    return str(uuid.uuid5(_NAMESPACE, f"{connector}\x00{tenant}\x00{key}"))


def idempotency_headers(key: str, header: str = DEFAULT_IDEMPOTENCY_HEADER) -> dict[str, str]:
    """The header to send with a create: ``{"Idempotency-Key": key}`` by default."""
    return {header: key}


_current_idempotency: ContextVar[tuple[str, str] | None] = ContextVar(
    "synckit_idempotency", default=None
)


def current_idempotency_headers() -> dict[str, str]:
    """Inside a ``create`` run with ``idempotency_header``: that header; else ``{}``."""
    current = _current_idempotency.get()
    return {current[0]: current[1]} if current else {}


async def idempotency_request_hook(request: httpx.Request) -> None:
    """An httpx request event hook: adds the intent's idempotency header to POST/PUT/PATCH
    requests made inside a ``create`` run with ``idempotency_header``.

    ``httpx.AsyncClient(event_hooks={"request": [idempotency_request_hook]})``
    """
    current = _current_idempotency.get()
    if current and request.method in _IDEMPOTENT_METHODS and current[0] not in request.headers:
        request.headers[current[0]] = current[1]


def _json_safe(data: Mapping[str, Any] | None) -> Any:
    if data is None:
        return None
    # Lossy (str() of exotic values) rather than failing: the remote resource exists now,
    # and losing its record would be worse than storing a string.
    return json.loads(json.dumps(dict(data), default=str))


def _describe(exc: BaseException) -> str:
    """The failure kept in ``result._last_error``: redacted before it is cut (a secret cut
    in half would escape the patterns), NULs dropped (PostgreSQL refuses them in JSON)."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a broken __str__ must not replace the create's own failure
        text = f"{type(exc).__name__}: <unprintable>"
    text = redact_text(text).replace("\x00", "")
    return text if len(text) <= 300 else text[:297] + "..."


# --- persistence (the statements are synckit.store.intents') -----------------------------


@dataclass(frozen=True)
class _Claimed:
    token: str
    attempts: int
    find_first: bool


@dataclass(frozen=True)
class _Wait:
    until: datetime


def _stored(row: intent_store.IntentRow) -> IntentResult:
    return IntentResult(row.key, row.remote_id or "", row.result, "stored", row.attempts)


async def _claim(
    db: Database,
    *,
    tenant: str,
    connector: str,
    key: str,
    fp: str,
    now: datetime,
    lease: timedelta,
) -> IntentResult | _Claimed | _Wait:
    """The stored result, a lease to wait out, or the intent under a lease of ours."""
    mine = new_lease(lease, now=now)
    row, taken = await intent_store.claim(
        db, tenant=tenant, connector=connector, key=key, fingerprint=fp, lease=mine, now=now
    )
    if row.fingerprint != fp:
        raise IntentConflict(
            f"intent {key!r} of tenant {tenant!r} ({connector}) was first used with a "
            "different request; use a new key for a different create"
        )
    if taken:
        return _Claimed(mine.token, attempts=row.attempts, find_first=row.attempts > 1)
    if row.status == "done":
        return _stored(row)
    return _Wait(row.lease_expires_at or now)


async def _finish(
    db: Database,
    *,
    tenant: str,
    connector: str,
    key: str,
    record: RemoteRecord,
    outcome: IntentOutcome,
    now: datetime,
) -> IntentResult:
    """Record the remote id; if another run recorded one meanwhile, that one stands."""
    data = _json_safe(record.data)
    row, recorded = await intent_store.finish(
        db,
        tenant=tenant,
        connector=connector,
        key=key,
        remote_id=record.remote_id,
        result=data,
        now=now,
    )
    if not recorded:
        if row.remote_id != record.remote_id:
            # Our lease expired mid-call and another run created it as well.
            log.warning(
                "intent.duplicate_suspected",
                tenant=tenant,
                connector=connector,
                intent_key=key,
                remote_id=row.remote_id,
                duplicate_remote_id=record.remote_id,
            )
        return _stored(row)
    return IntentResult(key, record.remote_id, data, outcome, row.attempts)


# --- running an intent -------------------------------------------------------------------


async def run_intent(
    db: Database,
    *,
    tenant: str,
    connector: str,
    key: str,
    create: Create,
    find: Find | None = None,
    request: Any = None,
    idempotency_header: str | None = None,
    call_timeout: float = 30.0,
    lease_margin: timedelta = LEASE_MARGIN,
    clock: Callable[[], datetime] = utcnow,
) -> IntentResult:
    """Create the remote resource named by ``key`` at most once, and return its id.

        ``create(idempotency_key)`` makes the resource and returns a :class:`RemoteRecord`;
        ``find()`` looks for one an earlier attempt may have made (``None`` if there is
        none). ``request`` is what is being created: its fingerprint must match on every
        run with this key. With ``idempotency_header`` set, :func:`idempotency_request_hook`
        adds that header to the requests ``create`` makes. ``find`` and ``create`` together
        are cancelled after ``call_timeout`` seconds; the intent's lease lasts ``call_timeout``
    plus ``lease_margin`` (see the module docstring).

        Raises :class:`IntentConflict` for a reused key with a different request, whatever
        ``find`` or ``create`` raise (the intent stays pending; the next run asks ``find``),
        and :class:`IntentBusy` if another worker holds the intent for too long.
    """
    with tracing.span(
        "synckit.intent",
        synckit__tenant=tenant,
        synckit__connector=connector,
        synckit__intent__key=key,
    ) as span:
        if not key:
            raise PermanentError("an intent needs a non-empty key")
        fp = fingerprint(request)
        lease = timedelta(seconds=call_timeout) + lease_margin
        ids = {"tenant": tenant, "connector": connector, "key": key}
        state = await _claim_or_wait(db, ids, fp=fp, lease=lease, clock=clock)
        if isinstance(state, IntentResult):
            result = state
        else:
            result = await _run_claimed(
                db,
                ids,
                state,
                create=create,
                find=find,
                idempotency_header=idempotency_header,
                call_timeout=call_timeout,
                clock=clock,
            )
        tracing.set_attributes(
            span, synckit__intent__outcome=result.outcome, synckit__remote_id=result.remote_id
        )
        return result


async def _claim_or_wait(
    db: Database,
    ids: dict[str, str],
    *,
    fp: str,
    lease: timedelta,
    clock: Callable[[], datetime],
) -> IntentResult | _Claimed:
    """The stored result, or the intent under a lease of ours, waiting while another
    worker holds it (:class:`IntentBusy` once that lasts twice the lease)."""
    deadline = time.monotonic() + 2 * lease.total_seconds()
    pause = 0.05
    while True:
        state = await _claim(db, **ids, fp=fp, now=clock(), lease=lease)
        if isinstance(state, IntentResult | _Claimed):
            return state
        if time.monotonic() >= deadline:
            raise IntentBusy(
                f"intent {ids['key']!r} of tenant {ids['tenant']!r} is held by another worker",
                retry_after=max(timedelta(0), state.until - clock()),
            )
        # Another worker is running this intent: wait for it to finish or to lose its lease.
        remaining = max(0.0, (state.until - clock()).total_seconds())
        await asyncio.sleep(min(pause, remaining + 0.01))
        pause = min(pause * 2, 0.5)


async def _run_claimed(
    db: Database,
    ids: dict[str, str],
    state: _Claimed,
    *,
    create: Create,
    find: Find | None,
    idempotency_header: str | None,
    call_timeout: float,
    clock: Callable[[], datetime],
) -> IntentResult:
    """``find`` (on a retry) then ``create``, under the lease ``state`` holds; the outcome
    stored, or the lease released on a failure that is not a timeout."""
    tenant, connector, key = ids["tenant"], ids["connector"], ids["key"]
    fields = {"tenant": tenant, "connector": connector, "intent_key": key}
    outcome: IntentOutcome = "created"
    try:
        async with asyncio.timeout(call_timeout):
            record: RemoteRecord | None = None
            if state.find_first:
                if find is not None:
                    record = await find()
                    if record is not None:
                        outcome = "found"
                else:
                    log.warning("intent.blind_retry", attempt=state.attempts, **fields)
            if record is None:
                token = (
                    _current_idempotency.set(
                        (idempotency_header, idempotency_key(tenant, connector, key))
                    )
                    if idempotency_header
                    else None
                )
                try:
                    record = await create(idempotency_key(tenant, connector, key))
                finally:
                    if token is not None:
                        _current_idempotency.reset(token)
        if not isinstance(record, RemoteRecord) or not record.remote_id:
            raise PermanentError(
                f"intent {key!r}: create/find must return a RemoteRecord with a remote_id"
            )
    except (TimeoutError, httpx.TimeoutException):
        # The request may still land: keep the lease until it expires, then find.
        raise
    except Exception as exc:
        with contextlib.suppress(DatabaseError):
            await intent_store.release(
                db, **ids, token=state.token, error=_describe(exc), now=clock()
            )
        raise
    result = await _finish(db, **ids, record=record, outcome=outcome, now=clock())
    event = f"intent.{result.outcome}"
    log.info(event, remote_id=result.remote_id, attempt=state.attempts, **fields)
    return result


# --- writes as jobs ----------------------------------------------------------------------


class Writer(Protocol):
    """What a write job needs from a connector: the create of an ``operation``."""

    async def create(
        self, operation: str, request: Any, *, idempotency_key: str
    ) -> RemoteRecord: ...


@runtime_checkable
class FindingWriter(Writer, Protocol):
    """A writer that can also look for what an earlier, lost attempt created."""

    async def find(self, operation: str, request: Any) -> RemoteRecord | None: ...


#: ``(tenant, connector) -> writer``: the connector instance bound to the tenant.
WriterResolver = Callable[[str, str], Awaitable[Writer]]


def write_job(
    *,
    tenant: str,
    connector: str,
    key: str,
    request: Any,
    operation: str = "create",
    resource_key: str | None = None,
    idempotency_header: str | None = None,
    max_attempts: int | None = None,
    priority: int = 0,
) -> JobSpec:
    """The job that performs one intent-first write (enqueue it with the runtime's enqueue).

    The intent, not the job, is what makes the write happen once: enqueueing the same
    write twice gives two jobs, and whichever runs second returns the stored result.
    """
    payload = {
        "tenant": tenant,
        "connector": connector,
        "key": key,
        "operation": operation,
        "request": request,
        "idempotency_header": idempotency_header,
    }
    return JobSpec(
        kind=WRITE_KIND,
        payload=payload,
        resource_key=resource_key,
        max_attempts=max_attempts,
        priority=priority,
    )


def _field(payload: Mapping[str, Any], name: str) -> str:
    value = payload.get(name)
    if not isinstance(value, str) or not value:
        raise PermanentError(f"write job payload: {name!r} must be a non-empty string")
    return value


async def run_write(
    db: Database,
    writer: Writer,
    payload: Any,
    *,
    call_timeout: float = 30.0,
    lease_margin: timedelta = LEASE_MARGIN,
) -> IntentResult:
    """Run the write described by a :func:`write_job` payload through :func:`run_intent`.

    A malformed payload is a :class:`PermanentError` (dead-lettered, never retried).
    """
    if not isinstance(payload, Mapping):
        raise PermanentError("write job payload must be an object")
    tenant = _field(payload, "tenant")
    connector = _field(payload, "connector")
    key = _field(payload, "key")
    operation = _field(payload, "operation")
    request = payload.get("request")
    header = payload.get("idempotency_header")
    if header is not None and not isinstance(header, str):
        raise PermanentError("write job payload: 'idempotency_header' must be a string")

    async def create(idem: str) -> RemoteRecord:
        return await writer.create(operation, request, idempotency_key=idem)

    find: Find | None = None
    if isinstance(writer, FindingWriter):
        finder = writer

        async def find_it() -> RemoteRecord | None:
            return await finder.find(operation, request)

        find = find_it

    return await run_intent(
        db,
        tenant=tenant,
        connector=connector,
        key=key,
        create=create,
        find=find,
        request={"operation": operation, "request": request},
        idempotency_header=header,
        call_timeout=call_timeout,
        lease_margin=lease_margin,
    )


def write_job_handler(
    db: Database,
    resolve: WriterResolver,
    *,
    call_timeout: float = 30.0,
    lease_margin: timedelta = LEASE_MARGIN,
) -> Handler:
    """The handler of :data:`WRITE_KIND` jobs: ``registry.add(WRITE_KIND, handler)``."""

    async def handle(ctx: JobContext) -> None:
        payload = ctx.payload
        if not isinstance(payload, Mapping):
            raise PermanentError("write job payload must be an object")
        writer = await resolve(_field(payload, "tenant"), _field(payload, "connector"))
        result = await run_write(
            db, writer, payload, call_timeout=call_timeout, lease_margin=lease_margin
        )
        ctx.log.info(
            "write.done", intent_key=result.key, remote_id=result.remote_id, outcome=result.outcome
        )

    return handle


__all__ = [
    "DEFAULT_IDEMPOTENCY_HEADER",
    "LEASE_MARGIN",
    "WRITE_KIND",
    "Create",
    "Find",
    "FindingWriter",
    "IntentOutcome",
    "IntentResult",
    "RemoteRecord",
    "Writer",
    "WriterResolver",
    "canonical_json",
    "current_idempotency_headers",
    "fingerprint",
    "idempotency_headers",
    "idempotency_key",
    "idempotency_request_hook",
    "run_intent",
    "run_write",
    "write_job",
    "write_job_handler",
]
