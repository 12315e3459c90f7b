"""How the worker records outcomes (:class:`OutcomeRecorder`, a part of
:class:`~synckit.runtime.jobs.worker.Worker`): one recorder task takes the outcomes handlers
left in the queue, with the start marks of the jobs about to run, and writes them in one
transaction per batch: plain successes by one prebuilt statement (:meth:`_record_plain`),
the rest through :meth:`_record_sync`, where failures are classified and retried, paced
or dead-lettered, breakers are folded (:class:`~synckit.runtime.jobs.breakers.ResourceBook`),
follow-up jobs and outbox messages commit with their job, observers write in the same
transaction, and an outcome the database refuses is recorded as a failure with its
reason so the batch's others commit. Database trouble is waited out
(:meth:`_db_trouble`), never fatal.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, ClassVar

from synckit import tracing
from synckit.errors import ErrorClass, RetryPolicy, classify, retry_delay
from synckit.errors.backoff import backoff_delay
from synckit.errors.classify import Classification
from synckit.errors.exceptions import DatabaseError, NeedsReauth
from synckit.errors.waits import moment_after
from synckit.runtime.jobs.breakers import ResourceBook
from synckit.runtime.jobs.handlers import Registry
from synckit.runtime.observe.logging import redact_text
from synckit.runtime.writes import outbox
from synckit.store.connections import mark_needs_reauth_sync
from synckit.store.db import Database, SyncConn
from synckit.store.db_errors import connection_lost, savepoint
from synckit.store.jobs import enqueueing, outcomes
from synckit.store.jobs._base import ClaimedJob
from synckit.store.jobs.enqueueing import JobSpec
from synckit.store.jobs.outcomes import OutcomeStore
from synckit.store.outbox import NewMessage

__all__ = ["OutcomeObserver", "OutcomeRecorder", "RecordedOutcome", "WorkerStats"]


@dataclass
class WorkerStats:
    """What a worker did, counted as its recorder records each outcome."""

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


def _full_text(exc: BaseException) -> str:
    """``Type: message``, whole (classification keeps one line of 200 characters)."""
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not break recording
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: The worker's backoff after database trouble: 0.2 s doubling to 5 s, less up to half
#: of it (``errors.backoff.backoff_delay``, the one formula).
DB_BACKOFF_BASE = timedelta(seconds=0.2)
DB_BACKOFF_CAP = timedelta(seconds=5)
DB_BACKOFF_JITTER = 0.5


def _db_backoff(failures: int, uniform: float | None = None) -> float:
    """The wait after ``failures`` consecutive failures, as :class:`_Backoff` counts them
    (``uniform``: the jitter's draw in [0, 1]; a fresh random one by default)."""
    return backoff_delay(
        failures,
        random.random() if uniform is None else uniform,
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
        return _db_backoff(self.n, self._draw())


class OutcomeRecorder:
    """The recording half of :class:`~synckit.runtime.jobs.worker.Worker` (its one subclass,
    which sets every attribute declared here in its ``__init__``)."""

    #: Where outcomes are written: :mod:`synckit.store.jobs.outcomes` (a fake in unit tests).
    outcomes: ClassVar[OutcomeStore]
    db: Database
    registry: Registry
    lease: timedelta
    max_wait: timedelta
    retry_policy: RetryPolicy
    rng: random.Random
    clock: Callable[[], datetime]
    stats: WorkerStats
    observers: list[OutcomeObserver]
    book: ResourceBook
    _log: Any
    _held: dict[int, ClaimedJob]
    _spans: dict[int, Any]
    _outcomes: asyncio.Queue[_Outcome]
    _start_marks: list[tuple[ClaimedJob, asyncio.Future[ClaimedJob | None]]]
    _unrecorded: int
    _unrecorded_failures: dict[str, int]
    _record_wake: asyncio.Event
    _recorded: asyncio.Event
    _slot_free: asyncio.Event
    _record_seq: int

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
                self._forget_claim(o.job)
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
            self.book.success(conn, keyed, now)
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

        def fail(retry_at: datetime | None, *, count_attempt: bool) -> str | None:
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
                count_attempt=count_attempt,
            )

        if isinstance(o.exc, NeedsReauth) and job.resource_key:
            mark_needs_reauth_sync(conn, job.resource_key, redact_text(str(o.exc)), now=now)
            # The job waits for re-authorisation without spending an attempt.
            return fail(now, count_attempt=False)
        if c.error_class is ErrorClass.RATE_LIMITED:
            # A rate limit paces; it never fails: no attempt, no breaker, no budget.
            recorded = fail(self._paced_until(conn, o, c, now), count_attempt=False)
            return "paced" if recorded == "pending" else recorded
        retry_at = None
        if job.attempts < self._limit_of(job) or o.progress:
            # After progress, the backoff starts over: attempts that did nothing count.
            attempt = 1 if o.progress else job.attempts
            decision = retry_delay(c, attempt, self._retry_policy_of(job), rng=self.rng)
            if decision is not None:
                retry_at = moment_after(now, decision.delay, self.max_wait)
        if job.resource_key:
            self.book.failure(conn, job, c, now, retry_at, traced=job.id in self._spans)
        # Work committed in this attempt is progress: only attempts that committed
        # nothing count toward giving up.
        return fail(retry_at, count_attempt=not o.progress)

    def _paced_until(
        self, conn: SyncConn, o: _Outcome, c: Classification, now: datetime
    ) -> datetime | None:
        """When a rate-limited job runs again: its backoff or the API's wait, or the
        resource's pace once the rate limit is recorded (it never fails the job)."""
        job = o.job
        policy = self._retry_policy_of(job)
        decision = retry_delay(c, job.attempts, policy, rng=self.rng)
        wait = decision.delay if decision is not None else (c.retry_after or policy.base)
        retry_at: datetime | None = moment_after(now, wait, self.max_wait)
        if job.resource_key:
            paced = self.book.failure(
                conn, job, c, now, retry_at, sent_at=o.started_at, traced=job.id in self._spans
            )
            retry_at = paced or retry_at
        return retry_at

    def _end_span(self, job_id: int, outcome: str, o: _Outcome | None = None) -> None:
        """End the span of job ``job_id`` (if tracing made one) with its outcome."""
        span = self._spans.pop(job_id, None)
        if span is None:
            return
        decision = self.book.decisions.pop(job_id, None)
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

    def _forget_claim(self, job: ClaimedJob) -> None:
        """Stop holding ``job``'s claim, and only that claim: a job this worker's own
        maintenance rescued while it still ran may have been claimed here again, and the
        late outcome of the old attempt (fenced) must not drop the new claim, which would
        then go without heartbeats and be rescued once more."""
        mine = self._held.get(job.id)
        if mine is not None and mine.claim_token == job.claim_token:
            del self._held[job.id]

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
