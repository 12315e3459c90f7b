"""Outbox relay throughput: messages/s published to RabbitMQ with publisher confirms.

    python -m bench.outbox [--n 10000] [--batch 500] [--keys 0] [--write-batch 50] [--json]

For each engine (a temporary SQLite file; a PostgreSQL schema of its own, created and
dropped here) it writes ``n`` messages, then times :meth:`OutboxRelay.run_until_empty`
from the first claim until every message is confirmed by the broker and marked
published. The broker side is a fresh topic exchange bound to one queue; the queue's
depth is checked afterwards (all ``n`` messages routed), then both are deleted. Writing
the messages (:func:`outbox.add_many`, ``--write-batch`` messages per transaction, as an
application's transactions write them) is timed apart from the relay.

``--keys K`` spreads the messages over K ordering keys (0: no keys, no ordering).
``--json`` prints ``{"relay_per_s": <slowest engine>, "relay_per_s_<engine>": ...,
"write_per_s_<engine>": ...}``.
Environment: ``SYNCKIT_BENCH_AMQP_URL`` (default amqp://guest:guest@127.0.0.1:5672/),
``SYNCKIT_BENCH_POSTGRES_URL`` (default postgresql://postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aio_pika

from synckit.runtime.writes import outbox as ob
from synckit.store import migrate
from synckit.store.db import Database, open_database

AMQP_URL = os.environ.get("SYNCKIT_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
PG_URL = os.environ.get("SYNCKIT_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@dataclass(frozen=True)
class Figure:
    engine: str
    n: int
    seconds: float
    routed: int
    write_seconds: float

    @property
    def per_s(self) -> float:
        return self.n / self.seconds


async def _fill(db: Database, n: int, keys: int, per_tx: int) -> float:
    """Write ``n`` messages, ``per_tx`` a transaction; the seconds it took."""
    start = time.perf_counter()
    for first in range(0, n, per_tx):
        async with db.begin() as conn:
            await ob.add_many(
                conn,
                [
                    ob.NewMessage(
                        topic="bench.event",
                        payload={"seq": i, "body": "x" * 64},
                        key=f"k{i % keys}" if keys else None,
                    )
                    for i in range(first, min(n, first + per_tx))
                ],
            )
    return time.perf_counter() - start


async def _relay(db: Database, engine: str, n: int, batch: int, keys: int, per_tx: int) -> Figure:
    await migrate.upgrade(db)
    write_seconds = await _fill(db, n, keys, per_tx)
    name = f"bench-outbox-{uuid.uuid4().hex[:12]}"
    admin = await aio_pika.connect(AMQP_URL)
    channel = await admin.channel()
    try:
        exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(name, durable=False)
        await queue.bind(exchange, routing_key="#")
        publisher = ob.RabbitPublisher(AMQP_URL, exchange=name)
        relay = ob.OutboxRelay(db, publisher, batch=batch)
        try:
            await publisher.connect()  # connecting is not relaying
            start = time.perf_counter()
            # Bounded: a broker that goes away mid-run would otherwise be waited for.
            published = await asyncio.wait_for(relay.run_until_empty(), 300)
            seconds = time.perf_counter() - start
        finally:
            await publisher.close()
        if published != n:
            raise SystemExit(f"{engine}: relayed {published} of {n} messages")
        depth = await channel.declare_queue(name, passive=True)
        routed = depth.declaration_result.message_count or 0
        if routed != n:
            raise SystemExit(f"{engine}: {n} messages confirmed but {routed} in the queue")
    finally:
        # By name, on a fresh channel: whatever failed above may have closed this one.
        cleanup = await admin.channel()
        await cleanup.queue_delete(name)
        await cleanup.exchange_delete(name)
        await admin.close()
    return Figure(engine, n, seconds, routed, write_seconds)


async def _sqlite(n: int, batch: int, keys: int, per_tx: int) -> Figure:
    with tempfile.TemporaryDirectory(prefix="synckit-bench-") as tmp:
        db = open_database(f"sqlite:///{Path(tmp) / 'outbox.db'}")
        try:
            return await _relay(db, "sqlite", n, batch, keys, per_tx)
        finally:
            await db.dispose()


async def _postgres(n: int, batch: int, keys: int, per_tx: int) -> Figure:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    admin = open_database(PG_URL, pool_size=1)
    try:
        async with admin.begin() as conn:
            await conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in PG_URL else "?"
        db = open_database(f"{PG_URL}{sep}search_path={schema}")
        try:
            return await _relay(db, "postgresql", n, batch, keys, per_tx)
        finally:
            await db.dispose()
            async with admin.begin() as conn:
                await conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await admin.dispose()


async def main_async(n: int, batch: int, keys: int, per_tx: int = 50) -> list[Figure]:
    return [await _sqlite(n, batch, keys, per_tx), await _postgres(n, batch, keys, per_tx)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.outbox", description=__doc__)
    parser.add_argument("--n", type=int, default=10_000, help="messages per engine")
    parser.add_argument("--batch", type=int, default=500, help="messages per relay batch")
    parser.add_argument("--keys", type=int, default=0, help="ordering keys (0: none)")
    parser.add_argument(
        "--write-batch", type=int, default=50, help="messages per writing transaction"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.write_batch < 1:
        parser.error("--write-batch must be at least 1")
    figures = asyncio.run(main_async(args.n, args.batch, args.keys, args.write_batch))
    if args.json:
        out: dict[str, float] = {"relay_per_s": round(min(f.per_s for f in figures), 1)}
        out.update({f"relay_per_s_{f.engine}": round(f.per_s, 1) for f in figures})
        out.update({f"write_per_s_{f.engine}": round(f.n / f.write_seconds, 1) for f in figures})
        print(json.dumps(out))
        return
    keys = f"{args.keys} keys" if args.keys else "no keys"
    print(f"outbox relay to RabbitMQ with publisher confirms (batch {args.batch}, {keys})")
    for f in figures:
        print(
            f"  {f.engine:<10} {f.n:>8,} messages in {f.seconds:6.2f} s  "
            f"{f.per_s:>9,.0f} msg/s  (routed {f.routed:,}); written in "
            f"{f.write_seconds:.2f} s, {f.n / f.write_seconds:,.0f} msg/s "
            f"({args.write_batch} a transaction)"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
