"""The worker: one asyncio process that claims jobs, runs their handlers and records outcomes.

Tasks inside one worker:

* the claimer takes batches of due jobs while it has free slots, and otherwise sleeps
  until woken (LISTEN/NOTIFY on PostgreSQL, in-process events on SQLite) or until the
  poll interval passes;
* one task per job runs its handler under the kind's timeout, once its start (the attempt
  charged) is committed: in the claim for the jobs that start at once, else in a small
  transaction of its own when nothing finished here is unrecorded, else with the
  recorder's next batch;
* the recorder writes outcomes and start marks in batches: successes of many jobs commit
  in one transaction together with their follow-up jobs; failures are classified and
  retried by the errors rules, or dead-lettered; each other outcome is written in a
  savepoint, so one that cannot be written is recorded as a failure and never holds up
  the rest;
* the heartbeat extends the leases of held jobs and notices jobs cancelled meanwhile;
* maintenance rescues expired leases, fires recurring ticks and prunes old jobs.

A lost database is retried with backoff by every task; outcomes not yet written are kept
in memory and written when the database returns, so nothing a handler did is forgotten
while the process lives (and if it dies, the lease expires and the job runs again).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal, cast

import structlog

from synckit import tracing
from synckit.clock import utcnow
from synckit.errors import (
    BreakerPolicy,
    RetryPolicy,
)
from synckit.errors.exceptions import (
    Cancel,
    Discard,
    PermanentError,
    Snooze,
    SynckitError,
)
from synckit.errors.gate import gate
from synckit.errors.pace import PacePolicy
from synckit.errors.waits import DEFAULT_MAX_WAIT, moment_after
from synckit.runtime.http.transports import shared_connections
from synckit.runtime.jobs.breakers import ResourceBook
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.recorder import (
    OutcomeObserver,
    OutcomeRecorder,
    WorkerStats,
    _Backoff,
    _db_backoff,
    _Outcome,
)
from synckit.runtime.observe.logging import bind_claimed_job_in_task
from synckit.runtime.sync import cron
from synckit.runtime.writes.outbox import OutboxRelay, Publisher
from synckit.store import queue_history, resources
from synckit.store.db import Database
from synckit.store.jobs import admin, claiming, enqueueing, leasing, outcomes
from synckit.store.jobs._base import START_LEASE, ClaimedJob
from synckit.store.jobs.claiming import ClaimStore
from synckit.store.jobs.outcomes import OutcomeStore
from synckit.store.notify import NOTIFY_CHANNEL as JOBS_NOTIFY_CHANNEL
from synckit.store.notify import listen, watch_sqlite
from synckit.store.resources import BreakerStore

log = structlog.get_logger("synckit.worker")
#: Seconds between a worker's tries at the queue-depth sample (one row a minute).
QUEUE_SAMPLE_EVERY = 30.0
#: Seconds before a job whose row was busy at a heartbeat is beaten again (alone).
BUSY_RETRY = 0.1


class _Slots:
    """Handler slots, handed out first come, first served; a slot can also be taken
    synchronously, so that jobs charged as started in the claim run at once."""

    def __init__(self, n: int) -> None:
        self.free = n
        self._waiters: deque[asyncio.Future[None]] = deque()
        # Waiters not yet handed a slot nor cancelled (counted, not summed: a worker
        # claimed far ahead has hundreds of them, and this is read for every job).
        self._waiting = 0

    @property
    def startable(self) -> int:
        """How many jobs could take a slot right now without waiting."""
        return max(0, self.free - self._waiting)

    def try_take(self) -> bool:
        if self.startable > 0:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        if self.try_take():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._waiting += 1
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot in the same moment it was cancelled
            else:
                self._waiting -= 1  # gave up waiting: give() will pass it over
            raise

    def give(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._waiting -= 1
                waiter.set_result(None)
                return
        self.free += 1


class Worker(OutcomeRecorder):
    """Runs jobs from one database with the handlers of one registry.

    ``lease`` is how long a started job is held without a heartbeat; ``start_lease``
    (default ``min(lease, 2 s)``, :data:`~synckit.store.jobs._base.START_LEASE`) how long a job
    claimed ahead but not started is, so that a crash gives those back to other workers
    within a few seconds (the start lease, then one rescue pass), attempts unspent.
    ``max_wait`` caps every wait a handler asks for (retry-after, snooze);
    ``pace_policy`` says how rate limits pace their resource (``runtime/http/pacing.py``).

    ``charge_at="claim"`` charges every claimed job's attempt in the claim itself, as
    synckit did before charging at start: no start marks, so short jobs run at the
    queue's full speed, but a crash charges the jobs claimed ahead that never ran. The
    default, ``"start"``, charges a job only when it starts.
    """

    #: Where the recorder reads and writes breakers: :mod:`synckit.store.resources`
    #: (unit tests of the breaker decisions give an in-memory fake).
    breakers: ClassVar[BreakerStore] = resources
    #: Where the recorder writes a job's failure, snooze, cancel or discard:
    #: :mod:`synckit.store.jobs.outcomes` (unit tests of the outcome routing give a fake).
    #: (mypy does not take this module for the protocol, as it does store.resources.)
    outcomes: ClassVar[OutcomeStore] = cast(OutcomeStore, outcomes)
    #: Where the claim loop takes jobs: :mod:`synckit.store.jobs.claiming` (unit tests of
    #: what the loop asks for, and when, give an in-memory fake).
    claims: ClassVar[ClaimStore] = cast(ClaimStore, claiming)

    def __init__(
        self,
        db: Database,
        registry: Registry,
        *,
        concurrency: int = 10,
        worker_id: str | None = None,
        lease: timedelta = timedelta(seconds=60),
        poll_interval: float = 1.0,
        claim_batch: int | None = None,
        retry_policy: RetryPolicy | None = None,
        breaker_policy: BreakerPolicy | None = None,
        grace_period: float = 30.0,
        prune_after: timedelta = timedelta(days=7),
        rescue_interval: float | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], datetime] = utcnow,
        observers: Sequence[OutcomeObserver] = (),
        outbox_publisher: Publisher | None = None,
        start_lease: timedelta | None = None,
        max_wait: timedelta = DEFAULT_MAX_WAIT,
        pace_policy: PacePolicy | None = None,
        charge_at: Literal["start", "claim"] = "start",
        presence_every: float = 5.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if charge_at not in ("start", "claim"):
            raise ValueError(f"charge_at must be 'start' or 'claim', not {charge_at!r}")
        self.charge_at = charge_at
        if presence_every <= 0:
            raise ValueError("presence_every must be positive")
        #: Seconds between this worker's presence heartbeats (``synckit.store.workers``):
        #: silent for three of them, it is shown as lost.
        self.presence_every = presence_every
        self.start_lease = min(lease, start_lease or START_LEASE)
        self.max_wait = max_wait
        self.pace_policy = pace_policy or PacePolicy(max_wait=max_wait)
        self.db = db
        self.registry = registry
        self.concurrency = concurrency
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease = lease
        self.poll_interval = poll_interval
        self.claim_batch = claim_batch
        self._slots = _Slots(concurrency)
        # Average handler run time (EWMA), which decides whether to claim ahead.
        self._avg_run: float | None = None
        self._unrecorded_failures: dict[str, int] = {}
        self.retry_policy = retry_policy or registry.retry_policy or RetryPolicy()
        self.breaker_policy = breaker_policy or registry.breaker_policy or BreakerPolicy()
        #: Breakers and pacing of the resources whose outcomes this worker records.
        self.book = ResourceBook(
            self.breakers,
            registry,
            breaker_policy=self.breaker_policy,
            pace_policy=self.pace_policy,
            log=log.bind(worker_id=self.worker_id),
        )
        self.grace_period = grace_period
        self.prune_after = prune_after
        self.rescue_interval = rescue_interval or max(1.0, self.start_lease.total_seconds() / 4)
        self.rng = rng or random.Random()
        self.clock = clock
        self.stats = WorkerStats()
        self.observers = list(observers)
        #: When set, this worker also relays the transactional outbox to it.
        self.outbox_publisher = outbox_publisher
        self._init_in_flight()

    # --- public ---------------------------------------------------------------------

    def _init_in_flight(self) -> None:
        """The bookkeeping of the jobs this worker holds and the outcomes it records."""
        self._held: dict[int, ClaimedJob] = {}
        # Spans of the jobs held here (tracing on), and what their recording decided.
        self._spans: dict[int, Any] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._outcomes: asyncio.Queue[_Outcome] = asyncio.Queue()
        # Jobs that have their handler slot and wait for their start to be recorded.
        self._start_marks: list[tuple[ClaimedJob, asyncio.Future[ClaimedJob | None]]] = []
        # A start mark of its own is being committed (PostgreSQL).
        self._marking = False
        # Outcomes handed to the recorder and not yet committed.
        self._unrecorded = 0
        self._record_wake = asyncio.Event()
        self._wake = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._stopping = asyncio.Event()
        self._recorded = asyncio.Event()
        self._record_seq = 0
        self._log = log.bind(worker_id=self.worker_id)

    def stop(self) -> None:
        """Stop claiming; in-flight jobs get the grace period to finish."""
        self._stopping.set()
        self._wake.set()
        self._slot_free.set()

    async def run(self, *, install_signals: bool = False) -> WorkerStats:
        """Run until :meth:`stop` (or SIGTERM/SIGINT when ``install_signals``)."""
        if install_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        return await self._main(idle_exit=False)

    async def run_until_idle(self) -> WorkerStats:
        """Run every job that is due (and what they enqueue), then return. For tests."""
        return await self._main(idle_exit=True)

    # --- main loop ------------------------------------------------------------------

    async def _main(self, *, idle_exit: bool) -> WorkerStats:
        # Handlers' HTTP clients share connections while the worker runs (a pool per
        # connector on this event loop), closed after its last job.
        async with shared_connections():
            return await self._serve(idle_exit=idle_exit)

    async def _serve(self, *, idle_exit: bool) -> WorkerStats:
        enqueueing.register_waker(self.db, self._wake)
        self._log.info(
            "worker.started",
            concurrency=self.concurrency,
            database=self.db.display_url,
            loop=type(asyncio.get_running_loop()).__module__.partition(".")[0],
        )
        recorder = asyncio.create_task(self._recorder(), name="synckit-recorder")
        background = [
            asyncio.create_task(self._heartbeat(), name="synckit-heartbeat"),
        ]
        if not idle_exit:
            background.append(asyncio.create_task(self._presence(), name="synckit-presence"))
            background.append(asyncio.create_task(self._maintenance(), name="synckit-maint"))
            if self.db.is_postgres:
                background.append(asyncio.create_task(self._listen(), name="synckit-listen"))
            else:
                background.append(asyncio.create_task(self._watch(), name="synckit-watch"))
            if self.outbox_publisher is not None:
                relay = OutboxRelay(self.db, self.outbox_publisher)
                background.append(
                    asyncio.create_task(relay.run(self._stopping), name="synckit-outbox")
                )
        cancelled = False
        try:
            if idle_exit:
                await self._maintenance_once(rescue=True)
            await self._claim_loop(idle_exit=idle_exit)
            await self._drain()
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            if not cancelled:
                # Cancelled: return now; what is unrecorded is redone after the leases.
                await self._outcomes.join()
            recorder.cancel()
            await asyncio.gather(recorder, return_exceptions=True)
            enqueueing.unregister_waker(self.db, self._wake)
            self._log.info("worker.stopped", **vars(self.stats))
        return self.stats

    async def _claim_loop(self, *, idle_exit: bool) -> None:
        backoff = _Backoff()
        while not self._stopping.is_set():
            # A slot frees when its outcome is recorded, not when the handler returns: a job
            # that just hit a 429 must pace its resource before the next claim.
            capacity, batch_size = claim_plan(self.concurrency, self._avg_run, self.claim_batch)
            free = capacity - len(self._held)
            if free <= 0:
                self._slot_free.clear()
                if capacity - len(self._held) <= 0:
                    await self._slot_free.wait()
                continue
            # Claimed well ahead: claim again once half a batch has room, not for every
            # few outcomes (each claim is a transaction; so is each start mark).
            ahead = capacity > self.concurrency and len(self._held) > 2 * self.concurrency
            if ahead and free < batch_size // 2:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            # With work in flight, gather a few free slots (briefly) before claiming: one
            # claim of eight costs about what a claim of one does.
            min_batch = max(1, min(batch_size, self.concurrency) // 4)
            if self._held and free < min_batch:
                deadline = time.monotonic() + 0.02
                while free < min_batch and self._held and not self._stopping.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._slot_free.clear()
                    await self._wait_any(self._slot_free, left)
                    free = capacity - len(self._held)
            self._wake.clear()
            seq = self._record_seq
            try:
                batch = await self.claims.claim(
                    self.db,
                    self.worker_id,
                    min(free, batch_size),
                    now=self.clock(),
                    lease=self.lease,
                    # Jobs that will have a handler slot at once are started (charged) by
                    # the claim itself, unless outcomes here are unrecorded (a start must
                    # not commit before them: see _recorder); the rest are claimed ahead.
                    start=(
                        None
                        if self.charge_at == "claim"
                        else 0
                        if self._unrecorded
                        else self._slots.startable
                    ),
                    start_lease=self.start_lease,
                    breaker_policy=self.breaker_policy,
                )
            except Exception as exc:  # the worker must outlive any one failure
                await self._db_trouble("claim", exc, backoff)
                continue
            backoff.reset()
            for job in batch:
                self._start(job)
            if batch:
                continue
            if idle_exit:
                self._recorded.clear()
                if seq != self._record_seq:
                    # An outcome recorded while the claim ran may have made a job due
                    # (a follow-up, a retry): look again now, not a poll interval later.
                    continue
                if not self._tasks and self._outcomes.empty() and not self._held:
                    return
                # Wait for something in flight to finish: it may enqueue follow-ups.
                await self._wait_any(self._recorded, self.poll_interval)
                continue
            await self._wait_any(self._wake, self.poll_interval)

    async def _wait_any(self, event: asyncio.Event, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()

    async def _drain(self) -> None:
        """Give in-flight jobs the grace period, then cancel and release the rest."""
        if not self._tasks:
            return
        pending = list(self._tasks.values())
        _done, still = await asyncio.wait(pending, timeout=self.grace_period)
        if still:
            for t in still:
                t.cancel()
            await asyncio.gather(*still, return_exceptions=True)
        await self._outcomes.join()
        leftover = [(j.id, j.claim_token) for j in self._held.values()]
        if leftover:
            with contextlib.suppress(SynckitError):
                n = await leasing.release(self.db, leftover, now=self.clock())
                self._log.info("worker.released", jobs=n)
            self._held.clear()

    # --- running one job --------------------------------------------------------------

    def _start(self, job: ClaimedJob) -> None:
        self.stats.claimed += 1
        self._held[job.id] = job
        # The job's span runs from its claim to the recording of its outcome.
        span = tracing.start_job(job)
        if span is not None:
            self._spans[job.id] = span
        # A job the claim started takes its slot now, before any job claimed earlier
        # that still waits for one: it was charged on the promise of running at once.
        slotted = job.started and job.resource_key not in self._unrecorded_failures
        slotted = slotted and self._slots.try_take()
        task = asyncio.create_task(self._execute(job, slotted), name=f"synckit-job-{job.id}")
        self._tasks[job.id] = task

    def _forget_task(self, job_id: int) -> None:
        """Drop the running task's entry for ``job_id``, if it is this task's: a job this
        worker's own maintenance rescued (its lease ran out while it ran) may have been
        claimed here again, and its new attempt's task is not this one."""
        if self._tasks.get(job_id) is asyncio.current_task():
            del self._tasks[job_id]

    def _put_outcome(self, outcome: _Outcome) -> None:
        self._unrecorded += 1
        self._outcomes.put_nowait(outcome)
        self._record_wake.set()

    async def _execute(self, job: ClaimedJob, slotted: bool) -> None:
        if not slotted:
            await self._acquire_run_slot(job)
        try:
            if self._stopping.is_set():
                # Not started: shutdown releases it (a charged attempt is given back).
                self._forget_task(job.id)
                self._end_span(job.id, "released")
                return
            learnt = self.book.learnt.get(job.resource_key or "")
            held = gate(learnt, self.clock()).until if learnt is not None else None
            if held is not None and not job.probe:
                # Claimed ahead before this worker learnt its resource must wait.
                self._forget_task(job.id)
                self._put_outcome(_Outcome(job, "snooze", snooze_until=held))
                return
            if not job.started:
                started_job = await self._mark_started(job)
                if started_job is None:
                    # Rescued or cancelled while it waited: another worker may run it.
                    self._log.warning("job.lost_claim", job_id=job.id)
                    self._forget_task(job.id)
                    self._forget_claim(job)
                    self._slot_free.set()
                    self._end_span(job.id, "lost_claim")
                    return
                job = started_job
                if job.id in self._held:
                    self._held[job.id] = job
            started = time.monotonic()
            # Every event logged while the handler runs carries the job's context (this
            # task runs this one job, so the binding ends with it).
            bind_claimed_job_in_task(job)
            if self._spans:
                span = self._spans.get(job.id)
                tracing.set_attributes(span, synckit__job__attempt=job.attempts)
                tracing.enter(span)
            await self._execute_bound(job)
            took = time.monotonic() - started
            self._avg_run = took if self._avg_run is None else 0.8 * self._avg_run + 0.2 * took
        finally:
            self._slots.give()

    async def _mark_started(self, job: ClaimedJob) -> ClaimedJob | None:
        """Charge the job's attempt, committed before its handler runs (a job that kills
        its worker must run out of attempts): the job as started, or None if its claim
        was lost."""
        if not self._start_marks and not self._unrecorded and not self._marking:
            # Nothing finished here is unrecorded, so the mark needs no outcome's company
            # (see _recorder): commit it at once, in the cheapest transaction there is.
            # One such mark at a time: the jobs that get slots meanwhile (many, at high
            # concurrency) share the recorder's next statement rather than a connection
            # and a commit each.
            held = [(job.id, job.claim_token)]
            now = self.clock()
            got = outcomes.try_start_inline(self.db, held, now=now, lease=self.lease)
            if got is None and self.db.is_postgres:
                self._marking = True
                try:
                    got = await outcomes.start_many(self.db, held, now=now, lease=self.lease)
                except Exception as exc:  # the recorder retries it with backoff
                    self._log.warning("job.start_mark_failed", job_id=job.id, error=str(exc))
                finally:
                    self._marking = False
            if got is not None:
                return replace(job, attempts=job.attempts + 1, started=True) if got else None
        fut: asyncio.Future[ClaimedJob | None] = asyncio.get_running_loop().create_future()
        self._start_marks.append((job, fut))
        self._record_wake.set()
        return await fut

    async def _acquire_run_slot(self, job: ClaimedJob) -> None:
        """Wait for a handler slot, and for any failure of the job's resource that is not
        recorded yet (it may pace or open the resource): checked again once the slot is
        ours, since the failure may have happened while this job waited for it."""
        key = job.resource_key
        while True:
            while key in self._unrecorded_failures and not self._stopping.is_set():
                self._recorded.clear()
                await self._wait_any(self._recorded, 0.05)
            await self._slots.take()
            if key not in self._unrecorded_failures or self._stopping.is_set():
                return
            self._slots.give()

    async def _execute_bound(self, job: ClaimedJob) -> None:
        outcome: _Outcome
        spec = self.registry.get(job.kind)
        ctx: JobContext | None = None
        handler_started: datetime | None = None
        try:
            if spec is None:
                raise PermanentError(f"no handler registered for job kind {job.kind!r}")
            handler_started = self.clock()
            ctx = JobContext(
                job=job,
                worker_id=self.worker_id,
                db=self.db,
                log=self._log.bind(
                    job_id=job.id,
                    kind=job.kind,
                    resource_key=job.resource_key,
                    trace_id=job.trace_id,
                ),
            )
            try:
                async with asyncio.timeout(spec.timeout):
                    await spec.func(ctx)
            except TimeoutError as exc:
                raise TimeoutError(
                    f"job {job.kind!r} exceeded its {spec.timeout:g}s timeout"
                ) from exc
            outcome = _Outcome(job, "success", followups=ctx.followups, messages=ctx.messages)
        except Snooze as s:
            until = moment_after(self.clock(), s.delay, self.max_wait)
            outcome = _Outcome(job, "snooze", snooze_until=until)
        except Cancel as c:
            outcome = _Outcome(job, "cancel", reason=c.reason)
        except Discard as d:
            outcome = _Outcome(job, "discard", reason=d.reason)
        except asyncio.CancelledError:
            # Shutdown past the grace period, or the job was cancelled under us: the
            # release (or the cancel) already decides what happens to it.
            self._forget_task(job.id)
            self._slot_free.set()
            self._end_span(job.id, "cancelled")
            raise
        except Exception as exc:
            outcome = _Outcome(
                job,
                "failure",
                exc=exc,
                tb=traceback.format_exc(limit=30),
                progress=ctx is not None and ctx.made_progress,
                started_at=handler_started,
            )
        self._forget_task(job.id)
        self._slot_free.set()
        if outcome.kind == "failure" and job.resource_key:
            # Until this failure is recorded (it may pace or open the resource), no job of
            # the resource that this worker claimed ahead may start.
            key = job.resource_key
            self._unrecorded_failures[key] = self._unrecorded_failures.get(key, 0) + 1
        self._put_outcome(outcome)

    # --- background duties --------------------------------------------------------------

    async def _presence(self) -> None:
        """Register this worker, heartbeat every ``presence_every`` seconds with its jobs in
        flight, and say it stopped when cancelled (the worker's end). Never fatal."""
        from importlib.metadata import PackageNotFoundError, version

        from synckit.store import workers as presence

        try:
            ours = version("synckit")
        except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
            ours = "unknown"
        host, _, _ = self.worker_id.partition(":")

        async def register() -> None:
            await presence.register(
                self.db,
                self.worker_id,
                host=socket.gethostname() or host,
                pid=os.getpid(),
                version=ours,
                concurrency=self.concurrency,
                heartbeat_seconds=self.presence_every,
                now=self.clock(),
            )

        registered = False
        try:
            while True:
                try:
                    if not registered:
                        await register()
                        registered = True
                    elif not await presence.beat(
                        self.db, self.worker_id, in_flight=len(self._tasks), now=self.clock()
                    ):
                        registered = False
                        continue
                except Exception as exc:  # the worker must outlive any one failure
                    self._log.warning("worker.presence_failed", error=str(exc))
                await asyncio.sleep(self.presence_every)
        finally:
            if registered:
                with contextlib.suppress(Exception):
                    await asyncio.shield(
                        presence.stopped(self.db, self.worker_id, now=self.clock())
                    )

    async def _heartbeat(self) -> None:
        # Every third of the start lease while a job claimed ahead waits here (so that a
        # crash frees those within seconds); with started jobs alone, every third of
        # min(lease, 10 s), which bounds how late a cancellation is noticed. A job whose
        # row another transaction held at a beat (PostgreSQL: mostly this worker's own
        # page commit of it) is beaten again alone within BUSY_RETRY seconds, not at the
        # next full beat: a walk committing page after page under load otherwise skipped
        # beat after beat until its lease ran out and its own worker rescued it.
        short = max(0.05, self.start_lease.total_seconds() / 3)
        long = max(short, min(self.lease, timedelta(seconds=10)).total_seconds() / 3)
        last = time.monotonic()
        busy: set[int] = set()
        while True:
            await asyncio.sleep(min(short, BUSY_RETRY) if busy else short)
            current = list(self._held.values())
            if not current:
                busy = set()
                continue
            waiting = any(not j.started for j in current)
            # A full beat every `short` while a job claimed ahead waits, else every `long`;
            # between them, only the busy jobs, alone (never a full beat at BUSY_RETRY).
            if time.monotonic() - last >= (short if waiting else long):
                last = time.monotonic()
            elif busy:
                current = [j for j in current if j.id in busy]
            else:
                continue
            held = [(j.id, j.claim_token) for j in current]
            try:
                beat = await leasing.beat(
                    self.db,
                    self.worker_id,
                    held,
                    lease=self.lease,
                    now=self.clock(),
                    start_lease=self.start_lease,
                )
            except Exception as exc:  # the worker must outlive any one failure
                self._log.warning("worker.heartbeat_failed", error=str(exc))
                continue
            busy = beat.busy
            for job_id, token in held:
                task = self._tasks.get(job_id)
                mine = self._held.get(job_id)
                # Only the claim this beat was sent for: while the beat was on its way the
                # job may have ended its attempt and been claimed again (a retry), and that
                # new attempt is not the one whose claim is gone.
                if (
                    job_id not in beat.alive
                    and task is not None
                    and mine
                    and mine.claim_token == token
                ):
                    # Cancelled by an operator or rescued by another worker: stop the handler.
                    self._log.warning("job.lost_claim", job_id=job_id)
                    self._held.pop(job_id, None)
                    task.cancel()

    async def _maintenance_once(self, *, rescue: bool) -> None:
        now = self.clock()
        if rescue:
            limits = {
                kind: spec.max_attempts
                for kind in self.registry.kinds
                if (spec := self.registry.get(kind)) and spec.max_attempts is not None
            }
            n = await leasing.rescue_expired(self.db, now=now, max_attempts_by_kind=limits)
            if n:
                self.stats.rescued += n
                self._log.warning("job.leases_rescued", jobs=n)
                self._wake.set()
        schedules = self.registry.schedules
        if schedules:
            await cron.sync_schedules(self.db, schedules, now)
            if await cron.fire_due(self.db, schedules, now):
                self._wake.set()

    async def _maintenance(self) -> None:
        last_rescue = last_sample = 0.0
        last_prune = time.monotonic()
        backoff = _Backoff()
        while True:
            try:
                due_rescue = time.monotonic() - last_rescue >= self.rescue_interval
                await self._maintenance_once(rescue=due_rescue)
                if due_rescue:
                    last_rescue = time.monotonic()
                if time.monotonic() - last_sample >= QUEUE_SAMPLE_EVERY:
                    # The console's depth chart: one row a minute, by the first worker.
                    last_sample = time.monotonic()
                    await queue_history.sample(self.db, now=self.clock())
                if time.monotonic() - last_prune >= 3600:
                    last_prune = time.monotonic()
                    await admin.prune(self.db, older_than=self.prune_after, now=self.clock())
                backoff.reset()
                await asyncio.sleep(1.0)
            except Exception as exc:  # the worker must outlive any one failure
                await self._db_trouble("maintenance", exc, backoff)

    async def _listen(self) -> None:
        """Wake the claimer on NOTIFY; reconnect with backoff when the connection drops."""
        await listen(
            self.db,
            JOBS_NOTIFY_CHANNEL,
            self._wake.set,
            delay=_db_backoff,
            on_failure=lambda exc: self._log.warning("worker.listen_failed", error=str(exc)),
        )

    async def _watch(self) -> None:
        """SQLite: wake the claimer when another connection committed to the file."""
        await watch_sqlite(
            self.db,
            self._wake.set,
            on_failure=lambda exc: self._log.warning("worker.watch_failed", error=str(exc)),
        )



def claim_plan(
    concurrency: int, avg_run_seconds: float | None, claim_batch: int | None = None
) -> tuple[int, int]:
    """How many jobs a worker may hold (running or claimed ahead), and claim at once.

    Short jobs (under 50 ms on average) are claimed a large batch ahead of the handlers, so
    that claiming the next batch overlaps running and recording this one: the queue's
    throughput is then bound by transactions per batch, not per job. Longer jobs are
    claimed only for free handler slots, so that one worker never sits on work that idle
    workers could run. An explicit ``claim_batch`` sets the batch size either way.
    """
    if avg_run_seconds is not None and avg_run_seconds < 0.05:
        batch = claim_batch or max(concurrency * 4, 64)
        return concurrency + batch, batch
    batch = claim_batch or concurrency
    return concurrency, min(batch, concurrency)
