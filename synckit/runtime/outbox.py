"""The transactional outbox: messages written with the caller's data, relayed to a broker.

:func:`add` writes a message into ``outbox`` inside the caller's transaction, so the
message exists exactly when the caller's data does: a rolled-back transaction publishes
nothing, a committed one is published even if the process dies a microsecond later.

:class:`OutboxRelay` publishes pending messages through a :class:`Publisher`
(:class:`RabbitPublisher`, :class:`CallbackPublisher`, :class:`LogPublisher`) and marks
each one ``published`` only after the broker confirmed it. What callers may rely on:

* **At least once, stable id.** Every delivery carries the message's ``message_id``; a
  message can be delivered twice (a confirm lost with the connection, a crash between
  the confirm and the commit), never with a different id, so consumers de-duplicate on it.
* **Per-key order.** Messages with the same ``key`` are published in ``id`` order, and
  message N+1 of a key is not published before message N is confirmed. A message that
  failed for a transient reason (broker down, timeout) holds back the later messages of
  its key, not the other keys. Messages without a key have no order.
* **Nothing is lost when the broker is away.** A transient failure keeps the message
  pending with a backoff (:class:`~synckit.errors.RetryPolicy`) and never gives up; the
  relay itself backs off, reconnects and resumes.
* **A message the broker refuses for good** (unroutable and returned under
  ``mandatory``, too large, nacked) is marked ``failed`` and written to ``dead_letters``
  for review (connector ``"outbox"``, kind ``"outbox:<topic>"``, record id = message id);
  the other messages flow on. ``synckit outbox retry`` puts it back to pending.

Claiming. A batch is claimed, published and recorded in **one transaction** that holds
the claimed rows while the broker confirms them: with the existing columns (no lease
column) this is what makes "a row is published by one relay at a time" hold without a
lease to expire under a slow broker.

* PostgreSQL: rows are locked with ``FOR UPDATE SKIP LOCKED``, so any number of relay
  processes share the backlog and never publish one message concurrently. Per-key order
  across relays: a claimed message is only published when every pending message of its
  key with a smaller id is in the same claim (a smaller one held by another relay, or
  waiting for its retry, blocks it).
* SQLite: every transaction starts with ``BEGIN IMMEDIATE`` (see :mod:`synckit.store.db`),
  so concurrent relays are serialised and safe, and one relay is what is expected. The
  price: the write lock is held while a batch is published, so an :func:`add` from another
  connection waits for that batch's confirms (milliseconds on a healthy broker, at most
  the publisher's confirm timeout on a hung one). The relay connects to the broker
  *before* opening the transaction, so a broker that is down costs writers nothing.

Every SQL statement on ``outbox`` lives in this module, named; the CLI
(:mod:`synckit.runtime.outbox_cli`) and the worker call these operations.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol

import structlog
from sqlalchemy import (
    Row,
    Text,
    bindparam,
    cast,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection as SyncConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from synckit.clock import utcnow
from synckit.errors import Classification, ErrorClass, RetryPolicy, retry_delay
from synckit.errors.exceptions import (
    DatabaseError,
    PermanentError,
    RetryableError,
    SynckitError,
)
from synckit.runtime.logging import redact_text
from synckit.store.db import Database
from synckit.store.jobs import guarded_moment, read_moment, read_payload
from synckit.store.tables import UTCDateTime, dead_letters, outbox

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange

__all__ = [
    "DEFAULT_EXCHANGE",
    "DEFAULT_RETRY_POLICY",
    "NOTIFY_CHANNEL",
    "BatchResult",
    "CallbackPublisher",
    "LogPublisher",
    "NewMessage",
    "OutboxError",
    "OutboxInfo",
    "OutboxMessage",
    "OutboxMessageNotFound",
    "OutboxPayloadError",
    "OutboxRelay",
    "OutboxStateError",
    "PublishFailed",
    "PublishRejected",
    "Publisher",
    "PublisherUnavailable",
    "RabbitPublisher",
    "RelayStats",
    "add",
    "add_many",
    "claim_batch",
    "count_by_status",
    "list_messages",
    "mark_failed",
    "mark_published",
    "pending_count",
    "prune",
    "retry_failed",
    "retry_messages",
    "schedule_retries",
]

log = structlog.get_logger("synckit.outbox")

OutboxStatus = Literal["pending", "published", "failed"]
NOTIFY_CHANNEL = "synckit_outbox"
DEFAULT_EXCHANGE = "synckit.outbox"
#: AMQP limits a routing key (the topic) to 255 bytes; refusing longer topics in
#: :func:`add` beats a message that can never be published.
MAX_TOPIC_BYTES = 255
MAX_KEY_CHARS = 300
MAX_MESSAGE_ID_CHARS = 100
# Rows per INSERT statement: well under the bound-parameter limits of both engines.
_INSERT_CHUNK = 1000
# Literal, not a bound parameter: both planners only use the partial index
# ``ix_outbox_pending`` when the predicate visibly implies it.
_PENDING: Any = literal_column("'pending'")
# An unescaped NUL in the serialised JSON: an odd run of backslashes before ``u0000``.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

# A transient publish failure as the pure backoff function sees it. The outbox never
# gives up on a transient failure (the policy's attempt limits are dropped below), so
# ``retry_delay`` always answers with a delay.
_TRANSIENT = Classification(
    error_class=ErrorClass.TRANSIENT,
    retryable=True,
    max_attempts=None,
    surface=False,
    retry_after=None,
    reason="publish failed",
)
#: Reconnects and message retries: quick first retries, at most 30 s apart, so a broker
#: that comes back is used within half a minute.
DEFAULT_RETRY_POLICY = RetryPolicy(
    base=timedelta(seconds=0.5),
    cap=timedelta(seconds=30),
    floor=timedelta(milliseconds=100),
)


# --- errors ---------------------------------------------------------------------------


class OutboxError(SynckitError):
    """An outbox operation was refused."""


class OutboxPayloadError(OutboxError):
    """A message that cannot be stored: payload not JSON-serialisable, bad topic, key or id."""


class OutboxMessageNotFound(OutboxError):
    """No outbox message has the given id."""


class OutboxStateError(OutboxError):
    """The message's status does not allow the operation (retrying a published message)."""


class PublishFailed(RetryableError):
    """Publishing failed for now (broker down, connection lost, timeout): retry later."""


class PublisherUnavailable(PublishFailed):
    """The publisher cannot reach its broker at all; nothing was attempted."""


class PublishRejected(PermanentError):
    """The broker refused this message for good (unroutable, too large, nacked)."""


# --- messages -------------------------------------------------------------------------


@dataclass(frozen=True)
class OutboxMessage:
    """A message the relay hands to a :class:`Publisher`.

    ``attempts`` counts the earlier publish attempts (0 on the first).
    """

    id: int
    topic: str
    key: str | None
    payload: Any
    message_id: str
    attempts: int
    created_at: datetime

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
    if _NUL_ESCAPE.search(text):
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
    }


# --- writing messages (in the caller's transaction) ------------------------------------


def _insert(conn: AsyncConnection | SyncConnection) -> Any:
    return postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert


async def _connection(target: AsyncConnection | AsyncSession) -> AsyncConnection:
    if isinstance(target, AsyncSession):
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
    _wake_after_commit(conn)
    return ids


def add_many_sync(
    conn: SyncConnection, messages: Iterable[NewMessage], *, now: datetime
) -> list[str]:
    """:func:`add_many` on a synchronous connection, for code already running inside a
    transaction there (the worker records a job's messages this way). The caller wakes
    local relays after commit with :func:`wake_local_relays`."""
    rows = [_new_row(m, now) for m in messages]
    for start in range(0, len(rows), _INSERT_CHUNK):
        ins = _insert(conn)(outbox).values(rows[start : start + _INSERT_CHUNK])
        conn.execute(ins.on_conflict_do_nothing(index_elements=["message_id"]))
    if rows and conn.dialect.name == "postgresql":
        # Delivered at commit and dropped on rollback, which is exactly when a relay
        # should (and should not) wake up.
        conn.exec_driver_sql(f"NOTIFY {NOTIFY_CHANNEL}")
    return [r["message_id"] for r in rows]


def wake_local_relays(db: Database) -> None:
    """Wake this process's relays of ``db`` (call on the event loop, after commit)."""
    for ev in list(_wakers.get(str(db.url), ())):
        ev.set()


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


# In-process wake-ups: relays of this process register an event per database URL; an
# add() sets it once its transaction commits (SQLite has no LISTEN/NOTIFY).
_wakers: dict[str, set[asyncio.Event]] = {}


def _wake_after_commit(conn: AsyncConnection) -> None:
    from sqlalchemy import event

    key = str(conn.engine.url)
    sync_conn = conn.sync_connection
    if not _wakers.get(key) or sync_conn is None:
        return

    def on_commit(_conn: Any) -> None:
        for ev in list(_wakers.get(key, ())):
            ev.set()

    if not event.contains(sync_conn, "commit", on_commit):
        event.listen(sync_conn, "commit", on_commit, once=True)


# --- the relay's named operations ------------------------------------------------------


def _message(r: Row[Any]) -> OutboxMessage:
    return OutboxMessage(
        id=r.id,
        topic=r.topic,
        key=r.key,
        payload=r.payload,
        message_id=r.message_id,
        attempts=r.attempts,
        created_at=r.created_at,
    )


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


async def claim_batch(conn: AsyncConnection, *, now: datetime, limit: int) -> list[OutboxMessage]:
    """Lock up to ``limit`` due pending messages and return those that may be published now.

    Must run in the transaction that will record their outcome: the row locks (on
    PostgreSQL; the write lock on SQLite) are what keep other relays off them. A keyed
    message is returned only if every pending message of its key with a smaller id is in
    this claim too, so the returned messages of each key are the head of its queue.
    Returned in id order.
    """
    rows = list(await conn.execute(_claim_statement(now, limit)))
    keys = {r.key for r in rows if r.key is not None}
    if not keys:
        return [_message(r) for r in rows]
    # The first pending message of each key that this claim does not hold (locked by
    # another relay, or just added): nothing after it may go. A plain read, so that it
    # sees the rows other relays hold instead of skipping them. One index probe per key
    # (ix_outbox_pending_key), not a scan of every pending message of the keys.
    held = [r.id for r in rows]
    if conn.dialect.name == "postgresql":
        params: dict[str, Any] = {"keys": sorted(keys), "ids": held}
    else:
        params = {"keys": json.dumps(sorted(keys)), "ids": json.dumps(held)}
    first_blocker: dict[str, int] = {
        k: int(i)
        for k, i in await conn.execute(_BLOCKERS[conn.dialect.name], params)
        if i is not None
    }
    return [
        _message(r)
        for r in rows
        if r.key is None or r.key not in first_blocker or r.id < first_blocker[r.key]
    ]


async def mark_published(conn: AsyncConnection, ids: Sequence[int], *, now: datetime) -> None:
    """The broker confirmed these messages."""
    if ids:
        await conn.execute(
            update(outbox)
            .where(outbox.c.id.in_(list(ids)))
            .values(status="published", published_at=now, attempts=outbox.c.attempts + 1)
        )


async def schedule_retries(
    conn: AsyncConnection, retries: Sequence[tuple[int, str, datetime]]
) -> None:
    """Transient failures ``(id, error, next_attempt_at)``: count the attempt, try again later."""
    if retries:
        stmt = (
            update(outbox)
            .where(outbox.c.id == bindparam("b_id"))
            .values(
                attempts=outbox.c.attempts + 1,
                last_error=bindparam("b_error"),
                next_attempt_at=bindparam("b_at"),
            )
        )
        await conn.execute(
            stmt, [{"b_id": i, "b_error": e[:4000], "b_at": at} for i, e, at in retries]
        )


async def mark_failed(
    conn: AsyncConnection, rejected: Sequence[tuple[OutboxMessage, str]], *, now: datetime
) -> None:
    """Messages the broker refused for good: ``failed`` here, and each captured in the DLQ
    (:func:`synckit.store.dead_letters.capture_many`: a ``review`` row, since a refusal is a
    validation error; a message an operator ignored there stays ignored)."""
    # Imported here: the DLQ's package imports the runtime (handlers import this module).
    from synckit.store.dead_letters import Failure, capture_many, storable_text

    if not rejected:
        return
    stmt = (
        update(outbox)
        .where(outbox.c.id == bindparam("b_id"))
        .values(attempts=outbox.c.attempts + 1, status="failed", last_error=bindparam("b_error"))
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


async def pending_count(db: Database) -> int:
    """Messages not yet published nor failed (due now or waiting for a retry)."""
    async with db.begin() as conn:
        n = await conn.execute(
            select(func.count()).select_from(outbox).where(outbox.c.status == _PENDING)
        )
        return int(n.scalar_one())


# --- publishers -----------------------------------------------------------------------


class Publisher(Protocol):
    """Where the relay sends messages.

    ``publish`` returns once the broker has taken responsibility for the message (for
    RabbitMQ: the publisher confirm). It raises :class:`PublishRejected` when the broker
    refuses the message for good and :class:`PublishFailed` when it may work later; any
    other exception is a bug. ``connect`` is called before every batch and must be cheap
    when already connected; it raises :class:`PublisherUnavailable`. The relay publishes
    many messages concurrently and never closes the publisher: its owner does.
    """

    async def connect(self) -> None: ...

    async def publish(self, message: OutboxMessage) -> None: ...

    async def close(self) -> None: ...


class CallbackPublisher:
    """Publishes by awaiting ``callback(message)``: tests, in-process consumers, adapters.

    The callback may raise :class:`PublishRejected` or :class:`PublishFailed`; any other
    exception counts as a transient failure (the message is retried), because this is
    the seam where arbitrary user code meets the relay. On SQLite the callback runs while
    the relay holds the write lock, so it must not write to the same database.
    """

    def __init__(self, callback: Callable[[OutboxMessage], Awaitable[None]]) -> None:
        self._callback = callback

    async def connect(self) -> None:
        return None

    async def publish(self, message: OutboxMessage) -> None:
        try:
            await self._callback(message)
        except (PublishRejected, PublishFailed):
            raise
        except Exception as exc:
            raise PublishFailed(f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        return None


class LogPublisher:
    """Publishes by logging ``outbox.message`` events: development without a broker."""

    def __init__(self, logger: Any = None) -> None:
        self._log = logger if logger is not None else log

    async def connect(self) -> None:
        return None

    async def publish(self, message: OutboxMessage) -> None:
        self._log.info(
            "outbox.message",
            topic=message.topic,
            key=message.key,
            message_id=message.message_id,
            payload=message.payload,
        )

    async def close(self) -> None:
        return None


_BROKER_MAX_SIZE = re.compile(r"larger than configured max size (\d+)")


class RabbitPublisher:
    """Publishes to a RabbitMQ exchange with aio-pika (``pip install synckit[rabbitmq]``).

    Each message goes to ``exchange`` with routing key = topic, persistent, with the
    outbox ``message_id`` as the AMQP ``message_id``, ``content_type`` JSON, the key in
    the ``x-outbox-key`` header, and ``mandatory`` set. ``publish`` waits for the
    publisher confirm (at most ``confirm_timeout`` seconds). A returned (unroutable)
    message, a nack, or a body over ``max_message_size`` bytes is a
    :class:`PublishRejected`; any connection or channel trouble is a
    :class:`PublishFailed`, after which the next :meth:`connect` reconnects.

    ``declare_exchange`` declares a durable exchange of ``exchange_type`` on connect;
    otherwise the exchange must exist. ``exchange=""`` is the default exchange (the
    topic is then a queue name). ``max_message_size`` defaults to 16 MiB, RabbitMQ 4's
    default limit (3.x allows 128 MiB); a broker that closes the channel for a size
    over its limit lowers it to the broker's figure.
    """

    def __init__(
        self,
        url: str = "amqp://guest:guest@127.0.0.1:5672/",
        *,
        exchange: str = DEFAULT_EXCHANGE,
        exchange_type: str = "topic",
        declare_exchange: bool = True,
        confirm_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        max_message_size: int = 16 * 1024 * 1024,
    ) -> None:
        self.url = url
        self.exchange_name = exchange
        self.exchange_type = exchange_type
        self.declare_exchange = declare_exchange
        self.confirm_timeout = confirm_timeout
        self.connect_timeout = connect_timeout
        self.max_message_size = max_message_size
        self.connects = 0
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._lock = asyncio.Lock()

    @property
    def connected(self) -> bool:
        return (
            self._exchange is not None
            and self._connection is not None
            and not self._connection.is_closed
            and self._channel is not None
            and not self._channel.is_closed
        )

    async def connect(self) -> None:
        if self.connected:
            return
        async with self._lock:
            if self.connected:
                return
            await self._drop()
            try:
                import aio_pika
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise PublisherUnavailable(
                    "RabbitPublisher needs aio-pika: pip install synckit[rabbitmq]"
                ) from exc
            try:
                connection = await aio_pika.connect(self.url, timeout=self.connect_timeout)
                try:
                    channel = await connection.channel(
                        publisher_confirms=True, on_return_raises=True
                    )
                    if not self.exchange_name:
                        exchange = channel.default_exchange
                    elif self.declare_exchange:
                        exchange = await channel.declare_exchange(
                            self.exchange_name, self.exchange_type, durable=True
                        )
                    else:
                        exchange = await channel.get_exchange(self.exchange_name, ensure=True)
                except BaseException:
                    with contextlib.suppress(Exception):
                        await connection.close()
                    raise
            # The translation seam for connecting: aio-pika/aiormq raise a wide,
            # version-dependent set here (OSError, EOFError, AMQPError, TimeoutError,
            # RuntimeError on a half-open transport...). Each means "not reachable now".
            except Exception as exc:
                raise PublisherUnavailable(
                    f"cannot use RabbitMQ at {_mask_amqp(self.url)}: {type(exc).__name__}: {exc}"
                ) from exc
            self._connection, self._channel, self._exchange = connection, channel, exchange
            self.connects += 1

    async def publish(self, message: OutboxMessage) -> None:
        import aio_pika
        import aiormq
        import aiormq.exceptions as amqp_errors

        body = message.body()
        if len(body) > self.max_message_size:
            raise PublishRejected(
                f"message is {len(body)} bytes, over the broker's max_message_size "
                f"{self.max_message_size}"
            )
        exchange = self._exchange
        if exchange is None or not self.connected:
            raise PublishFailed("not connected to RabbitMQ")
        amqp_message = aio_pika.Message(
            body,
            message_id=message.message_id,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            timestamp=message.created_at,
            headers={"x-outbox-key": message.key} if message.key is not None else None,
            app_id="synckit",
        )
        try:
            await exchange.publish(
                amqp_message,
                routing_key=message.topic,
                mandatory=True,
                timeout=self.confirm_timeout,
            )
        except amqp_errors.PublishError as exc:  # a Basic.Return (before DeliveryError)
            ret = exc.message.delivery if exc.message is not None else None
            detail = (
                f"{ret.reply_code} {ret.reply_text}"
                if isinstance(ret, aiormq.spec.Basic.Return)
                else str(exc)
            )
            raise PublishRejected(
                f"unroutable: the broker returned the message ({detail}) from exchange "
                f"{self.exchange_name!r} with routing key {message.topic!r}"
            ) from exc
        except amqp_errors.DeliveryError as exc:
            raise PublishRejected(f"the broker refused the message: {exc}") from exc
        except ValueError as exc:  # aiormq's own check of the routing key
            raise PublishRejected(f"cannot publish: {exc}") from exc
        except (
            amqp_errors.AMQPError,
            amqp_errors.ChannelInvalidStateError,
            ConnectionError,
            OSError,
            EOFError,
            TimeoutError,
            RuntimeError,
        ) as exc:
            if match := _BROKER_MAX_SIZE.search(str(exc)):
                # The broker closed the channel over a body size; from now on such a
                # message is refused here, so it is dead-lettered instead of closing the
                # channel under every batch it lands in.
                self.max_message_size = min(self.max_message_size, int(match.group(1)))
            self._exchange = None
            raise PublishFailed(
                f"publish to RabbitMQ failed: {type(exc).__name__}: {exc}".rstrip(": ")
            ) from exc

    async def close(self) -> None:
        async with self._lock:
            await self._drop()

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        self._channel = self._exchange = None
        if connection is not None and not connection.is_closed:
            # Closing a connection the broker already dropped can raise anything the
            # transport had, or wait for ever on a hung broker; nothing is left to save.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), self.connect_timeout)


def _mask_amqp(url: str) -> str:
    return re.sub(r"//([^:/@]*):[^@]*@", r"//\1:***@", url)


# --- the relay ------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchResult:
    """What one batch did: messages claimed, confirmed, dead-lettered, left for a retry."""

    claimed: int = 0
    published: int = 0
    rejected: int = 0
    retrying: int = 0


@dataclass
class RelayStats:
    """Running totals of one relay, for tests, benchmarks and status pages."""

    batches: int = 0
    published: int = 0
    rejected: int = 0
    retrying: int = 0
    #: Times the relay backed off (publisher unavailable, failures, database trouble).
    backoffs: int = 0


@dataclass
class _Outcomes:
    published: list[int] = field(default_factory=list)
    rejected: list[tuple[OutboxMessage, str]] = field(default_factory=list)
    retries: list[tuple[OutboxMessage, str]] = field(default_factory=list)


class OutboxRelay:
    """Publishes pending outbox messages through ``publisher``.

    ``batch`` messages are claimed per transaction and published concurrently (the
    messages of one key one after the other); ``retry_policy`` spaces both the retries of
    a message that failed transiently and the relay's reconnects (attempt limits do not
    apply: the outbox never gives up on a transient failure). ``idle_interval`` is how
    often an idle relay looks for work when nothing wakes it.
    """

    def __init__(
        self,
        db: Database,
        publisher: Publisher,
        *,
        batch: int = 500,
        retry_policy: RetryPolicy | None = None,
        idle_interval: float = 0.5,
        listen: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        if batch <= 0:
            raise OutboxError(f"batch must be positive, not {batch}")
        self.db = db
        self.publisher = publisher
        self.batch = batch
        self.retry_policy = replace(retry_policy or DEFAULT_RETRY_POLICY, max_attempts={})
        self.idle_interval = idle_interval
        self.listen = listen
        self.stats = RelayStats()
        self._rng = rng or random.Random()
        self._failures = 0
        self._wake = asyncio.Event()

    async def relay_once(self) -> int:
        """Publish one batch; return how many messages the broker confirmed.

        Raises :class:`PublisherUnavailable` when the broker cannot be reached and
        :class:`~synckit.errors.DatabaseError` when the database cannot.
        """
        return (await self.relay_batch()).published

    async def relay_batch(self) -> BatchResult:
        """Like :meth:`relay_once`, with the whole tally of the batch."""
        # Connect before the transaction opens: a broker that is down must not hold
        # row locks (or, on SQLite, the write lock) while it refuses us.
        await self.publisher.connect()
        outcomes = _Outcomes()
        async with self.db.begin() as conn:
            messages = await claim_batch(conn, now=utcnow(), limit=self.batch)
            if not messages:
                return BatchResult()
            await self._publish(messages, outcomes)
            now = utcnow()
            await mark_published(conn, outcomes.published, now=now)
            await schedule_retries(
                conn,
                [(m.id, error, now + self._delay(m.attempts + 1)) for m, error in outcomes.retries],
            )
            await mark_failed(conn, outcomes.rejected, now=now)
        result = BatchResult(
            claimed=len(messages),
            published=len(outcomes.published),
            rejected=len(outcomes.rejected),
            retrying=len(outcomes.retries),
        )
        self.stats.batches += 1
        self.stats.published += result.published
        self.stats.rejected += result.rejected
        self.stats.retrying += result.retrying
        for m, reason in outcomes.rejected:
            log.warning(
                "outbox.dead_lettered",
                id=m.id,
                topic=m.topic,
                key=m.key,
                message_id=m.message_id,
                reason=reason,
            )
        if outcomes.retries:
            log.warning(
                "outbox.publish_failed",
                count=len(outcomes.retries),
                error=outcomes.retries[0][1],
            )
        return result

    async def _publish(self, messages: Sequence[OutboxMessage], out: _Outcomes) -> None:
        chains: dict[str, list[OutboxMessage]] = {}
        singles: list[OutboxMessage] = []
        for m in messages:
            if m.key is None:
                singles.append(m)
            else:
                chains.setdefault(m.key, []).append(m)

        async def one(m: OutboxMessage) -> bool:
            try:
                await self.publisher.publish(m)
            except PublishRejected as exc:
                out.rejected.append((m, str(exc) or type(exc).__name__))
                return True  # refused for good: the rest of its key flows on
            except PublishFailed as exc:
                out.retries.append((m, str(exc) or type(exc).__name__))
                return False
            out.published.append(m.id)
            return True

        async def chain(ms: list[OutboxMessage]) -> None:
            for m in ms:
                # Message N+1 of a key waits for N's confirm; after a transient failure
                # the rest of the key stays pending, untouched, behind it.
                if not await one(m):
                    return

        # A TaskGroup, so that a bug in one publish cancels the others before the
        # transaction rolls back, rather than leaving them running.
        async with asyncio.TaskGroup() as tg:
            for ms in chains.values():
                tg.create_task(chain(ms))
            for m in singles:
                tg.create_task(one(m))

    def _delay(self, attempt: int) -> timedelta:
        decision = retry_delay(_TRANSIENT, max(1, attempt), self.retry_policy, rng=self._rng)
        return decision.delay if decision is not None else self.retry_policy.cap

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop`` is set, surviving broker and database outages.

        Between batches with work it goes on at once; when idle it waits for an
        :func:`add` in this process, a NOTIFY on PostgreSQL, or ``idle_interval``. Any
        failure is logged and retried with backoff; this coroutine only returns when
        stopped (or is cancelled).
        """
        key = str(self.db.url)
        _wakers.setdefault(key, set()).add(self._wake)
        listener = (
            asyncio.create_task(self._listen(), name="synckit-outbox-listen")
            if self.listen and self.db.is_postgres
            else None
        )
        log.info("outbox.relay_started", batch=self.batch)
        try:
            while not stop.is_set():
                result = await self._step()
                if result is None:
                    await self._sleep(stop, self._next_backoff())
                elif result.claimed == 0:
                    await self._idle(stop)
        finally:
            _wakers.get(key, set()).discard(self._wake)
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener
            log.info("outbox.relay_stopped", published=self.stats.published)

    async def run_until_empty(self) -> int:
        """Relay until no message is pending; return how many were published meanwhile.

        Outages are waited out with backoff, like :meth:`run`, and messages waiting for a
        retry are waited for, so bound it with ``asyncio.timeout`` where that matters.
        """
        published = 0
        never = asyncio.Event()
        while True:
            result = await self._step()
            if result is None:
                await self._sleep(never, self._next_backoff())
                continue
            published += result.published
            if result.claimed == 0:
                if await pending_count(self.db) == 0:
                    return published
                # Held by another relay, or waiting for a retry: look again soon.
                await asyncio.sleep(min(self.idle_interval, 0.05))

    async def _step(self) -> BatchResult | None:
        """One batch; None when it could not run (already logged).

        Only a batch that could not run backs the relay off: messages that failed inside
        a batch carry their own backoff, and a lost broker shows at the next connect.
        """
        try:
            result = await self.relay_batch()
        except PublishFailed as exc:
            log.warning("outbox.publisher_unavailable", error=str(exc))
        except DatabaseError as exc:
            log.warning("outbox.database_error", error=str(exc))
        except Exception:
            # The relay is a long-lived background task: an unexpected error (a bug in
            # a publisher, say) is logged and retried with backoff rather than ending
            # relaying for the life of the process.
            log.exception("outbox.relay_error")
        else:
            self._failures = 0
            return result
        return None

    def _next_backoff(self) -> float:
        self._failures += 1
        self.stats.backoffs += 1
        return self._delay(self._failures).total_seconds()

    async def _sleep(self, stop: asyncio.Event, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=seconds)

    async def _idle(self, stop: asyncio.Event) -> None:
        self._wake.clear()
        stop_wait = asyncio.ensure_future(stop.wait())
        wake_wait = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait(
                {stop_wait, wake_wait},
                timeout=self.idle_interval,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            stop_wait.cancel()
            wake_wait.cancel()

    async def _listen(self) -> None:
        """Wake on NOTIFY from other processes' add(); reconnect with backoff when dropped."""
        import asyncpg

        url = self.db.url.set(drivername="postgresql")
        dsn = url.render_as_string(hide_password=False)
        failures = 0
        while True:
            conn = None
            try:
                conn = await asyncpg.connect(dsn, timeout=10)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, ev=lost: ev.set())
                await conn.add_listener(NOTIFY_CHANNEL, lambda *_a: self._wake.set())
                failures = 0
                self._wake.set()  # anything added while we were not listening
                await lost.wait()
            except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                failures += 1
                log.warning("outbox.listen_failed", error=str(exc))
                await asyncio.sleep(self._delay(failures).total_seconds())
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()


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
    moments: dict[str, datetime | None] = {}
    for name in ("next_attempt_at", "created_at", "published_at"):
        try:
            moments[name] = read_moment(getattr(r, name))
        except ValueError as exc:
            moments[name], bad[name] = None, str(exc)
    try:
        payload = read_payload(r.payload)
    except ValueError as exc:
        payload, bad["payload"] = None, str(exc)
    return OutboxInfo(
        id=r.id,
        topic=r.topic,
        key=r.key,
        message_id=r.message_id,
        status=r.status,
        attempts=r.attempts,
        last_error=r.last_error,
        payload=payload,
        unreadable=bad,
        **moments,
    )


# ``outbox`` as the views read it: timestamps guarded and the payload as text, parsed
# per row by _info (the drivers would fail the whole fetch on one corrupt value).
_LISTED: Any = select(
    *(
        cast(c, Text).label(c.name)
        if c.name == "payload"
        else guarded_moment(c)
        if isinstance(c.type, UTCDateTime)
        else c
        for c in outbox.c
    )
)


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
    async with db.begin() as conn:
        return [_info(r) for r in await conn.execute(stmt)]


async def count_by_status(db: Database) -> dict[str, int]:
    async with db.begin() as conn:
        rows = await conn.execute(select(outbox.c.status, func.count()).group_by(outbox.c.status))
        return {s: int(c) for s, c in rows}


async def _requeue(conn: AsyncConnection, where: Any, now: datetime) -> list[str]:
    """Back to pending, due now, with a fresh backoff; return the message ids."""
    res = await conn.execute(
        update(outbox)
        .where(where)
        .values(status="pending", next_attempt_at=now, attempts=0)
        .returning(outbox.c.message_id)
    )
    message_ids = [r[0] for r in res]
    # Their dead letters are being handled: close them, so the DLQ shows what is open.
    for start in range(0, len(message_ids), _INSERT_CHUNK):
        await conn.execute(
            update(dead_letters)
            .where(
                dead_letters.c.tenant == "",
                dead_letters.c.connector == "outbox",
                dead_letters.c.record_id.in_(message_ids[start : start + _INSERT_CHUNK]),
                dead_letters.c.status == "review",
            )
            .values(status="resolved", status_reason="outbox message retried", resolved_at=now)
        )
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
    total = 0
    while True:
        async with db.begin() as conn:
            victims = (
                select(outbox.c.id)
                .where(outbox.c.status == "published", outbox.c.published_at < cutoff)
                .limit(batch)
            )
            res = await conn.execute(
                delete(outbox).where(outbox.c.id.in_(victims.scalar_subquery()))
            )
            n = res.rowcount or 0
        total += n
        if n < batch:
            return total
