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
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal, cast

import structlog

from synckit import tracing
from synckit.clock import utcnow
from synckit.errors import (
    BreakerOutcome,
    BreakerPolicy,
    BreakerSnapshot,
    BreakerState,
    Classification,
    ErrorClass,
    RetryPolicy,
    breaker_open,
    breaker_outcome,
    breaker_transition,
    classify,
    global_breaker_trips,
    retry_delay,
)
from synckit.errors.backoff import backoff_delay
from synckit.errors.exceptions import (
    Cancel,
    DatabaseError,
    Discard,
    NeedsReauth,
    PermanentError,
    Snooze,
    SynckitError,
)
from synckit.errors.gate import LaneFacts, gate
from synckit.errors.pace import PacePolicy
from synckit.errors.waits import DEFAULT_MAX_WAIT, moment_after
from synckit.runtime import cron, outbox, pacing
from synckit.runtime.handlers import JobContext, Registry
from synckit.runtime.http import shared_connections
from synckit.runtime.logging import bind_claimed_job_in_task, redact_text
from synckit.runtime.outbox import OutboxRelay, Publisher
from synckit.store import queue_history, resources
from synckit.store.connections import mark_needs_reauth_sync
from synckit.store.db import Database, SyncConn, connection_lost, savepoint
from synckit.store.jobs import admin, claiming, enqueueing, leasing, outcomes
from synckit.store.jobs._base import START_LEASE, ClaimedJob
from synckit.store.jobs.claiming import ClaimStore
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.jobs.outcomes import OutcomeStore
from synckit.store.moments import read_moment
from synckit.store.notify import NOTIFY_CHANNEL as JOBS_NOTIFY_CHANNEL
from synckit.store.notify import listen, watch_sqlite
from synckit.store.outbox import NewMessage
from synckit.store.resources import BreakerStore

log = structlog.get_logger("synckit.worker")
#: Seconds between a worker's tries at the queue-depth sample (one row a minute).
QUEUE_SAMPLE_EVERY = 30.0


@dataclass
class _Outcome:
    job: ClaimedJob
    kind: str  # success | failure | snooze | cancel | discard
    followups: list[JobSpec] = field(default_factory=list)
    messages: list[NewMessage] = field(default_factory=list)
    exc: BaseException | None = None
    tb: str | None = None
    snooze_until: datetime | None = None
    reason: str = ""
    error_class: str | None = None
    #: The attempt committed work of its own (JobContext.progressed): a failure is free.
    progress: bool = False
    #: When the handler started: requests it sent went out after this (pacing's
    #: "in flight when the limit hit" is judged against it).
    started_at: datetime | None = None
    #: The status recorded (:meth:`Worker._after`): what the job's span ends with.
    recorded: str | None = "succeeded"


@dataclass(frozen=True)
class RecordedOutcome:
    """What happened to one job, as recorded: handed to outcome observers.

    ``status`` is ``succeeded``, ``pending`` (a retry is scheduled), ``paced`` (rate
    limited: rescheduled for when its resource is available, attempt not spent and not a
    failure), ``dead``, ``snoozed``, ``cancelled`` or ``discarded``; ``error_class`` is
    set for failures.
    """

    job: ClaimedJob
    status: str
    error_class: str | None
    error: BaseException | None


#: Called inside the transaction that records a batch of outcomes, so what an observer
#: writes (audit counts, say) commits atomically with the outcomes themselves.
OutcomeObserver = Callable[[SyncConn, list[RecordedOutcome], datetime], None]


_RESOURCE_MOMENTS = (
    "opened_at",
    "cooldown_until",
    "probe_expires_at",
    "window_start",
    "next_available_at",
)


def _full_text(exc: BaseException) -> str:
    """``Type: message``, whole (classification keeps one line of 200 characters)."""
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not break recording
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _moment_or_none(value: object) -> datetime | None:
    try:
        return read_moment(value)
    except ValueError:
        return None  # unreadable: no pace to keep (the claim reads it so too)


@dataclass
class WorkerStats:
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    snoozed: int = 0
    paced: int = 0
    cancelled: int = 0
    discarded: int = 0
    fenced: int = 0
    rescued: int = 0


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


class Worker:
    """Runs jobs from one database with the handlers of one registry.

    ``lease`` is how long a started job is held without a heartbeat; ``start_lease``
    (default ``min(lease, 2 s)``, :data:`~synckit.store.jobs._base.START_LEASE`) how long a job
    claimed ahead but not started is, so that a crash gives those back to other workers
    within a few seconds (the start lease, then one rescue pass), attempts unspent.
    ``max_wait`` caps every wait a handler asks for (retry-after, snooze);
    ``pace_policy`` says how rate limits pace their resource (``runtime/pacing.py``).

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
        # Resources this worker's own outcomes just paced or opened: jobs of theirs that
        # were claimed ahead are put back instead of run (other workers' changes are
        # seen by the next claim, and by ctx.http before every request): what this
        # worker learnt of each lane, for the gate to decide on.
        self._learnt: dict[str, LaneFacts] = {}
        self._unrecorded_failures: dict[str, int] = {}
        self.retry_policy = retry_policy or registry.retry_policy or RetryPolicy()
        self.breaker_policy = breaker_policy or registry.breaker_policy or BreakerPolicy()
        self.grace_period = grace_period
        self.prune_after = prune_after
        self.rescue_interval = rescue_interval or max(1.0, self.start_lease.total_seconds() / 4)
        self.rng = rng or random.Random()
        self.clock = clock
        self.stats = WorkerStats()
        self.observers = list(observers)
        #: When set, this worker also relays the transactional outbox to it.
        self.outbox_publisher = outbox_publisher
        self._held: dict[int, ClaimedJob] = {}
        # Spans of the jobs held here (tracing on), and what their recording decided.
        self._spans: dict[int, Any] = {}
        self._decisions: dict[int, dict[str, Any]] = {}
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

    # --- public ---------------------------------------------------------------------

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
                self._tasks.pop(job.id, None)
                self._end_span(job.id, "released")
                return
            learnt = self._learnt.get(job.resource_key or "")
            held = gate(learnt, self.clock()).until if learnt is not None else None
            if held is not None and not job.probe:
                # Claimed ahead before this worker learnt its resource must wait.
                self._tasks.pop(job.id, None)
                self._put_outcome(_Outcome(job, "snooze", snooze_until=held))
                return
            if not job.started:
                started_job = await self._mark_started(job)
                if started_job is None:
                    # Rescued or cancelled while it waited: another worker may run it.
                    self._log.warning("job.lost_claim", job_id=job.id)
                    self._tasks.pop(job.id, None)
                    self._held.pop(job.id, None)
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
            self._tasks.pop(job.id, None)
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
        self._tasks.pop(job.id, None)
        self._slot_free.set()
        if outcome.kind == "failure" and job.resource_key:
            # Until this failure is recorded (it may pace or open the resource), no job of
            # the resource that this worker claimed ahead may start.
            key = job.resource_key
            self._unrecorded_failures[key] = self._unrecorded_failures.get(key, 0) + 1
        self._put_outcome(outcome)

    # --- recording outcomes -------------------------------------------------------------

    async def _recorder(self) -> None:
        backoff = _Backoff()
        while True:
            while self._outcomes.empty() and not self._start_marks:
                self._record_wake.clear()
                await self._record_wake.wait()
            # One turn of the loop: the handler slot an outcome just freed goes to the
            # next job, whose start mark then shares this transaction.
            await asyncio.sleep(0)
            batch: list[_Outcome] = []
            while len(batch) < 1000:
                try:
                    batch.append(self._outcomes.get_nowait())
                except asyncio.QueueEmpty:
                    break
            # A start mark commits with (or after) the outcomes of every job that finished
            # here before it: were the new job to kill the worker, those finished jobs
            # must not run again, charged a second attempt.
            marks, self._start_marks = self._start_marks, []
            held = [(j.id, j.claim_token) for j, _ in marks]
            while True:
                try:
                    if batch:
                        started = await self._record_plain(batch, held)
                        if started is None:
                            started = await self._record(batch, held)
                    else:
                        now = self.clock()
                        started = await outcomes.start_many(
                            self.db, held, now=now, lease=self.lease
                        )
                    backoff.reset()
                    break
                except Exception as exc:  # the worker must outlive any one failure
                    await self._db_trouble("record", exc, backoff)
            for job, fut in marks:
                if not fut.done():
                    fut.set_result(
                        replace(job, attempts=job.attempts + 1, started=True)
                        if job.id in started
                        else None
                    )
            self._unrecorded -= len(batch)
            for o in batch:
                self._held.pop(o.job.id, None)
                self._outcomes.task_done()
                if self._spans:
                    self._end_span(o.job.id, o.kind, o)
                key = o.job.resource_key
                if o.kind == "failure" and key and key in self._unrecorded_failures:
                    self._unrecorded_failures[key] -= 1
                    if self._unrecorded_failures[key] <= 0:
                        del self._unrecorded_failures[key]
            if batch:
                self._record_seq += 1
                self._recorded.set()
                self._slot_free.set()

    async def _record_plain(
        self, batch: list[_Outcome], marks: list[tuple[int, int]]
    ) -> set[int] | None:
        """The common batch, plain successes and start marks, in one raw transaction
        (jobs.try_complete_and_start_inline, jobs.complete_and_start_pg): the ids
        started, or None when the batch needs the general path (:meth:`_record`), or
        SQLite's write lock is taken this instant."""
        if self.observers or not all(
            o.kind == "success" and not o.followups and not o.messages and not o.job.resource_key
            for o in batch
        ):
            return None  # breakers, follow-ups, messages or observers to write
        now = self.clock()
        done = [(o.job.id, o.job.claim_token) for o in batch]
        if self.db.is_postgres:
            held, started = await outcomes.complete_and_start_pg(
                self.db, done, marks, now=now, lease=self.lease
            )
        else:
            got = outcomes.try_complete_and_start_inline(
                self.db, done, marks, now=now, lease=self.lease
            )
            if got is None:
                return None
            held, started = got
        self.stats.succeeded += len(held)
        self.stats.fenced += len(done) - len(held)
        if self._spans:
            for o in batch:
                if o.job.id not in held:
                    o.recorded = None
        return started

    async def _record(self, batch: list[_Outcome], marks: list[tuple[int, int]]) -> set[int]:
        """Write ``batch`` and the start ``marks`` in one transaction; the ids started."""
        now = self.clock()
        successes = [o for o in batch if o.kind == "success"]
        held, results, woke_jobs, woke_outbox, started = await self.db.write(
            self._record_sync, batch, marks, now
        )
        # A success whose follow-ups or messages the database refused is in results, as
        # the failure it was recorded as.
        refused = sum(1 for o, _ in results if o.kind == "success")
        for o in successes:
            if o.job.id not in held:
                o.recorded = None  # fenced (or refused: _after says which)
        self.stats.succeeded += len(held)
        self.stats.fenced += len(successes) - len(held) - refused
        if woke_jobs:
            enqueueing.target_wake(self.db)
        if woke_outbox:
            outbox.wake_local_relays(self.db)
        for o, status in results:
            self._after(o, status)
        return started

    def _record_sync(
        self, conn: SyncConn, batch: list[_Outcome], marks: list[tuple[int, int]], now: datetime
    ) -> tuple[set[int], list[tuple[_Outcome, str | None]], bool, bool, set[int]]:
        """Record a batch of outcomes and start marks in one transaction (run whole by
        Database.write). With marks, PostgreSQL commits it without waiting for the WAL
        flush: jobs wait for this commit before they run."""
        started = outcomes.start_many_sync(
            conn, marks, now=now, lease=self.lease, async_commit=True
        )
        successes = [o for o in batch if o.kind == "success"]
        others = [o for o in batch if o.kind != "success"]
        plain = [o for o in successes if not o.followups and not o.messages]
        held = outcomes.complete_many_sync(
            conn, [(o.job.id, o.job.claim_token) for o in plain], now=now
        )
        results: list[tuple[_Outcome, str | None]] = []
        rich = [o for o in successes if o.followups or o.messages]
        followups = messages = False
        if rich:
            try:
                with savepoint(conn):
                    got = self._complete_with_writes(conn, rich, now)
            except Exception as exc:  # one of them writes what the database refuses
                if connection_lost(conn, exc):
                    raise
                # Each alone, so that only the one that cannot be written fails.
                got = set()
                for o in rich:
                    try:
                        with savepoint(conn):
                            got |= self._complete_with_writes(conn, [o], now)
                    except Exception as one:
                        if connection_lost(conn, one):
                            raise
                        results.append((o, self._record_refused(conn, o, now, one)))
            held |= got
            followups = any(o.followups for o in rich if o.job.id in got)
            messages = any(o.messages for o in rich if o.job.id in got)
        keyed = Counter(
            o.job.resource_key for o in successes if o.job.id in held and o.job.resource_key
        )
        if keyed:
            self._breaker_success(conn, keyed, now)
        for o in others:
            results.append((o, self._record_guarded(conn, o, now)))
        if self.observers:
            recorded = [
                RecordedOutcome(o.job, "succeeded", None, None)
                for o in successes
                if o.job.id in held
            ] + [
                RecordedOutcome(o.job, status, o.error_class, o.exc)
                for o, status in results
                if status is not None
            ]
            for observe in self.observers:
                observe(conn, recorded, now)
        return held, results, followups, messages, started

    @staticmethod
    def _complete_with_writes(conn: SyncConn, done: list[_Outcome], now: datetime) -> set[int]:
        """Complete successes with their follow-up jobs and outbox messages: the ids whose
        claim still held (only theirs write anything)."""
        held = outcomes.complete_many_sync(
            conn, [(o.job.id, o.job.claim_token) for o in done], now=now
        )
        jobs_ = [f for o in done if o.job.id in held for f in o.followups]
        if jobs_:
            enqueueing._enqueue_sync(conn, jobs_, now)
        messages = [m for o in done if o.job.id in held for m in o.messages]
        if messages:
            outbox.add_many_sync(conn, messages, now=now)
        return held

    def _record_guarded(self, conn: SyncConn, o: _Outcome, now: datetime) -> str | None:
        """Record one outcome in a savepoint; one that cannot be recorded (a bug, a value
        the database refuses) is recorded as a failure with its reason instead, so the
        batch's other outcomes commit. A lost connection fails the whole batch, which the
        recorder retries."""
        try:
            with savepoint(conn):
                return self._record_other(conn, o, now)
        except Exception as exc:  # any failure of this one outcome, bug or refusal
            if connection_lost(conn, exc):
                raise
            problem = exc
        return self._record_refused(conn, o, now, problem)

    def _record_refused(
        self, conn: SyncConn, o: _Outcome, now: datetime, problem: Exception
    ) -> str | None:
        """Record as a failure, with its reason, an outcome the database refused (its
        savepoint rolled back); None when even that will not go in."""
        reason = redact_text(
            f"the {o.kind} outcome could not be recorded: {type(problem).__name__}: {problem}"
        ).replace("\x00", "")[:1000]
        self._log.error(
            "job.outcome_unrecordable", job_id=o.job.id, kind=o.job.kind, error=reason[:300]
        )
        try:
            with savepoint(conn):
                return self._record_unrecordable(conn, o, now, reason)
        except Exception as exc:  # even the plain failure would not go in
            if connection_lost(conn, exc):
                raise
            # Left running: its lease expires and the rescue retries it.
            self._log.error("job.outcome_dropped", job_id=o.job.id, error=repr(exc)[:300])
            return None

    def _record_unrecordable(
        self, conn: SyncConn, o: _Outcome, now: datetime, reason: str
    ) -> str | None:
        job = o.job
        o.error_class = ErrorClass.TRANSIENT.value
        o.exc = RuntimeError(reason)
        o.tb = None
        retry_at = None
        if job.attempts < self._limit_of(job):
            retry_at = moment_after(now, self._retry_policy_of(job).base, self.max_wait)
        return self.outcomes.fail_sync(
            conn,
            job,
            max_attempts=self._limit_of(job),
            now=now,
            error_class=o.error_class,
            message=reason,
            retry_at=retry_at,
        )

    def _limit_of(self, job: ClaimedJob) -> int:
        return self.registry.attempt_limit(job.kind, job.max_attempts)

    def _retry_policy_of(self, job: ClaimedJob) -> RetryPolicy:
        """The registry's policy for this job (a connector's, say), else the worker's."""
        choose = self.registry.retry_policy_for
        chosen = choose(job) if choose is not None else None
        return chosen if chosen is not None else self.retry_policy

    def _record_other(self, conn: SyncConn, o: _Outcome, now: datetime) -> str | None:
        job = o.job
        if o.kind == "snooze":
            assert o.snooze_until is not None
            return (
                "snoozed"
                if self.outcomes.snooze_sync(conn, job, now=now, until=o.snooze_until)
                else None
            )
        if o.kind in ("cancel", "discard"):
            status = "cancelled" if o.kind == "cancel" else "discarded"
            ok = self.outcomes.finish_sync(conn, job, now=now, status=status, reason=o.reason)  # type: ignore[arg-type]
            return status if ok else None
        assert o.exc is not None
        c = classify(exc=o.exc, now=now)
        o.error_class = c.error_class.value
        # Error texts are stored and shown to operators: no token may survive into them.
        message = redact_text(c.reason)
        detail = redact_text(_full_text(o.exc))  # the reason is one line of 200 at most
        o.tb = redact_text(o.tb) if o.tb else None
        if isinstance(o.exc, NeedsReauth) and job.resource_key:
            mark_needs_reauth_sync(conn, job.resource_key, redact_text(str(o.exc)), now=now)
            # The job waits for re-authorisation without spending an attempt.
            return self.outcomes.fail_sync(
                conn,
                job,
                max_attempts=self._limit_of(job),
                now=now,
                error_class=c.error_class.value,
                message=message,
                retry_at=now,
                traceback=o.tb,
                detail=detail,
                count_attempt=False,
            )
        if c.error_class is ErrorClass.RATE_LIMITED:
            # A rate limit paces; it never fails: no attempt, no breaker, no budget.
            policy = self._retry_policy_of(job)
            decision = retry_delay(c, job.attempts, policy, rng=self.rng)
            wait = decision.delay if decision is not None else (c.retry_after or policy.base)
            retry_at: datetime | None = moment_after(now, wait, self.max_wait)
            if job.resource_key:
                paced = self._resource_failure(conn, job, c, now, retry_at, sent_at=o.started_at)
                retry_at = paced or retry_at
            recorded = self.outcomes.fail_sync(
                conn,
                job,
                max_attempts=self._limit_of(job),
                now=now,
                error_class=c.error_class.value,
                message=message,
                retry_at=retry_at,
                traceback=o.tb,
                detail=detail,
                count_attempt=False,
            )
            return "paced" if recorded == "pending" else recorded
        retry_at = None
        if job.attempts < self._limit_of(job) or o.progress:
            # After progress, the backoff starts over: attempts that did nothing count.
            attempt = 1 if o.progress else job.attempts
            decision = retry_delay(c, attempt, self._retry_policy_of(job), rng=self.rng)
            if decision is not None:
                retry_at = moment_after(now, decision.delay, self.max_wait)
        if job.resource_key:
            self._resource_failure(conn, job, c, now, retry_at)
        return self.outcomes.fail_sync(
            conn,
            job,
            max_attempts=self._limit_of(job),
            now=now,
            error_class=c.error_class.value,
            message=message,
            retry_at=retry_at,
            traceback=o.tb,
            detail=detail,
            # Work committed in this attempt is progress: only attempts that committed
            # nothing count toward giving up.
            count_attempt=not o.progress,
        )

    def _end_span(self, job_id: int, outcome: str, o: _Outcome | None = None) -> None:
        """End the span of job ``job_id`` (if tracing made one) with its outcome."""
        span = self._spans.pop(job_id, None)
        if span is None:
            return
        decision = self._decisions.pop(job_id, None)
        if decision:
            tracing.set_attributes(span, **decision)
        if o is None:
            tracing.end_job(span, outcome)
            return
        tracing.end_job(
            span,
            outcome,
            status=o.recorded,
            exc=o.exc if o.kind == "failure" else None,
            error_class=o.error_class,
        )

    def _after(self, o: _Outcome, status: str | None) -> None:
        o.recorded = status
        job = o.job
        tenant, connector = (None, None)
        if isinstance(job.payload, dict):
            tenant, connector = job.payload.get("tenant"), job.payload.get("connector")
        fields: dict[str, Any] = {
            "tenant": tenant or job.resource_key,
            "connector": connector,
            "job_id": job.id,
            "kind": job.kind,
            "attempt": job.attempts,
            "resource_key": job.resource_key,
            "trace_id": job.trace_id,
        }
        if status is None:
            self.stats.fenced += 1
            self._log.warning("job.outcome_fenced", **fields)
        elif status == "pending":
            self.stats.retried += 1
            self._log.info("job.retry_scheduled", error=str(o.exc)[:300], **fields)
        elif status == "dead":
            self.stats.dead += 1
            self._log.warning("job.dead", error=str(o.exc)[:300], **fields)
        elif status == "snoozed":
            self.stats.snoozed += 1
        elif status == "paced":
            self.stats.paced += 1
            self._log.info("job.paced", error=str(o.exc)[:300], **fields)
        elif status == "cancelled":
            self.stats.cancelled += 1
        elif status == "discarded":
            self.stats.discarded += 1

    # --- per-resource state -------------------------------------------------------------

    def _snapshot(self, r: Any) -> BreakerSnapshot:
        """The breaker of a row read with its timestamps guarded (``store.resources``'s
        breaker reads). What cannot be read (an unknown state, a timestamp no datetime
        holds) reads as closed or unset, with a warning: one corrupt row must not fail
        the batch, and writing the snapshot back repairs it."""
        moments: dict[str, datetime | None] = {}
        bad: list[str] = []
        for name in _RESOURCE_MOMENTS:
            try:
                moments[name] = read_moment(r._mapping[name])
            except ValueError as exc:
                moments[name] = None
                bad.append(f"{name}: {exc}")
        try:
            state = BreakerState(r.state)
        except ValueError:
            state = BreakerState.CLOSED
            bad.append(f"unknown state {str(r.state)[:60]!r}")
        if bad:
            self._log.warning(
                "resource.unreadable", resource_key=r.resource_key, reasons=bad, read_as="closed"
            )
        return BreakerSnapshot(
            state=state,
            consecutive_failures=r.consecutive_failures,
            opened_at=moments["opened_at"],
            reopen_count=r.reopen_count,
            cooldown_until=moments["cooldown_until"],
            probe_in_flight=r.probe_job_id is not None,
            probe_expires_at=moments["probe_expires_at"],
            window_start=moments["window_start"],
            window_calls=r.window_calls,
            window_failures=r.window_failures,
        )

    def _store_snapshot(
        self,
        conn: SyncConn,
        key: str,
        before: BreakerSnapshot,
        after: BreakerSnapshot,
        now: datetime,
        **extra: Any,
    ) -> None:
        values: dict[str, Any] = {
            "state": after.state.value,
            "consecutive_failures": after.consecutive_failures,
            "opened_at": after.opened_at,
            "reopen_count": after.reopen_count,
            "cooldown_until": after.cooldown_until,
            "window_start": after.window_start,
            "window_calls": after.window_calls,
            "window_failures": after.window_failures,
            "updated_at": now,
            **extra,
        }
        if not after.probe_in_flight:
            values["probe_job_id"] = None
            values["probe_expires_at"] = None
        self.breakers.write_resource_sync(conn, key, values)
        if after.state != before.state:
            event = {
                "open": "breaker.opened",
                "closed": "breaker.closed",
                "half_open": "breaker.half_open",
            }[after.state.value]
            self._log.warning(
                event,
                resource_key=key,
                failures=after.consecutive_failures,
                cooldown_until=after.cooldown_until,
            )

    def _breaker_success(self, conn: SyncConn, keys: Counter[str], now: datetime) -> None:
        rows = self.breakers.dirty_breakers_sync(conn, sorted(keys))
        parents: set[str] = set()
        for r in rows:
            before = after = self._snapshot(r)
            for _ in range(keys[r.resource_key]):  # each success counts in the rate window
                after = breaker_transition(after, BreakerOutcome.SUCCESS, now, self.breaker_policy)
            self._store_snapshot(conn, r.resource_key, before, after, now)
            if r.parent_key:
                parents.add(r.parent_key)
        if parents:
            # A tenant call that succeeds once the API-wide cool-down is over is its probe.
            for p in self.breakers.unclosed_breakers_sync(conn, sorted(parents)):
                before = self._snapshot(p)
                after = breaker_transition(before, BreakerOutcome.SUCCESS, now, self.breaker_policy)
                self._store_snapshot(conn, p.resource_key, before, after, now)

    def _resource_failure(
        self,
        conn: SyncConn,
        job: ClaimedJob,
        c: Classification,
        now: datetime,
        retry_at: datetime | None,
        *,
        sent_at: datetime | None = None,
    ) -> datetime | None:
        """Fold a failure into the resource's breaker and, for a rate limit, its pace;
        returns when the resource is next available (None: not paced)."""
        key = job.resource_key
        r = self.breakers.breaker_row_sync(conn, key)
        if r is None:
            return None
        extra: dict[str, Any] = {
            "last_error_class": c.error_class.value,
            "last_error": redact_text(c.reason)[:500],
        }
        paced: datetime | None = None
        if c.error_class is ErrorClass.RATE_LIMITED and key:
            paced = self._pace(
                conn, job, key, c, now, sent_at, _moment_or_none(r.next_available_at)
            )
            if paced is not None:
                self._block(key, paced=paced)
                self._log.info("resource.throttled", resource_key=key, until=paced)
        before = self._snapshot(r)
        after = breaker_transition(
            before, breaker_outcome(c), now, self.breaker_policy, server_wait=c.retry_after
        )
        if after.state is BreakerState.OPEN and after.cooldown_until is not None:
            self._block(r.resource_key, open_until=after.cooldown_until)
        if job.id in self._spans:  # what the job's span tells: the pace and the breaker
            self._decisions[job.id] = {
                "synckit__pace__until": paced.isoformat() if paced is not None else None,
                "synckit__breaker__state": after.state.value,
                "synckit__breaker__transition": (
                    f"{before.state.value}->{after.state.value}"
                    if before.state is not after.state
                    else None
                ),
            }
        self._store_snapshot(conn, r.resource_key, before, after, now, **extra)
        if r.parent_key and after.state is BreakerState.OPEN and before.state is not after.state:
            self._maybe_open_parent(conn, r.parent_key, now)
        return paced

    def _pace_policy_of(self, job: ClaimedJob) -> PacePolicy:
        """The registry's pace policy for this job (its connector's ``pace``), else the
        worker's."""
        choose = self.registry.pace_policy_for
        chosen = choose(job) if choose is not None else None
        return chosen if chosen is not None else self.pace_policy

    def _pace(
        self,
        conn: SyncConn,
        job: ClaimedJob,
        key: str,
        c: Classification,
        now: datetime,
        sent_at: datetime | None,
        current: datetime | None,
    ) -> datetime | None:
        """Pace the resource: no worker calls it before the server's time is up."""
        # Requests sent before the current event's pace ended are that event (a burst
        # of in-flight 429s is one); the handler's start bounds when its requests went.
        until = pacing.record_rate_limit_sync(
            conn, key, c, sent_at=sent_at, now=now, policy=self._pace_policy_of(job)
        )
        return until if until is not None else current

    def _maybe_open_parent(self, conn: SyncConn, parent_key: str, now: datetime) -> None:
        """Open the API-wide breaker when many of its tenants' breakers are open together."""
        children = self.breakers.child_states_sync(conn, parent_key)
        open_children = sum(1 for state in children if state != "closed")
        if not global_breaker_trips(open_children, len(children), self.breaker_policy):
            return
        p = self.breakers.breaker_row_sync(conn, parent_key)
        if p is None or p.state == "open":
            return
        before = self._snapshot(p)
        after = breaker_open(before, now, self.breaker_policy)
        self._store_snapshot(
            conn,
            parent_key,
            before,
            after,
            now,
            last_error=f"{open_children} of {len(children)} tenants failing",
        )

    def _block(
        self, key: str, *, paced: datetime | None = None, open_until: datetime | None = None
    ) -> None:
        """Remember that ``key`` is paced until ``paced`` or its breaker open until
        ``open_until`` (the later of what was learnt wins), for :func:`gate`."""
        # Written from the database writer thread, read on the event loop: a plain dict
        # assignment is atomic under the GIL, and a stale read only delays the put-back.
        facts = self._learnt.get(key, LaneFacts())
        if paced is not None and (facts.next_available_at or paced) <= paced:
            facts = replace(facts, next_available_at=paced)
        if open_until is not None and (facts.cooldown_until or open_until) <= open_until:
            facts = replace(facts, state="open", cooldown_until=open_until)
        self._learnt[key] = facts

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
        # min(lease, 10 s), which bounds how late a cancellation is noticed.
        short = max(0.05, self.start_lease.total_seconds() / 3)
        long = max(short, min(self.lease, timedelta(seconds=10)).total_seconds() / 3)
        last = time.monotonic()
        while True:
            await asyncio.sleep(short)
            current = list(self._held.values())
            if not current:
                continue
            waiting = any(not j.started for j in current)
            if not waiting and time.monotonic() - last < long:
                continue
            last = time.monotonic()
            held = [(j.id, j.claim_token) for j in current]
            try:
                alive = await leasing.heartbeat(
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
            for job_id, _ in held:
                task = self._tasks.get(job_id)
                if job_id not in alive and task is not None and job_id in self._held:
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

    async def _db_trouble(self, where: str, exc: Exception, backoff: _Backoff) -> None:
        """Log a failed step and wait before the caller retries it.

        Database trouble is expected (restarts, failovers) and logged as a warning; any
        other exception is a bug worth a traceback, but it must not kill the worker.
        """
        delay = backoff.next()
        if isinstance(exc, DatabaseError):
            self._log.warning("worker.database_error", where=where, error=str(exc), retry_in=delay)
        else:
            self._log.error(
                "worker.unexpected_error",
                where=where,
                error=repr(exc),
                retry_in=delay,
                exc_info=exc,
            )
        await asyncio.sleep(delay)


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


#: The worker's backoff after database trouble: 0.2 s doubling to 5 s, less up to half
#: of it (``errors.backoff.backoff_delay``, the one formula).
DB_BACKOFF_BASE = timedelta(seconds=0.2)
DB_BACKOFF_CAP = timedelta(seconds=5)
DB_BACKOFF_JITTER = 0.5


def _db_backoff(failures: int) -> float:
    """The wait after ``failures`` consecutive failures, as :class:`_Backoff` counts them."""
    return backoff_delay(
        failures,
        random.random(),
        base=DB_BACKOFF_BASE,
        cap=DB_BACKOFF_CAP,
        jitter=DB_BACKOFF_JITTER,
    ).total_seconds()


class _Backoff:
    """Consecutive waits after database trouble (:data:`DB_BACKOFF_BASE` doubling to
    :data:`DB_BACKOFF_CAP`, jittered); ``reset`` after a step that worked."""

    def __init__(self, draw: Callable[[], float] = random.random) -> None:
        self.n = 0
        self._draw = draw

    def reset(self) -> None:
        self.n = 0

    def next(self) -> float:
        self.n += 1
        return backoff_delay(
            self.n,
            self._draw(),
            base=DB_BACKOFF_BASE,
            cap=DB_BACKOFF_CAP,
            jitter=DB_BACKOFF_JITTER,
        ).total_seconds()
