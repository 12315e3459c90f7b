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

Claiming. No transaction is open while a broker confirms. A batch is claimed under the
one lease (:mod:`synckit.store.leases`) in a short transaction that commits before the
first publish; the messages are published and their confirms awaited with no
transaction open; the outcomes are written in a second short transaction, fenced by the
lease (:func:`synckit.store.outbox.record`). A relay that dies between the publish and
that write leaves its messages to come due when the lease ends: they are published again
with the same ``message_id`` (at least once). Publishing stops starting new messages
halfway through the lease, and the batch's publishes are cut off before the lease ends,
so a slow broker cannot make two relays hold one message.

* PostgreSQL: candidates are locked ``FOR UPDATE SKIP LOCKED`` for the claim's short
  transaction, so any number of relay processes share the backlog and never publish one
  message concurrently. Per-key order across relays: a message is only claimed when
  every pending message of its key with a smaller id is due and in the same claim (a
  smaller one held by another relay, whose lease moved it out of due, or waiting for its
  retry, blocks it).
* SQLite: write transactions are serialised (``BEGIN IMMEDIATE``), and each of the
  relay's is a few statements long, so an :func:`add` from another connection never
  waits for a broker.

Every SQL statement on ``outbox`` lives in :mod:`synckit.store.outbox`, named; this
module re-exports the operations the CLI (:mod:`synckit.cli.outbox`), the
console and the worker call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from synckit import tracing
from synckit.clock import utcnow
from synckit.errors import Classification, ErrorClass, RetryPolicy, retry_delay
from synckit.errors.exceptions import (
    DatabaseError,
    OutboxError,
    PublisherUnavailable,
    PublishFailed,
    PublishRejected,
)
from synckit.store import notify
from synckit.store import outbox as store
from synckit.store.db import Database
from synckit.store.leases import new_lease
from synckit.store.outbox import (
    NOTIFY_CHANNEL,
    NewMessage,
    OutboxInfo,
    OutboxMessage,
    add,
    add_many,
    add_many_sync,
    claim_batch,
    count_by_status,
    list_messages,
    mark_failed,
    mark_published,
    pending_count,
    prune,
    retry_failed,
    retry_messages,
    schedule_retries,
    wake_local_relays,
)

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
    "OutboxInfo",
    "OutboxMessage",
    "OutboxRelay",
    "Publisher",
    "RabbitPublisher",
    "RelayStats",
    "add",
    "add_many",
    "add_many_sync",
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
    "wake_local_relays",
]

log = structlog.get_logger("synckit.outbox")

DEFAULT_EXCHANGE = "synckit.outbox"

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
    the seam where arbitrary user code meets the relay. No transaction is open while it
    runs, so it may write to the same database, on SQLite too.
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
            headers=_headers(message),
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


def _headers(message: OutboxMessage) -> dict[str, Any] | None:
    """A message's AMQP headers: its ordering key, and the W3C ``traceparent`` of the span
    it was published (or, tracing off here, written) in, so a consumer continues the trace."""
    headers: dict[str, Any] = {}
    if message.key is not None:
        headers["x-outbox-key"] = message.key
    if message.trace_parent:
        headers["traceparent"] = message.trace_parent
    return headers or None


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
    often an idle relay looks for work when nothing wakes it. ``lease`` is how long a
    claimed batch is held: new publishes start in its first half only, and publishes
    still unconfirmed at three quarters of it are cut off (those messages are retried
    without spending an attempt), so the outcome is written while the lease holds.
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
        lease: timedelta = timedelta(minutes=2),
    ) -> None:
        if batch <= 0:
            raise OutboxError(f"batch must be positive, not {batch}")
        if lease <= timedelta(0):
            raise OutboxError(f"lease must be positive, not {lease}")
        self.lease = lease
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
        :class:`~synckit.errors.exceptions.DatabaseError` when the database cannot.
        """
        return (await self.relay_batch()).published

    async def relay_batch(self) -> BatchResult:
        """Like :meth:`relay_once`, with the whole tally of the batch."""
        # Connect before claiming: a broker that is down must not leave messages leased
        # (held back for the lease) while it refuses us.
        await self.publisher.connect()
        outcomes = _Outcomes()
        started = asyncio.get_running_loop().time()
        lease = new_lease(self.lease)
        messages = await store.claim(self.db, now=utcnow(), limit=self.batch, lease=lease)
        if not messages:
            return BatchResult()
        # No transaction is open from here until the outcomes are written.
        window = self.lease.total_seconds()
        await self._publish(messages, outcomes, stop_starting=started + window / 2)
        if asyncio.get_running_loop().time() - started > window * 0.75:
            log.warning("outbox.slow_batch", claimed=len(messages), lease=window)
        now = utcnow()
        done = {*outcomes.published, *(m.id for m, _ in outcomes.rejected)}
        done.update(m.id for m, _ in outcomes.retries)
        recorded = await store.record(
            self.db,
            lease.token,
            published=outcomes.published,
            retries=[
                (m.id, error, now + self._delay(m.attempts + 1)) for m, error in outcomes.retries
            ],
            rejected=outcomes.rejected,
            released=[m.id for m in messages if m.id not in done],
            now=now,
        )
        if recorded.lost:
            # Taken over after our lease ended: the new holder publishes them again.
            log.warning("outbox.lease_lost", count=len(recorded.lost))
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

    async def _publish(
        self, messages: Sequence[OutboxMessage], out: _Outcomes, *, stop_starting: float
    ) -> None:
        """Publish ``messages`` (keys in order), starting none after ``stop_starting``
        (event loop time); publishes still running at twice that are cut off and their
        messages left out of ``out``, to be released."""
        loop = asyncio.get_running_loop()
        cut_off = stop_starting + (stop_starting - loop.time()) / 2
        chains: dict[str, list[OutboxMessage]] = {}
        singles: list[OutboxMessage] = []
        for m in messages:
            if m.key is None:
                singles.append(m)
            else:
                chains.setdefault(m.key, []).append(m)

        async def one(m: OutboxMessage) -> bool:
            if loop.time() > stop_starting:
                return False  # left for the next claim, not attempted
            try:
                # The publish's span (tracing on) is a child of the span the message was
                # written in; the message carries the publish span's traceparent.
                with tracing.publish_span(m) as span:
                    if span is None:
                        await self.publisher.publish(m)
                    else:
                        tp = tracing.current_traceparent()
                        await self.publisher.publish(dataclasses.replace(m, trace_parent=tp))
                        span.set_attribute("synckit.outbox.confirmed", True)
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

        # A TaskGroup, so that a bug in one publish cancels the others rather than
        # leaving them running past the batch.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(cut_off), asyncio.TaskGroup() as tg:
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
        notify.register(self.db, NOTIFY_CHANNEL, self._wake)
        listener = (
            asyncio.create_task(
                notify.listen(
                    self.db,
                    NOTIFY_CHANNEL,
                    self._wake.set,
                    delay=lambda n: self._delay(n).total_seconds(),
                    on_failure=lambda exc: log.warning("outbox.listen_failed", error=str(exc)),
                ),
                name="synckit-outbox-listen",
            )
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
            notify.unregister(self.db, NOTIFY_CHANNEL, self._wake)
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
