"""Every SQL statement on ``outbox``, named; the relay and publishers are
:mod:`synckit.runtime.writes.outbox`, which re-exports what its callers use from here.

:func:`add` / :func:`add_many` write messages in the caller's transaction. The relay's
operations are :func:`claim` (a batch under the one lease, :mod:`synckit.store.leases`,
in a short transaction of its own) and :func:`record` (their outcomes, fenced by that
lease, in another): no transaction stays open while a broker confirms. A claimed
message's ``next_attempt_at`` moves to the end of its lease, so it is not due while
held, and its key's later messages wait behind it (the claim holds back every message
of a key behind its first message that is not due); should the relay die between the
publish and :func:`record`, the message comes due when the lease ends and is published
again with the same ``message_id`` (at least once, as always).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import (
    Row,
    bindparam,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection as SyncConnection
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.clock import utcnow
from synckit.errors import ErrorClass
from synckit.errors.exceptions import (
    OutboxError,
    OutboxMessageNotFound,
    OutboxPayloadError,
    OutboxStateError,
)
from synckit.redaction import redact_text
from synckit.store import leases, notify
from synckit.store.batches import delete_in_batches
from synckit.store.db import Database
from synckit.store.lazy_asyncio import is_async_session
from synckit.store.leases import Lease
from synckit.store.moments import (
    from_row,
    guarded_columns,
    json_holds_nul,
    read_moments,
    read_payload,
)
from synckit.store.tables import dialect_insert, outbox

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
from synckit.tracing import current_traceparent

__all__ = [
    "MAX_KEY_CHARS",
    "MAX_MESSAGE_ID_CHARS",
    "MAX_TOPIC_BYTES",
    "NOTIFY_CHANNEL",
    "NewMessage",
    "OutboxInfo",
    "OutboxMessage",
    "Recorded",
    "add",
    "add_many",
    "add_many_sync",
    "claim",
    "claim_batch",
    "count_by_status",
    "list_messages",
    "mark_failed",
    "mark_published",
    "pending_count",
    "prune",
    "record",
    "retry_failed",
    "retry_messages",
    "schedule_retries",
    "wake_local_relays",
]

OutboxStatus = Literal["pending", "published", "failed"]
NOTIFY_CHANNEL = "synckit_outbox"

#: AMQP limits a routing key (the topic) to 255 bytes; refusing longer topics in
#: :func:`add` beats a message that can never be published.
MAX_TOPIC_BYTES = 255
MAX_KEY_CHARS = 300
MAX_MESSAGE_ID_CHARS = 100
# Ids per statement (resolving reviews): well under the bound-parameter limits of both engines.
_INSERT_CHUNK = 1000
# Literal, not a bound parameter: both planners only use the partial index
# ``ix_outbox_pending`` when the predicate visibly implies it.
_PENDING: Any = literal_column("'pending'")

# --- errors ---------------------------------------------------------------------------


# --- messages -------------------------------------------------------------------------


@dataclass(frozen=True)
class OutboxMessage:
    """A message the relay hands to a publisher (:mod:`synckit.runtime.writes.outbox`).

    ``attempts`` counts the earlier publish attempts (0 on the first).
    """

    id: int
    topic: str
    key: str | None
    payload: Any
    message_id: str
    attempts: int
    created_at: datetime
    #: The W3C traceparent of the span it was written in (:mod:`synckit.tracing`).
    trace_parent: str | None = None

    def body(self) -> bytes:
        """The payload as compact UTF-8 JSON: what goes on the wire."""
        return json.dumps(self.payload, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class NewMessage:
    """One message for :func:`add_many`."""

    topic: str
    payload: Any
    key: str | None = None
    message_id: str | None = None
    #: The W3C traceparent of the span it is made in (None when tracing is off).
    trace_parent: str | None = field(default_factory=current_traceparent)


def _new_row(m: NewMessage, now: datetime) -> dict[str, Any]:
    topic, key = m.topic, m.key
    if not isinstance(topic, str) or not topic:
        raise OutboxPayloadError(f"an outbox message needs a topic (a non-empty string): {topic!r}")
    if len(topic.encode()) > MAX_TOPIC_BYTES:
        raise OutboxPayloadError(
            f"outbox topic {topic[:40]!r}... is {len(topic.encode())} bytes; "
            f"a routing key holds at most {MAX_TOPIC_BYTES}"
        )
    if key is not None and (not isinstance(key, str) or len(key) > MAX_KEY_CHARS):
        raise OutboxPayloadError(
            f"outbox key must be a string of at most {MAX_KEY_CHARS} characters: {key!r:.60}"
        )
    message_id = m.message_id if m.message_id is not None else str(uuid.uuid4())
    if not isinstance(message_id, str) or not message_id or len(message_id) > MAX_MESSAGE_ID_CHARS:
        raise OutboxPayloadError(
            "message_id must be a non-empty string of at most "
            f"{MAX_MESSAGE_ID_CHARS} characters: {message_id!r:.60}"
        )
    try:
        text = json.dumps(m.payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise OutboxPayloadError(
            f"payload of outbox message {topic!r} is not JSON-serialisable: {exc}"
        ) from exc
    if json_holds_nul(text):
        # PostgreSQL's JSONB cannot hold U+0000; refusing it on every engine keeps an
        # application portable instead of failing only in production.
        raise OutboxPayloadError(
            f"payload of outbox message {topic!r} contains a NUL character (U+0000), "
            "which PostgreSQL cannot store in JSON"
        )
    return {
        "topic": topic,
        "key": key,
        "payload": m.payload,
        "message_id": message_id,
        "attempts": 0,
        "status": "pending",
        "next_attempt_at": now,
        "created_at": now,
        "trace_parent": m.trace_parent if isinstance(m.trace_parent, str) else None,
    }


# --- writing messages (in the caller's transaction) ------------------------------------


def _insert(conn: AsyncConnection | SyncConnection) -> Any:
    return dialect_insert(conn)


async def _connection(target: AsyncConnection | AsyncSession) -> AsyncConnection:
    if is_async_session(target):
        return await target.connection()
    if isinstance(target, AsyncConnection):
        return target
    raise OutboxError(
        "outbox.add needs the caller's AsyncConnection or AsyncSession, not "
        f"{type(target).__name__} (the message must commit or roll back with the caller's writes)"
    )


async def add_many(
    connection: AsyncConnection | AsyncSession,
    messages: Iterable[NewMessage],
    *,
    now: datetime | None = None,
) -> list[str]:
    """Write several messages in the caller's transaction; return their message ids.

    The messages are published only if that transaction commits. Every message is
    validated before anything is written (:class:`OutboxPayloadError`). A ``message_id``
    already in the outbox is not written again: the first message with an id wins, so a
    message id doubles as an idempotency key.
    """
    now = now or utcnow()
    batch = list(messages)
    if not batch:
        return []
    conn = await _connection(connection)
    ids = await conn.run_sync(lambda c: add_many_sync(c, batch, now=now))
    notify.wake_after_commit(conn, NOTIFY_CHANNEL)
    return ids


def add_many_sync(
    conn: SyncConnection, messages: Iterable[NewMessage], *, now: datetime
) -> list[str]:
    """:func:`add_many` on a synchronous connection, for code already running inside a
    transaction there (the worker records a job's messages this way). The caller wakes
    local relays after commit with :func:`wake_local_relays`."""
    rows = [_new_row(m, now) for m in messages]
    if rows:
        # One statement, many parameter sets: SQLAlchemy batches them into multi-row
        # INSERTs itself ("insertmanyvalues") from one cached compile. A VALUES list of
        # the rows was compiled afresh for every batch (as many bind names as values):
        # ~15% of a relay test's CPU.
        ins = _insert(conn)(outbox).on_conflict_do_nothing(index_elements=["message_id"])
        conn.execute(ins, rows)
    if rows and conn.dialect.name == "postgresql":
        # Delivered at commit and dropped on rollback, which is exactly when a relay
        # should (and should not) wake up.
        conn.exec_driver_sql(f"NOTIFY {NOTIFY_CHANNEL}")
    return [r["message_id"] for r in rows]


def wake_local_relays(db: Database) -> None:
    """Wake this process's relays of ``db`` (call on the event loop, after commit)."""
    notify.wake(db, NOTIFY_CHANNEL)


async def add(
    connection: AsyncConnection | AsyncSession,
    topic: str,
    payload: Any,
    *,
    key: str | None = None,
    message_id: str | None = None,
) -> str:
    """Write one message in the caller's transaction; return its message id.

    ``connection`` is the caller's ``AsyncConnection`` or ``AsyncSession``: the message is
    published only if that transaction commits. ``topic`` becomes the routing key;
    messages sharing a ``key`` are published in order. ``message_id`` (default: a new
    uuid4 string) travels with the message so consumers can de-duplicate. A payload that
    is not JSON-serialisable raises :class:`OutboxPayloadError` and writes nothing.
    """
    ids = await add_many(
        connection, [NewMessage(topic=topic, payload=payload, key=key, message_id=message_id)]
    )
    return ids[0]


# --- the relay's named operations ------------------------------------------------------


def _message(r: Row[Any]) -> OutboxMessage:
    return from_row(OutboxMessage, r)


_BLOCKERS = {
    "postgresql": text(
        "SELECT k.key, (SELECT o.id FROM outbox o WHERE o.status = 'pending'"
        " AND o.key = k.key AND o.id <> ALL(CAST(:ids AS bigint[])) ORDER BY o.id LIMIT 1)"
        " FROM unnest(CAST(:keys AS varchar[])) AS k(key)"
    ),
    "sqlite": text(
        "SELECT k.value, (SELECT o.id FROM outbox o WHERE o.status = 'pending'"
        " AND o.key = k.value AND o.id NOT IN (SELECT value FROM json_each(:ids))"
        " ORDER BY o.id LIMIT 1) FROM json_each(:keys) AS k"
    ),
}


def _claim_statement(now: datetime, limit: int) -> Any:
    """Due pending messages, oldest first, minus those a waiting key holds back."""
    # Keys whose head waits for a retry, and from which id on they are held back.
    # key || '' is the key, but no index on key can serve it: SQLite then finds the few
    # waiting messages through next_attempt_at (ix_outbox_pending) instead of walking
    # every keyed pending message in key order (ix_outbox_pending_key) for the GROUP BY.
    unindexed_key = outbox.c.key + literal("")
    waiting = (
        select(unindexed_key.label("key"), func.min(outbox.c.id).label("first_id"))
        .where(
            outbox.c.status == _PENDING,
            outbox.c.next_attempt_at > now,
            unindexed_key.is_not(None),
        )
        .group_by(unindexed_key)
        .subquery("waiting")
    )
    stmt = (
        select(
            outbox.c.id,
            outbox.c.topic,
            outbox.c.key,
            outbox.c.payload,
            outbox.c.message_id,
            outbox.c.attempts,
            outbox.c.created_at,
            outbox.c.trace_parent,
        )
        .select_from(outbox.outerjoin(waiting, waiting.c.key == outbox.c.key))
        .where(
            outbox.c.status == _PENDING,
            outbox.c.next_attempt_at <= now,
            # Held-back messages are left out before the LIMIT: otherwise the followers
            # of one stuck key could fill every batch and starve all the other keys.
            or_(waiting.c.first_id.is_(None), outbox.c.id < waiting.c.first_id),
        )
        # Oldest first, so a key's head always comes before its followers. The partial
        # index ix_outbox_pending_id holds pending rows only, in id order: the claim
        # reads about `limit` rows of it, whatever the backlog or published history.
        .order_by(outbox.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True, of=outbox)
    )
    return stmt


async def claim_batch(
    conn: AsyncConnection, *, now: datetime, limit: int, lease: Lease
) -> list[OutboxMessage]:
    """Take up to ``limit`` due pending messages under ``lease`` and return those that
    may be published now, in id order, in the caller's (short) transaction.

    A keyed message is returned only if every pending message of its key with a smaller
    id is in this claim too, so the returned messages of each key are the head of its
    queue. Taken messages are due again only when the lease ends (``next_attempt_at``),
    which holds back their keys' later messages meanwhile. Two claimers never take one
    message: PostgreSQL skips rows another claim has locked, and the lease's own check
    refuses a row another claim took since; SQLite runs claims one at a time.
    """
    rows = list(await conn.execute(_claim_statement(now, limit)))
    keys = {r.key for r in rows if r.key is not None}
    first_blocker: dict[str, int] = {}
    if keys:
        # The first pending message of each key that this claim does not hold (locked by
        # another relay, or just added): nothing after it may go. A plain read, so that
        # it sees the rows other relays hold instead of skipping them. One index probe
        # per key (ix_outbox_pending_key), not a scan of every pending message of the keys.
        held = [r.id for r in rows]
        if conn.dialect.name == "postgresql":
            params: dict[str, Any] = {"keys": sorted(keys), "ids": held}
        else:
            params = {"keys": json.dumps(sorted(keys)), "ids": json.dumps(held)}
        first_blocker = {
            k: int(i)
            for k, i in await conn.execute(_BLOCKERS[conn.dialect.name], params)
            if i is not None
        }
    picked = [
        r
        for r in rows
        if r.key is None or r.key not in first_blocker or r.id < first_blocker[r.key]
    ]
    if not picked:
        return []
    taken = {
        int(i)
        for (i,) in await conn.execute(
            leases.claim(
                outbox,
                lease,
                outbox.c.id.in_([r.id for r in picked]),
                outbox.c.status == _PENDING,
                now=now,
                values={"next_attempt_at": lease.expires_at},
            ).returning(outbox.c.id)
        )
    }
    return [_message(r) for r in picked if r.id in taken]


async def claim(db: Database, *, now: datetime, limit: int, lease: Lease) -> list[OutboxMessage]:
    """:func:`claim_batch` in a transaction of its own, committed on return."""
    async with db.begin() as conn:
        return await claim_batch(conn, now=now, limit=limit, lease=lease)


def _holding(token: str | None) -> list[Any]:
    return [] if token is None else [leases.held(outbox, token)]


async def mark_published(
    conn: AsyncConnection, ids: Sequence[int], *, now: datetime, token: str | None = None
) -> None:
    """The broker confirmed these messages (with ``token``: those it still holds)."""
    if ids:
        await conn.execute(
            update(outbox)
            .where(outbox.c.id.in_(list(ids)), *_holding(token))
            .values(
                status="published",
                published_at=now,
                attempts=outbox.c.attempts + 1,
                **leases.RELEASED,
            )
        )


async def schedule_retries(
    conn: AsyncConnection,
    retries: Sequence[tuple[int, str, datetime]],
    *,
    token: str | None = None,
) -> None:
    """Transient failures ``(id, error, next_attempt_at)``: count the attempt, try again later."""
    if retries:
        stmt = (
            update(outbox)
            .where(outbox.c.id == bindparam("b_id"), *_holding(token))
            .values(
                attempts=outbox.c.attempts + 1,
                last_error=bindparam("b_error"),
                next_attempt_at=bindparam("b_at"),
                **leases.RELEASED,
            )
        )
        await conn.execute(
            stmt, [{"b_id": i, "b_error": e[:4000], "b_at": at} for i, e, at in retries]
        )


async def mark_failed(
    conn: AsyncConnection,
    rejected: Sequence[tuple[OutboxMessage, str]],
    *,
    now: datetime,
    token: str | None = None,
) -> None:
    """Messages the broker refused for good: ``failed`` here, and each captured in the DLQ
    (:func:`synckit.store.dead_letters.capture.capture_many`: a ``review`` row, since a refusal is a
    validation error; a message an operator ignored there stays ignored)."""
    from synckit.store.dead_letters.capture import Failure, capture_many
    from synckit.store.moments import storable_text

    if not rejected:
        return
    stmt = (
        update(outbox)
        .where(outbox.c.id == bindparam("b_id"), *_holding(token))
        .values(
            attempts=outbox.c.attempts + 1,
            status="failed",
            last_error=bindparam("b_error"),
            **leases.RELEASED,
        )
    )
    # The broker's reason is untrusted text: redacted, and a NUL in it (which PostgreSQL
    # refuses) must not fail the batch on every retry; stored as the DLQ stores it.
    await conn.execute(
        stmt,
        [
            {"b_id": m.id, "b_error": storable_text(redact_text(reason))[:4000]}
            for m, reason in rejected
        ],
    )
    failures = [
        Failure(
            tenant="",
            connector="outbox",
            kind=f"outbox:{m.topic}"[:200],
            record_id=m.message_id,
            # The whole message, so that the dead letter can be read without the outbox.
            payload={
                "outbox_id": m.id,
                "topic": m.topic,
                "key": m.key,
                "message_id": m.message_id,
                "payload": m.payload,
            },
            error_class=ErrorClass.VALIDATION.value,
            message=reason,
            attempts=m.attempts + 1,
            source="outbox",
        )
        for m, reason in rejected
    ]
    await capture_many(conn, failures, now=now)


@dataclass(frozen=True)
class Recorded:
    """What :func:`record` wrote: the ids its lease still held, and those it had lost
    (taken over after the lease ended; their outcome is the new holder's to write)."""

    held: frozenset[int]
    lost: frozenset[int]


async def record(
    db: Database,
    token: str,
    *,
    published: Sequence[int],
    retries: Sequence[tuple[int, str, datetime]],
    rejected: Sequence[tuple[OutboxMessage, str]],
    released: Sequence[int],
    now: datetime,
) -> Recorded:
    """The outcomes of one claimed batch, in one short transaction, fenced by ``token``:
    confirmed messages published, transient failures retried later (one attempt more),
    refused ones failed and dead-lettered, and ``released`` (not attempted) due again
    now, as they were. Only messages ``token`` still holds change."""
    ids = [*published, *(i for i, _, _ in retries), *(m.id for m, _ in rejected), *released]
    if not ids:
        return Recorded(frozenset(), frozenset())
    async with db.begin() as conn:
        held = frozenset(
            int(i)
            for (i,) in await conn.execute(
                select(outbox.c.id)
                .where(outbox.c.id.in_(ids), leases.held(outbox, token))
                .with_for_update()
            )
        )
        await mark_published(conn, [i for i in published if i in held], now=now, token=token)
        await schedule_retries(conn, [r for r in retries if r[0] in held], token=token)
        await mark_failed(conn, [r for r in rejected if r[0].id in held], now=now, token=token)
        back = [i for i in released if i in held]
        if back:
            await conn.execute(
                leases.fenced(outbox, token, outbox.c.id.in_(back), values={"next_attempt_at": now})
            )
    return Recorded(held, frozenset(ids) - held)


async def pending_count(db: Database) -> int:
    """Messages not yet published nor failed (due now or waiting for a retry)."""
    async with db.read() as conn:
        n = await conn.execute(
            select(func.count()).select_from(outbox).where(outbox.c.status == _PENDING)
        )
        return int(n.scalar_one())


# --- looking at and repairing the outbox (the CLI) --------------------------------------


@dataclass(frozen=True)
class OutboxInfo:
    """One outbox row as the CLI shows it."""

    id: int
    topic: str
    key: str | None
    message_id: str
    status: str
    attempts: int
    last_error: str | None
    next_attempt_at: datetime | None
    created_at: datetime | None
    published_at: datetime | None
    payload: Any = None
    #: ``{column: reason}`` of what a corrupt row holds instead of a value (then None).
    unreadable: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        def ts(v: datetime | None) -> str | None:
            return v.isoformat() if v is not None else None

        return {
            "id": self.id,
            "topic": self.topic,
            "key": self.key,
            "message_id": self.message_id,
            "status": self.status,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "next_attempt_at": ts(self.next_attempt_at),
            "created_at": ts(self.created_at),
            "published_at": ts(self.published_at),
            "payload": self.payload,
            **({"unreadable": dict(self.unreadable)} if self.unreadable else {}),
        }


def _info(r: Row[Any]) -> OutboxInfo:
    """A row as read by :data:`_LISTED` (or typed, as a plain ``select(outbox)`` gives
    it): each value parsed here, so one corrupt row is named instead of fatal."""
    bad: dict[str, str] = {}
    moments = read_moments(r._mapping, ("next_attempt_at", "created_at", "published_at"), bad)
    try:
        payload = read_payload(r.payload)
    except ValueError as exc:
        payload, bad["payload"] = None, str(exc)
    return from_row(OutboxInfo, r, payload=payload, unreadable=bad, **moments)


# ``outbox`` as the views read it: timestamps guarded and the payload as text, parsed
# per row by _info (the drivers would fail the whole fetch on one corrupt value).
_LISTED: Any = select(*guarded_columns(outbox.c, as_text=("payload",)))


async def list_messages(
    db: Database,
    *,
    status: str | None = None,
    topic: str | None = None,
    key: str | None = None,
    limit: int = 50,
) -> list[OutboxInfo]:
    """Messages matching every filter given, newest first."""
    stmt = _LISTED.order_by(outbox.c.id.desc()).limit(limit)
    if status:
        stmt = stmt.where(outbox.c.status == status)
    if topic:
        stmt = stmt.where(outbox.c.topic == topic)
    if key:
        stmt = stmt.where(outbox.c.key == key)
    async with db.read() as conn:
        return [_info(r) for r in await conn.execute(stmt)]


async def count_by_status(db: Database) -> dict[str, int]:
    async with db.read() as conn:
        rows = await conn.execute(select(outbox.c.status, func.count()).group_by(outbox.c.status))
        return {s: int(c) for s, c in rows}


async def _requeue(conn: AsyncConnection, where: Any, now: datetime) -> list[str]:
    """Back to pending, due now, with a fresh backoff; return the message ids."""
    res = await conn.execute(
        update(outbox)
        .where(where)
        .values(status="pending", next_attempt_at=now, attempts=0, **leases.RELEASED)
        .returning(outbox.c.message_id)
    )
    message_ids = [r[0] for r in res]
    # Their dead letters are being handled: close them, so the DLQ shows what is open.
    from synckit.store.dead_letters.replay import resolve_outbox_reviews  # it builds on the outbox

    for start in range(0, len(message_ids), _INSERT_CHUNK):
        await resolve_outbox_reviews(conn, message_ids[start : start + _INSERT_CHUNK], now=now)
    if message_ids and conn.dialect.name == "postgresql":
        await conn.exec_driver_sql(f"NOTIFY {NOTIFY_CHANNEL}")
    return message_ids


async def retry_messages(db: Database, ids: Sequence[int]) -> int:
    """Put the given messages (failed, or pending in backoff) back to pending now.

    All or nothing: an unknown id raises :class:`OutboxMessageNotFound`, a published
    message :class:`OutboxStateError`.
    """
    wanted = sorted(set(ids))
    if not wanted:
        return 0
    now = utcnow()
    async with db.begin() as conn:
        found = {
            r.id: r.status
            for r in await conn.execute(
                select(outbox.c.id, outbox.c.status)
                .where(outbox.c.id.in_(wanted))
                .with_for_update()
            )
        }
        if missing := [i for i in wanted if i not in found]:
            raise OutboxMessageNotFound(f"no outbox message with id {', '.join(map(str, missing))}")
        if published := [i for i in wanted if found[i] == "published"]:
            raise OutboxStateError(
                f"outbox message {', '.join(map(str, published))} is already published"
            )
        requeued = await _requeue(conn, outbox.c.id.in_(wanted), now)
    return len(requeued)


async def retry_failed(db: Database, *, topic: str | None = None) -> int:
    """Put every failed message (of ``topic``, if given) back to pending; return how many."""
    now = utcnow()
    where = outbox.c.status == "failed"
    if topic:
        where = where & (outbox.c.topic == topic)
    async with db.begin() as conn:
        return len(await _requeue(conn, where, now))


async def prune(
    db: Database,
    *,
    older_than: timedelta = timedelta(days=7),
    batch: int = 5000,
    now: datetime | None = None,
) -> int:
    """Delete messages published more than ``older_than`` ago, ``batch`` rows per
    transaction; return how many. Failed messages stay until an operator deals with them."""
    cutoff = (now or utcnow()) - older_than
    victims = (
        select(outbox.c.id)
        .where(outbox.c.status == "published", outbox.c.published_at < cutoff)
        .limit(batch)
    )
    stmt = delete(outbox).where(leases.picked(outbox.c.id, victims))
    return await delete_in_batches(db, stmt, batch)
