"""The outbox relay against the real RabbitMQ: confirms, outages, returns, nacks, order.

Every test declares its own exchange and queue (unique names) and deletes them after.
The broker connection is cut through :class:`TcpProxy`, a loopback proxy the test owns,
so an outage is an outage of this test only, not of the shared broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, AbstractQueue
from services import service_unavailable
from sqlalchemy import select
from waits import EVENT_TIMEOUT, await_until  # tests/

from synckit.errors import RetryPolicy
from synckit.errors.exceptions import PublisherUnavailable
from synckit.runtime.writes import outbox
from synckit.runtime.writes.outbox import OutboxRelay, RabbitPublisher
from synckit.store.db import Database
from synckit.store.outbox import NewMessage
from synckit.store.tables import dead_letters

pytestmark = pytest.mark.rabbitmq

RABBIT_HOST = os.environ.get("SYNCKIT_TEST_RABBIT_HOST", "127.0.0.1")
RABBIT_PORT = int(os.environ.get("SYNCKIT_TEST_RABBIT_PORT", "5672"))
CREDENTIALS = "guest:guest"
FAST = RetryPolicy(
    base=timedelta(milliseconds=100),
    cap=timedelta(seconds=1),
    floor=timedelta(milliseconds=50),
)


def amqp_url(port: int = RABBIT_PORT) -> str:
    return f"amqp://{CREDENTIALS}@{RABBIT_HOST}:{port}/"


@dataclass
class Broker:
    """A test's own exchange (topic) and queue on the shared broker, plus what arrived."""

    connection: AbstractConnection
    channel: AbstractChannel
    exchange: AbstractExchange
    queue: AbstractQueue
    name: str
    received: list[tuple[str, dict[str, Any], str | None]] = field(default_factory=list)

    async def consume(self) -> None:
        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            key = (message.headers or {}).get("x-outbox-key")
            self.received.append(
                (str(message.message_id), json.loads(message.body), key if key else None)
            )

        await self.queue.consume(on_message, no_ack=True)

    async def wait_for(self, distinct: int, seconds: float = EVENT_TIMEOUT) -> None:
        async def arrived() -> bool:
            return len({mid for mid, _, _ in self.received}) >= distinct

        await await_until(
            arrived,
            lambda: f"only {len(self.received)} of {distinct} messages arrived",
            timeout=seconds,
            interval=0.02,
        )


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    """A fresh topic exchange bound with ``orders.#`` to a fresh queue being consumed."""
    try:
        connection = await aio_pika.connect(amqp_url(), timeout=5)
    except Exception as exc:  # whatever aio-pika raises, the broker is not usable here
        service_unavailable("RabbitMQ", f"{RABBIT_HOST}:{RABBIT_PORT}: {exc!r}")
        raise
    name = f"synckit-test-{uuid.uuid4().hex[:12]}"
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=2000)
    exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
    queue = await channel.declare_queue(name, durable=False)
    await queue.bind(exchange, routing_key="orders.#")
    b = Broker(connection, channel, exchange, queue, name)
    await b.consume()
    try:
        yield b
    finally:
        # By name, on a fresh channel: a test may have got the first one closed.
        cleanup = await connection.channel()
        await cleanup.queue_delete(name)
        await cleanup.exchange_delete(name)
        await connection.close()


class TcpProxy:
    """A loopback TCP proxy to the broker that can cut every connection for a while."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.refusing = False
        self.cuts = 0
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()  # a reset at once: the broker is "down"
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._pairs.discard(pair)
            for w in pair:
                w.transport.abort()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.transport.abort()

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until :meth:`heal`."""
        self.refusing = True
        self.cuts += 1
        for pair in list(self._pairs):
            for w in pair:
                w.transport.abort()

    def heal(self) -> None:
        self.refusing = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def check_delivery(broker: Broker, expected: dict[str, dict[str, Any]]) -> int:
    """None lost, duplicates only of one message id, per-key order; return duplicates."""
    first: dict[str, dict[str, Any]] = {}
    order: dict[str, list[int]] = defaultdict(list)
    for mid, body, key in broker.received:
        if mid in first:
            assert body == first[mid], f"message id {mid} carried two different bodies"
            continue
        first[mid] = body
        if key is not None:
            order[key].append(body["seq"])
    assert set(first) == set(expected), "messages lost or invented"
    assert all(first[mid] == body for mid, body in expected.items())
    for key, seqs in order.items():
        assert seqs == sorted(seqs), f"key {key} arrived out of order"
    return len(broker.received) - len(first)


def messages(n: int, keys: int, topic: str = "orders.created") -> list[NewMessage]:
    """``n`` messages, every third unkeyed, the rest spread over ``keys`` keys in sequence."""
    out = []
    for i in range(n):
        key = None if i % 3 == 0 else f"key-{i % keys}"
        out.append(NewMessage(topic, {"seq": i, "key": key}, key=key, message_id=f"m-{i}"))
    return out


async def add_all(db: Database, batch: list[NewMessage]) -> dict[str, dict[str, Any]]:
    async with db.begin() as conn:
        await outbox.add_many(conn, batch)
    return {m.message_id or "": m.payload for m in batch}


async def test_ten_thousand_messages_arrive_once_each_in_key_order(
    db: Database, broker: Broker
) -> None:
    """10,000 messages are confirmed, consumed and counted: none lost, keys in order."""
    expected = await add_all(db, messages(10_000, keys=25))
    publisher = RabbitPublisher(amqp_url(), exchange=broker.name)
    relay = OutboxRelay(db, publisher, batch=500, retry_policy=FAST)
    try:
        # The whole run: about 15-40 s on a quiet machine.
        assert await asyncio.wait_for(relay.run_until_empty(), 3 * EVENT_TIMEOUT) == 10_000
    finally:
        await publisher.close()
    await broker.wait_for(10_000)
    assert check_delivery(broker, expected) == 0  # no outage, so not even a duplicate
    assert await outbox.count_by_status(db) == {"published": 10_000}


async def test_broker_outage_mid_run_loses_nothing(db: Database, broker: Broker) -> None:
    """The broker connection cut for 3 s mid-run: the relay backs off, resumes, loses nothing."""
    proxy = TcpProxy(RABBIT_HOST, RABBIT_PORT)
    port = await proxy.start()
    expected = await add_all(db, messages(6_000, keys=25))
    publisher = RabbitPublisher(amqp_url(port), exchange=broker.name, connect_timeout=2)
    relay = OutboxRelay(db, publisher, batch=200, retry_policy=FAST, idle_interval=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        await broker.wait_for(1_000)
        proxy.cut()
        pending_at_cut = await outbox.pending_count(db)
        # Writers keep working while the broker is away; these wait in the outbox.
        late = [
            NewMessage("orders.late", {"seq": i, "key": "late"}, key="late", message_id=f"late-{i}")
            for i in range(500)
        ]
        expected |= await add_all(db, late)
        await asyncio.sleep(3)
        assert await outbox.pending_count(db) > 0  # nothing got through the cut
        proxy.heal()
        await broker.wait_for(len(expected))  # a loaded machine is slow, not lossy

        async def drained() -> bool:
            return await outbox.pending_count(db) == 0

        await await_until(drained, "the outbox drained", interval=0.02)
    finally:
        stop.set()
        await asyncio.wait_for(task, EVENT_TIMEOUT)
        await publisher.close()
        await proxy.close()
    assert pending_at_cut > 0, "the relay finished before the cut: the test proved nothing"
    check_delivery(broker, expected)
    assert await outbox.count_by_status(db) == {"published": len(expected)}
    assert publisher.connects >= 2 and relay.stats.backoffs > 0


async def test_rolled_back_transaction_publishes_nothing(db: Database, broker: Broker) -> None:
    """Only the committed transaction's message reaches the broker, not the rolled-back one."""
    with pytest.raises(RuntimeError):
        async with db.begin() as conn:
            await outbox.add(conn, "orders.created", {"seq": 1}, message_id="rolled-back")
            raise RuntimeError("business write failed")
    async with db.begin() as conn:
        await outbox.add(conn, "orders.created", {"seq": 2}, message_id="committed")
    publisher = RabbitPublisher(amqp_url(), exchange=broker.name)
    try:
        assert await OutboxRelay(db, publisher).run_until_empty() == 1
    finally:
        await publisher.close()
    await broker.wait_for(1)
    await asyncio.sleep(0.3)  # time for anything else to arrive (nothing should)
    assert [mid for mid, _, _ in broker.received] == ["committed"]


async def test_unroutable_message_is_dead_lettered_and_others_flow(
    db: Database, broker: Broker
) -> None:
    """A message no queue is bound for is returned (mandatory), dead-lettered; others arrive."""
    async with db.begin() as conn:
        await outbox.add(conn, "orders.created", {"seq": 0}, key="k", message_id="before")
        await outbox.add(conn, "invoices.created", {"seq": 1}, key="k", message_id="lost")
        await outbox.add(conn, "orders.created", {"seq": 2}, key="k", message_id="after")
    publisher = RabbitPublisher(amqp_url(), exchange=broker.name)
    try:
        assert await OutboxRelay(db, publisher).run_until_empty() == 2
    finally:
        await publisher.close()
    await broker.wait_for(2)
    assert [mid for mid, _, _ in broker.received] == ["before", "after"]
    [failed] = await outbox.list_messages(db, status="failed")
    assert failed.message_id == "lost"
    async with db.begin() as conn:
        [dl] = list(await conn.execute(select(dead_letters)))
    assert (dl.connector, dl.kind, dl.record_id, dl.status) == (
        "outbox",
        "outbox:invoices.created",
        "lost",
        "review",
    )
    assert "unroutable" in dl.error_message and "NO_ROUTE" in dl.error_message
    assert "invoices.created" in dl.error_message


async def test_nacked_message_is_dead_lettered(db: Database, broker: Broker) -> None:
    """A message the broker nacks (a full queue that rejects publishes) is dead-lettered."""
    full = await broker.channel.declare_queue(
        f"{broker.name}-full",
        durable=False,
        arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
    )
    await full.bind(broker.exchange, routing_key="full.#")
    try:
        async with db.begin() as conn:
            await outbox.add(conn, "full.created", {"seq": 0}, message_id="nacked")
            await outbox.add(conn, "orders.created", {"seq": 1}, message_id="fine")
        publisher = RabbitPublisher(amqp_url(), exchange=broker.name)
        try:
            assert await OutboxRelay(db, publisher).run_until_empty() == 1
        finally:
            await publisher.close()
    finally:
        await full.delete(if_unused=False, if_empty=False)
    [failed] = await outbox.list_messages(db, status="failed")
    assert failed.message_id == "nacked" and "Nack" in (failed.last_error or "")
    await broker.wait_for(1)
    assert [mid for mid, _, _ in broker.received] == ["fine"]


async def test_too_large_message_is_dead_lettered(db: Database, broker: Broker) -> None:
    """A body over max_message_size is refused before it can close the channel."""
    async with db.begin() as conn:
        await outbox.add(conn, "orders.created", {"blob": "x" * 5000}, message_id="big")
        await outbox.add(conn, "orders.created", {"seq": 1}, message_id="small")
    publisher = RabbitPublisher(amqp_url(), exchange=broker.name, max_message_size=1024)
    try:
        assert await OutboxRelay(db, publisher).run_until_empty() == 1
    finally:
        await publisher.close()
    [failed] = await outbox.list_messages(db, status="failed")
    assert failed.message_id == "big" and "max_message_size 1024" in (failed.last_error or "")
    await broker.wait_for(1)
    assert [mid for mid, _, _ in broker.received] == ["small"]


async def test_amqp_properties_carry_the_message_id(db: Database, broker: Broker) -> None:
    """Deliveries are persistent JSON with the outbox message id and key, routed by topic."""
    seen: list[aio_pika.abc.AbstractIncomingMessage] = []
    probe = await broker.channel.declare_queue(f"{broker.name}-probe", durable=False)
    await probe.bind(broker.exchange, routing_key="orders.paid")

    async def keep(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        seen.append(message)

    await probe.consume(keep, no_ack=True)
    try:
        async with db.begin() as conn:
            await outbox.add(conn, "orders.paid", {"seq": 1}, key="order-7", message_id="paid-7")
        publisher = RabbitPublisher(amqp_url(), exchange=broker.name)
        try:
            await OutboxRelay(db, publisher).run_until_empty()
        finally:
            await publisher.close()
        await broker.wait_for(1)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.02)
    finally:
        await probe.delete(if_unused=False, if_empty=False)
    [m] = seen
    assert m.message_id == "paid-7" and m.routing_key == "orders.paid"
    assert m.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert m.content_type == "application/json" and json.loads(m.body) == {"seq": 1}
    assert (m.headers or {}).get("x-outbox-key") == "order-7"


async def test_missing_exchange_keeps_messages_pending(db: Database, broker: Broker) -> None:
    """An exchange that does not exist (and is not declared) is an outage: nothing is lost."""
    async with db.begin() as conn:
        await outbox.add(conn, "orders.created", {"seq": 1}, message_id="kept")
    publisher = RabbitPublisher(
        amqp_url(), exchange=f"{broker.name}-missing", declare_exchange=False
    )
    relay = OutboxRelay(db, publisher)
    try:
        with pytest.raises(PublisherUnavailable, match="NOT_FOUND"):
            await relay.relay_once()
    finally:
        await publisher.close()
    assert await outbox.count_by_status(db) == {"pending": 1}
