""":class:`RuntimeContext`: the runtime's :class:`~synckit.connectors.context.SyncContext`.

``ctx.http`` is the tenant's ``httpx.AsyncClient`` (base URL, auth, timeouts, pacing and
error classification applied to every request: see :mod:`synckit.runtime.http.client`);
``ctx.log`` a structlog logger bound to tenant, connector, stream and trace id;
``ctx.intent(...)`` an intent-first create; ``ctx.stream`` the stream being polled.
:func:`open_context` opens one; the connector's auth declaration is fulfilled here
(:meth:`RuntimeContext.auth_for`).
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import httpx
import structlog

from synckit.clock import utcnow
from synckit.connectors.auth import OAuth2
from synckit.connectors.base import DEFAULT_STREAM, Connector, pace_policy_of
from synckit.connectors.context import SyncContext
from synckit.runtime.http.client import SyncClient
from synckit.runtime.http.network import Network
from synckit.runtime.http.pacer import PacedTransport, Pacer
from synckit.runtime.http.pacing import FirstSlots, PaceView
from synckit.runtime.http.transports import (
    DEFAULT_NETWORK,
    borrow_transport,
    tls_context,
    transport_for,
)
from synckit.runtime.observe.logging import bind_known_secrets, scrub_values, secret_values
from synckit.store.db import Database

if TYPE_CHECKING:
    from synckit.runtime.writes.intents import Create, Find, IntentResult

__all__ = ["ConnectorHost", "RuntimeContext", "SendTimeAuth", "open_context"]


class ConnectorHost(Protocol):
    """What the runtime asks of the application that holds the connectors:
    :class:`synckit.App` is the one there is. The runtime's jobs (webhooks,
    subscriptions, tenant actions) take a host, not the App: the App sits above the
    runtime, and the runtime names no module above it."""

    @property
    def connectors(self) -> Mapping[str, type[Connector[Any]]]: ...

    clock: Callable[[], datetime]

    def connector(self, name: str) -> type[Connector[Any]]: ...

    async def database(self) -> Database: ...

    def context(
        self,
        db: Database,
        tenant: Any,
        *,
        stream: str | None = None,
        trace_id: str | None = None,
        log: Any = None,
    ) -> AbstractAsyncContextManager[SyncContext]: ...


@runtime_checkable
class SendTimeAuth(Protocol):
    """An ``httpx.Auth`` that attaches its credential when the transport sends the request
    (:class:`~synckit.runtime.credentials.oauth.OAuth2Auth`): ``open_context`` wires
    ``before_send`` into the paced transport and sets ``attached_by_transport``."""

    attached_by_transport: bool

    async def before_send(self, request: httpx.Request) -> None: ...


class _RecordLog:
    """``log.bind(record_id=...)``, bound only when the handler first uses it: most
    handlers of most records log nothing, and binding cost ~1 µs a record."""

    __slots__ = ("_base", "_bound", "_record_id")

    def __init__(self, base: Any, record_id: str) -> None:
        self._base = base
        self._record_id = record_id
        self._bound: Any = None

    def _logger(self) -> Any:
        if self._bound is None:
            self._bound = self._base.bind(record_id=self._record_id)
        return self._bound

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger(), name)

    def __repr__(self) -> str:
        return repr(self._logger())


@dataclass(eq=False)
class RuntimeContext(SyncContext):
    """The runtime's :class:`SyncContext`. One per tenant and cycle (or replay).

    ``record_id`` is set in the copy ``handle()`` receives for one record, whose ``log``
    is bound to it too.
    """

    db: Database
    connector: Connector[Any]
    tenant: str
    stream: str
    resource_key: str
    trace_id: str
    log: Any
    http: httpx.AsyncClient
    record_id: str | None = None
    #: The App's proxy and CAs, which its OAuth2 token endpoint is reached through too.
    network: Network = DEFAULT_NETWORK

    def for_record(self, record_id: str) -> RuntimeContext:
        """This context for the handling of one record: ``record_id`` set and logged."""
        # A shallow copy of the fields: dataclasses.replace re-runs __init__, which was
        # half of the framework's cost per record (2.8 us of ~6) in poll cycles.
        ctx = object.__new__(type(self))
        ctx.__dict__.update(self.__dict__)
        ctx.record_id = record_id
        ctx.log = _RecordLog(self.log, record_id)
        return ctx

    async def intent(
        self,
        key: str,
        *,
        create: Create,
        find: Find | None = None,
        request: Any = None,
        idempotency_header: str | None = None,
    ) -> IntentResult:
        """Create something on the API at most once per ``key`` for this tenant.

        Delegates to :func:`synckit.runtime.writes.intents.run_intent` (the intent is stored
        before ``create`` runs; a finished one returns its stored result; an unfinished
        one asks ``find`` first). ``request`` is what the create sends: its fingerprint
        detects a key reused for a different request.
        """
        # Imported here: intents depends on the runtime, and a connector that never
        # creates anything should not pay for it.
        from synckit.runtime.writes.intents import run_intent

        return await run_intent(
            self.db,
            tenant=self.tenant,
            connector=self.connector.name,
            key=key,
            create=create,
            find=find,
            request=request,
            idempotency_header=idempotency_header,
        )

    def auth_for(self, declaration: OAuth2) -> httpx.Auth:
        """An :class:`~synckit.runtime.credentials.oauth.OAuth2Auth` for this tenant: its token
        set is read from, and refreshed into, the tenant's connection row."""
        # Imported here: authlib is loaded only by connectors that use OAuth2.
        from synckit.runtime.credentials.oauth import OAuth2Auth

        return OAuth2Auth(
            self.db, self.tenant, declaration.config_for(self.connector), network=self.network
        )


async def _idempotency_hook(request: httpx.Request) -> None:
    # Inside ctx.intent(..., idempotency_header=...), the create's POST/PUT/PATCH requests
    # carry the intent's idempotency key.
    from synckit.runtime.writes.intents import idempotency_request_hook

    await idempotency_request_hook(request)


@functools.cache
def _version() -> str:
    # Once per process: reading the distribution's metadata cost ~0.35 ms per poll cycle.
    try:
        from importlib.metadata import version

        return version("synckit")
    except Exception:  # not installed as a distribution (a source checkout)
        return "dev"


@functools.cache  # once per process: later calls are free
def prepare_process() -> None:
    """Pay once, before a worker's first job, what its first cycles would otherwise pay
    on their clock: the TLS context (the CA bundle, ~50 ms of CPU), the modules a context
    imports on first use, the package's version and the metrics registry. Measured on
    ``bench.tenants`` (1,000 tenants, one worker): these were ~8% of the worker's CPU in
    the cycle's first second."""
    from synckit.runtime.credentials import oauth  # noqa: F401
    from synckit.runtime.observe import instruments
    from synckit.runtime.writes import intents  # noqa: F401

    tls_context()
    _version()
    instruments.prepare()


@functools.lru_cache(maxsize=1024)
def _base_url(url: str | httpx.URL) -> httpx.URL:
    # Parsed once per base URL and process (httpx would parse it twice for every client,
    # that is every cycle: ~40 us), with the trailing slash httpx adds. An httpx.URL is
    # immutable: every client may share it.
    parsed = httpx.URL(url)
    if parsed.raw_path.endswith(b"/"):
        return parsed
    return parsed.copy_with(raw_path=parsed.raw_path + b"/")


def _user_agent(connector: Connector[Any]) -> str:
    return f"synckit/{_version()} ({connector.name})"


@asynccontextmanager
async def open_context(
    db: Database,
    connector: Connector[Any],
    *,
    resource_key: str,
    stream: str = DEFAULT_STREAM,
    trace_id: str | None = None,
    log: Any = None,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Callable[[], datetime] = utcnow,
    pace: PaceView | None = None,
    first_slots: FirstSlots | None = None,
    network: Network = DEFAULT_NETWORK,
) -> AsyncIterator[RuntimeContext]:
    """A :class:`RuntimeContext` for ``connector``'s tenant; its HTTP client closes on exit.

    ``transport`` replaces the network (``httpx.MockTransport`` in tests); pacing and
    classification still apply on top of it. Without one, a worker's context borrows the
    connections an earlier one of the connector left open
    (:func:`~synckit.runtime.http.transports.borrow_transport`) and gives them back on exit;
    elsewhere it opens its own, closed on exit. ``pace`` and ``first_slots``, read and
    reserved by the caller just now (a poll job's start read), seed the pacing: the first
    request needs no read or reservation of its own. ``network``: the proxy and CAs
    the client's own connections use (``App(proxy=..., ca_bundle=...)``).

    The secret values of the tenant's config are scrubbed, by value, from every text
    redacted while the context is open (log lines, stored error texts), and from the
    texts of an exception leaving it: an API that echoes a credential back in a shape no
    pattern knows (a custom header's value in a sentence) leaks it nowhere.
    """
    known = secret_values(connector.config)
    with bind_known_secrets(known):
        try:
            ctx, client, paced = _build(
                db, connector, resource_key, stream, trace_id, log, transport, clock, pace,
                first_slots, network,
            )  # fmt: skip
            try:
                # Auth is built last: an OAuth flow needs the context (database, tenant).
                auth = connector.build_auth(ctx)
                if auth is not None:
                    client.auth = auth
                # (A runtime-checkable protocol's isinstance is slow: not for None.)
                if auth is not None and isinstance(auth, SendTimeAuth):
                    # The bearer token goes on after the pacing wait, just before the
                    # request leaves: a wait longer than the token's remaining life must
                    # not send it expired (and a 401 on it is no evidence of a refused
                    # grant).
                    paced.before_send = auth.before_send
                    auth.attached_by_transport = True
            except BaseException:
                await client.aclose()
                raise
            async with client:
                yield ctx
        except BaseException as exc:
            # The worker records a failed job after this context has closed, in its
            # recorder task, where the binding above does not reach: the texts it
            # stores (message, traceback, status reason) are read from the exception.
            _scrub_exception(exc, known)
            raise


def _build(
    db: Database,
    connector: Connector[Any],
    resource_key: str,
    stream: str,
    trace_id: str | None,
    log: Any,
    transport: httpx.AsyncBaseTransport | None,
    clock: Callable[[], datetime],
    pace: PaceView | None = None,
    first_slots: FirstSlots | None = None,
    network: Network = DEFAULT_NETWORK,
) -> tuple[RuntimeContext, SyncClient, PacedTransport]:
    trace_id = trace_id or uuid.uuid4().hex
    bound = (log if log is not None else structlog.get_logger("synckit.connector")).bind(
        tenant=connector.tenant, connector=connector.name, stream=stream, trace_id=trace_id
    )
    pacer = Pacer(
        db,
        resource_key,
        rate_limit=connector.rate_limit,
        max_wait=connector.max_inline_wait,
        clock=clock,
        pace=pace_policy_of(type(connector)),
    )
    if pace is not None:
        pacer.seed(pace)
    if first_slots is not None:
        pacer.seed_slots(first_slots)
    timeout = connector.timeout
    borrowed = False
    if transport is None:
        # In a worker, the connections a previous cycle left open (http.borrow_transport).
        transport = borrow_transport(connector.name, network)
        borrowed = transport is not None
        if transport is None:
            transport = transport_for(network)
    paced = PacedTransport(
        transport, pacer, connector=connector.name, borrowed=borrowed, network=network
    )
    if not isinstance(timeout, httpx.Timeout):
        timeout = httpx.Timeout(timeout)
    client = SyncClient(
        connector=connector,
        pacer=pacer,
        clock=clock,
        base_url=_base_url(connector.tenant_base_url),
        timeout=timeout,
        transport=paced,
        headers={"User-Agent": _user_agent(connector)},
        event_hooks={"request": [_idempotency_hook]},
    )
    ctx = RuntimeContext(
        db=db,
        connector=connector,
        tenant=connector.tenant,
        stream=stream,
        resource_key=resource_key,
        trace_id=trace_id,
        log=bound,
        http=client,
        network=network,
    )
    return ctx, client, paced


def _scrub_exception(exc: BaseException, values: Sequence[str]) -> None:
    """Scrub ``values`` from the texts ``exc`` carries, in place: its arguments, string
    attributes, a carried classification's reason and notes, along its cause and
    context chain and inside exception groups. A traceback formatted later, the
    worker's classification and ``str(exc)`` then show ``***`` where a value was."""
    if not any(len(v) >= 6 for v in values):
        return  # scrub_values ignores shorter ones: nothing could change
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 100:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        try:
            e.args = tuple(_scrubbed(a, values) for a in e.args)
            for name, value in list(vars(e).items()):
                clean = _scrubbed(value, values)
                if clean is not value:
                    setattr(e, name, clean)
        except Exception:  # an exception type that refuses new attributes keeps them
            pass
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)


def _scrubbed(value: Any, values: Sequence[str]) -> Any:
    if isinstance(value, str):
        clean = scrub_values(value, values)
        return value if clean == value else clean
    if isinstance(value, list) and all(isinstance(v, str) for v in value):  # __notes__
        cleaned = [scrub_values(v, values) for v in value]
        return value if cleaned == value else cleaned
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # A carried Classification: the worker stores its reason, not str(exc).
        changes = {
            f.name: scrub_values(v, values)
            for f in dataclasses.fields(value)
            if isinstance(v := getattr(value, f.name, None), str) and scrub_values(v, values) != v
        }
        return dataclasses.replace(value, **changes) if changes else value
    return value
