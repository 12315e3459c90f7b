"""What commits with a page of a poll cycle, in one transaction: its checkpoint (fenced by
the cycle job's claim), its records landed in their declared table, its failed records as
dead letters (the DLQ's one capture) and those that now succeed resolved, and the audit
counts. Pages of cycles committing together share a transaction (:func:`_commit_pages`,
``Database.write_grouped``); the cycle itself is :mod:`synckit.runtime.sync.poll`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from synckit.runtime.sync.records import Landing, land
from synckit.store import checkpoints
from synckit.store.audit import AuditCounts, minute_of, record_audit_many_sync, record_audit_sync
from synckit.store.checkpoints import (
    save_checkpoint,
)
from synckit.store.db import SyncConn
from synckit.store.dead_letters import capture as dlq_store
from synckit.store.jobs._base import ClaimedJob
from synckit.store.records import statements as record_sql

if TYPE_CHECKING:
    pass


__all__ = ["RecordFailure", "dead_letter_records", "resolve_records"]

#: A page's cursor that keeps the stored checkpoint (a held page commits no new one).
_KEEP: Any = object()


# --- dead letters of records ------------------------------------------------------------


@dataclass(frozen=True)
class RecordFailure:
    """One record whose ``handle()`` failed, as it goes to the dead-letter queue."""

    record_id: str
    payload: Any
    error_class: str
    message: str
    traceback: str | None


def dead_letter_records(
    conn: SyncConn,
    *,
    tenant: str,
    connector: str,
    kind: str,
    failures: Sequence[RecordFailure],
    trace_id: str | None,
    job_id: int | None,
    resource_key: str | None,
    now: datetime,
) -> None:
    """Write failed records to ``dead_letters`` in the caller's transaction, through the
    DLQ's one capture (:func:`synckit.store.dead_letters.capture.capture_many`: one row
    per record, a repeat updates it, an ignored row stays ignored)."""
    dlq_store.capture_many(
        conn,
        [
            dlq_store.Failure(
                tenant=tenant,
                connector=connector,
                kind=kind,
                record_id=f.record_id,
                payload=f.payload,
                error_class=f.error_class,
                message=f.message,
                traceback=f.traceback,
                trace_id=trace_id,
                job_id=job_id,
                resource_key=resource_key,
                source="poll",
            )
            for f in failures
        ],
        now=now,
    )


def resolve_records(
    conn: SyncConn,
    *,
    tenant: str,
    connector: str,
    kind: str,
    record_ids: Sequence[str],
    now: datetime,
) -> int:
    """Mark the open dead letters of records that just succeeded ``resolved``, in the
    caller's transaction; return how many
    (:func:`synckit.store.dead_letters.capture.resolve_records`)."""
    return dlq_store.resolve_records(
        conn,
        tenant=tenant,
        connector=connector,
        kind=kind,
        record_ids=record_ids,
        now=now,
        reason="succeeded in a later poll cycle",
    )


@dataclass(frozen=True)
class _PageCommit:
    """Everything one page commits (:func:`_commit_page`)."""

    tenant: str
    connector: str
    stream: str
    kind: str
    job: ClaimedJob | None
    cursor: Any  # _KEEP: leave the checkpoint as it is
    failures: Sequence[RecordFailure]
    succeeded: Sequence[str]
    resolve: bool
    ok: int
    trace_id: str | None
    resource_key: str | None
    now: datetime
    #: The page's records for their declared tables (synckit.runtime.sync.records), if any.
    landing: Landing | None = None
    #: The stream's policy is ``hold``: a record the database refuses as the page lands
    #: keeps the checkpoint where it was, as a record the model refused would have.
    hold: bool = False
    #: The records already landed, in their own database (``Records(database=URL)``).
    landed: bool = False


def _to_land(p: _PageCommit) -> Landing | None:
    """The records this transaction lands (none when they landed elsewhere)."""
    return None if p.landed else p.landing


def _held_by_landing(p: _PageCommit) -> bool:
    """Whether a ``hold`` page decides its checkpoint only once its records landed."""
    return p.hold and _to_land(p) is not None and p.cursor is not _KEEP


def _failures_of(p: _PageCommit) -> Sequence[RecordFailure]:
    """The page's failures, with the records the database refused as it landed them."""
    if p.landing is None or not p.landing.refused:
        return p.failures
    return [*p.failures, *p.landing.refused]


def _ok_of(p: _PageCommit) -> int:
    return p.ok - (len(p.landing.refused) if p.landing is not None else 0)


def _commit_page(conn: SyncConn, p: _PageCommit) -> bool:
    """The page's one transaction (:meth:`Database.write`); False, with nothing written,
    when the job no longer holds its claim."""
    if _held_by_landing(p):
        # The claim first (its row locked on PostgreSQL until the commit), then the
        # records; the checkpoint advances only if the database refused none of them.
        if p.job is not None and not checkpoints.holds_claim(conn, p.job.id, p.job.claim_token):
            return False
        assert p.landing is not None
        land(conn, p.landing, p.now)
        if not p.landing.refused:
            save_checkpoint(conn, p.tenant, p.connector, p.stream, p.cursor, p.now)
        _commit_page_rest(conn, p)
        return True
    if p.job is not None and p.cursor is not _KEEP:
        if not checkpoints.save_checkpoint_held(
            conn,
            p.tenant,
            p.connector,
            p.stream,
            p.cursor,
            p.now,
            job_id=p.job.id,
            token=p.job.claim_token,
        ):
            return False
    elif p.job is not None and not checkpoints.holds_claim(conn, p.job.id, p.job.claim_token):
        return False
    elif p.cursor is not _KEEP:
        save_checkpoint(conn, p.tenant, p.connector, p.stream, p.cursor, p.now)
    if (landing := _to_land(p)) is not None:
        land(conn, landing, p.now)
    _commit_page_rest(conn, p)
    return True


def _commit_pages(conn: SyncConn, pages: list[_PageCommit]) -> list[bool]:
    """:func:`_commit_page` for the pages of a group (``Database.write_grouped``'s
    ``many``): the checkpoints of the pages whose job holds its claim in one statement
    (:func:`checkpoints.save_checkpoints_held`), then each page's dead letters,
    resolutions and audit counts. A trivial poll cycle's commit was one statement of its
    own, ~12% of a PostgreSQL worker's CPU (``bench.tenants``)."""
    # Records tables' sequences first, in name order (synckit.store.records.statements.lock_seqs).
    record_sql.lock_seqs(
        conn, sorted({t for p in pages if (w := _to_land(p)) is not None for t in w.tables})
    )
    held = [
        p for p in pages if p.job is not None and p.cursor is not _KEEP and not _held_by_landing(p)
    ]
    streams = {(p.tenant, p.connector, p.stream) for p in held}
    if len(streams) < len(held):  # one stream twice: an upsert may not touch a row twice
        return [_commit_page(conn, p) for p in pages]
    saved = dict(
        zip(
            map(id, held),
            checkpoints.save_checkpoints_held(
                conn,
                [
                    checkpoints.HeldCheckpoint(
                        p.tenant, p.connector, p.stream, p.cursor, p.now,
                        job_id=p.job.id, token=p.job.claim_token,
                    )
                    for p in held
                    if p.job is not None  # (narrowed above)
                ],
            ),
            strict=True,
        )
    )  # fmt: skip
    out: list[bool] = []
    # The audit counts of the group, per minute: one statement for its buckets of plain
    # successes (record_audit_many_sync, which takes buckets in key order too).
    audits: dict[datetime, tuple[datetime, list[AuditCounts]]] = {}
    for p in pages:
        if id(p) in saved:
            if saved[id(p)]:
                if (landing := _to_land(p)) is not None:
                    land(conn, landing, p.now)
                _commit_page_rest(conn, p, audit=False)
                _, counts = audits.setdefault(minute_of(p.now), (p.now, []))
                counts.append(
                    AuditCounts(
                        p.tenant,
                        p.connector,
                        _ok_of(p),
                        Counter(f.error_class for f in _failures_of(p)),
                    )
                )
            out.append(saved[id(p)])
        else:
            out.append(_commit_page(conn, p))
    for now, counts in audits.values():
        record_audit_many_sync(conn, counts, now)
    return out


def _commit_page_rest(conn: SyncConn, p: _PageCommit, *, audit: bool = True) -> None:
    """What a page commits besides its checkpoint: dead letters, resolutions and (unless
    ``audit`` is False: the caller counts them) audit counts."""
    failures = _failures_of(p)
    where = {"tenant": p.tenant, "connector": p.connector, "kind": p.kind}
    if failures:
        dead_letter_records(
            conn,
            **where,
            failures=failures,
            trace_id=p.trace_id,
            job_id=p.job.id if p.job is not None else None,
            resource_key=p.resource_key,
            now=p.now,
        )
    succeeded = p.succeeded
    if failures is not p.failures:
        refused = {f.record_id for f in failures}
        succeeded = [rid for rid in succeeded if rid not in refused]
    if p.resolve and succeeded:
        resolve_records(conn, **where, record_ids=succeeded, now=p.now)
    if audit:
        record_audit_sync(
            conn,
            p.tenant,
            p.connector,
            p.now,
            _ok_of(p),
            Counter(f.error_class for f in failures),
        )
