"""Poll cycles and the scheduler that starts them.

A *poll cycle* is a job (kind ``synckit.poll``) for one tenant and stream. It reads the
stored checkpoint, iterates the connector's ``poll()`` pages and runs ``handle()`` on
every record of a page, a few at once, each isolated from the others. After each page,
one synchronous transaction commits (:meth:`~synckit.store.db.Database.write`: one hop
to SQLite's writer thread, ``run_sync`` on PostgreSQL, statements built once):

* the page's checkpoint (unless the stream's ``hold`` policy stops before a failure),
* a ``dead_letters`` row per failed record, one row per (tenant, connector,
  ``record:<stream>``, record id): a record failing again updates its row (attempt
  count, last error, history) instead of adding one; validation and authorization
  failures wait for ``review``, the rest are ``pending`` for replay a minute later,
* ``resolved`` on the dead letters of records that succeeded this time (so a replay
  never overwrites newer data with an old payload); skipped while the stream has no open
  dead letter (looked up once, when the cycle reads its checkpoint),
* the audit counts of the page (:func:`synckit.store.audit.record_audit_sync`),
* and, for a cycle run as a job, a check that the job still holds its claim (a cycle
  whose lease was rescued must not move a checkpoint another cycle now owns).

A crash therefore re-processes at most the page it interrupted. Errors about the whole
API abort the cycle without committing the page: anything ``poll()`` raises, and
:class:`~synckit.errors.exceptions.RateLimited` /
:class:`~synckit.errors.exceptions.NeedsReauth` (or a database outage) raised by
``handle()``; the job then fails and is retried by the worker's rules, which pace the
resource. Any other exception of ``handle()`` fails that record only. A rate limit
spends no attempt (the cycle is rescheduled for when the resource is available and
resumes from its last committed page), and neither does a failure after a committed
page: a cycle is given up only after ``POLL_MAX_ATTEMPTS`` attempts that committed
nothing.

The *scheduler* (a recurring job, kind ``synckit.schedule``) keeps one tick per tenant and
stream in ``cron_ticks`` (named ``poll:<tenant>:<stream>``, beside the recurring jobs'
own ticks) and, for every due tick of an active tenant, advances the tick with a
compare-and-set and enqueues the cycle in the same transaction, with unique key
``poll:<tenant>:<stream>`` (never two unfinished cycles for one pair) and the tenant's
resource key (breakers, pacing and ``max_in_flight`` apply to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import traceback as tb
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import structlog

from synckit import tracing
from synckit.clock import utcnow
from synckit.connectors.base import Connector, Page, Stream
from synckit.connectors.records import Records, key_from_raw
from synckit.errors.classify import Classification, classify
from synckit.errors.exceptions import (
    Cancel,
    ConfigurationError,
    DatabaseError,
    NeedsReauth,
    RateLimited,
)
from synckit.runtime.observe.instruments import record_records
from synckit.runtime.observe.logging import redact_text
from synckit.runtime.sync.page_commit import (
    _KEEP,
    RecordFailure,
    _commit_page,
    _commit_pages,
    _PageCommit,
    dead_letter_records,
)
from synckit.runtime.sync.records import Landing, land, prepare
from synckit.runtime.sync.records import destination as records_destination
from synckit.store import checkpoints
from synckit.store.audit import record_audit_sync
from synckit.store.checkpoints import (
    CycleStart,
    save_checkpoint,
)
from synckit.store.db import Database, SyncConn
from synckit.store.jobs._base import ClaimedJob
from synckit.store.records import schema as record_schema

if TYPE_CHECKING:
    from synckit.connectors.context import SyncContext

__all__ = [
    "POLL_KIND",
    "SCHEDULE_KIND",
    "CycleResult",
    "poll_key",
    "read_cycle_start",
    "record_failure",
    "record_id_of",
    "record_kind",
    "run_cycle",
    "stream_of_kind",
]

POLL_KIND = "synckit.poll"
SCHEDULE_KIND = "synckit.schedule"
#: Attempts of one poll job; a cycle that keeps failing is replaced at the next tick.
POLL_MAX_ATTEMPTS = 10
# Errors of handle() that say the API (or synckit's database) cannot be used right now,
# not that this record is bad: they end the cycle, and the page is read again later.
_CYCLE_ERRORS = (RateLimited, NeedsReauth, DatabaseError)

log = structlog.get_logger("synckit.poll")


def record_kind(stream: str) -> str:
    """The ``dead_letters.kind`` of the records of ``stream``."""
    return f"record:{stream}"


def stream_of_kind(kind: str) -> str:
    """The stream of a record dead letter's kind (``record:messages`` -> ``messages``)."""
    if not kind.startswith("record:") or len(kind) == len("record:"):
        raise ConfigurationError(
            f"dead letter kind {kind!r} is not a record kind (record:<stream>)"
        )
    return kind[len("record:") :]


def poll_key(tenant: str, stream: str) -> str:
    """The unique key of a tenant's cycle of ``stream`` (and the name of its tick)."""
    return f"poll:{tenant}:{stream}"


# --- checkpoints ------------------------------------------------------------------------

# What a cycle reads and writes of its stream's checkpoint: synckit.store.checkpoints
# (statements built once; the page's checkpoint and its claim check in one statement).


def read_cycle_start(conn: SyncConn, tenant: str, connector: str, stream: str) -> CycleStart:
    """:class:`CycleStart` of the stream, in the caller's transaction (one statement)."""
    return checkpoints.read_cycle_start(conn, tenant, connector, stream, record_kind(stream))


# --- one cycle --------------------------------------------------------------------------


@dataclass(frozen=True)
class CycleResult:
    """What one cycle did. ``held`` is true when a ``hold`` stream stopped at a failure."""

    tenant: str
    connector: str
    stream: str
    pages: int
    ok: int
    failed: int
    checkpoint: Any
    held: bool = False


@dataclass
class _PageOutcome:
    ok_ids: list[str] = field(default_factory=list)
    failures: list[RecordFailure] = field(default_factory=list)
    abort: BaseException | None = None
    #: The indexes in the page of the records that failed.
    failed_at: set[int] = field(default_factory=set)
    landing: Landing | None = None


def _storable_or_described(value: Any) -> Any:
    """The record as stored in a dead letter: itself when JSON can hold it, else its repr.

    Not a conversion (status's ``_to_json_values`` turns datetimes into text): the stored
    payload and a record's hashed id stay exactly what the connector gave.
    """
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        return {"unserialisable": repr(value)[:10_000]}


def record_id_of(connector: Connector[Any], record: Any) -> str:
    """``connector.record_id(record)``, or a hash of the record when that fails."""
    try:
        rid = connector.record_id(record)
        if isinstance(rid, str) and rid:
            return rid[:500]
    except Exception:  # connector code; a record without an id still gets a stable one
        pass
    text = json.dumps(_storable_or_described(record), sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:40]


def _classification(connector: Connector[Any], exc: BaseException, now: datetime) -> Classification:
    try:
        return connector.classify(None, exc, now)
    except Exception:  # a broken classify() override must not lose the record
        return classify(exc=exc, now=now, rules=connector.classify_rules)


def _failure(
    connector: Connector[Any], rid: str, record: Any, exc: Exception, now: datetime
) -> RecordFailure:
    c = _classification(connector, exc, now)
    text = str(exc)
    # Stored in dead_letters and logged: through the redaction step, here in the cycle's
    # task, where the tenant's own secret values are bound (open_context).
    message = redact_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
    trace = redact_text("".join(tb.format_exception(exc, limit=30)))
    return RecordFailure(
        record_id=rid,
        payload=_storable_or_described(record),
        error_class=c.error_class.value,
        message=message,
        traceback=trace[-20_000:],
    )


def record_failure(
    connector: Connector[Any], rid: str, record: Any, exc: Exception, now: datetime
) -> RecordFailure:
    """One failed record as it goes to the dead-letter queue: classified by the
    connector, its message and traceback redacted (call it where the tenant is bound)."""
    return _failure(connector, rid, record, exc, now)


async def handle_page(
    connector: Connector[Any],
    ctx: SyncContext,
    records: Sequence[Any],
    *,
    concurrency: int,
    clock: Callable[[], datetime] = utcnow,
) -> _PageOutcome:
    """Run ``handle()`` on every record, ``concurrency`` at a time, each isolated."""
    out = _PageOutcome()
    pending = enumerate(records)

    async def lane() -> None:
        for index, record in pending:
            if out.abort is not None:
                return
            rid = record_id_of(connector, record)
            try:
                await connector.handle(ctx.for_record(rid), record)
            except _CYCLE_ERRORS as exc:
                if out.abort is None:
                    out.abort = exc
                return
            except Exception as exc:
                failure = _failure(connector, rid, record, exc, clock())
                out.failures.append(failure)
                out.failed_at.add(index)
                ctx.log.warning(
                    "record.failed",
                    record_id=rid,
                    error_class=failure.error_class,
                    error=failure.message[:300],
                )
            else:
                out.ok_ids.append(rid)

    lanes = min(concurrency, len(records))
    if lanes <= 1:  # nothing to run side by side: no task (an empty page has no lane)
        if records:
            await lane()
        return out
    tasks = [asyncio.create_task(lane()) for _ in range(lanes)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return out


def _prepare_landing(
    connector: Connector[Any],
    ctx: SyncContext,
    decl: Records,
    page: Page,
    outcome: _PageOutcome,
    clock: Callable[[], datetime],
) -> None:
    """Map and validate the page's records for their table (those ``handle()`` did not
    fail); the ones the model refuses join the page's failures."""
    if page.sweep and not decl.sweep:
        raise ConfigurationError(
            f"connector {connector.name!r} stream {ctx.stream!r}: a page asks to sweep, "
            "but the stream's Records do not declare sweep=True"
        )
    records = page.records
    if outcome.failed_at:
        records = [r for i, r in enumerate(records) if i not in outcome.failed_at]

    def failure_of(raw: Any, exc: Exception) -> RecordFailure:
        return _failure(connector, record_id_of(connector, raw), raw, exc, clock())

    landing, failures, failed = prepare(
        decl,
        connector.tenant,
        ctx.stream,
        records,
        failure_of,
        sync=page.full_sync,
        sweep=page.sweep,
    )
    if page.full_sync is not None and outcome.failed_at:
        # Records handle() failed still exist at the API: their rows are not swept.
        seen = (key_from_raw(page.records[i], decl.spec) for i in sorted(outcome.failed_at))
        landing.failed_keys.extend(k for k in seen if k is not None)
    for f in failures:
        ctx.log.warning(
            "record.failed", record_id=f.record_id, error_class=f.error_class, error=f.message[:300]
        )
    outcome.failures.extend(failures)
    if not outcome.failed_at and not outcome.ok_ids:  # handle() did not run: ids here
        bad = set(failed)
        outcome.ok_ids = [record_id_of(connector, r) for i, r in enumerate(records) if i not in bad]
    elif failed:
        gone = {f.record_id for f in failures}
        outcome.ok_ids = [rid for rid in outcome.ok_ids if rid not in gone]
    outcome.landing = landing


def _land_elsewhere(
    conn: SyncConn,
    landing: Landing,
    tenant: str,
    connector: str,
    stream: str,
    cursor: Any,
    hold: bool,
    now: datetime,
    failures: Sequence[RecordFailure],
    ok: int,
) -> None:
    """A page's records in their own database (``Records(database=URL)``), with the
    checkpoint that covers them (:func:`record_schema.save_landing`) and what the
    runtime's commit of the page writes besides (its dead letters and audit counts), in
    one transaction there; a ``hold`` page whose records the database refused keeps the
    checkpoint."""
    land(conn, landing, now)
    if cursor is not _KEEP and not (hold and landing.refused):
        page = {
            "ok": ok - len(landing.refused),
            "failures": [dataclasses.asdict(f) for f in [*failures, *landing.refused]],
        }
        record_schema.save_landing(conn, tenant, connector, stream, cursor, now, page)


async def _landed_checkpoint(
    db: Database,
    far: Database,
    tenant: str,
    connector: str,
    stream: str,
    checkpoint: Any,
    clock: Callable[[], datetime],
) -> tuple[Any, bool]:
    """The checkpoint a cycle of a stream whose records live in another database starts
    from: the one landed there with its rows. When this database's is behind (a crash
    between the two commits), it is brought up to it first, with the dead letters and
    audit counts of that page; and whether there were dead letters."""
    landed, page = await far.run_read(record_schema.read_landing_page, tenant, connector, stream)
    if landed is record_schema.NO_LANDING or landed == checkpoint:
        return checkpoint, False
    failures = [RecordFailure(**f) for f in (page or {}).get("failures", ())]

    def catch_up(conn: SyncConn) -> None:
        # What that page's lost commit wrote: the checkpoint, dead letters, audit counts.
        now = clock()
        save_checkpoint(conn, tenant, connector, stream, landed, now)
        if failures:
            dead_letter_records(
                conn, tenant=tenant, connector=connector, kind=record_kind(stream),
                failures=failures, trace_id=None, job_id=None, resource_key=None, now=now,
            )  # fmt: skip
        record_audit_sync(
            conn, tenant, connector, now, int((page or {}).get("ok", 0)),
            Counter(f.error_class for f in failures),
        )  # fmt: skip

    await db.write(catch_up)
    return landed, bool(failures)


def _check_checkpoint(connector: Connector[Any], stream: str, cursor: Any) -> None:
    try:
        json.dumps(cursor, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"connector {connector.name!r} stream {stream!r}: the checkpoint of a page must "
            f"be JSON-serialisable: {exc}"
        ) from None


async def run_cycle(
    db: Database,
    connector: Connector[Any],
    ctx: SyncContext,
    *,
    job: ClaimedJob | None = None,
    clock: Callable[[], datetime] = utcnow,
    progressed: Callable[[], None] | None = None,
    start: CycleStart | None = None,
) -> CycleResult:
    """Run one poll cycle of ``ctx.stream`` for ``connector``'s tenant (see the module doc).

    ``job`` is the poll job running it, whose claim is checked at every page commit
    (:class:`~synckit.errors.exceptions.Cancel` if it was lost); None outside the queue.
    ``progressed`` is called after each committed page (the job's
    :meth:`~synckit.runtime.jobs.handlers.JobContext.progressed`: committed pages are progress,
    so a cycle failing after them does not spend an attempt). ``start`` is the stream's
    :func:`read_cycle_start`, when the caller read it with the tenant; read here if None.
    """
    with tracing.span(
        f"synckit.poll {ctx.stream}",
        synckit__tenant=connector.tenant,
        synckit__connector=connector.name,
        synckit__stream=ctx.stream,
        synckit__job__id=job.id if job is not None else None,
    ) as span:
        result = await _run_cycle(
            db, connector, ctx, job=job, clock=clock, progressed=progressed, start=start
        )
        tracing.set_attributes(
            span,
            synckit__pages=result.pages,
            synckit__records=result.ok,
            synckit__failed=result.failed,
            synckit__held=result.held,
        )
        return result


async def _run_cycle(
    db: Database,
    connector: Connector[Any],
    ctx: SyncContext,
    *,
    job: ClaimedJob | None,
    clock: Callable[[], datetime],
    progressed: Callable[[], None] | None,
    start: CycleStart | None,
) -> CycleResult:
    cls = type(connector)
    stream = cls.stream(ctx.stream)
    tenant, name = connector.tenant, connector.name
    if start is None:
        start = await db.write(read_cycle_start, tenant, name, stream.name)
    checkpoint = start.checkpoint
    far = records_destination(stream.records) if stream.records is not None else None
    caught_up = False
    if far is not None:
        checkpoint, caught_up = await _landed_checkpoint(
            db, far, tenant, name, stream.name, checkpoint, clock
        )
    source = connector.poll(ctx, checkpoint)
    if not hasattr(source, "__anext__"):
        raise ConfigurationError(
            f"connector {name!r}: poll() must be an async generator yielding Page objects, "
            f"it returned {type(source).__name__}"
        )
    cycle = _Cycle(
        db, connector, ctx, stream, job=job, clock=clock, progressed=progressed, far=far,
        checkpoint=checkpoint, open_dead_letters=start.open_dead_letters or caught_up,
    )  # fmt: skip
    await cycle.run(source)
    # One line per cycle at info, when it ends (poll.finished says where it started): two
    # were ~8% of a trivial cycle's CPU.
    ctx.log.info(
        "poll.finished",
        pages_from=_short(checkpoint),
        pages=cycle.pages,
        ok=cycle.ok,
        failed=cycle.failed,
        held=cycle.held,
    )
    return CycleResult(
        tenant, name, stream.name, cycle.pages, cycle.ok, cycle.failed, cycle.checkpoint,
        cycle.held,
    )  # fmt: skip


class _Cycle:
    """One cycle's pages: each handled, then committed with its checkpoint, and counted
    (the rest of the cycle reads what is counted: the checkpoint, whether dead letters
    are open, whether the stream is held)."""

    def __init__(
        self,
        db: Database,
        connector: Connector[Any],
        ctx: SyncContext,
        stream: Stream,
        *,
        job: ClaimedJob | None,
        clock: Callable[[], datetime],
        progressed: Callable[[], None] | None,
        far: Database | None,
        checkpoint: Any,
        open_dead_letters: bool,
    ) -> None:
        self.db, self.connector, self.ctx, self.stream = db, connector, ctx, stream
        self.job, self.clock, self.progressed, self.far = job, clock, progressed, far
        self.cls = type(connector)
        self.tenant, self.name = connector.tenant, connector.name
        self.kind = record_kind(stream.name)
        self.concurrency = stream.concurrency or self.cls.record_concurrency
        self.checkpoint = self.started_from = checkpoint
        # Open dead letters of this stream appear only through its own cycles (one at a
        # time, by its unique key; a cycle that lost its claim commits nothing), so one
        # look at the start, kept true once a page dead-letters a record, tells whether a
        # page has any to resolve: most pages of most streams then skip that statement.
        self.open_dead_letters = open_dead_letters
        self.pages = self.ok = self.failed = 0
        self.held = False
        # A hold stream's page whose records the database refused (known once committed).
        self.held_by_db = False

    async def run(self, source: Any) -> None:
        """Every page of ``source``, to its end or the first held page.

        A page's commit waits its turn at the database (SQLite's one writer; a group on
        PostgreSQL): it was the longest part of a page (~100 ms of ~190 in bench.sync's
        declared run). So the commit runs in a task of its own while the connector fetches
        the next page here (the connector's code stays in the job's task and context), and
        that page is handled only once the commit is done: records are still handled after
        every page before theirs committed, and nothing is handled past a failed commit.
        """
        committing: asyncio.Task[None] | None = None
        try:
            async for page in source:
                if committing is not None:
                    done, committing = committing, None
                    await done
                if self.held_by_db:
                    self.held = True
                    break
                committing = await self._page(page)
                if committing is None:
                    self.held = True
                    break
            if committing is not None:
                done, committing = committing, None
                await done
            self.held = self.held or self.held_by_db
        except asyncio.CancelledError:
            if committing is not None:
                committing.cancel()  # a cancelled cycle commits nothing more
            raise
        finally:
            if committing is not None:
                # The fetch failed while the last page committed: that commit still counts
                # when it succeeds (committed pages are progress); the fetch's error is
                # the cycle's.
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await committing
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _page(self, page: Any) -> asyncio.Task[None] | None:
        """Handle ``page`` and start its commit (the task); None once it was held, its
        commit done."""
        if not isinstance(page, Page):
            raise ConfigurationError(
                f"connector {self.name!r}: poll() yielded {type(page).__name__}, not a Page"
            )
        # The page's span: its records handled, then its commit (ended there).
        page_span = tracing.start(
            "synckit.page", synckit__page=self.pages + 1, synckit__stream=self.stream.name
        )
        try:
            with tracing.use(page_span):
                outcome, cursor, advance = await self._handled(page)
        except BaseException as exc:
            tracing.end(page_span, exc)
            raise
        if not advance:
            await self.commit(outcome, cursor, advance, page_span)
            tracing.end(page_span)
            return None
        committing = asyncio.create_task(self.commit(outcome, cursor, advance, page_span))
        if page_span is not None:
            committing.add_done_callback(tracing.ender(page_span))
        return committing

    async def commit(
        self, outcome: _PageOutcome, cursor: Any, advance: bool, span: Any = None
    ) -> None:
        """Commit one handled page, then count it. ``span`` is the page's (tracing on),
        ended here."""
        if span is None:
            return await self._commit(outcome, cursor, advance)
        with tracing.use(span):
            await self._commit(outcome, cursor, advance)
            tracing.set_attributes(
                span,
                synckit__records=len(outcome.ok_ids),
                synckit__failed=len(outcome.failures),
                synckit__checkpoint__committed=cursor is not _KEEP,
            )

    async def _commit(self, outcome: _PageOutcome, cursor: Any, advance: bool) -> None:
        landed = False
        stream = self.stream
        if self.far is not None and outcome.landing is not None:
            # Records in another database: their transaction there, with the checkpoint
            # that covers them, commits first; then this database's (checkpoint, dead
            # letters, audit). A crash between leaves that one ahead: the next cycle starts
            # from it (_landed_checkpoint), so no page lands twice or is skipped.
            await self.far.write(
                _land_elsewhere, outcome.landing, self.tenant, self.name, stream.name,
                cursor, stream.policy == "hold", self.clock(), outcome.failures,
                len(outcome.ok_ids),
            )  # fmt: skip
            landed = True
            if outcome.landing.refused and stream.policy == "hold":
                cursor, advance = _KEEP, False
        failed_ids = {f.record_id for f in outcome.failures}
        # A record twice in one page that failed once stays failed.
        succeeded = [rid for rid in outcome.ok_ids if rid not in failed_ids]
        capture = (
            tracing.span(
                "synckit.dlq.capture",
                synckit__tenant=self.tenant,
                synckit__connector=self.name,
                synckit__stream=stream.name,
                synckit__records=len(outcome.failures),
                synckit__error_class=sorted({f.error_class for f in outcome.failures}),
            )
            if outcome.failures
            else tracing.NULL
        )
        with capture:
            committed = await self._write(outcome, cursor, succeeded, landed)
        if not committed:
            assert self.job is not None
            raise Cancel(f"poll job {self.job.id} lost its claim; the page is not committed")
        self._counted(outcome, cursor, advance)

    async def _write(
        self, outcome: _PageOutcome, cursor: Any, succeeded: list[str], landed: bool
    ) -> bool:
        """One synchronous transaction, one hop to the database (SQLite's writer thread,
        run_sync on PostgreSQL): the write lock is held for the statements only, not for
        a thread round trip per statement. Pages of cycles committing together share a
        transaction on either engine (Database.write_grouped)."""
        return await self.db.write_grouped(
            _commit_page,
            _PageCommit(
                tenant=self.tenant,
                connector=self.name,
                stream=self.stream.name,
                kind=self.kind,
                job=self.job,
                cursor=cursor,
                failures=outcome.failures,
                succeeded=succeeded,
                resolve=self.open_dead_letters,
                ok=len(outcome.ok_ids),
                trace_id=self.ctx.trace_id,
                resource_key=self.ctx.resource_key,
                now=self.clock(),
                landing=outcome.landing,
                hold=self.stream.policy == "hold",
                landed=landed,
            ),
            # Every group locks the tenants' audit buckets in one order.
            order=(self.tenant, self.name),
            many=_commit_pages,
        )

    def _counted(self, outcome: _PageOutcome, cursor: Any, advance: bool) -> None:
        if outcome.landing is not None and outcome.landing.refused:
            # Records the database refused as the page landed: dead letters now too.
            refused = outcome.landing.refused
            outcome.failures.extend(refused)
            gone = {f.record_id for f in refused}
            outcome.ok_ids = [rid for rid in outcome.ok_ids if rid not in gone]
            if self.stream.policy == "hold":  # the checkpoint stayed (_commit_page)
                cursor, advance = _KEEP, False
                self.held_by_db = True
        self.open_dead_letters = self.open_dead_letters or bool(outcome.failures)
        self.pages += 1
        if self.progressed is not None:
            self.progressed()
        self.ok += len(outcome.ok_ids)
        self.failed += len(outcome.failures)
        record_records(self.name, self.stream.name, len(outcome.ok_ids), len(outcome.failures))
        if cursor is not _KEEP:
            self.checkpoint = cursor
        self.ctx.log.debug(
            "poll.page_committed",
            page=self.pages,
            ok=len(outcome.ok_ids),
            failed=len(outcome.failures),
        )
        if not advance:
            self.ctx.log.warning(
                "poll.held",
                page=self.pages,
                failed=len(outcome.failures),
                reason="hold policy: the checkpoint stays before the first failed page",
            )

    async def _handled(self, page: Page) -> tuple[_PageOutcome, Any, bool]:
        """Handle a page's records: its outcome, the cursor to commit, whether the
        checkpoint advances."""
        connector, ctx, stream = self.connector, self.ctx, self.stream
        if stream.records is None or self.cls.handles():
            outcome = await handle_page(
                connector, ctx, page.records, concurrency=self.concurrency, clock=self.clock
            )
        else:  # records as data: nothing to run per record
            outcome = _PageOutcome()
        if stream.records is not None and outcome.abort is None:
            _prepare_landing(connector, ctx, stream.records, page, outcome, self.clock)
        if outcome.abort is not None:
            ctx.log.warning(
                "poll.aborted",
                pages_from=_short(self.started_from),
                page=self.pages + 1,
                error=str(outcome.abort)[:300],
                error_type=type(outcome.abort).__name__,
            )
            raise outcome.abort
        advance = not (outcome.failures and stream.policy == "hold")
        cursor = page.checkpoint if advance and page.checkpoint is not None else _KEEP
        if cursor is not _KEEP:
            _check_checkpoint(connector, stream.name, cursor)
        return outcome, cursor, advance


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except ValueError:  # a circular value (a checkpoint is checked when stored, not here)
        text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
