""":class:`App`: the object users build from their connectors, and the CLI loads.

>>> app = App(connectors=[GraphMail])          # doctest: +SKIP

``synckit worker --app myproject.sync:app`` runs its jobs; ``synckit tenants ... --app
myproject.sync:app`` manages its tenants. The App builds the job :class:`Registry`:

* ``synckit.poll``: one poll cycle of one tenant and stream
  (:func:`synckit.runtime.sync.poll.run_cycle`);
* ``synckit.schedule``: the scheduler, a recurring job (every 5 s by default) that
  enqueues the due cycles (:func:`synckit.runtime.sync.scheduler.schedule_polls`).

Handlers get no database from the queue, so the App holds one: the one given to
:meth:`App.worker` / :meth:`App.bind`, else one opened from the worker's
``--database-url`` (the CLI tells the App), ``$SYNCKIT_DATABASE_URL``, the App's own
``database_url``, then the default.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import httpx

from synckit.clock import utcnow
from synckit.connectors.base import Connector
from synckit.connectors.context import SyncContext
from synckit.connectors.records import Records
from synckit.dlq.replay import ReplayProcessor, register_dlq_replay, replayers_from_app
from synckit.errors.exceptions import (
    ConfigurationError,
    TenantNotFound,
)
from synckit.runtime.admin.tenants import Tenant, add_tenant, get_tenant
from synckit.runtime.http.transports import network_of
from synckit.runtime.jobs.handlers import Registry
from synckit.runtime.jobs.worker import Worker
from synckit.runtime.observe.alert_delivery import get_alert_router
from synckit.runtime.observe.alerts import register_alerts
from synckit.runtime.sync.context import RuntimeContext, open_context, prepare_process
from synckit.runtime.sync.poll import (
    POLL_KIND,
    SCHEDULE_KIND,
    CycleResult,
    record_id_of,
    run_cycle,
    stream_of_kind,
)
from synckit.runtime.sync.poll_jobs import PollJobs
from synckit.runtime.sync.records import RecordsReader, land
from synckit.runtime.sync.records import destination as records_destination
from synckit.runtime.sync.records import prepare as prepare_landing
from synckit.runtime.sync.scheduler import schedule_polls
from synckit.store.db import Database, SyncConn, open_database
from synckit.store.jobs._base import ClaimedJob
from synckit.store.records.schema import TableOwner, prepare_destination, upgrade_tables

__all__ = ["App"]

SCHEDULER_NAME = "synckit.poll-scheduler"


class App:
    """Connectors by name, the job registry that runs them, and the database they use.

    ``scheduler_every`` is how often due cycles are looked for; ``poll_timeout`` bounds
    one cycle (a cycle cut short keeps the checkpoints of the pages it committed).
    ``transport`` replaces the network of every connector (for tests). ``registry`` lets
    the App's handlers join an existing registry. ``clock`` (for tests) is the time its
    cycles, HTTP pacing and workers read; a clock that can sleep
    (:class:`~synckit.testing.FakeClock`) also takes their waits, so a ``Retry-After: 30``
    costs a test no wall time. A database the App uses takes its clock as
    :attr:`~synckit.store.db.Database.clock`: ``enqueue_many(db, ...)`` stamps jobs by
    it, so the App's ``run_until_idle`` finds them due.

    ``proxy`` is the URL of a proxy every connector's requests go through; without one,
    they honour the environment's ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY`` and
    ``NO_PROXY``. ``ca_bundle`` is a PEM file of the certificate authorities to trust
    instead of the default bundle (a company's TLS-inspecting proxy, a private API's CA).

    ``webhook_url`` is where providers reach ``synckit web``'s ``/webhooks`` (e.g.
    ``https://sync.example.com/webhooks``; default ``$SYNCKIT_WEBHOOK_URL``): the
    notification URL of the webhook subscriptions the App keeps
    (:mod:`synckit.runtime.sync.subscriptions`). Without one, none is made.
    """

    def __init__(
        self,
        connectors: Sequence[type[Connector[Any]]] = (),
        *,
        database_url: str | None = None,
        registry: Registry | None = None,
        scheduler_every: timedelta = timedelta(seconds=5),
        poll_timeout: float = 3600.0,
        transport: httpx.AsyncBaseTransport | None = None,
        dlq_replay_every: timedelta | None = timedelta(minutes=1),
        alerts_every: timedelta | None = timedelta(minutes=1),
        clock: Callable[[], datetime] | None = None,
        proxy: str | None = None,
        ca_bundle: str | os.PathLike[str] | None = None,
        webhook_url: str | None = None,
    ) -> None:
        #: How connectors' clients reach their APIs (proxy, trusted CAs).
        self.network = network_of(proxy, ca_bundle)
        self.webhook_url = webhook_url
        self._subscriptions_registered = False
        self._connectors: dict[str, type[Connector[Any]]] = {}
        for cls in connectors:
            self.add_connector(cls)
        self.database_url = database_url
        self.transport = transport
        self.clock: Callable[[], datetime] = clock or utcnow
        self.registry = registry if registry is not None else Registry()
        #: The poll and scheduler jobs of this App's connectors.
        self.poll_jobs = PollJobs(self, self._connectors)
        self.registry.add(POLL_KIND, self.poll_jobs.poll, timeout=poll_timeout)
        # A poll cycle that fails is retried with its connector's retry_policy, if any.
        self.registry.retry_policy_for = self.poll_jobs.retry_policy_for
        self.registry.pace_policy_for = self.poll_jobs.pace_policy_for
        self.registry.add(SCHEDULE_KIND, self.poll_jobs.schedule, timeout=120.0)
        self.registry.recurring(SCHEDULER_NAME, SCHEDULE_KIND, every=scheduler_every)
        if dlq_replay_every is not None:
            # Failed records and dead jobs are replayed automatically (capped backoff).
            register_dlq_replay(self.registry, self._replay_processor, every=dlq_replay_every)
        if alerts_every is not None:
            # Pattern alerts, evaluated on the database of the worker that runs the job.
            register_alerts(self.registry, every=alerts_every)
        self._webhooks_registered = False
        if any(getattr(c, "webhooks", None) is not None for c in self._connectors.values()):
            self._register_webhooks()
        self._db: Database | None = None
        self._owned: tuple[asyncio.AbstractEventLoop, Database] | None = None

    # --- connectors -----------------------------------------------------------------------

    def _register_webhooks(self) -> None:
        """The webhook inbox's jobs, once a connector of the App declares webhooks."""
        from synckit.runtime.sync.webhooks import register_webhooks

        if not self._webhooks_registered:
            register_webhooks(self.registry, self, sweep_every=timedelta(seconds=30))
            self._webhooks_registered = True
        subscribed = any(
            getattr(getattr(c, "webhooks", None), "subscription", None) is not None
            for c in self._connectors.values()
        )
        if subscribed and not self._subscriptions_registered:
            from synckit.runtime.sync.subscriptions import register_subscriptions

            register_subscriptions(self.registry, self, every=timedelta(minutes=1))
            self._subscriptions_registered = True

    def add_connector(self, cls: type[Connector[Any]]) -> None:
        """Know one more connector class (its ``name`` must be set and unique)."""
        if not (isinstance(cls, type) and issubclass(cls, Connector)):
            raise ConfigurationError(f"{cls!r} is not a Connector subclass")
        if not cls.name:
            raise ConfigurationError(f"connector class {cls.__qualname__} has no name")
        other = self._connectors.get(cls.name)
        if other is not None and other is not cls:
            raise ConfigurationError(
                f"two connectors are named {cls.name!r}: {other.__qualname__} "
                f"and {cls.__qualname__}"
            )
        if getattr(getattr(cls, "webhooks", None), "subscription", None) is not None:
            missing = [
                hook
                for hook in ("create_subscription", "renew_subscription", "delete_subscription")
                if not callable(getattr(cls, hook, None))
            ]
            if missing:
                raise ConfigurationError(
                    f"connector {cls.name!r} declares a webhook subscription but has no "
                    + ", ".join(missing)
                )
        self._connectors[cls.name] = cls
        if getattr(cls, "webhooks", None) is not None and hasattr(self, "_webhooks_registered"):
            self._register_webhooks()

    @property
    def connectors(self) -> Mapping[str, type[Connector[Any]]]:
        return dict(self._connectors)

    def connector(self, name: str) -> type[Connector[Any]]:
        """The connector class named ``name``; ConfigurationError listing the known ones."""
        try:
            return self._connectors[name]
        except KeyError:
            known = ", ".join(sorted(self._connectors)) or "none"
            raise ConfigurationError(
                f"unknown connector {name!r} (this app knows: {known})"
            ) from None

    # --- the database ---------------------------------------------------------------------

    def bind(self, db: Database) -> None:
        """Make the App's handlers use ``db`` (:meth:`worker` does this)."""
        self._adopt(db)
        self._db = db

    def _adopt(self, db: Database) -> None:
        """An App with a clock of its own lends it to a database it uses, so that what is
        written through that database without a time (``enqueue_many(db, ...)`` in a
        test) is stamped by the clock the App's workers run by."""
        if self.clock is not utcnow:
            db.use_clock(self.clock)

    def _open(
        self, db: Database, connector: Connector[Any], resource_key: str, stream: str, **more: Any
    ) -> AbstractAsyncContextManager[RuntimeContext]:
        """:func:`open_context` for ``connector``'s tenant with this App's transport,
        network and clock (``more``: the other arguments it takes)."""
        return open_context(
            db,
            connector,
            resource_key=resource_key,
            stream=stream,
            transport=self.transport,
            network=self.network,
            clock=self.clock,
            **more,
        )

    def use_database_url(self, url: str | None) -> str | None:
        """Called by ``synckit worker`` and ``synckit web`` with the URL of their command
        line (or ``$SYNCKIT_DATABASE_URL``): the App's handlers use that database. Returns
        the URL the command is to open: the one given, else the App's own
        ``database_url`` (None: the default), so that handlers and worker never use
        different databases. The process's environment is left alone.
        """
        if url:
            self.database_url = url
        return self.database_url

    async def database(self) -> Database:
        """The database the App's handlers use (see the module docstring)."""
        if self._db is not None:
            return self._db
        loop = asyncio.get_running_loop()
        if self._owned is None or self._owned[0] is not loop:
            self._owned = (loop, open_database(self.database_url))
        return self._owned[1]

    # --- records ------------------------------------------------------------------------

    def record_tables(self) -> list[TableOwner]:
        """The records tables the App's streams declare (each declaration's own table,
        then its children's), in connector and stream order."""
        out: list[TableOwner] = []
        owners: dict[str, str] = {}
        for name, cls in sorted(self._connectors.items()):
            for s in cls.declared_streams():
                far = s.records.database if s.records is not None else None
                for r in s.records.tables() if s.records is not None else ():
                    here = f"{name}/{s.name}"
                    if r.table in owners:
                        raise ConfigurationError(
                            f"records table {r.table!r} is declared by {owners[r.table]} and "
                            f"{here}: give each stream a table of its own"
                        )
                    owners[r.table] = here
                    out.append(TableOwner(r.spec, name, s.name, r.database or far))
        return out

    async def upgrade_records(self, db: Database) -> list[str]:
        """Create or extend the records tables the App declares (``synckit db upgrade
        --app``); what was done, a line each. Refuses a change it cannot apply with one
        line naming the field and the table (:class:`RecordsSchemaError`)."""
        owners = self.record_tables()
        done = await upgrade_tables(db, [o for o in owners if o.database is None], self.clock())
        for url in sorted({o.database for o in owners if o.database is not None}):
            # Tables in another database: created there, beside its own record_tables and
            # record_landings (synckit.store.records.schema.prepare_destination).
            far = open_database(url)
            try:
                await far.write(prepare_destination)
                mine = [o for o in owners if o.database == url]
                done += [
                    f"{line} in {far.display_url}"
                    for line in await upgrade_tables(far, mine, self.clock())
                ]
            finally:
                await far.dispose()
        return done

    def records(
        self,
        tenant: str,
        stream: str,
        *,
        connector: str | None = None,
        db: Database | None = None,
    ) -> RecordsReader:
        """The landed rows of ``tenant``'s ``stream``, and their changes since a cursor::

            page = await app.records("acme", "messages").changes(since=cursor, limit=100)

        ``connector`` is needed only when two connectors have a stream of that name.
        ``db`` defaults to the App's database (:meth:`database`); a stream whose
        ``Records`` name another database is read there.
        """
        found = [
            (name, s)
            for name, cls in sorted(self._connectors.items())
            if connector in (None, name)
            for s in cls.declared_streams()
            if s.name == stream
        ]
        if not found:
            raise ConfigurationError(f"no connector of this app has a stream {stream!r}")
        if len(found) > 1:
            names = ", ".join(n for n, _ in found)
            raise ConfigurationError(f"stream {stream!r} is in {names}: name the connector")
        decl = found[0][1].records
        if decl is None:
            raise ConfigurationError(f"stream {stream!r} declares no records")
        if decl.database is not None:  # the tables live in another database
            return RecordsReader(lambda: _destination_of(decl), decl, tenant)
        return RecordsReader(db if db is not None else self.database, decl, tenant)

    async def aclose(self) -> None:
        """Dispose of a database the App opened itself."""
        if self._owned is not None:
            owned, self._owned = self._owned[1], None
            await owned.dispose()

    async def _replay_processor(self) -> ReplayProcessor:
        db = await self.database()
        replayers, _ = replayers_from_app(self, db)
        return ReplayProcessor(db, replayers, registry=self.registry, on_review=_announce_review)

    def worker(self, db: Database, **options: Any) -> Worker:
        """A :class:`Worker` running this App's jobs on ``db`` (options as for Worker).

        The process pays its one-time costs now, not on its first cycles' clock
        (:func:`~synckit.runtime.sync.context.prepare_process`, as ``synckit worker`` does)."""
        prepare_process()
        self.bind(db)
        if self.clock is not utcnow:
            options.setdefault("clock", self.clock)
        return Worker(db, self.registry, **options)

    # --- tenants and cycles ---------------------------------------------------------------

    async def add_tenant(
        self, db: Database, tenant: str, connector: str, config: Any = None, **options: Any
    ) -> Tenant:
        """:func:`synckit.runtime.admin.tenants.add_tenant` with this App's connectors."""
        self._adopt(db)
        return await add_tenant(db, tenant, connector, config, app=self, **options)

    def instance(self, tenant: Tenant) -> Connector[Any]:
        """The tenant's connector, bound to it (its config validated)."""
        return self.connector(tenant.connector)(tenant.tenant, tenant.config)

    @asynccontextmanager
    async def context(
        self,
        db: Database,
        tenant: str | Tenant,
        *,
        stream: str | None = None,
        trace_id: str | None = None,
        log: Any = None,
    ) -> AsyncIterator[SyncContext]:
        """A :class:`SyncContext` for ``tenant`` (e.g. to call its API from a script)."""
        self._adopt(db)
        t = tenant if isinstance(tenant, Tenant) else await get_tenant(db, tenant)
        connector = self.instance(t)
        streams = type(connector).declared_streams()
        name = stream or (streams[0].name if streams else "default")
        async with self._open(
            db, connector, t.resource_key, name, trace_id=trace_id, log=log
        ) as ctx:
            yield ctx

    async def schedule(self, db: Database, *, now: datetime | None = None) -> list[str]:
        """Enqueue the due cycles now; what the recurring scheduler job does."""
        self._adopt(db)
        return await schedule_polls(
            db, self._connectors, now=now if now is not None else self.clock()
        )

    async def poll(
        self,
        db: Database,
        tenant: str,
        stream: str | None = None,
        *,
        job: ClaimedJob | None = None,
        trace_id: str | None = None,
        log: Any = None,
    ) -> CycleResult:
        """Run one cycle of ``tenant``'s ``stream`` (default: its first) in this process."""
        t = await get_tenant(db, tenant)
        cls = self.connector(t.connector)
        if stream is None:
            streams = cls.declared_streams()
            if not streams:
                raise ConfigurationError(f"connector {cls.name!r} does not poll")
            stream = streams[0].name
        cls.stream(stream)
        async with self.context(db, t, stream=stream, trace_id=trace_id, log=log) as ctx:
            return await run_cycle(db, ctx.connector, ctx, job=job, clock=self.clock)

    async def replay_webhook(self, db: Database, payload: Any) -> None:
        """Process a dead-lettered webhook event again (its dead letter's ``payload``):
        it goes back to the inbox as pending, with its processing job."""
        from synckit.runtime.sync.webhooks import replay_event

        await replay_event(db, self, payload, self.clock())

    async def replay_record(
        self, db: Database, tenant: str, connector: str, kind: str, payload: Any
    ) -> None:
        """Run ``handle()`` again on one dead-lettered record; raise if it fails again.

        ``kind`` is the dead letter's (``record:<stream>``). The call is paced and
        classified like a poll cycle's. Rows that can never be replayed (the tenant is
        gone or uses another connector now, the kind is not a record kind) raise
        :class:`synckit.errors.exceptions.Unreplayable`; what configuration prevents (the
        tenant's secrets do not open with ``$SYNCKIT_SECRET_KEY``, this App lacks the
        connector or stream) raises :class:`synckit.errors.exceptions.ReplayBlocked`, which
        leaves the row as it was; a paused tenant raises
        :class:`~synckit.errors.exceptions.TenantError` (replay it once resumed).
        """
        from synckit.errors.exceptions import ReplayBlocked, TenantError, Unreplayable

        try:
            stream = stream_of_kind(kind)
        except ConfigurationError as exc:
            raise Unreplayable(str(exc)) from exc
        try:
            t = await get_tenant(db, tenant)
            if t.connector != connector:
                raise Unreplayable(
                    f"tenant {tenant!r} now uses connector {t.connector!r}, not {connector!r}"
                )
            cls = self.connector(connector)
            cls.stream(stream)
            instance = cls(t.tenant, t.config)
        except TenantNotFound as exc:
            raise Unreplayable(str(exc)) from exc
        except ConfigurationError as exc:
            # No key, a wrong key, a connector this App lacks: not the row's fault, so
            # never a reason to give the row up (the processor leaves it as it was).
            raise ReplayBlocked(str(exc)) from exc
        if t.status == "paused":
            raise TenantError(f"tenant {tenant!r} is paused")
        async with self._open(db, instance, t.resource_key, stream) as ctx:
            decl = cls.stream(stream).records
            if decl is None or cls.handles():
                await instance.handle(ctx.for_record(record_id_of(instance, payload)), payload)
            if decl is not None:
                await _land_one(db, decl, tenant, stream, payload, self.clock())


async def _land_one(
    db: Database, decl: Records, tenant: str, stream: str, payload: Any, now: datetime
) -> None:
    """Land one record (a dead letter's, replayed) in its table, in a transaction of its
    own; raise what refuses it (the model, the database) so the replay records why."""

    def refusal(_raw: Any, exc: Exception) -> Exception:
        return exc

    landing, failures, _ = prepare_landing(decl, tenant, stream, [payload], refusal)
    if failures:
        raise failures[0]

    def tx(conn: SyncConn) -> None:
        land(conn, landing, now)
        if landing.refused:
            raise landing.refused[0]

    await (records_destination(decl) or db).write(tx)


async def _destination_of(decl: Records) -> Database:
    far = records_destination(decl)
    assert far is not None
    return far


_review_tasks: set[asyncio.Task[Any]] = set()


def _announce_review(tenant: str, error_class: str, count: int) -> None:
    """Route DLQ rows that reached review to the alert sinks (grouped by tenant and class)."""
    task = asyncio.get_running_loop().create_task(
        get_alert_router().dlq_review(tenant, error_class, count)
    )
    _review_tasks.add(task)
    task.add_done_callback(_review_tasks.discard)
