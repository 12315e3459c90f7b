"""The transactional outbox and its relay on SQLite and PostgreSQL, without a broker.

The publisher here is a :class:`CallbackPublisher` that records what it was given, so
each test sees exactly what would have reached a broker. RabbitMQ itself is exercised in
``test_outbox_rabbit.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession
from waits import EVENT_TIMEOUT, PROCESS_TIMEOUT, await_until, wait_until  # tests/

from synckit.errors import RetryPolicy
from synckit.errors.exceptions import (
    OutboxError,
    OutboxMessageNotFound,
    OutboxPayloadError,
    OutboxStateError,
    PublisherUnavailable,
    PublishRejected,
)
from synckit.runtime.writes import outbox
from synckit.runtime.writes.outbox import CallbackPublisher, LogPublisher, OutboxRelay
from synckit.store import outbox as outbox_store
from synckit.store.db import Database, open_database
from synckit.store.leases import new_lease
from synckit.store.outbox import NewMessage, OutboxMessage
from synckit.store.tables import dead_letters
from synckit.store.tables import outbox as outbox_table

REPO = Path(__file__).resolve().parents[2]
NO_WAIT = RetryPolicy.deterministic()
LEASE = timedelta(minutes=2)


class Recorder:
    """A publisher callback that records each message, optionally failing some."""

    def __init__(
        self,
        fail: Callable[[OutboxMessage], Exception | None] | None = None,
        delay: float = 0.0,
    ) -> None:
        self.fail = fail
        self.delay = delay
        self.published: list[OutboxMessage] = []
        self.calls: list[tuple[str, str, float, float]] = []  # message_id, outcome, start, end

    async def __call__(self, m: OutboxMessage) -> None:
        start = time.monotonic()
        if self.delay:
            # Longer for early messages, so a concurrent later one would overtake them.
            await asyncio.sleep(self.delay * (1 + (m.id % 3 == 0)))
        exc = self.fail(m) if self.fail else None
        self.calls.append((m.message_id, "failed" if exc else "ok", start, time.monotonic()))
        if exc is not None:
            raise exc
        self.published.append(m)

    @property
    def ids(self) -> list[str]:
        return [m.message_id for m in self.published]


def _true(check: Callable[[], object]) -> Callable[[], Awaitable[object]]:
    """``check`` as the coroutine function ``await_until`` polls."""

    async def go() -> object:
        return check()

    return go


async def _listening(db: Database) -> bool:
    """Whether a PostgreSQL session waits in LISTEN (this relay's, at least once it does)."""
    async with db.begin() as conn:
        found = await conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'"
        )
        return bool(found.scalar())


def relay_for(db: Database, recorder: Recorder, **kw: Any) -> OutboxRelay:
    kw.setdefault("retry_policy", NO_WAIT)
    return OutboxRelay(db, CallbackPublisher(recorder), **kw)


async def rows(db: Database) -> list[Any]:
    async with db.begin() as conn:
        return list(await conn.execute(select(outbox_table).order_by(outbox_table.c.id)))


async def test_add_commits_and_rolls_back_with_the_callers_transaction(db: Database) -> None:
    """A message added in a rolled-back transaction is never published; a committed one is."""
    with pytest.raises(RuntimeError):
        async with db.begin() as conn:
            await outbox.add(conn, "orders.created", {"order": 1})
            raise RuntimeError("the caller's business write failed")
    async with db.begin() as conn:
        kept = await outbox.add(conn, "orders.created", {"order": 2}, key="o-2")
    rec = Recorder()
    assert await relay_for(db, rec).run_until_empty() == 1
    assert [(m.payload, m.key, m.message_id) for m in rec.published] == [
        ({"order": 2}, "o-2", kept)
    ]
    assert uuid.UUID(kept).version == 4
    [row] = await rows(db)
    assert row.status == "published" and row.attempts == 1 and row.published_at is not None


async def test_add_joins_an_async_session(db: Database) -> None:
    """add() on an AsyncSession writes in the session's transaction: rollback drops it."""
    async with AsyncSession(db.engine) as session:
        await outbox.add(session, "t", {"n": 1}, message_id="dropped")
        await session.rollback()
        await outbox.add(session, "t", {"n": 2}, message_id="kept")
        await session.commit()
    assert [r.message_id for r in await rows(db)] == ["kept"]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"when": datetime(2024, 1, 1, tzinfo=UTC)}, "not JSON-serialisable"),
        ({"tags": {"a", "b"}}, "not JSON-serialisable"),
        ({"ratio": math.nan}, "not JSON-serialisable"),
        ({"name": "nul\x00byte"}, "NUL character"),
    ],
)
async def test_payload_that_is_not_json_is_refused_clearly(
    db: Database, payload: Any, reason: str
) -> None:
    """A payload that cannot be stored as JSON raises OutboxPayloadError and writes nothing."""
    async with db.begin() as conn:
        with pytest.raises(OutboxPayloadError, match=reason) as info:
            await outbox.add(conn, "bad.topic", payload)
        assert "'bad.topic'" in str(info.value)
        # Refused before any SQL ran, so the caller's transaction is still usable.
        await outbox.add(conn, "good.topic", {"literal": "\\u0000 is fine as text"})
    assert [r.topic for r in await rows(db)] == ["good.topic"]


async def test_bad_topic_key_or_message_id_is_refused(db: Database) -> None:
    """Topics over 255 bytes (the routing key limit), empty topics and bad ids are refused."""
    async with db.begin() as conn:
        for kwargs in (
            {"topic": "t" * 256},
            {"topic": ""},
            {"topic": "t", "message_id": "m" * 101},
            {"topic": "t", "key": "k" * 301},
        ):
            with pytest.raises(OutboxPayloadError):
                await outbox.add(conn, payload={}, **kwargs)
    assert await rows(db) == []


async def test_add_refuses_a_database_instead_of_a_transaction(db: Database) -> None:
    """add() needs the caller's connection or session, not the Database: it must join a tx."""
    with pytest.raises(OutboxError, match="AsyncConnection or AsyncSession"):
        await outbox.add(db, "t", {})  # type: ignore[arg-type]


async def test_same_message_id_is_stored_once(db: Database) -> None:
    """A message id already in the outbox is not added again (the first one wins)."""
    async with db.begin() as conn:
        await outbox.add(conn, "t", {"v": 1}, message_id="order-1-created")
    async with db.begin() as conn:
        await outbox.add(conn, "t", {"v": 2}, message_id="order-1-created")
        await outbox.add_many(conn, [NewMessage("t", {"v": 3}, message_id="order-1-created")])
    [row] = await rows(db)
    assert row.payload == {"v": 1}


async def test_same_key_is_published_in_order_one_at_a_time(db: Database) -> None:
    """Messages of a key are published in id order, each only after the previous confirmed."""
    async with db.begin() as conn:
        await outbox.add_many(
            conn,
            [NewMessage("t", {"k": f"k{i % 3}", "seq": i // 3}, key=f"k{i % 3}") for i in range(60)]
            + [NewMessage("t", {"seq": i}) for i in range(20)],
        )
    rec = Recorder(delay=0.002)
    assert await relay_for(db, rec, batch=25).run_until_empty() == 80
    by_key: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    calls = {mid: (start, end) for mid, _, start, end in rec.calls}
    for m in rec.published:
        if m.key is not None:
            by_key[m.key].append((m.payload["seq"], *calls[m.message_id]))
    assert set(by_key) == {"k0", "k1", "k2"}
    for seqs in by_key.values():
        assert [s for s, _, _ in seqs] == list(range(20))
        for (_, _, end), (_, start, _) in itertools.pairwise(seqs):
            assert start >= end  # N+1 started only after N's publish returned


async def test_unkeyed_messages_are_published_concurrently(db: Database) -> None:
    """A batch of unkeyed messages is in flight together, not one after the other."""
    async with db.begin() as conn:
        await outbox.add_many(conn, [NewMessage("t", {"i": i}) for i in range(50)])
    rec = Recorder(delay=0.05)
    assert await relay_for(db, rec, batch=50).relay_once() == 50
    # How many publishes were in flight when each began: one after the other, always 1.
    spans = [(start, end) for _, _, start, end in rec.calls]
    peak = max(sum(1 for s, e in spans if s <= began < e) for began, _ in spans)
    assert peak >= 25, peak


async def test_transient_failure_blocks_its_key_only(db: Database) -> None:
    """A message that fails transiently holds back later messages of its key, not other keys."""
    async with db.begin() as conn:
        await outbox.add_many(
            conn,
            [NewMessage("t", {"seq": i}, key="stuck", message_id=f"stuck-{i}") for i in range(3)]
            + [NewMessage("t", {"seq": i}, key="free", message_id=f"free-{i}") for i in range(3)]
            + [NewMessage("t", {"seq": 0}, message_id="unkeyed")],
        )
    rec = Recorder(
        fail=lambda m: ConnectionResetError("broker gone") if m.message_id == "stuck-1" else None
    )
    relay = relay_for(db, rec, retry_policy=RetryPolicy.deterministic(timedelta(hours=1)))
    result = await relay.relay_batch()
    assert (result.published, result.retrying, result.rejected) == (5, 1, 0)
    assert sorted(rec.ids) == ["free-0", "free-1", "free-2", "stuck-0", "unkeyed"]
    state = {r.message_id: r for r in await rows(db)}
    failed = state["stuck-1"]
    assert failed.status == "pending" and failed.attempts == 1
    assert "ConnectionResetError: broker gone" in failed.last_error
    assert failed.next_attempt_at > datetime.now(UTC) + timedelta(minutes=59)
    # The message behind it was not attempted at all, and is not claimable while it waits.
    assert state["stuck-2"].attempts == 0 and state["stuck-2"].status == "pending"
    assert await relay.relay_once() == 0
    assert sorted(rec.ids) == ["free-0", "free-1", "free-2", "stuck-0", "unkeyed"]


async def test_head_retried_later_than_its_followers_is_still_claimed(db: Database) -> None:
    """A key's head whose retry time is after its followers' is claimed before them."""
    async with db.begin() as conn:
        await outbox.add_many(
            conn, [NewMessage("t", {"seq": i}, key="k", message_id=f"k-{i}") for i in range(30)]
        )
    failures = iter([ConnectionResetError("gone")])
    rec = Recorder(fail=lambda m: next(failures, None) if m.message_id == "k-0" else None)
    policy = RetryPolicy.deterministic(timedelta(milliseconds=20))
    relay = relay_for(db, rec, batch=10, retry_policy=policy)
    # k-0 now waits until after every follower's time; a batch of 10 by due time would
    # hold only followers, all blocked by k-0, for ever.
    assert await asyncio.wait_for(relay.run_until_empty(), 10) == 30
    assert rec.ids == [f"k-{i}" for i in range(30)]


async def test_a_stuck_key_does_not_starve_other_messages(db: Database) -> None:
    """Followers of a key whose head waits do not fill the batches: others still go."""
    async with db.begin() as conn:
        await outbox.add_many(
            conn,
            [NewMessage("t", {}, key="stuck", message_id=f"s-{i}") for i in range(50)]
            + [NewMessage("t", {}, message_id=f"u-{i}") for i in range(20)],
        )
    rec = Recorder(fail=lambda m: TimeoutError("no confirm") if m.message_id == "s-0" else None)
    relay = relay_for(db, rec, batch=10, retry_policy=RetryPolicy.deterministic(timedelta(hours=1)))
    for _ in range(5):
        await relay.relay_once()
    assert sorted(rec.ids) == sorted(f"u-{i}" for i in range(20))
    assert await outbox.pending_count(db) == 50


async def test_transient_failure_is_retried_until_published(db: Database) -> None:
    """A message keeps being retried with backoff until the publisher accepts it."""
    async with db.begin() as conn:
        await outbox.add(conn, "t", {"n": 1}, key="k", message_id="flaky")
        await outbox.add(conn, "t", {"n": 2}, key="k", message_id="after")
    failures = iter([TimeoutError("confirm timed out")] * 3)
    rec = Recorder(fail=lambda m: next(failures, None) if m.message_id == "flaky" else None)
    policy = RetryPolicy(
        base=timedelta(milliseconds=10),
        cap=timedelta(milliseconds=40),
        floor=timedelta(milliseconds=10),
        jitter=0.0,
    )
    relay = relay_for(db, rec, retry_policy=policy)
    assert await asyncio.wait_for(relay.run_until_empty(), 10) == 2
    assert rec.ids == ["flaky", "after"]
    state = {r.message_id: r for r in await rows(db)}
    assert state["flaky"].attempts == 4 and state["flaky"].status == "published"
    assert relay.stats.retrying == 3


async def test_rejected_message_is_dead_lettered_and_the_rest_flow(db: Database) -> None:
    """A message refused for good is failed, dead-lettered with the reason; others go on."""
    async with db.begin() as conn:
        await outbox.add_many(
            conn,
            [
                NewMessage("orders", {"seq": 0}, key="k", message_id="m0"),
                NewMessage("nowhere", {"seq": 1}, key="k", message_id="m1"),
                NewMessage("orders", {"seq": 2}, key="k", message_id="m2"),
                NewMessage("orders", {"seq": 3}, message_id="m3"),
            ],
        )
    rec = Recorder(
        fail=lambda m: PublishRejected("unroutable: NO_ROUTE") if m.topic == "nowhere" else None
    )
    relay = relay_for(db, rec)
    assert await relay.run_until_empty() == 3
    assert sorted(rec.ids) == ["m0", "m2", "m3"]
    state = {r.message_id: r for r in await rows(db)}
    assert state["m1"].status == "failed" and state["m1"].last_error == "unroutable: NO_ROUTE"
    async with db.begin() as conn:
        [dl] = list(await conn.execute(select(dead_letters)))
    assert (dl.tenant, dl.connector, dl.kind, dl.record_id) == (
        "",
        "outbox",
        "outbox:nowhere",
        "m1",
    )
    assert (dl.error_class, dl.status, dl.error_message) == (
        "validation",
        "review",
        "unroutable: NO_ROUTE",
    )
    assert dl.payload["payload"] == {"seq": 1} and dl.payload["topic"] == "nowhere"
    assert dl.payload["outbox_id"] == state["m1"].id
    assert relay.stats.rejected == 1


async def test_retry_puts_failed_messages_back_and_closes_their_dead_letters(
    db: Database,
) -> None:
    """retry_failed/retry_messages re-queue failed messages; published ones are refused."""
    async with db.begin() as conn:
        await outbox.add_many(
            conn,
            [NewMessage("bad", {"i": i}, message_id=f"bad-{i}") for i in range(3)]
            + [NewMessage("good", {}, message_id="good")],
        )
    rejecting = Recorder(fail=lambda m: PublishRejected("no") if m.topic == "bad" else None)
    await relay_for(db, rejecting).run_until_empty()
    state = {r.message_id: r for r in await rows(db)}
    with pytest.raises(OutboxStateError, match="already published"):
        await outbox.retry_messages(db, [state["good"].id, state["bad-0"].id])
    with pytest.raises(OutboxMessageNotFound, match="999999"):
        await outbox.retry_messages(db, [999999])
    assert await outbox.retry_messages(db, [state["bad-0"].id]) == 1
    assert await outbox.retry_failed(db) == 2
    assert await outbox.count_by_status(db) == {"pending": 3, "published": 1}
    async with db.begin() as conn:
        assert {r.status for r in await conn.execute(select(dead_letters))} == {"resolved"}
    accepting = Recorder()
    assert await relay_for(db, accepting).run_until_empty() == 3
    assert sorted(accepting.ids) == ["bad-0", "bad-1", "bad-2"]


async def test_relay_run_waits_out_an_unavailable_publisher(db: Database) -> None:
    """While the publisher cannot connect the relay backs off, keeps everything, then resumes."""

    class Flaky(CallbackPublisher):
        def __init__(self, cb: Callable[[OutboxMessage], Awaitable[None]]) -> None:
            super().__init__(cb)
            self.refusals = 3

        async def connect(self) -> None:
            if self.refusals:
                self.refusals -= 1
                raise PublisherUnavailable("connection refused")

    async with db.begin() as conn:
        await outbox.add_many(conn, [NewMessage("t", {"i": i}) for i in range(10)])
    rec = Recorder()
    policy = RetryPolicy(
        base=timedelta(milliseconds=20), cap=timedelta(milliseconds=50), floor=timedelta(0)
    )
    relay = OutboxRelay(db, Flaky(rec), retry_policy=policy, idle_interval=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    await await_until(_true(lambda: len(rec.ids) == 10), "10 messages published")
    stop.set()
    await asyncio.wait_for(task, EVENT_TIMEOUT)
    assert len(set(rec.ids)) == 10
    assert relay.stats.backoffs >= 3
    assert await outbox.count_by_status(db) == {"published": 10}


async def test_running_relay_is_woken_by_a_commit(db: Database) -> None:
    """An idle relay publishes a message soon after the adding transaction commits."""
    rec = Recorder()
    # Its next look without a wake-up is an hour away: published at all means woken.
    relay = relay_for(db, rec, idle_interval=3600)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    # Settling into idle (were it slower, its first look would find the message: a pass
    # that proves less, never a failure).
    await asyncio.sleep(0.3)
    async with db.begin() as conn:
        await outbox.add(conn, "t", {}, message_id="wake")
    await await_until(_true(lambda: rec.ids), "the message published")
    stop.set()
    await asyncio.wait_for(task, EVENT_TIMEOUT)
    assert rec.ids == ["wake"]


ADD_SCRIPT = """
import asyncio, sys
from synckit.store.db import open_database
from synckit.store.outbox import add

async def main() -> None:
    db = open_database(sys.argv[1])
    async with db.begin() as conn:
        await add(conn, "t", {}, message_id="from-afar")
    await db.dispose()

asyncio.run(main())
"""


async def test_relay_is_woken_by_notify_from_another_process(
    db: Database, engine_name: str, migrated_url: str
) -> None:
    """On PostgreSQL an idle relay is woken by LISTEN/NOTIFY when another process adds."""
    if engine_name != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite relays poll")
    rec = Recorder()
    # Its next look on its own is an hour away: published at all means woken (by the
    # NOTIFY, or by the look it takes once its LISTEN connection is up).
    relay = relay_for(db, rec, idle_interval=3600)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        await await_until(lambda: _listening(db), "a LISTEN connection")
        await asyncio.sleep(0.3)  # settling into idle, as above
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", ADD_SCRIPT, migrated_url, cwd=REPO
        )
        assert await asyncio.wait_for(proc.wait(), PROCESS_TIMEOUT) == 0
        await await_until(_true(lambda: rec.ids), "the message published")
    finally:
        stop.set()
        await asyncio.wait_for(task, EVENT_TIMEOUT)
    assert rec.ids == ["from-afar"]


async def test_log_publisher_logs_each_message(db: Database) -> None:
    """LogPublisher turns each message into an outbox.message event and marks it published."""
    from structlog.testing import capture_logs

    async with db.begin() as conn:
        await outbox.add(conn, "t", {"a": 1}, key="k", message_id="logged")
    with capture_logs() as logs:
        await OutboxRelay(db, LogPublisher()).run_until_empty()
    [event] = [e for e in logs if e["event"] == "outbox.message"]
    assert (event["message_id"], event["payload"], event["key"]) == ("logged", {"a": 1}, "k")


async def test_second_relay_skips_held_rows_and_respects_key_order(
    db: Database, engine_name: str
) -> None:
    """While one relay holds a key's head, another relay takes other work, not that key."""
    if engine_name != "postgresql":
        pytest.skip("SQLite serialises relays with BEGIN IMMEDIATE: nothing to skip")
    async with db.begin() as conn:
        await outbox.add_many(
            conn,
            [NewMessage("t", {}, key="k", message_id=f"k-{i}") for i in range(3)]
            + [NewMessage("t", {}, message_id="free")],
        )
    now = datetime.now(UTC)
    async with db.begin() as first:
        held = await outbox.claim_batch(first, now=now, limit=1, lease=new_lease(LEASE))
        assert [m.message_id for m in held] == ["k-0"]
        async with db.begin() as second:
            # k-1 and k-2 are due and unlocked, but k-0 is ahead of them in another relay.
            other = await outbox.claim_batch(second, now=now, limit=10, lease=new_lease(LEASE))
            assert [m.message_id for m in other] == ["free"]


RELAY_SCRIPT = """
import asyncio, os, sys, time
from synckit.store.db import open_database
from synckit.runtime.writes.outbox import CallbackPublisher, OutboxRelay

url, out_path, go_path = sys.argv[1:4]

async def main() -> None:
    db = open_database(url)
    fd = os.open(out_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def record(m):
        start = time.monotonic_ns()
        await asyncio.sleep(0.002)  # a publish that takes a while, so relays overlap
        line = f"{m.message_id} {m.key or '-'} {m.payload['seq']} {start} {time.monotonic_ns()}"
        os.write(fd, (line + "\\n").encode())

    relay = OutboxRelay(db, CallbackPublisher(record), batch=40, listen=False)
    open(out_path + ".ready", "w").close()  # imported and connected: waiting for go
    while not os.path.exists(go_path):
        await asyncio.sleep(0.01)
    await relay.run_until_empty()
    os.close(fd)
    await db.dispose()

asyncio.run(main())
"""


def test_relay_processes_never_publish_a_message_twice(migrated_url: str, tmp_path: Path) -> None:
    """Four relay processes on one outbox publish every message once, keys in order."""
    keyed, unkeyed = 40 * 25, 1000

    async def fill() -> None:
        d = open_database(migrated_url)
        try:
            async with d.begin() as conn:
                await outbox.add_many(
                    conn,
                    [
                        NewMessage("t", {"seq": i // 40}, key=f"k{i % 40}", message_id=f"k-{i}")
                        for i in range(keyed)
                    ]
                    + [NewMessage("t", {"seq": i}, message_id=f"u-{i}") for i in range(unkeyed)],
                )
        finally:
            await d.dispose()

    asyncio.run(fill())
    go = tmp_path / "go"
    outputs = [tmp_path / f"relay-{n}.log" for n in range(4)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RELAY_SCRIPT, migrated_url, str(out), str(go)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stderr=subprocess.PIPE,
        )
        for out in outputs
    ]
    try:
        # All of them start together, once every one is ready.
        wait_until(
            lambda: (
                all(Path(f"{out}.ready").exists() for out in outputs)
                or any(p.poll() is not None for p in procs)
            ),
            "the relay processes ready",
        )
        go.touch()
        for p in procs:
            _, err = p.communicate(timeout=PROCESS_TIMEOUT)
            assert p.returncode == 0, err.decode()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    lines = [
        (n, line.split())
        for n, out in enumerate(outputs)
        for line in out.read_text().split("\n")
        if line
    ]
    published = [fields[0] for _, fields in lines]
    assert len(published) == keyed + unkeyed
    assert len(set(published)) == keyed + unkeyed  # not one message published twice
    if migrated_url.startswith("postgresql"):
        # SQLite's busy handler is not fair (the last writer tends to win the lock
        # again), so only PostgreSQL is sure to spread the work over the processes.
        assert len({n for n, _ in lines}) >= 2
    by_key: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for _, (_mid, key, seq, start, end) in lines:
        if key != "-":
            by_key[key].append((int(seq), int(start), int(end)))
    for chain in by_key.values():
        chain.sort()
        assert [s for s, _, _ in chain] == list(range(25))
        for (_, _, end), (_, start, _) in itertools.pairwise(chain):
            assert start >= end  # across processes too, N+1 waited for N
    counts = asyncio.run(_counts(migrated_url))
    assert counts == {"published": keyed + unkeyed}


async def _counts(url: str) -> dict[str, int]:
    d = open_database(url)
    try:
        return await outbox.count_by_status(d)
    finally:
        await d.dispose()


async def test_no_transaction_is_open_while_the_broker_confirms(db: Database) -> None:
    """While a confirm is held back, another connection rewrites the message being
    published and commits a new one: the relay holds no lock (no row lock on PostgreSQL,
    not SQLite's write lock) across the broker call."""
    async with db.begin() as conn:
        await outbox.add(conn, "t", {"n": 1}, key="k", message_id="held")
    confirming, release = asyncio.Event(), asyncio.Event()

    async def slow_confirm(m: OutboxMessage) -> None:
        confirming.set()
        await release.wait()

    relay = OutboxRelay(db, CallbackPublisher(slow_confirm), retry_policy=NO_WAIT)
    task = asyncio.create_task(relay.relay_batch())
    await asyncio.wait_for(confirming.wait(), 10)
    try:
        async with asyncio.timeout(5), db.begin() as conn:
            if db.is_postgres:
                # Fail at once on a row lock instead of waiting for it.
                await conn.exec_driver_sql("SET LOCAL lock_timeout = '1s'")
            await conn.execute(
                outbox_table.update()
                .where(outbox_table.c.message_id == "held")
                .values(attempts=outbox_table.c.attempts)
            )
            await outbox.add(conn, "t", {"n": 2}, message_id="meanwhile")
    finally:
        release.set()
    result = await asyncio.wait_for(task, 10)
    assert (result.claimed, result.published) == (1, 1)
    by_id = {r.message_id: r for r in await rows(db)}
    assert by_id["held"].status == "published" and by_id["held"].lease_token is None
    assert by_id["meanwhile"].status == "pending"


async def test_a_batch_whose_relay_died_after_publishing_is_published_again(
    db: Database,
) -> None:
    """A relay that published but died before recording leaves its messages leased; once
    the lease ends another relay publishes them again, same message id, and the dead
    relay's late outcome is refused by the fence."""
    async with db.begin() as conn:
        await outbox.add_many(
            conn, [NewMessage("t", {"i": i}, key="k", message_id=f"m{i}") for i in range(2)]
        )
    dead = new_lease(timedelta(hours=1))
    claimed = await outbox_store.claim(db, now=datetime.now(UTC), limit=10, lease=dead)
    assert [m.message_id for m in claimed] == ["m0", "m1"]
    rec = Recorder()
    # Held: not due while the lease lasts, so nothing is published twice at once.
    assert await relay_for(db, rec).relay_once() == 0
    # The hour passes (its end moved to now, rather than waited for): the lease has ended.
    async with db.begin() as conn:
        await conn.execute(
            update(outbox_table)
            .where(outbox_table.c.lease_token == dead.token)
            .values(
                lease_expires_at=datetime.now(UTC) - timedelta(seconds=1),
                next_attempt_at=datetime.now(UTC) - timedelta(seconds=1),
            )
        )
    assert await relay_for(db, rec).relay_once() == 2
    assert rec.ids == ["m0", "m1"]
    late = await outbox_store.record(
        db,
        dead.token,
        published=[],
        retries=[(claimed[0].id, "late", datetime.now(UTC))],
        rejected=[],
        released=[claimed[1].id],
        now=datetime.now(UTC),
    )
    assert late.held == frozenset() and late.lost == {m.id for m in claimed}
    assert [(r.status, r.attempts, r.last_error) for r in await rows(db)] == [
        ("published", 1, None),
        ("published", 1, None),
    ]


async def test_messages_not_started_within_the_lease_window_are_released(db: Database) -> None:
    """With a short lease, a slow key stops starting publishes halfway through it; the
    messages it did not attempt are due again at once, no attempt spent."""
    async with db.begin() as conn:
        await outbox.add_many(
            conn, [NewMessage("t", {"i": i}, key="k", message_id=f"m{i}") for i in range(5)]
        )

    # Publishes start until half the lease (3 s) after the claim began. The first returns
    # at once and the second outlasts that window, so the third is never started: one or
    # two published (two unless the claim itself took over 1.5 s, when the second is cut
    # off), the rest released, as long as the claim took under 3 s.
    async def publish(m: OutboxMessage) -> None:
        if m.message_id == "m1":
            await asyncio.sleep(3.2)
        await rec(m)

    rec = Recorder()
    relay = OutboxRelay(
        db, CallbackPublisher(publish), retry_policy=NO_WAIT, lease=timedelta(seconds=6)
    )
    result = await relay.relay_batch()
    assert result.claimed == 5 and 1 <= result.published <= 2, result
    left = [r for r in await rows(db) if r.status == "pending"]
    assert left and all(r.attempts == 0 and r.lease_token is None for r in left)
    assert all(r.next_attempt_at <= datetime.now(UTC) for r in left)
    assert await relay_for(db, rec).run_until_empty() == len(left)
    assert rec.ids == [f"m{i}" for i in range(5)]


async def test_a_key_held_under_another_relays_lease_waits_behind_it(db: Database) -> None:
    """Once a relay's claim has committed (its messages leased, nothing locked), another
    relay takes other work but none of the held key's later messages, on both engines."""
    async with db.begin() as conn:
        await outbox.add_many(
            conn,
            [NewMessage("t", {}, key="k", message_id=f"k-{i}") for i in range(3)]
            + [NewMessage("t", {}, message_id="free")],
        )
    now = datetime.now(UTC)
    held = await outbox_store.claim(db, now=now, limit=1, lease=new_lease(LEASE, now=now))
    assert [m.message_id for m in held] == ["k-0"]
    other = await outbox_store.claim(db, now=now, limit=10, lease=new_lease(LEASE, now=now))
    assert [m.message_id for m in other] == ["free"]
    assert await outbox_store.claim(db, now=now, limit=10, lease=new_lease(LEASE, now=now)) == []
