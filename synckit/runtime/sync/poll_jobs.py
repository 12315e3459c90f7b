"""The poll jobs: ``synckit.poll`` (one cycle of one tenant and stream) and
``synckit.schedule`` (the recurring job that enqueues the due cycles), run for the
connectors of one host (:class:`synckit.App` registers them; see :class:`PollJobs`).

A poll job reads its tenant, its stream's checkpoint and its resource's pacing with the
other poll jobs of its process that start at the same moment, in one statement (see
"what a poll job reads first" below), then runs its cycle
(:func:`synckit.runtime.sync.poll.run_cycle`) in a :class:`RuntimeContext`.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import httpx

from synckit.clock import utcnow
from synckit.connectors.base import Connector, pace_policy_of
from synckit.errors.backoff import RetryPolicy
from synckit.errors.exceptions import ConfigurationError, Discard, PermanentError, SecretCorrupt
from synckit.errors.pace import PacePolicy
from synckit.runtime.admin.tenants import _COLUMNS, _tenant
from synckit.runtime.http import pacing
from synckit.runtime.http.network import Network
from synckit.runtime.http.pacing import PaceView
from synckit.runtime.jobs.handlers import JobContext
from synckit.runtime.sync.context import ConnectorHost, open_context
from synckit.runtime.sync.poll import POLL_KIND, record_kind, run_cycle
from synckit.store import checkpoints
from synckit.store.checkpoints import CycleStart, cycle_start_of
from synckit.store.db import Database, SyncConn
from synckit.store.db_errors import is_driver_error, savepoint
from synckit.store.jobs._base import ClaimedJob

__all__ = ["PollHost", "PollJobs"]


class PollHost(ConnectorHost, Protocol):
    """What the poll jobs ask of their host beyond a :class:`ConnectorHost`: how its
    connectors reach their APIs, and its scheduler's step (:meth:`synckit.App.schedule`)."""

    transport: httpx.AsyncBaseTransport | None
    network: Network

    async def schedule(self, db: Database, *, now: datetime | None = None) -> list[str]: ...


class PollJobs:
    """The handlers and policies of the poll jobs of ``host``'s connectors.

    ``connectors`` is the host's own mapping, read live: a connector the host adds later
    is polled too. :class:`synckit.App` registers :meth:`poll` and :meth:`schedule` as
    the handlers of ``synckit.poll`` and ``synckit.schedule``, and
    :meth:`retry_policy_for` / :meth:`pace_policy_for` as the registry's policies.
    """

    def __init__(self, host: PollHost, connectors: Mapping[str, type[Connector[Any]]]) -> None:
        self._host = host
        self._connectors = connectors
        self._starts: weakref.WeakKeyDictionary[Database, _StartReads] = weakref.WeakKeyDictionary()

    def slot_want(self, row: Any) -> pacing.SlotWant | None:
        """A starting poll job's first slots, for its start read to reserve: those of an
        active tenant whose connector declares a rate (read from the class: the
        connector is not made yet). Called in the start read's transaction."""
        cls = self._connectors.get(row.connector)
        if cls is None or row.status != "active":
            return None
        rate = cls.rate_limit
        if rate is None:
            return None
        wait = cls.max_inline_wait.total_seconds()
        return pacing.SlotWant(row.resource_key, rate.per_second, rate.burst, wait)

    def retry_policy_for(self, job: ClaimedJob) -> RetryPolicy | None:
        if job.kind != POLL_KIND or not isinstance(job.payload, Mapping):
            return None
        cls = self._connectors.get(str(job.payload.get("connector")))
        return cls.retry_policy if cls is not None else None

    def pace_policy_for(self, job: ClaimedJob) -> PacePolicy | None:
        if job.kind != POLL_KIND or not isinstance(job.payload, Mapping):
            return None
        cls = self._connectors.get(str(job.payload.get("connector")))
        return pace_policy_of(cls) if cls is not None else None

    async def _job_database(self, jctx: JobContext) -> Database:
        """The database of the worker running the job (its writes then share the worker's
        writer), else the host's."""
        return jctx.db if jctx.db is not None else await self._host.database()

    async def schedule(self, jctx: JobContext) -> None:
        fired = await self._host.schedule(await self._job_database(jctx))
        if fired:
            jctx.log.info("poll.cycles_enqueued", cycles=len(fired))

    def start_reads(self, db: Database) -> _StartReads:
        reads = self._starts.get(db)
        if reads is None:
            reads = self._starts[db] = _StartReads(db, want=self.slot_want, clock=self._host.clock)
        return reads

    async def poll(self, jctx: JobContext) -> None:
        p = jctx.payload
        if not (
            isinstance(p, Mapping)
            and all(isinstance(p.get(k), str) for k in ("tenant", "connector", "stream"))
        ):
            raise Discard(f"malformed poll payload: {str(p)[:200]}")
        db = await self._job_database(jctx)
        # The tenant and where its stream stands, read with other jobs starting now.
        row, start, pace, first = await self.start_reads(db).read(
            p["tenant"], p["connector"], p["stream"]
        )
        if row is None:
            raise Discard(f"tenant {p['tenant']!r} was removed")
        try:
            t = _tenant(row, reveal=True, cipher=None)  # as get_tenant reads it
        except SecretCorrupt as exc:
            # Damaged since the worker's start check: hold this tenant alone, as it does.
            from synckit.runtime.credentials.keys import hold_unreadable

            fault = "config: " + str(exc).removeprefix(f"tenant {p['tenant']!r}: ")
            await hold_unreadable(db, p["tenant"], fault)
            raise Discard(f"tenant {p['tenant']!r} held: {fault}") from None
        if t.connector != p["connector"]:
            raise Discard(f"tenant {t.tenant!r} now uses connector {t.connector!r}")
        if t.status != "active":
            raise Discard(f"tenant {t.tenant!r} is {t.status}")
        try:
            cls = self._host.connector(t.connector)
            cls.stream(p["stream"])
        except ConfigurationError as exc:
            raise Discard(str(exc)) from None
        try:
            instance = cls(t.tenant, t.config)
        except ConfigurationError as exc:
            # The config was valid when added; the model has changed since. Retrying
            # cannot help: a human must update the tenant's config.
            raise PermanentError(str(exc)) from exc
        async with open_context(
            db,
            instance,
            resource_key=t.resource_key,
            stream=p["stream"],
            trace_id=jctx.job.trace_id,
            log=jctx.log,
            transport=self._host.transport,
            network=self._host.network,
            clock=self._host.clock,
            pace=pace,
            first_slots=first,
        ) as ctx:
            await run_cycle(
                db,
                instance,
                ctx,
                job=jctx.job,
                clock=self._host.clock,
                progressed=jctx.progressed,
                start=start,
            )


# --- what a poll job reads first -----------------------------------------------------------
#
# Before its cycle a poll job reads its tenant's row (as get_tenant does), its stream's
# CycleStart and its resource's pacing (as read_pace_sync makes it: its own and its
# parent's next_available_at, the quota last reported), which the cycle's first request
# would otherwise read alone. The jobs of one process that start while such a read waits
# for the database join it: one statement reads them all, their keys one array
# parameter. Read one job at a time, 64 cycles starting together were 64 transactions: on
# PostgreSQL as many pooled connections (beyond the pool's size, new ones), on SQLite as
# many savepoints of the writer's group.
#
# In the same transaction, the cycles whose connector declares a rate reserve their first
# requests' slots (pacing.take_first_slots_sync): a cycle's first request then needs no
# reservation of its own. Reserved one by one, 50 cycles starting together in a
# PostgreSQL worker sent their first requests 125-340 ms after they were enqueued (each
# reservation a transaction queued behind the others), against 45 ms for the claims.

StartKey = tuple[str, str, str]  # tenant, connector, stream
PollStart = tuple[Any, CycleStart | None, PaceView | None]
_GONE: PollStart = (None, None, None)
#: What a poll job reads first, with the first slots reserved for its cycle, if any.
StartRead = tuple[Any, CycleStart | None, PaceView | None, pacing.FirstSlots | None]


# Built once, for the columns get_tenant reads.
_POLL_STARTS = checkpoints.PollStartReads(_COLUMNS)


def _poll_starts(conn: SyncConn, keys: Sequence[StartKey]) -> dict[StartKey, PollStart]:
    """What each poll job of ``keys`` reads first (see above), in one statement; a key
    whose tenant is gone has no entry."""
    wanted = [(t, c, s, record_kind(s)) for t, c, s in keys]
    out: dict[StartKey, PollStart] = {}
    for row in _POLL_STARTS.rows(conn, wanted):
        start = cycle_start_of(row.start_cursor, row.start_open_dead_letters)
        available = pacing._later(row.next_available_at, row.parent_available_at)
        pace = PaceView(available, pacing._quota_of(row))
        out[(row.want_tenant, row.want_connector, row.want_stream)] = (row, start, pace)
    return out


def _poll_start(conn: SyncConn, tenant: str, connector: str, stream: str) -> PollStart:
    """The tenant's row (None when it is gone), its stream's :class:`CycleStart` and its
    resource's pacing, in the caller's transaction."""
    return _poll_starts(conn, [(tenant, connector, stream)]).get((tenant, connector, stream), _GONE)


@dataclass(eq=False)
class _StartBatch:
    done: asyncio.Future[dict[StartKey, PollStart | Exception]]
    keys: set[StartKey] = field(default_factory=set)
    #: The database has begun reading it: later jobs start a batch of their own.
    taken: bool = False
    #: The first slots reserved in its transaction, by key (one key per resource).
    slots: dict[StartKey, tuple[pacing.SlotResult, pacing.SlotWant]] = field(default_factory=dict)


class _StartReads:
    """The poll jobs' first reads on one database, taken together (see above)."""

    def __init__(
        self,
        db: Database,
        *,
        want: Callable[[Any], pacing.SlotWant | None] | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.db = db
        #: Which first slots a starting job's tenant row asks for (None: none).
        self._want = want
        self._clock = clock
        # The batch is taken where Database.write runs it: SQLite's writer thread.
        self._lock = threading.Lock()
        self._open: _StartBatch | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def read(self, tenant: str, connector: str, stream: str) -> StartRead:
        key = (tenant, connector, stream)
        loop = asyncio.get_running_loop()
        with self._lock:
            batch = self._open
            fresh = batch is None or batch.taken or batch.done.get_loop() is not loop
            if fresh:
                batch = self._open = _StartBatch(loop.create_future())
                # Retrieved even when every job waiting for it was cancelled meanwhile.
                batch.done.add_done_callback(lambda f: f.cancelled() or f.exception())
            assert batch is not None
            batch.keys.add(key)
        if fresh:
            task = loop.create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # Shielded: a job cancelled while it waits must not cancel the others' read.
        found = (await asyncio.shield(batch.done)).get(key, _GONE)
        if isinstance(found, Exception):
            raise found
        # Slot times count from when the answer came back, as a request's own
        # reservation's do (Pacer.before_request).
        slot = batch.slots.pop(key, None)
        first = None
        if slot is not None:
            result, want = slot
            first = pacing.FirstSlots(result, self._clock(), want.rate, want.burst)
        return (*found, first)

    def _take(self, conn: SyncConn, batch: _StartBatch) -> dict[StartKey, PollStart | Exception]:
        with self._lock:
            batch.taken = True
            keys = sorted(batch.keys)
        found = self._read(conn, keys)
        batch.slots = self._first_slots(conn, found)
        return found

    def _first_slots(
        self, conn: SyncConn, found: dict[StartKey, PollStart | Exception]
    ) -> dict[StartKey, tuple[pacing.SlotResult, pacing.SlotWant]]:
        """The first slots of the starting cycles that want them, reserved in the start
        read's transaction. A cycle left without (its row held elsewhere or unreadable)
        reserves at its first request, as it would have anyway."""
        if self._want is None:
            return {}
        owner: dict[str, tuple[StartKey, pacing.SlotWant]] = {}  # one cycle per resource
        for key, got in found.items():
            if isinstance(got, Exception) or got[0] is None:
                continue
            want = self._want(got[0])
            if want is not None and want.key not in owner:
                owner[want.key] = (key, want)
        if not owner:
            return {}
        wants = [want for _key, want in owner.values()]
        now = self._clock()
        try:
            with savepoint(conn):
                reserved = pacing.take_first_slots_sync(conn, wants, now=now)
        except Exception:
            if conn.invalidated or conn.closed:
                raise
            # A resource row that cannot be read: each reserves alone, so that only its
            # cycle goes without (its first request then meets the row itself).
            reserved = {}
            for want in wants if len(wants) > 1 else []:
                try:
                    with savepoint(conn):
                        reserved.update(pacing.take_first_slots_sync(conn, [want], now=now))
                except Exception:
                    if conn.invalidated or conn.closed:
                        raise
        return {owner[k][0]: (result, owner[k][1]) for k, result in reserved.items()}

    def _read(self, conn: SyncConn, keys: list[StartKey]) -> dict[StartKey, PollStart | Exception]:
        if len(keys) > 1:
            try:
                with savepoint(conn):
                    return dict(_poll_starts(conn, keys))
            except Exception:  # a row one of them cannot read: each reads alone below
                if conn.invalidated or conn.closed:
                    raise
        # One key's unreadable row (a corrupt timestamp, checkpoint or status) fails that
        # job alone, as it did when each job read its own.
        found: dict[StartKey, PollStart | Exception] = {}
        for key in keys:
            try:
                with savepoint(conn):
                    found[key] = _poll_start(conn, *key)
            except Exception as exc:
                if conn.invalidated or conn.closed:
                    raise
                # As Database.write would raise it, had the job read alone.
                found[key] = self.db.translate(exc) if is_driver_error(exc) else exc
        return found

    async def _run(self, batch: _StartBatch) -> None:
        try:
            found = await self.db.write(self._take, batch)
        except BaseException as exc:
            with self._lock:
                batch.taken = True
            if isinstance(exc, asyncio.CancelledError):
                batch.done.cancel()
                raise
            batch.done.set_exception(exc)
        else:
            batch.done.set_result(found)
