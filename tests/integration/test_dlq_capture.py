"""The one dead-letter capture (dlq.store.capture_many) on both engines: poll cycles, dead
jobs and the outbox write through it; an operator's ignore stands; one history shape;
set-based statements; NULs and lone surrogates stored as U+FFFD; concurrent captures.

Poll cycles run for real (App.poll) against synckit.testing.FakeAPI on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from sqlalchemy import event, select, update
from sqlalchemy.engine import Connection
from waits import PROCESS_TIMEOUT  # tests/

from synckit import App, BearerToken, Connector, Page, SyncContext
from synckit.clock import utcnow
from synckit.errors.exceptions import PermanentError, PublishRejected
from synckit.runtime.jobs.handlers import JobContext, Registry
from synckit.runtime.jobs.worker import Worker
from synckit.runtime.observe.logging import redact_text
from synckit.runtime.writes import outbox as outbox_store
from synckit.runtime.writes.outbox import CallbackPublisher, OutboxRelay
from synckit.store.db import Database, open_database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import replay as dlq_replay
from synckit.store.dead_letters import rows as dlq_rows
from synckit.store.dead_letters.capture import Failure
from synckit.store.dead_letters.rows import DlqFilter
from synckit.store.jobs import enqueueing
from synckit.store.moments import storable_text
from synckit.store.outbox import OutboxMessage
from synckit.store.tables import checkpoints, dead_letters
from synckit.testing import FakeAPI

HISTORY_KEYS = {"at", "source", "error_class", "message", "attempt", "trace_id"}
FFFD = "\ufffd"

# --- a paged connector on a fake API --------------------------------------------------------


class ItemsConfig(BaseModel):
    api_token: str


class Items(Connector[ItemsConfig]):
    """Pages ``GET /items?page=N`` until ``next`` is null; ``handle`` fails the records
    named in ``fail``: with the exception given, or a ValueError of the text given."""

    name = "items"
    auth = BearerToken("api_token")
    fail: ClassVar[dict[str, Exception | str]] = {}

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        page = (checkpoint or {}).get("page", 0) + 1
        while True:
            body = (await ctx.http.get("/items", params={"page": page})).json()
            yield Page(body["items"], checkpoint={"page": page})
            if body["next"] is None:
                return
            page = body["next"]

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        error = self.fail.get(record["id"])
        if isinstance(error, Exception):
            raise error
        if error is not None:
            raise ValueError(error)


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeAPI, str]]:
    fake = FakeAPI()
    async with fake.serve() as url:
        yield fake, url


def items_api(fake: FakeAPI, pages: list[list[dict[str, Any]]]) -> None:
    """``GET /items?page=N`` answers ``pages[N-1]``; every poll starts at its checkpoint."""

    def handler(req: Any) -> dict[str, Any]:
        n = int(req.query.get("page", "1"))
        return {"items": pages[n - 1], "next": n + 1 if n < len(pages) else None}

    fake.route("GET", "/items", handler)


async def items_app(db: Database, url: str, fail: dict[str, Exception | str]) -> App:
    cls = type("Items", (Items,), {"base_url": url, "fail": fail})
    app = App([cls])
    await app.add_tenant(db, "acme", "items", {"api_token": "tok-acme"})
    return app


async def forget_checkpoint(db: Database) -> None:
    """Start the next cycle from the first page again (the records are read again)."""
    async with db.begin() as conn:
        await conn.execute(checkpoints.delete())


async def the_row(db: Database, record_id: str, kind: str = "record:default") -> Any:
    async with db.begin() as conn:
        return (
            await conn.execute(
                select(dead_letters).where(
                    dead_letters.c.kind == kind, dead_letters.c.record_id == record_id
                )
            )
        ).one()


# --- an operator's decision stands ----------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "opened"),
    [
        (ValueError("HTTP 503 from upstream"), "pending"),
        (PermanentError("422: no title"), "review"),
    ],
)
async def test_an_ignore_survives_a_later_failed_poll_of_the_record(
    db: Database, api: tuple[FakeAPI, str], error: Exception, opened: str
) -> None:
    """`synckit dlq ignore` (dlq_replay.ignore_matching) on a record's dead letter, pending or in
    review: the next cycle that fails the record appends to its history, and the row
    stays ignored with the operator's reason; a later success does not resolve it."""
    fake, url = api
    items_api(fake, [[{"id": "r1"}, {"id": "r2"}]])
    fail: dict[str, Exception | str] = {"r1": error}
    app = await items_app(db, url, fail)
    await app.poll(db, "acme")
    first = await the_row(db, "r1")
    assert first.status == opened
    ignored = await dlq_replay.ignore_matching(
        db, DlqFilter(ids=(first.id,)), reason="known bad record", now=utcnow()
    )
    assert ignored == 1
    before = await dlq_reads.get(db, first.id)

    await forget_checkpoint(db)
    result = await app.poll(db, "acme")
    assert result.failed == 1
    row = await dlq_reads.get(db, first.id)
    assert (row.status, row.status_reason) == ("ignored", "known bad record")
    assert row.resolved_at == before.resolved_at and row.next_retry_at == before.next_retry_at
    assert row.attempt_count == 2 and len(row.history) == 2
    assert row.history[-1]["source"] == "poll"
    assert await dlq_reads.count(db, DlqFilter(statuses=("pending", "review"))) == 0

    fail.clear()
    await forget_checkpoint(db)
    await app.poll(db, "acme")
    assert (await dlq_reads.get(db, first.id)).status == "ignored"


async def test_a_failed_poll_reopens_a_resolved_row_with_a_fresh_replay_budget(
    db: Database, api: tuple[FakeAPI, str]
) -> None:
    """Replay counts: a record failing again in a poll starts its replays over (as a
    direct capture does), whatever it had spent; only ignored rows are kept as they are."""
    fake, url = api
    items_api(fake, [[{"id": "r1"}]])
    app = await items_app(db, url, {"r1": "boom"})
    await app.poll(db, "acme")
    row = await the_row(db, "r1")
    async with db.begin() as conn:
        await conn.execute(
            update(dead_letters)
            .where(dead_letters.c.id == row.id)
            .values(status="review", status_reason="10 replays failed", replay_attempts=10)
        )
    await forget_checkpoint(db)
    await app.poll(db, "acme")
    again = await dlq_reads.get(db, row.id)
    assert (again.status, again.status_reason, again.replay_attempts) == ("pending", None, 0)
    assert again.next_retry_at is not None and again.attempt_count == 2


# --- one history shape ------------------------------------------------------------------------


async def test_poll_job_and_outbox_failures_write_the_same_history_shape(
    db: Database, api: tuple[FakeAPI, str]
) -> None:
    """A failed record of a poll cycle, a dead job and a message the broker refuses: each
    history entry has the same keys, its source named, and a repeat appends one more."""
    fake, url = api
    items_api(fake, [[{"id": "r1"}]])
    app = await items_app(db, url, {"r1": "boom"})

    registry = Registry()

    @registry.handler("export", max_attempts=1)
    async def export(ctx: JobContext) -> None:
        raise ValueError("export failed")

    async def reject(m: OutboxMessage) -> None:
        raise PublishRejected("unroutable: NO_ROUTE")

    relay = OutboxRelay(db, CallbackPublisher(reject))

    async def fail_each_once() -> None:
        await forget_checkpoint(db)
        await app.poll(db, "acme", trace_id="trace-poll")
        await enqueueing.enqueue(db, "export", {"tenant": "acme"})
        assert (await Worker(db, registry).run_until_idle()).dead == 1
        async with db.begin() as conn:
            await outbox_store.add(conn, "orders", {"n": 1}, message_id="m1")
        await relay.relay_batch()

    await fail_each_once()
    async with db.begin() as conn:
        rows = {r.connector or r.kind: r for r in await conn.execute(select(dead_letters))}
    assert sorted(rows) == ["export", "items", "outbox"]
    sources = {}
    for name, row in rows.items():
        assert [set(h) for h in row.history] == [HISTORY_KEYS], name
        sources[name] = row.history[0]["source"]
    assert sources == {"items": "poll", "export": "job", "outbox": "outbox"}
    assert rows["items"].history[0]["trace_id"] == "trace-poll"

    await outbox_store.retry_failed(db)
    await fail_each_once()
    async with db.begin() as conn:
        every = list(await conn.execute(select(dead_letters).order_by(dead_letters.c.id)))
    # The job died under a new id: a row of its own. The record and the message: their
    # rows, one more entry each.
    assert len(every) == 4 and [set(h) for h in every[-1].history] == [HISTORY_KEYS]
    again = {r.connector or r.kind: r for r in every}
    for name in ("items", "outbox"):
        assert [set(h) for h in again[name].history] == [HISTORY_KEYS, HISTORY_KEYS], name
        assert again[name].history[1]["attempt"] == again[name].attempt_count


# --- set-based ------------------------------------------------------------------------------


def failures(n: int, *, prefix: str = "r", error_class: str = "server_error") -> list[Failure]:
    return [
        Failure(
            tenant="acme",
            connector="items",
            kind="record:default",
            record_id=f"{prefix}{i}",
            payload={"id": i, "subject": "x" * 50},
            error_class=error_class,
            message=f"HTTP 503 on item {i}",
            source="poll",
        )
        for i in range(n)
    ]


def capture(conn: Connection, failures: list[Failure], now: datetime) -> list[dlq_capture.Captured]:
    return dlq_capture.capture_many(conn, failures, now=now)


@contextlib.contextmanager
def statements(db: Database) -> Any:
    """Every statement sent to the database meanwhile, with its parameter count."""
    seen: list[tuple[str, int]] = []
    engine = db.sync_engine if db.sync_engine is not None else db.engine.sync_engine

    def record(conn: Any, cursor: Any, sql: str, params: Any, context: Any, many: bool) -> None:
        if "dead_letters" in sql or "connections" in sql:
            seen.append((sql, len(params or ())))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


async def test_a_page_of_failures_is_a_few_statements_with_fixed_parameters(
    db: Database,
) -> None:
    """10 or 100 failures: the same statements (a lock read and an insert; then a lock read
    and a merge for repeats), each with the same number of parameters."""
    now = datetime(2026, 3, 1, tzinfo=UTC)
    shapes = {}
    for n in (10, 100):
        for phase in ("new", "repeat"):
            with statements(db) as seen:
                got = await db.write(capture, failures(n, prefix=f"{n}-"), now)
            assert len(got) == n and all(c.created == (phase == "new") for c in got)
            assert len(seen) == 2, [s for s, _ in seen]
            shapes[(n, phase)] = [count for _, count in seen]
    assert shapes[(10, "new")] == shapes[(100, "new")]
    assert shapes[(10, "repeat")] == shapes[(100, "repeat")]
    assert max(c for counts in shapes.values() for c in counts) <= 20
    async with db.begin() as conn:
        rows = list(await conn.execute(select(dead_letters.c.attempt_count)))
    assert len(rows) == 110 and {r.attempt_count for r in rows} == {2}


async def test_more_failures_than_a_chunk_are_captured_in_chunks(db: Database) -> None:
    """2,500 failures at once (more than CAPTURE_CHUNK, and than SQLite's or asyncpg's
    parameter limits would allow as one value per column): all captured, one per key."""
    now = datetime(2026, 3, 1, tzinfo=UTC)
    many = failures(2_500) + failures(10)  # ten keys twice: the last failure counts
    with statements(db) as seen:
        got = await db.write(capture, many, now)
    assert len(got) == 2_510 and got[0].id == got[2_500].id
    assert len(seen) == 2 * -(-2_500 // dlq_capture.CAPTURE_CHUNK)
    assert await dlq_reads.count(db) == 2_500


def test_the_capture_statements_carry_a_cache_key() -> None:
    """Built once per engine, and cacheable (text with typed parameters)."""
    for sql in dlq_capture._SQL.values():
        for stmt in (sql.lock, sql.insert, sql.merge, sql.pause, sql.resolve):
            assert stmt._generate_cache_key() is not None


# --- NUL and lone surrogates --------------------------------------------------------------


async def test_nul_in_an_error_text_or_a_payload_is_dead_lettered_and_the_cycle_moves_on(
    db: Database, api: tuple[FakeAPI, str]
) -> None:
    """PostgreSQL's text and jsonb refuse NUL (and no driver encodes a lone surrogate): such
    a record is captured with U+FFFD in their place (error text, traceback, nested payload
    strings and keys, record id), the page commits and the cycle goes on to the next page;
    the record succeeding later resolves its row."""
    fake, url = api
    nul_payload = {"id": "r-payload", "body": {"te\x00xt": ["a\x00b", {"deep": "\x00"}]}}
    surrogate = {"id": "r-surrogate", "name": "half \ud800 pair"}
    nul_id = {"id": "r\x00id"}
    items_api(fake, [[{"id": "r-text"}, nul_payload, surrogate, nul_id], [{"id": "p2"}]])
    fail: dict[str, Exception | str] = {
        "r-text": "bad value \x00 in field",
        "r-payload": "rejected",
        "r-surrogate": "rejected \udc00 too",
        "r\x00id": "rejected",
    }
    app = await items_app(db, url, fail)
    result = await app.poll(db, "acme")
    assert (result.pages, result.ok, result.failed) == (2, 1, 4)
    async with db.begin() as conn:
        saved = (await conn.execute(select(checkpoints.c.cursor))).scalar_one()
    assert saved == {"page": 2}

    text_row = await dlq_reads.get(db, (await the_row(db, "r-text")).id)
    assert text_row.error_message == f"ValueError: bad value {FFFD} in field"
    assert f"bad value {FFFD} in field" in (text_row.traceback or "")
    assert text_row.history[0]["message"] == text_row.error_message
    payload_row = await dlq_reads.get(db, (await the_row(db, "r-payload")).id)
    assert payload_row.payload == {
        "id": "r-payload",
        "body": {f"te{FFFD}xt": [f"a{FFFD}b", {"deep": FFFD}]},
    }
    surrogate_row = await dlq_reads.get(db, (await the_row(db, "r-surrogate")).id)
    assert surrogate_row.payload == {"id": "r-surrogate", "name": f"half {FFFD} pair"}
    assert surrogate_row.error_message == f"ValueError: rejected {FFFD} too"
    id_row = await the_row(db, f"r{FFFD}id")
    assert id_row.status == "pending"

    fail.clear()
    await forget_checkpoint(db)
    again = await app.poll(db, "acme")
    assert again.failed == 0
    async with db.begin() as conn:
        statuses = set((await conn.execute(select(dead_letters.c.status))).scalars())
    assert statuses == {"resolved"}


async def test_a_broker_refusal_with_nul_in_its_reason_fails_the_message_not_the_batch(
    db: Database,
) -> None:
    """The outbox stores the broker's reason (last_error and its dead letter) with U+FFFD
    for NUL: the batch commits on both engines, the other message is published."""

    async def publish(m: OutboxMessage) -> None:
        if m.topic == "nowhere":
            raise PublishRejected("unroutable \x00 NO_ROUTE")

    async with db.begin() as conn:
        await outbox_store.add(conn, "nowhere", {"n": 1}, message_id="m1")
        await outbox_store.add(conn, "orders", {"n": 2}, message_id="m2")
    result = await OutboxRelay(db, CallbackPublisher(publish)).relay_batch()
    assert (result.published, result.rejected) == (1, 1)
    [failed] = await outbox_store.list_messages(db, status="failed")
    assert failed.last_error == f"unroutable {FFFD} NO_ROUTE"
    row = await the_row(db, "m1", kind="outbox:nowhere")
    assert row.error_message == f"unroutable {FFFD} NO_ROUTE" and row.status == "review"


# --- concurrent captures ----------------------------------------------------------------------

CAPTURER = textwrap.dedent(
    """
    import asyncio, random, sys, time
    from datetime import UTC, datetime
    from pathlib import Path
    from synckit.store.dead_letters import capture as dlq_capture
    from synckit.store.dead_letters import reads as dlq_reads
    from synckit.store.dead_letters import replay as dlq_replay
    from synckit.store.dead_letters import rows as dlq_rows
    from synckit.store.db import open_database

    url, start, me = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])

    async def main():
        db = open_database(url)
        rng = random.Random(me)
        created = []
        try:
            while not start.exists():
                time.sleep(0.005)
            for r in range(ROUNDS):
                keys = [f"k{r}-{i}" for i in range(KEYS)]
                rng.shuffle(keys)
                failures = [
                    dlq_capture.Failure(tenant="acme", connector="items", kind="record:default",
                                  record_id=k, payload={"by": me}, error_class="server_error",
                                  message=f"from {me}", source="poll")
                    for k in keys
                ]
                got = await db.write(
                    lambda c: dlq_capture.capture_many(c, failures, now=datetime.now(UTC))
                )
                created.extend(f.record_id for c, f in zip(got, failures) if c.created)
        finally:
            await db.dispose()
        print(" ".join(created))

    asyncio.run(main())
    """
)
PROCS, ROUNDS, KEYS = 3, 8, 40


def test_processes_capturing_the_same_new_records_at_once_share_one_row_each(
    migrated_url: str, tmp_path: Path
) -> None:
    """Three OS processes capture the same fresh keys at the same moment, round after
    round: one row per key, every failure counted on it (an insert that lost the race
    merges into the winner's row), no deadlock."""
    script = tmp_path / "capturer.py"
    script.write_text(f"ROUNDS, KEYS = {ROUNDS}, {KEYS}\n" + CAPTURER)
    start = tmp_path / "start"
    with contextlib.ExitStack() as stack:
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), migrated_url, str(start), str(i)],
                stdout=stack.enter_context(open(tmp_path / f"p{i}.stdout", "wb")),
                stderr=stack.enter_context(open(tmp_path / f"p{i}.stderr", "wb")),
            )
            for i in range(PROCS)
        ]
        start.touch()
        for i, p in enumerate(procs):
            assert p.wait(timeout=PROCESS_TIMEOUT) == 0, (tmp_path / f"p{i}.stderr").read_text()[
                -2000:
            ]
    created = Counter(
        k for i in range(PROCS) for k in (tmp_path / f"p{i}.stdout").read_text().split()
    )
    # Every key was created by exactly one process; the others' captures were repeats.
    assert len(created) == ROUNDS * KEYS and set(created.values()) == {1}

    async def rows() -> list[Any]:
        db = open_database(migrated_url)
        try:
            async with db.begin() as conn:
                return list(await conn.execute(select(dead_letters)))
        finally:
            await db.dispose()

    got = asyncio.run(rows())
    assert len(got) == ROUNDS * KEYS
    assert {r.attempt_count for r in got} == {PROCS}
    assert {len(r.history) for r in got} == {PROCS}
    assert {tuple(h["attempt"] for h in r.history) for r in got} == {(1, 2, 3)}


def scrubbed(value: Any) -> Any:
    """What capture stores of a JSON value: every string and key through storable_text."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_text(k): scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrubbed(v) for v in value]
    return value


HOSTILE_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(), st.sampled_from(["\x00", "\ud800", "\udc00", "\ud83d", "\ude00"])
    ),
    max_size=12,
)
PAYLOADS = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | HOSTILE_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(HOSTILE_TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(payload=PAYLOADS, message=HOSTILE_TEXT)
@example(payload="a payload that is a JSON string", message="")  # read back as itself
@example(payload={"k\x00": ["\x00", {"\ud800": "\udc00x"}]}, message="\x00\ud800")
def test_any_payload_and_message_are_stored_with_only_nul_and_surrogates_replaced(
    migrated_url: str, payload: Any, message: str
) -> None:
    """Generated JSON payloads and messages with NULs and lone surrogates anywhere: the
    capture commits on both engines, and reads back as the input with U+FFFD there."""

    async def go() -> dlq_rows.DeadLetter:
        db = open_database(migrated_url)
        try:
            [c] = await db.write(
                capture,
                [
                    Failure(
                        tenant="acme",
                        connector="items",
                        kind="record:default",
                        record_id=f"gen-{uuid.uuid4().hex}",
                        payload=payload,
                        error_class="server_error",
                        message=message,
                    )
                ],
                datetime.now(UTC),
            )
            return await dlq_reads.get(db, c.id)
        finally:
            await db.dispose()

    row = asyncio.run(go())
    assert row.payload == scrubbed(payload)
    # Redacted first (a generated text may look like a secret), then made storable.
    assert row.error_message == storable_text(redact_text(message))[:4000]
