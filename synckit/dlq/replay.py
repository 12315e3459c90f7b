"""The replay processor: dead letters are re-run until they succeed, need a human, or are
beyond help.

:class:`ReplayProcessor` takes due rows under a lease (see :mod:`synckit.store.dead_letters`), so
any number of processors, in any number of processes, never replay one row at once, on
PostgreSQL and on SQLite. For each row it picks what to do (:meth:`ReplayProcessor.plan`):

* a replayer registered for the row's kind in :class:`Replayers` (exact kind first, then
  the longest registered prefix, such as ``record:``) is awaited with the row;
* a dead job (record id ``job:<id>``) without a replayer is run again: its job row is
  put back in the queue with fresh attempts (``jobs.retry_job``) when it still exists
  and is dead, else a new job of the same kind and payload is enqueued
  (``jobs.enqueue``). Either way the dead letter is marked ``resolved`` at once: its work
  is back in the queue, where the job's own retries take over. Re-running the original
  job rather than always enqueueing a copy keeps one dead letter per job: should it die
  again, the worker reopens this very row (``job:<id>``), whose ``replay_attempts`` and
  ``next_retry_at`` (kept on resolution) carry on, so a job that always fails reaches
  review after ``max_attempts`` replays instead of cycling forever through fresh rows.
  Nothing is re-run when the job succeeded since, is queued again, or another
  unfinished job holds its unique key (a dead poll cycle whose stream's next cycle is
  queued): the row is resolved as ``not_rerun``, with that reason. When a job
  :class:`~synckit.runtime.jobs.handlers.Registry` is given and has no handler for the kind,
  the row is ignored;
* anything else cannot be replayed and is ``ignored`` with the reason (no replayer for
  the kind, a payload that does not parse, a record payload that is not a JSON object,
  a replayer raising :class:`Unreplayable`).

Outcomes: success resolves the row. A failure is classified (:func:`synckit.errors.classify`):
validation and authorization errors go to ``review`` at once; other failures are retried
after :func:`~synckit.errors.dlq_policy.next_retry_delay` (``min(2^n min, 24 h)`` with jitter, or
the server's wait if longer), and go to ``review`` once ``max_attempts`` replays failed.
Rows moved to review are announced once per run and per ``(tenant, error class)``: a
``dlq.review`` log event and the optional ``on_review(tenant, error_class, count)``
callback. Rows whose resource waits (breaker open, paced, connection not active) are
pushed to when it is available, without spending an attempt. No replayer exception, and
no exception of ``on_review``, ever stops the processor.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import traceback as tb
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

import structlog

from synckit import tracing
from synckit.clock import utcnow
from synckit.dlq.outcomes import OUTCOMES, SKIP_WAIT, Outcome, ReplayResult, Verdict, record
from synckit.errors.classify import classify
from synckit.errors.dlq_policy import REVIEW_CLASSES, UniformSource, next_retry_delay
from synckit.errors.exceptions import (
    ConfigurationError,
    JobNotFound,
    JobStateError,
    Unreplayable,
)
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.store.db import Conn, Database
from synckit.store.dead_letters import reads as store_reads
from synckit.store.dead_letters import replay as store
from synckit.store.dead_letters.replay import ReplayError
from synckit.store.dead_letters.rows import DeadLetter, DlqFilter
from synckit.store.jobs import admin
from synckit.store.leases import new_lease

__all__ = [
    "DLQ_REPLAY_KIND",
    "Plan",
    "RecordReplayApp",
    "ReplayProcessor",
    "ReplaySummary",
    "Replayer",
    "Replayers",
    "app_record_replayer",
    "register_dlq_replay",
    "replayers_from_app",
]

log = structlog.get_logger("synckit.dlq")

#: A replayer re-runs one dead letter; returning means success, raising means failure.
Replayer = Callable[[DeadLetter], Awaitable[None]]
OnReview = Callable[[str, str, int], object]
DLQ_REPLAY_KIND = "synckit.dlq_replay"


class Replayers:
    """Replayers by row kind: exact kinds, then the longest matching prefix.

    >>> replayers = Replayers()
    >>> replayers.register_prefix("record:", replay_record)  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._exact: dict[str, Replayer] = {}
        self._prefixes: dict[str, Replayer] = {}

    def register(self, kind: str, fn: Replayer) -> None:
        """Replay rows of exactly ``kind`` with ``fn`` (a job kind, say)."""
        self._exact[kind] = fn

    def register_prefix(self, prefix: str, fn: Replayer) -> None:
        """Replay rows whose kind starts with ``prefix`` (``"record:"``) with ``fn``."""
        self._prefixes[prefix] = fn

    def lookup(self, kind: str) -> Replayer | None:
        if kind in self._exact:
            return self._exact[kind]
        best = max((p for p in self._prefixes if kind.startswith(p)), key=len, default=None)
        return None if best is None else self._prefixes[best]

    def __bool__(self) -> bool:
        return bool(self._exact or self._prefixes)


class RecordReplayApp(Protocol):
    """An application that can re-run one captured record (the connectors' ``App``)."""

    def replay_record(
        self, db: Database, tenant: str, connector: str, kind: str, payload: Any
    ) -> Awaitable[None]: ...


def app_record_replayer(app: RecordReplayApp, db: Database) -> Replayer:
    """A replayer for ``record:`` rows that calls ``app.replay_record(db, tenant, ...)``."""

    async def replay(row: DeadLetter) -> None:
        await app.replay_record(db, row.tenant, row.connector, row.kind, row.payload)

    return replay


def replayers_from_app(app: object, db: Database) -> tuple[Replayers, Registry | None]:
    """The replayers and job registry an application object offers.

    ``app`` may be a :class:`Replayers`, a job :class:`Registry`, or an object with
    ``replay_record`` (registered for ``record:`` rows) and optionally ``replayers``
    (a :class:`Replayers`) and ``registry`` (a job :class:`Registry`) attributes.
    """
    if isinstance(app, Replayers):
        return app, None
    if isinstance(app, Registry):
        return Replayers(), app
    replayers = getattr(app, "replayers", None)
    if not isinstance(replayers, Replayers):
        replayers = Replayers()
    if callable(getattr(app, "replay_record", None)) and replayers.lookup("record:") is None:
        replayers.register_prefix("record:", app_record_replayer(app, db))  # type: ignore[arg-type]
    webhook = getattr(app, "replay_webhook", None)
    if callable(webhook) and replayers.lookup("webhook:") is None:

        async def replay_webhook(row: DeadLetter) -> None:
            await webhook(db, row.payload)

        replayers.register_prefix("webhook:", replay_webhook)
    registry = getattr(app, "registry", None)
    return replayers, registry if isinstance(registry, Registry) else None


@dataclass(frozen=True)
class Plan:
    """What replaying a row will do: ``replayer``, ``job`` (re-run the dead job),
    ``ignore`` (cannot be replayed, ``reason`` says why) or ``skip`` (leave it alone)."""

    action: Literal["replayer", "job", "ignore", "skip"]
    reason: str = ""
    replayer: Replayer | None = None

    def describe(self) -> str:
        return {
            "replayer": "replay",
            "job": "re-run job",
            "ignore": f"ignore: {self.reason}",
            "skip": f"skip: {self.reason}",
        }[self.action]


@dataclass(frozen=True)
class ReplaySummary:
    """Counts of one run. ``reviews`` counts the rows sent to review per
    ``(tenant, error_class)``; ``reasons`` counts ``(outcome, reason)`` for rows that were
    ignored, skipped, deferred or blocked (left as they were: the replay cannot run
    because of configuration, see :class:`ReplayBlocked`), and for rows resolved without
    a replay of their own (a dead job put back in the queue, one that succeeded since).

    ``not_rerun`` counts rows resolved although this replay ran nothing, each with its
    reason: the job succeeded since, is already queued again, or another unfinished job
    holds its unique key (a dead poll cycle whose stream's next cycle is queued: that
    cycle carries on from the checkpoint)."""

    claimed: int = 0
    resolved: int = 0
    not_rerun: int = 0
    retry: int = 0
    review: int = 0
    ignored: int = 0
    deferred: int = 0
    skipped: int = 0
    blocked: int = 0
    reviews: dict[tuple[str, str], int] = field(default_factory=dict)
    reasons: dict[tuple[str, str], int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("claimed", *OUTCOMES)}

    def __add__(self, other: ReplaySummary) -> ReplaySummary:
        reviews = Counter(self.reviews)
        reviews.update(other.reviews)
        reasons = Counter(self.reasons)
        reasons.update(other.reasons)
        return ReplaySummary(
            **{k: getattr(self, k) + getattr(other, k) for k in self.counts()},
            reviews=dict(reviews),
            reasons=dict(reasons),
        )


def _job_id(row: DeadLetter) -> int | None:
    if row.job_id is not None:
        return row.job_id
    _, _, tail = row.record_id.partition(":")
    return int(tail) if tail.isdigit() else None


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not break the processor
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ReplayProcessor:
    """Replays due dead letters; see the module docstring for what it guarantees.

    ``max_attempts`` replays per row before review; ``batch`` rows are leased at a time
    and replayed ``concurrency`` at once, each within ``timeout`` seconds. The lease of a
    batch covers its worst case (default: ``timeout * ceil(batch / concurrency)`` plus a
    minute). ``missing_replayer="skip"`` leaves rows that have no replayer alone (the
    CLI without ``--app``) instead of ignoring them. ``registry``, when given, is the job
    registry whose kinds dead jobs may be re-run as.
    """

    def __init__(
        self,
        db: Database,
        replayers: Replayers | None = None,
        *,
        registry: Registry | None = None,
        max_attempts: int = 10,
        batch: int = 100,
        concurrency: int = 16,
        timeout: float = 60.0,
        lease: timedelta | None = None,
        rng: UniformSource | None = None,
        clock: Callable[[], datetime] = utcnow,
        on_review: OnReview | None = None,
        missing_replayer: Literal["ignore", "skip"] = "ignore",
        skip_reason: str = "no replayer for this kind",
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if batch < 1 or concurrency < 1 or timeout <= 0:
            raise ValueError("batch, concurrency and timeout must be positive")
        self.db = db
        self.replayers = replayers or Replayers()
        self.registry = registry
        self.max_attempts = max_attempts
        self.batch = batch
        self.concurrency = concurrency
        self.timeout = timeout
        self.lease = lease or timedelta(seconds=timeout * math.ceil(batch / concurrency) + 60.0)
        self.rng: UniformSource = rng or random.Random()
        self.clock = clock
        self.on_review = on_review
        self.missing_replayer = missing_replayer
        self.skip_reason = skip_reason

    # --- deciding ---------------------------------------------------------------------

    def plan(self, row: DeadLetter) -> Plan:
        """What replaying ``row`` would do (pure: no I/O)."""
        if row.payload_error is not None:
            return Plan("ignore", f"payload does not parse as JSON ({row.payload_error})")
        if row.kind.startswith("record:") and not isinstance(row.payload, dict):
            return Plan("ignore", f"payload is not a JSON object ({type(row.payload).__name__})")
        fn = self.replayers.lookup(row.kind)
        if fn is not None:
            return Plan("replayer", replayer=fn)
        if row.is_job:
            if _job_id(row) is None:
                return Plan("ignore", f"record id {row.record_id!r} does not name a job")
            if self.registry is not None and self.registry.get(row.kind) is None:
                return Plan("ignore", f"no handler registered for job kind {row.kind!r}")
            return Plan("job")
        if self.missing_replayer == "skip":
            return Plan("skip", self.skip_reason)
        return Plan("ignore", f"no replayer registered for kind {row.kind!r}")

    # --- running ----------------------------------------------------------------------

    async def run_once(self, limit: int = 500) -> ReplaySummary:
        """Replay up to ``limit`` due rows, a batch at a time, and return what happened."""
        total = ReplaySummary()
        first = True
        while total.claimed < limit:
            now = self.clock()
            lease = new_lease(self.lease, now=now)
            async with self.db.begin() as conn:
                if first:
                    await store.schedule_unscheduled(conn, now)
                    first = False
                rows = await store.claim_due(
                    conn, now=now, limit=min(self.batch, limit - total.claimed), lease=lease
                )
                claimed = len(rows)
                rows, deferred = await self._defer_waiting(conn, rows, lease.token, now)
            if not claimed:
                break
            total += _summary_of(deferred) + await self._process(rows, lease.token, automatic=True)
        self._alert(total)
        return total

    async def replay_ids(
        self, ids: Sequence[int], *, progress: Callable[[ReplayResult], None] | None = None
    ) -> ReplaySummary:
        """Replay the rows ``ids`` now, whenever they were due (pending or review rows)."""
        return await self.replay_matching(DlqFilter(ids=tuple(ids)), progress=progress)

    async def replay_matching(
        self, flt: DlqFilter, *, progress: Callable[[ReplayResult], None] | None = None
    ) -> ReplaySummary:
        """Replay every pending or review row matching ``flt`` now (an operator's replay).

        Rows are streamed, leased and replayed a batch at a time, as :meth:`run_once`
        does; a row another processor holds is left to it (counted as skipped).
        """
        total = ReplaySummary()
        listed: list[DeadLetter] = []
        async for row in store_reads.iter_rows(self.db, flt.narrowed(("pending", "review"))):
            plan = self.plan(row)
            if plan.action == "skip":
                total += self._report([_result(row, "skipped", plan.reason)], progress)
                continue
            listed.append(row)
            if len(listed) >= self.batch:
                total += await self._manual_batch(listed, progress)
                listed = []
        if listed:
            total += await self._manual_batch(listed, progress)
        self._alert(total)
        return total

    async def preview(self, flt: DlqFilter) -> AsyncIterator[tuple[DeadLetter, Plan]]:
        """Each pending or review row matching ``flt`` with its plan; changes nothing."""
        async for row in store_reads.iter_rows(self.db, flt.narrowed(("pending", "review"))):
            yield row, self.plan(row)

    async def _manual_batch(
        self, listed: list[DeadLetter], progress: Callable[[ReplayResult], None] | None
    ) -> ReplaySummary:
        now = self.clock()
        lease = new_lease(self.lease, now=now)
        async with self.db.begin() as conn:
            claimed = await store.claim_ids(conn, [r.id for r in listed], now=now, lease=lease)
            rows, deferred = await self._defer_waiting(conn, claimed, lease.token, now)
        got = {r.id for r in claimed}
        missed = [
            _result(r, "skipped", "held by another replay, or no longer pending or in review")
            for r in listed
            if r.id not in got
        ]
        summary = self._report([*missed, *deferred], progress)
        originals = {r.id: r for r in listed}
        return summary + await self._process(
            rows, lease.token, automatic=False, progress=progress, originals=originals
        )

    @staticmethod
    def _report(
        results: list[ReplayResult], progress: Callable[[ReplayResult], None] | None
    ) -> ReplaySummary:
        if progress is not None:
            for r in results:
                progress(r)
        return _summary_of(results)

    async def _defer_waiting(
        self, conn: Conn, rows: list[DeadLetter], token: str, now: datetime
    ) -> tuple[list[DeadLetter], list[ReplayResult]]:
        """Push rows whose resource waits to when it is available, without spending an
        attempt; return the rows to replay and the deferred ones' results."""
        waits = await store.resource_waits(
            conn, [r.resource_key for r in rows if r.resource_key], now
        )
        if not waits:
            return rows, []
        keep: list[DeadLetter] = []
        by_key: dict[str, list[DeadLetter]] = {}
        for r in rows:
            if r.resource_key is not None and r.resource_key in waits:
                by_key.setdefault(r.resource_key, []).append(r)
            else:
                keep.append(r)
        deferred: list[ReplayResult] = []
        for key, group in by_key.items():
            until, why = waits[key]
            reason = f"waiting: {why} until {until.isoformat(timespec='seconds')}"
            hit = set(
                await store.defer(
                    conn, [r.id for r in group], until=until, reason=reason, token=token
                )
            )
            deferred += [_result(r, "deferred", f"waiting: {why}") for r in group if r.id in hit]
        return keep, deferred

    async def _process(
        self,
        rows: list[DeadLetter],
        token: str,
        *,
        automatic: bool,
        progress: Callable[[ReplayResult], None] | None = None,
        originals: dict[int, DeadLetter] | None = None,
    ) -> ReplaySummary:
        if not rows:
            return ReplaySummary()
        gate = asyncio.Semaphore(self.concurrency)

        async def one(row: DeadLetter) -> Verdict:
            async with gate:
                return await self._replay_one(row, automatic=automatic)

        done = await asyncio.gather(*(one(r) for r in rows))
        results = await record(
            self.db, list(done), token=token, originals=originals or {}, now=self.clock()
        )
        if progress is not None:
            for r in results:
                progress(r)
        return _summary_of(results)

    async def _replay_one(self, row: DeadLetter, *, automatic: bool) -> Verdict:
        with tracing.span(
            "synckit.dlq.replay",
            synckit__tenant=row.tenant,
            synckit__connector=row.connector,
            synckit__dlq__id=row.id,
            synckit__dlq__kind=row.kind,
            synckit__dlq__record_id=row.record_id,
            synckit__dlq__replay_attempt=row.replay_attempts + 1,
            synckit__dlq__automatic=automatic,
        ) as span:
            done = await self._replay_one_bare(row, automatic=automatic)
            if span is not None:
                tracing.set_attributes(
                    span,
                    synckit__dlq__action=done.action,
                    synckit__dlq__reason=done.reason,
                    synckit__error_class=done.error.error_class if done.error else None,
                )
            return done

    async def _replay_one_bare(self, row: DeadLetter, *, automatic: bool) -> Verdict:
        now = self.clock()
        if automatic and row.replay_attempts >= self.max_attempts:
            # Its replays were spent before it came due (a re-run job that died again, or
            # a lowered limit): straight to review, not one replay more.
            return Verdict(
                row,
                "review",
                f"replay attempts exhausted ({row.replay_attempts}/{self.max_attempts})",
                replayed=False,
            )
        plan = self.plan(row)
        if plan.action == "ignore":
            return Verdict(row, "ignore", plan.reason, replayed=False)
        if plan.action == "skip":
            return Verdict(row, "skip", plan.reason, next_retry_at=now + SKIP_WAIT, replayed=False)
        try:
            async with asyncio.timeout(self.timeout):
                if plan.action == "job":
                    return await self._rerun_job(row)
                assert plan.replayer is not None
                await plan.replayer(row)
            return Verdict(row, "resolve", "replayed")
        except Unreplayable as exc:
            return Verdict(row, "ignore", f"unreplayable: {exc.reason}")
        except ConfigurationError as exc:
            # The environment, not the row: leave the row as it was.
            return Verdict(row, "blocked", f"cannot replay here: {exc}", replayed=False)
        except TimeoutError as exc:
            if isinstance(exc.__context__, asyncio.CancelledError):
                exc = TimeoutError(f"replay exceeded its {self.timeout:g}s timeout")
            return self._failed(row, exc, tb.format_exc(limit=30))
        except Exception as exc:  # a replayer must never kill the processor
            return self._failed(row, exc, tb.format_exc(limit=30))

    def _failed(self, row: DeadLetter, exc: BaseException, trace: str) -> Verdict:
        now = self.clock()
        c = classify(exc=exc, now=now)
        cls = c.error_class.value
        error = ReplayError(cls, _describe(exc), trace)
        attempts = row.replay_attempts + 1
        if cls in REVIEW_CLASSES:
            return Verdict(row, "review", f"{cls} error on replay: {c.reason}", error)
        if attempts >= self.max_attempts:
            return Verdict(
                row, "review", f"replay failed {attempts} times; last: {c.reason}", error
            )
        delay = next_retry_delay(attempts, self.rng)
        if c.retry_after is not None and c.retry_after > delay:
            delay = c.retry_after
        return Verdict(row, "retry", c.reason, error, next_retry_at=now + delay)

    async def _rerun_job(self, row: DeadLetter) -> Verdict:
        job_id = _job_id(row)
        assert job_id is not None  # plan() checked
        try:
            info = await admin.get_job(self.db, job_id)
        except JobNotFound:
            info = None
        if info is None or info.kind != row.kind:
            # Pruned (or, on SQLite, its id reused): enqueue a copy in the recording
            # transaction, atomically with resolving this row.
            return Verdict(row, "enqueue", "re-enqueued")
        follow_up = self.clock() + next_retry_delay(row.replay_attempts + 1, self.rng)
        if info.status == "dead":
            holder = await self._key_holder(info)
            if holder is not None:
                # Re-running it would break the key's one-unfinished-job rule; the holder
                # is the same work, queued already (a poll cycle's next cycle, say).
                return Verdict(
                    row,
                    "not_rerun",
                    f"not re-run: job {holder.id} ({holder.status}) holds its unique key "
                    f"{info.unique_key!r} and does this work",
                    replayed=False,
                )
            try:
                await admin.retry_job(self.db, job_id)
            except JobNotFound:
                return Verdict(row, "enqueue", "re-enqueued")
            except JobStateError as exc:
                # Changed meanwhile (a holder appeared, say): nothing ran, the row waits.
                wait = self.clock() + SKIP_WAIT
                return Verdict(row, "skip", f"job {job_id} not re-run: {exc}", None, wait)
            return Verdict(row, "resolve_job", f"job {job_id} re-run", None, follow_up)
        if info.status in ("pending", "running"):
            return Verdict(
                row,
                "not_rerun",
                f"not re-run: job {job_id} is already {info.status} again",
                None,
                follow_up,
                replayed=False,
            )
        if info.status == "succeeded":
            return Verdict(
                row, "not_rerun", f"not re-run: job {job_id} has succeeded since", replayed=False
            )
        return Verdict(row, "ignore", f"job {job_id} was {info.status}")

    async def _key_holder(self, info: admin.JobInfo) -> admin.JobInfo | None:
        """The unfinished job, other than this one, that holds ``info``'s unique key."""
        if info.unique_key is None:
            return None
        holder = await admin.unfinished_with_key(self.db, info.unique_key)
        return holder if holder is not None and holder.id != info.id else None

    def _alert(self, summary: ReplaySummary) -> None:
        for (tenant, error_class), n in sorted(summary.reviews.items()):
            log.warning("dlq.review", tenant=tenant, error_class=error_class, count=n)
            if self.on_review is not None:
                try:
                    outcome = self.on_review(tenant, error_class, n)
                    if asyncio.iscoroutine(outcome):
                        outcome.close()
                        raise TypeError("on_review must be a plain function, not a coroutine")
                except Exception as exc:  # an alert sink must never stop the replays
                    log.error("dlq.review_callback_failed", error=_describe(exc), exc_info=exc)


def _result(row: DeadLetter, outcome: Outcome, reason: str) -> ReplayResult:
    return ReplayResult(row.id, row.tenant, row.kind, outcome, reason)


def _summary_of(results: Sequence[ReplayResult]) -> ReplaySummary:
    counts: Counter[str] = Counter(r.outcome for r in results)
    reviews: Counter[tuple[str, str]] = Counter(
        (r.tenant, r.error_class or "unknown") for r in results if r.outcome == "review"
    )
    reasons: Counter[tuple[str, str]] = Counter(
        (r.outcome, r.reason)
        for r in results
        if r.outcome in ("not_rerun", "ignored", "skipped", "deferred", "blocked")
        or (r.outcome == "resolved" and r.reason not in ("", "replayed"))
    )
    return ReplaySummary(
        claimed=len(results),
        reviews=dict(reviews),
        reasons=dict(reasons),
        **{o: counts.get(o, 0) for o in OUTCOMES},
    )


def register_dlq_replay(
    registry: Registry,
    processor_factory: Callable[[], ReplayProcessor | Awaitable[ReplayProcessor]],
    every: timedelta = timedelta(minutes=1),
    *,
    limit: int = 500,
    timeout: float = 600.0,
) -> None:
    """Run the DLQ replay processor every ``every`` as the recurring job ``synckit.dlq_replay``.

    ``processor_factory`` is called at each run (return one shared processor if you like);
    it may be a coroutine function, for processors that need the worker's database.
    A run that fails is logged (``dlq.replay_failed``) and not retried: the next tick is
    the retry, and no row is lost meanwhile (leases simply expire).
    """

    async def dlq_replay(ctx: JobContext) -> None:
        try:
            made = processor_factory()
            processor = await made if inspect.isawaitable(made) else made
            summary = await processor.run_once(limit)
        except Exception as exc:  # the next tick retries; a dead sweep job helps nobody
            ctx.log.error("dlq.replay_failed", error=_describe(exc), exc_info=exc)
            return
        if summary.claimed:
            ctx.log.info("dlq.replay_run", **summary.counts())

    registry.add(DLQ_REPLAY_KIND, dlq_replay, timeout=timeout)
    registry.recurring(DLQ_REPLAY_KIND, DLQ_REPLAY_KIND, every=every)
