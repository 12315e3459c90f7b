"""Poll cycles against a real HTTP server on loopback, on SQLite and PostgreSQL.

The fake API pages records (``GET /<stream>?page=N``, three records a page) and accepts
writes (``POST /sink``); a test overrides single responses to inject failures.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from http import HTTPStatus
from typing import Any, ClassVar

import httpx
import pytest
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy import text as sa_text
from waits import EVENT_TIMEOUT, await_until  # tests/

from synckit import App, BearerToken, Connector, Page, RateLimit, Stream, SyncContext
from synckit.clock import utcnow
from synckit.connectors.schedule import parse_schedule
from synckit.errors import RetryPolicy
from synckit.errors.exceptions import Cancel, NeedsReauth, RateLimited, Unreplayable
from synckit.runtime.sync.poll import poll_key, run_cycle
from synckit.runtime.writes.intents import RemoteRecord
from synckit.store.checkpoints import load_checkpoint, save_checkpoint
from synckit.store.db import Database
from synckit.store.jobs import admin, claiming
from synckit.store.jobs._base import ClaimedJob
from synckit.store.jobs.admin import reschedule_job
from synckit.store.resources import get_resource
from synckit.store.tables import audit_buckets, connections, dead_letters, jobs

# --- a paged REST API on loopback ---------------------------------------------------------


@dataclass
class Req:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def page(self) -> int:
        return int(self.query.get("page", "0"))

    def json(self) -> Any:
        return json.loads(self.body or b"null")


Response = tuple[int, dict[str, str], Any]


@dataclass
class FakeApi:
    """An HTTP/1.1 server (asyncio, keep-alive) that records every request it gets."""

    pages: dict[str, int] = field(default_factory=lambda: {"default": 3, "items": 3, "users": 3})
    per_page: int = 3
    override: Callable[[Req], Response | None] | None = None
    requests: list[Req] = field(default_factory=list)
    url: str = ""
    #: TCP connections accepted, and those the client has closed since.
    connections: int = 0
    closed: int = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"

    async def close(self) -> None:
        self._server.close()
        await self._server.wait_closed()

    def gets(self, path: str) -> list[Req]:
        return [r for r in self.requests if r.method == "GET" and r.path == path]

    def respond(self, req: Req) -> Response:
        if self.override is not None and (custom := self.override(req)) is not None:
            return custom
        if req.method == "POST" and req.path == "/sink":
            return 201, {}, {"id": f"remote-{req.json()['id']}"}
        stream = req.path.strip("/")
        if req.method == "GET" and stream in self.pages:
            last = self.pages[stream]
            if req.page > last:
                return 200, {}, {"items": [], "next": None}
            prefix = "u" if stream == "users" else "i"
            items = [
                {"id": f"{prefix}{req.page}-{i}", "page": req.page} for i in range(self.per_page)
            ]
            return 200, {}, {"items": items, "next": req.page + 1 if req.page < last else None}
        return 404, {}, {"error": "no such route"}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while line := await reader.readline():
                method, target, _ = line.decode().split(" ", 2)
                headers: dict[str, str] = {}
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode().partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                url = urllib.parse.urlsplit(target)
                req = Req(
                    method,
                    url.path,
                    dict(urllib.parse.parse_qsl(url.query)),
                    headers,
                    body,
                    time.monotonic(),
                )
                self.requests.append(req)
                status, extra, payload = self.respond(req)
                data = json.dumps(payload).encode()
                head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
                head += [f"{k}: {v}" for k, v in extra.items()]
                head += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
                writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
                await writer.drain()
            self.closed += 1  # the client's EOF
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed += 1
        finally:
            writer.close()

    async def settled(self) -> None:
        """Wait (briefly) until the server has seen every closed connection's EOF."""
        for _ in range(200):
            if self.closed == self.connections:
                return
            await asyncio.sleep(0.01)


@pytest.fixture
async def api() -> AsyncIterator[FakeApi]:
    server = FakeApi()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


# --- the connector under test -------------------------------------------------------------


class Crash(BaseException):
    """Stands for the process dying mid-page (nothing after it runs)."""


class ItemsConfig(BaseModel):
    api_token: str


@dataclass
class Knobs:
    seen: list[str] = field(default_factory=list)
    fail: dict[str, Exception] = field(default_factory=dict)
    crash_once: set[str] = field(default_factory=set)
    post: bool = False
    checkpoints_seen: list[Any] = field(default_factory=list)
    intents: bool = False


class ItemsBase(Connector[ItemsConfig]):
    """A paged REST connector as an integration engineer writes one."""

    auth = BearerToken("api_token")
    record_concurrency = 2
    knobs: ClassVar[Knobs]

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        page = (checkpoint or {}).get("page", 0) + 1
        while True:
            body = (await ctx.http.get(f"/{ctx.stream}", params={"page": page})).json()
            yield Page(body["items"], checkpoint={"page": page})
            if body["next"] is None:
                return
            page = body["next"]

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        k = self.knobs
        rid = record["id"]
        k.seen.append(rid)
        k.checkpoints_seen.append(await load_checkpoint(ctx.db, self.tenant, self.name, ctx.stream))
        if rid in k.crash_once:
            k.crash_once.discard(rid)
            raise Crash(rid)
        if rid in k.fail:
            raise k.fail[rid]
        if k.intents:

            async def create(idempotency_key: str) -> RemoteRecord:
                sent = await ctx.http.post("/sink", json=record)
                return RemoteRecord(sent.json()["id"])

            await ctx.intent(f"copy:{rid}", create=create, request=record)
        elif k.post:
            await ctx.http.post("/sink", json=record)


def make(api: FakeApi, **attrs: Any) -> type[ItemsBase]:
    """A connector class on this test's server: ``name = "items"`` unless given."""
    attrs.setdefault("name", "items")
    attrs.setdefault("knobs", Knobs())
    return type("Items", (ItemsBase,), {"base_url": api.url, **attrs})


async def setup(db: Database, cls: type[ItemsBase], *tenants: str) -> App:
    app = App([cls])
    for t in tenants or ("acme",):
        await app.add_tenant(db, t, cls.name, {"api_token": f"tok-{t}"})
    return app


async def run_worker(app: App, db: Database) -> None:
    worker = app.worker(db, retry_policy=RetryPolicy.deterministic(), poll_interval=0.05)
    await worker.run_until_idle()


async def dlq_rows(db: Database) -> dict[str, Any]:
    async with db.begin() as conn:
        rows = await conn.execute(select(dead_letters).where(dead_letters.c.kind.like("record:%")))
        return {r.record_id: r for r in rows}


async def job_rows(db: Database, kind: str = "synckit.poll") -> list[Any]:
    async with db.begin() as conn:
        return list(await conn.execute(select(jobs).where(jobs.c.kind == kind)))


# --- cycles ---------------------------------------------------------------------------------


async def test_cycle_commits_the_checkpoint_of_each_page(db: Database, api: FakeApi) -> None:
    """Three pages: every record handled, and page N's checkpoint is stored before N+1."""
    cls = make(api)
    app = await setup(db, cls)
    result = await app.poll(db, "acme")
    assert (result.pages, result.ok, result.failed) == (3, 9, 0)
    assert sorted(cls.knobs.seen) == sorted(f"i{p}-{i}" for p in (1, 2, 3) for i in range(3))
    assert await load_checkpoint(db, "acme", "items", "default") == {"page": 3}
    seen_during = dict(zip(cls.knobs.seen, cls.knobs.checkpoints_seen, strict=True))
    assert {seen_during[f"i{p}-0"]["page"] if p > 1 else None for p in (1, 2, 3)} == {
        None,
        1,
        2,
    }
    assert all(r.headers["authorization"] == "Bearer tok-acme" for r in api.requests)
    async with db.begin() as conn:
        audit = list(await conn.execute(select(audit_buckets)))
    assert sum(r.ok for r in audit) == 9 and sum(r.failed for r in audit) == 0


async def test_bad_records_are_dead_lettered_and_the_checkpoint_advances(
    db: Database, api: FakeApi
) -> None:
    """One bad record (and one the API refuses with 422) fail alone; the rest succeed."""
    cls = make(api, knobs=Knobs(fail={"i2-1": ValueError("no title")}, post=True))
    api.override = lambda r: (
        (422, {}, {"error": "bad"}) if r.path == "/sink" and r.json()["id"] == "i3-0" else None
    )
    app = await setup(db, cls)
    before = utcnow()
    result = await app.poll(db, "acme", trace_id="trace-123")
    assert (result.ok, result.failed) == (7, 2)
    assert await load_checkpoint(db, "acme", "items", "default") == {"page": 3}
    rows = await dlq_rows(db)
    assert set(rows) == {"i2-1", "i3-0"}
    bad = rows["i2-1"]
    assert (bad.tenant, bad.connector, bad.kind) == ("acme", "items", "record:default")
    assert bad.payload == {"id": "i2-1", "page": 2}
    assert bad.error_class == "unknown" and "ValueError: no title" in bad.error_message
    assert "ValueError: no title" in bad.traceback and "in handle" in bad.traceback
    assert bad.trace_id == "trace-123" and bad.status == "pending" and bad.attempt_count == 1
    assert timedelta(seconds=55) < bad.next_retry_at - before < timedelta(seconds=65)
    refused = rows["i3-0"]
    assert refused.error_class == "validation" and refused.status == "review"
    assert refused.next_retry_at is None
    assert "POST " in refused.error_message and "/sink" in refused.error_message
    async with db.begin() as conn:
        audit = list(await conn.execute(select(audit_buckets)))
    assert sum(r.ok for r in audit) == 7 and sum(r.failed for r in audit) == 2
    classes: Counter[str] = Counter()
    for r in audit:
        classes.update(r.failed_by_class or {})
    assert classes == {"unknown": 1, "validation": 1}


async def test_hold_stops_before_the_failure_and_a_second_failure_updates_the_row(
    db: Database, api: FakeApi
) -> None:
    """hold: checkpoint of the last clean page, cycle ends; failing again counts on one row;
    succeeding later resolves it."""
    knobs = Knobs(fail={"i2-1": ValueError("boom")})
    cls = make(api, knobs=knobs, streams=(Stream("items", policy="hold"),))
    app = await setup(db, cls)
    first = await app.poll(db, "acme")
    assert first.held and first.pages == 2
    assert await load_checkpoint(db, "acme", "items", "items") == {"page": 1}
    assert [r.page for r in api.gets("/items")] == [1, 2]
    second = await app.poll(db, "acme")
    assert second.held and [r.page for r in api.gets("/items")] == [1, 2, 2]
    rows = await dlq_rows(db)
    assert list(rows) == ["i2-1"]
    row = rows["i2-1"]
    assert row.attempt_count == 2 and row.kind == "record:items"
    assert [h["error_class"] for h in row.history] == ["unknown", "unknown"]
    knobs.fail.clear()
    third = await app.poll(db, "acme")
    assert not third.held and await load_checkpoint(db, "acme", "items", "items") == {"page": 3}
    resolved = (await dlq_rows(db))["i2-1"]
    assert resolved.status == "resolved" and resolved.resolved_at is not None


async def test_a_crash_mid_page_reprocesses_only_that_page(db: Database, api: FakeApi) -> None:
    """A cycle killed in page 2 resumes at page 2: page 1 is never handled twice."""
    cls = make(api, knobs=Knobs(crash_once={"i2-0"}))
    app = await setup(db, cls)
    with pytest.raises(Crash):
        await app.poll(db, "acme")
    assert await load_checkpoint(db, "acme", "items", "default") == {"page": 1}
    await app.poll(db, "acme")
    assert await load_checkpoint(db, "acme", "items", "default") == {"page": 3}
    counts = Counter(cls.knobs.seen)
    assert all(counts[f"i1-{i}"] == 1 for i in range(3))
    assert all(counts[f"i3-{i}"] == 1 for i in range(3))
    assert all(1 <= counts[f"i2-{i}"] <= 2 for i in range(3))
    assert counts["i2-0"] == 2
    assert await dlq_rows(db) == {}


async def test_a_cycle_that_lost_its_claim_commits_nothing(db: Database, api: FakeApi) -> None:
    """Fencing: a cycle whose job was rescued elsewhere cannot move the checkpoint."""
    cls = make(api)
    app = await setup(db, cls)
    ghost = ClaimedJob(
        id=999, kind="synckit.poll", payload={}, resource_key="items:acme", attempts=1,
        max_attempts=5, priority=0, trace_id=None, run_at=utcnow(), claim_token=1,
    )  # fmt: skip
    with pytest.raises(Cancel, match="lost its claim"):
        await app.poll(db, "acme", job=ghost)
    assert await load_checkpoint(db, "acme", "items", "default") is None


async def test_a_claim_lost_mid_cycle_commits_nothing_more(db: Database, api: FakeApi) -> None:
    """A real claim rescued after page 1: page 1 stays committed; page 2 (checkpoint, dead
    letter, audit counts) is not, and the cycle is cancelled."""
    stolen: list[str] = []

    class Stolen(ItemsBase):
        async def handle(self, ctx: SyncContext, record: Any) -> None:
            if record["page"] == 2 and not stolen:
                # Another worker's rescue and re-claim: the fencing token changes.
                stolen.append(record["id"])
                async with ctx.db.begin() as conn:
                    await conn.execute(
                        jobs.update()
                        .where(jobs.c.id == job.id)
                        .values(claim_token=jobs.c.claim_token + 1)
                    )
            await super().handle(ctx, record)

    cls = type("Items", (Stolen,), {"name": "items", "base_url": api.url, "knobs": Knobs()})
    cls.knobs.fail["i2-1"] = ValueError("bad")
    app = await setup(db, cls)
    assert await app.schedule(db) == ["poll:acme:default"]
    [job] = await claiming.claim(db, "w1", 1)
    with pytest.raises(Cancel, match="lost its claim"):
        await app.poll(db, "acme", job=job)
    assert stolen
    assert await load_checkpoint(db, "acme", "items", "default") == {"page": 1}
    assert await dlq_rows(db) == {}
    async with db.begin() as conn:
        audit = list(await conn.execute(select(audit_buckets)))
    assert sum(r.ok for r in audit) == 3 and sum(r.failed for r in audit) == 0


async def test_a_held_page_of_a_lost_claim_commits_nothing(db: Database, api: FakeApi) -> None:
    """A page that keeps the checkpoint (hold, a record failed) checks the claim too: lost,
    its dead letter and audit counts are not written."""

    class Stolen(ItemsBase):
        async def handle(self, ctx: SyncContext, record: Any) -> None:
            async with ctx.db.begin() as conn:
                await conn.execute(
                    jobs.update()
                    .where(jobs.c.id == job.id)
                    .values(claim_token=jobs.c.claim_token + 1)
                )
            raise ValueError("bad")

    attrs = {"name": "items", "base_url": api.url, "knobs": Knobs()}
    cls = type("Items", (Stolen,), {**attrs, "streams": (Stream("items", policy="hold"),)})
    app = await setup(db, cls)
    assert await app.schedule(db) == ["poll:acme:items"]
    [job] = await claiming.claim(db, "w1", 1)
    with pytest.raises(Cancel, match="lost its claim"):
        await app.poll(db, "acme", "items", job=job)
    assert await load_checkpoint(db, "acme", "items", "items") is None
    assert await dlq_rows(db) == {}
    async with db.begin() as conn:
        assert list(await conn.execute(select(audit_buckets))) == []


async def test_a_record_failing_then_succeeding_in_one_cycle_is_resolved(
    db: Database, api: FakeApi
) -> None:
    """No open dead letter at the start, one written on page 1: page 3 seeing the record
    succeed resolves it in the same cycle (the open flag follows the cycle's own writes)."""
    knobs = Knobs(fail={"i1-0": ValueError("not yet")})
    cls = make(api, knobs=knobs)

    def again_on_page_3(req: Req) -> Response | None:
        if req.path == "/default" and req.page == 3:
            knobs.fail.clear()
            return 200, {}, {"items": [{"id": "i1-0", "page": 3}], "next": None}
        return None

    api.override = again_on_page_3
    app = await setup(db, cls)
    result = await app.poll(db, "acme")
    assert (result.pages, result.ok, result.failed) == (3, 6, 1)
    row = (await dlq_rows(db))["i1-0"]
    assert row.status == "resolved" and row.resolved_at is not None


async def test_only_this_streams_open_dead_letters_are_resolved(db: Database, api: FakeApi) -> None:
    """Open dead letters of another stream (or resolved ones) do not make a cycle resolve
    anything of its own; an open one of its stream from an earlier cycle is resolved."""
    api.pages["users"] = 1
    knobs = Knobs(fail={"u1-0": ValueError("bad user"), "i1-1": ValueError("bad item")})
    cls = make(api, knobs=knobs, streams=(Stream("items"), Stream("users")))
    app = await setup(db, cls)
    await app.poll(db, "acme", "items")
    await app.poll(db, "acme", "users")
    rows = await dlq_rows(db)
    assert {r: rows[r].status for r in rows} == {"u1-0": "pending", "i1-1": "pending"}
    knobs.fail.clear()
    from synckit.store.checkpoints import save_checkpoint

    await db.write(save_checkpoint, "acme", "items", "items", None, utcnow())
    await app.poll(db, "acme", "items")
    rows = await dlq_rows(db)
    assert {r: rows[r].status for r in rows} == {"u1-0": "pending", "i1-1": "resolved"}


async def test_read_cycle_start_sees_the_checkpoint_and_open_dead_letters(db: Database) -> None:
    """One statement: the stored checkpoint and whether any dead letter of the stream's
    records is pending or in review (resolved and ignored ones do not count)."""
    from synckit.runtime.sync.page_commit import RecordFailure, dead_letter_records
    from synckit.runtime.sync.poll import read_cycle_start
    from synckit.store.checkpoints import CycleStart

    now = utcnow()
    start = await db.write(read_cycle_start, "acme", "items", "items")
    assert start == CycleStart(None, False)

    def fail(conn: Any, kind: str, error_class: str) -> None:
        failure = RecordFailure("r1", {"id": "r1"}, error_class, "boom", None)
        dead_letter_records(
            conn, tenant="acme", connector="items", kind=kind, failures=[failure],
            trace_id=None, job_id=None, resource_key=None, now=now,
        )  # fmt: skip

    await db.write(fail, "record:users", "unknown")  # another stream
    await db.write(fail, "job:poll:items", "unknown")  # a dead cycle, not a record
    assert await db.write(read_cycle_start, "acme", "items", "items") == CycleStart(None, False)
    await db.write(fail, "record:items", "validation")  # review
    assert (await db.write(read_cycle_start, "acme", "items", "items")).open_dead_letters
    async with db.begin() as conn:
        await conn.execute(
            dead_letters.update()
            .where(dead_letters.c.kind == "record:items")
            .values(status="ignored")
        )
    from synckit.store.checkpoints import save_checkpoint

    await db.write(save_checkpoint, "acme", "items", "items", {"page": 7}, now)
    start = await db.write(read_cycle_start, "acme", "items", "items")
    assert start == CycleStart({"page": 7}, False)


def test_the_page_statements_are_cacheable() -> None:
    """The statements of every page carry a cache key (a dialect's on_conflict upsert has
    none and is compiled each time it runs)."""
    from synckit.store import audit, checkpoints
    from synckit.store.dead_letters import capture as dlq_capture

    for stmt in (
        checkpoints._SAVE_CHECKPOINT,
        checkpoints._HOLDS,
        checkpoints._SAVE_CHECKPOINT_HELD["postgresql"],
        checkpoints._SAVE_CHECKPOINT_HELD["sqlite"],
        checkpoints._CYCLE_START,
        dlq_capture._SQL[True].resolve,
        dlq_capture._SQL[False].resolve,
        audit._UPSERT,
        audit._SET_CLASSES,
    ):
        assert stmt._generate_cache_key() is not None, stmt


# --- connections, and what a poll job reads first ------------------------------------------


async def test_a_cycle_logs_one_line_at_info_saying_where_it_started(
    db: Database, api: FakeApi
) -> None:
    """poll.finished is a cycle's one info line: where it started, what it did."""
    from structlog.testing import capture_logs

    app = await setup(db, make(api))
    with capture_logs() as logs:
        await app.poll(db, "acme")
        await app.poll(db, "acme")
    info = [e for e in logs if e["log_level"] == "info" and e["event"].startswith("poll.")]
    assert [(e["event"], e["pages_from"], e["pages"], e["ok"]) for e in info] == [
        ("poll.finished", "null", 3, 9),
        ("poll.finished", '{"page": 3}', 1, 0),
    ]


async def test_cookies_an_api_sets_go_with_the_cycles_later_requests(
    db: Database, api: FakeApi
) -> None:
    """A cookie set by one response goes with the client's later requests (responses that
    set none skip the cookie jar)."""
    api.override = lambda r: (
        (200, {"Set-Cookie": "session=s1; Path=/"}, {"items": [], "next": 2})
        if r.page == 1
        else None
    )
    app = await setup(db, make(api))
    await app.poll(db, "acme")
    pages = api.gets("/default")
    assert [p.page for p in pages] == [1, 2, 3]
    assert [p.headers.get("cookie") for p in pages] == [None, "session=s1", "session=s1"]


async def test_a_workers_cycles_reuse_connections_closed_when_it_stops(
    db: Database, api: FakeApi
) -> None:
    """Cycles run one after another by a worker send their requests over the connection
    the previous cycle left open (each still with its own tenant's token); the worker
    closes it when it stops."""
    api.pages["default"] = 1
    cls = make(api)
    app = await setup(db, cls, "acme", "globex", "initech")
    await app.schedule(db)
    worker = app.worker(db, concurrency=1, poll_interval=0.05)
    await worker.run_until_idle()
    assert worker.stats.succeeded == 3
    gets = api.gets("/default")
    assert len(gets) == 3
    assert {g.headers["authorization"] for g in gets} == {
        f"Bearer tok-{t}" for t in ("acme", "globex", "initech")
    }
    assert api.connections == 1
    await api.settled()
    assert api.closed == 1


async def test_a_cycle_outside_a_worker_closes_its_own_connection(
    db: Database, api: FakeApi
) -> None:
    """Outside a worker (a script's App.poll) a cycle's connections are its own and
    close with it."""
    api.pages["default"] = 1
    app = await setup(db, make(api))
    await app.poll(db, "acme")
    await app.poll(db, "acme")
    assert api.connections == 2
    await api.settled()
    assert api.closed == 2


async def test_a_borrowed_transport_given_back_busy_is_closed(api: FakeApi) -> None:
    """A transport comes back to the free list only with every connection idle: one
    holding a response nobody closed is closed, and the next borrower gets a new one. An
    idle one is lent again; all close when the last holder leaves."""
    from synckit.runtime.http.transports import (
        borrow_transport,
        give_back_transport,
        shared_connections,
    )

    assert borrow_transport("items") is None  # nobody lends: a context opens its own
    async with shared_connections():
        first = borrow_transport("items")
        assert first is not None
        async with httpx.AsyncClient(transport=first, base_url=api.url) as client:
            busy = await client.send(client.build_request("GET", "/items"), stream=True)
            await give_back_transport("items", first)
            await api.settled()
            assert (api.connections, api.closed) == (1, 1)
            await busy.aclose()
        second = borrow_transport("items")
        assert second is not None and second is not first
        async with httpx.AsyncClient(transport=second, base_url=api.url) as client:
            await client.get("/items")
            await give_back_transport("items", second)
            assert borrow_transport("items") is second
            await client.get("/items")
            await give_back_transport("items", second)
            assert (api.connections, api.closed) == (2, 1)
    await api.settled()
    assert (api.connections, api.closed) == (2, 2)
    assert borrow_transport("items") is None


async def test_poll_start_reads_what_get_tenant_read_cycle_start_and_read_pace_read(
    db: Database, api: FakeApi
) -> None:
    """The poll job's one statement reads the tenant as get_tenant does, the stream's
    start as read_cycle_start and the pacing as read_pace_sync (the resource's own
    next_available_at or its parent's, whichever is later, and the stored quota)."""
    from synckit.runtime.admin.tenants import _tenant, get_tenant
    from synckit.runtime.http.pacing import read_pace_sync
    from synckit.runtime.sync.page_commit import RecordFailure, dead_letter_records
    from synckit.runtime.sync.poll import read_cycle_start
    from synckit.runtime.sync.poll_jobs import _poll_start
    from synckit.store.tables import resources

    await setup(db, make(api), "acme", "globex")
    now = utcnow().replace(microsecond=0)

    async def check(tenant: str) -> None:
        row, start, pace = await db.write(_poll_start, tenant, "items", "default")
        t = await get_tenant(db, tenant)
        assert _tenant(row, reveal=True, cipher=None) == t
        assert start == await db.write(read_cycle_start, tenant, "items", "default")
        assert pace == await db.write(read_pace_sync, t.resource_key)

    await check("acme")  # no checkpoint, no pacing, no quota
    await db.write(save_checkpoint, "acme", "items", "default", {"page": 4}, now)
    failure = RecordFailure("r1", {"id": "r1"}, "validation", "boom", None)
    await db.write(
        lambda c: dead_letter_records(
            c, tenant="acme", connector="items", kind="record:default", failures=[failure],
            trace_id=None, job_id=None, resource_key=None, now=now,
        )
    )  # fmt: skip

    async def pace(key: str, **values: Any) -> None:
        async with db.begin() as conn:
            await conn.execute(
                resources.update().where(resources.c.resource_key == key).values(**values)
            )

    quota = {
        "quota_limit": 100,
        "quota_remaining": 7,
        "quota_reset_at": now + timedelta(minutes=5),
        "quota_at": now,
    }
    await pace("items:acme", next_available_at=now + timedelta(seconds=30), **quota)
    await check("acme")
    await pace("api:items", next_available_at=now + timedelta(seconds=90))  # the parent's
    await check("acme")
    await check("globex")  # the parent's only
    await pace("items:acme", next_available_at=now + timedelta(seconds=300))
    await check("acme")
    _row, start, pace_view = await db.write(_poll_start, "acme", "items", "default")
    assert start is not None and start.checkpoint == {"page": 4} and start.open_dead_letters
    assert pace_view is not None and pace_view.available_at == now + timedelta(seconds=300)
    assert pace_view.quota is not None and pace_view.quota.remaining == 7
    assert await db.write(_poll_start, "nobody", "items", "default") == (None, None, None)


async def test_poll_jobs_starting_together_read_in_one_statement(
    db: Database, api: FakeApi
) -> None:
    """Poll jobs whose first read waits for the database together share one statement;
    each gets what it would have read alone (a removed tenant reads as gone)."""
    from sqlalchemy import event

    from synckit.runtime.sync.poll_jobs import _poll_start, _StartReads

    tenants = [f"t{i}" for i in range(6)]
    await setup(db, make(api), *tenants)
    await db.write(save_checkpoint, "t3", "items", "default", {"page": 2}, utcnow())
    engine = db.sync_engine if db.sync_engine is not None else db.engine.sync_engine
    statements: list[str] = []

    def seen(_c: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "want_tenant" in statement:
            statements.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        reads = _StartReads(db)
        got = await asyncio.gather(
            *(reads.read(t, "items", "default") for t in [*tenants, "nobody"])
        )
        again = await reads.read("t1", "items", "default")  # a batch of its own
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert len(statements) == 2
    for t, (row, start, pace, first) in zip([*tenants, "nobody"], got, strict=True):
        assert first is None  # "items" declares no rate: no slot is reserved
        alone = await db.write(_poll_start, t, "items", "default")
        assert (row is None, start, pace) == (alone[0] is None, alone[1], alone[2])
        if row is not None:
            assert row.tenant == t and row._mapping == alone[0]._mapping
    assert got[3][1] is not None and got[3][1].checkpoint == {"page": 2}
    assert got[-1] == (None, None, None, None)
    assert again[0] is not None and again[0].tenant == "t1"


async def test_a_row_one_starting_job_cannot_read_fails_that_job_alone(
    db: Database, api: FakeApi, engine_name: str
) -> None:
    """A poison row (a checkpoint that is not JSON) in a shared first read: that job's read
    raises, the others read what they would have read alone."""
    from synckit.runtime.sync.poll_jobs import _poll_start, _StartReads

    await setup(db, make(api), "ok1", "bad", "ok2")
    bad_cursor = {"sqlite": "'{not json'", "postgresql": "('1' || repeat('0', 5000))::jsonb"}
    async with db.begin() as conn:
        await conn.execute(
            sa_text(
                "INSERT INTO checkpoints (tenant, connector, stream, cursor, updated_at) VALUES"
                f" ('bad', 'items', 'default', {bad_cursor[engine_name]}, CURRENT_TIMESTAMP)"
            )
        )
    reads = _StartReads(db)
    got = await asyncio.gather(
        *(reads.read(t, "items", "default") for t in ("ok1", "bad", "ok2")),
        return_exceptions=True,
    )
    assert isinstance(got[1], Exception)
    for t, g in (("ok1", got[0]), ("ok2", got[2])):
        assert not isinstance(g, BaseException)
        alone = await db.write(_poll_start, t, "items", "default")
        assert g[0] is not None and g[0]._mapping == alone[0]._mapping and g[1:3] == alone[1:]


def count_reservations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The resource keys of the slot reservations ctx.http makes from now on."""
    from synckit.runtime.http import pacer as runtime_http

    taken: list[str] = []
    real = runtime_http._take_slot

    def counted(conn: Any, key: str, *args: Any) -> Any:
        taken.append(key)
        return real(conn, key, *args)

    monkeypatch.setattr(runtime_http, "_take_slot", counted)
    return taken


async def test_cycles_starting_together_reserve_their_first_slots_in_their_start_read(
    db: Database, api: FakeApi
) -> None:
    """Poll jobs of a connector declaring a rate, starting together, reserve their
    cycles' first slots in their shared start read: what a first request's own
    reservation (take_slot_sync, ahead) would have reserved, on the same shared schedule.
    A paused tenant and a paced resource reserve nothing."""
    from synckit.runtime.admin.tenants import pause_tenant
    from synckit.runtime.http import pacing
    from synckit.store.tables import resources

    cls = make(api, rate_limit=RateLimit(5, burst=1))
    tenants = ["a1", "a2", "a3", "held", "paced"]
    app = await setup(db, cls, *tenants)
    await pause_tenant(db, "held")
    now = utcnow()
    async with db.begin() as conn:
        await conn.execute(
            resources.update()
            .where(resources.c.resource_key == "items:paced")
            .values(next_available_at=now + timedelta(seconds=60))
        )
    reads = app.poll_jobs.start_reads(db)
    got = dict(
        zip(
            tenants,
            await asyncio.gather(*(reads.read(t, "items", "default") for t in tenants)),
            strict=True,
        )
    )
    assert got["held"][3] is None and got["paced"][3] is None
    # What a request's own reservation takes on a resource with nothing reserved yet.
    later = utcnow()
    alone = await db.write(
        lambda c: pacing.take_slot_sync(
            c, "items:a3", declared_rate=5, burst=1, in_flight=0, observed=None,
            now=later, max_wait=30.0, ahead=True,
        )
    )  # fmt: skip
    for t in ("a1", "a2", "a3"):
        first = got[t][3]
        assert first is not None and first.result.reserved, t
        assert (first.result.wait, first.result.more, first.result.interval) == (
            0.0,
            (0.2, 0.4, 0.6, 0.8),
            0.2,
        ), t
    # a3's own reservation came after its start read's: its first slot follows those
    # (the schedule stands one interval after the last reserved one).
    assert alone.reserved
    assert later + timedelta(seconds=alone.wait) >= now + timedelta(seconds=1.0)
    async with db.begin() as conn:
        stored = {
            r.resource_key: r.tokens_at
            for r in await conn.execute(select(resources.c.resource_key, resources.c.tokens_at))
        }
    assert stored["items:held"] is None and stored["items:paced"] is None
    assert stored["items:a1"] is not None and stored["items:a1"] >= now + timedelta(seconds=1.0)


async def test_a_cycles_first_requests_go_by_the_slots_its_start_read_reserved(
    db: Database, api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cycles run by a worker, their connector declaring 5/s: their first requests make
    no reservation of their own (the start read's slots cover them) and keep the
    declared spacing."""
    cls = make(api, rate_limit=RateLimit(5, burst=1))
    taken = count_reservations(monkeypatch)
    fresh = await setup(db, cls, "b1", "b2")
    assert sorted(await fresh.schedule(db)) == ["poll:b1:default", "poll:b2:default"]
    # The slots count from the start read, which comes after this moment (the API's
    # clock: time.monotonic).
    before = time.monotonic()
    await run_worker(fresh, db)
    assert taken == []
    for t in ("b1", "b2"):
        times = [
            r.at
            for r in api.gets("/default")
            if r.headers.get("authorization") == f"Bearer tok-{t}"
        ]
        assert len(times) == 3, t
        # The k-th request no sooner than k intervals (0.2 s) after the start read: the
        # slots' schedule. Lower bounds from a moment before it, not gaps between
        # requests: a slot used late, as a loaded machine does, leaves less than an
        # interval before the next (CI met 0.139 s, then 0.120 s after a first request
        # 0.08 s late).
        assert all(b - before >= 0.2 * k for k, b in enumerate(times)), (t, before, times)


async def test_first_slots_reserved_at_another_rate_than_the_clients_are_not_used(
    db: Database, api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start read reserves at the connector class's declared rate; a connector
    instance pacing at another (set on the instance) reserves its first slot itself."""
    from synckit.runtime.http import pacing
    from synckit.runtime.sync.context import open_context

    cls = make(api, rate_limit=RateLimit(5, burst=1))
    await setup(db, cls, "vip")
    taken = count_reservations(monkeypatch)

    def first() -> pacing.FirstSlots:
        reserved = pacing.SlotResult(0.0, "", True, pacing.PaceView(None, None), (0.2,), 0.2)
        return pacing.FirstSlots(reserved, utcnow(), 5.0, 1)

    async def one_request(instance: ItemsBase) -> None:
        async with open_context(db, instance, resource_key="items:vip", first_slots=first()) as ctx:
            await ctx.http.get("/default", params={"page": 1})

    await one_request(cls("vip", {"api_token": "tok-vip"}))
    assert taken == []  # the class's rate: the first slots served it
    other = cls("vip", {"api_token": "tok-vip"})
    other.rate_limit = RateLimit(1, burst=1)  # type: ignore[misc]
    await one_request(other)
    assert taken == ["items:vip"]


async def test_a_resource_row_that_cannot_be_read_costs_only_its_own_cycle_its_first_slots(
    db: Database, api: FakeApi, engine_name: str
) -> None:
    """A resource whose schedule is not a time (SQLite holds what it is given): the start
    read still reads every starting job's tenant, and the other cycles still get their
    first slots; that cycle's first request meets the row itself."""
    if engine_name != "sqlite":
        pytest.skip("a timestamptz column cannot hold text")
    cls = make(api, rate_limit=RateLimit(5, burst=1))
    await setup(db, cls, "ok1", "bad", "ok2")
    async with db.begin() as conn:
        await conn.execute(
            sa_text(
                "UPDATE resources SET tokens_at = 'not a time' WHERE resource_key = 'items:bad'"
            )
        )
    app = App([cls])
    reads = app.poll_jobs.start_reads(db)
    got = await asyncio.gather(*(reads.read(t, "items", "default") for t in ("ok1", "bad", "ok2")))
    assert [g[0].tenant for g in got] == ["ok1", "bad", "ok2"]
    assert got[0][3] is not None and got[2][3] is not None
    assert got[1][3] is None


async def test_a_first_slot_whose_resource_another_transaction_holds_is_not_waited_for(
    db: Database, api: FakeApi, engine_name: str
) -> None:
    """PostgreSQL: the start read skips a resource row another transaction holds (the
    read never waits for a lock, so it can be in no lock cycle); that cycle's first
    request reserves its own slot once the row is free."""
    if engine_name != "postgresql":
        pytest.skip("row locks: SQLite's writer holds the whole file")
    from synckit.store.tables import resources

    cls = make(api, rate_limit=RateLimit(5, burst=1))
    app = await setup(db, cls, "free", "busy")
    async with db.engine.connect() as other:
        tx = await other.begin()
        await other.execute(
            select(resources.c.resource_key)
            .where(resources.c.resource_key == "items:busy")
            .with_for_update()
        )
        reads = app.poll_jobs.start_reads(db)
        # A read that waited for the row lock would wait for the rollback below: forever.
        free, busy = await asyncio.wait_for(
            asyncio.gather(
                reads.read("free", "items", "default"), reads.read("busy", "items", "default")
            ),
            timeout=EVENT_TIMEOUT,
        )
        assert free[3] is not None and busy[3] is None
        assert busy[0] is not None and busy[0].tenant == "busy"  # the start itself is read
        await tx.rollback()


# --- errors about the whole API --------------------------------------------------------------


async def test_429_aborts_the_cycle_and_defers_the_tenant(db: Database, api: FakeApi) -> None:
    """A 429 on page 2 ends the job (retried later), paces the resource by Retry-After, and
    keeps page 1's checkpoint; no record is dead-lettered."""
    api.override = lambda r: (429, {"Retry-After": "120"}, {}) if r.page == 2 else None
    cls = make(api)
    app = await setup(db, cls)
    before = utcnow()
    assert await app.schedule(db) == ["poll:acme:default"]
    await run_worker(app, db)
    [job] = await job_rows(db)
    assert job.status == "pending" and job.error_class == "rate_limited"
    assert job.attempts == 0  # snoozed for the pace, the attempt not spent
    info = await get_resource(db, "items:acme")
    assert info.next_available_at is not None
    assert timedelta(seconds=115) < info.next_available_at - before < timedelta(seconds=150)
    assert await load_checkpoint(db, "acme", "items", "default") == {"page": 1}
    assert await dlq_rows(db) == {}
    assert [r.page for r in api.gets("/default")] == [1, 2]


async def test_a_failed_cycle_is_retried_by_its_connectors_retry_policy(
    db: Database, api: FakeApi
) -> None:
    """Connector.retry_policy times the retry of its failed cycles, not the worker's."""
    api.override = lambda r: (503, {}, {})
    cls = make(api, retry_policy=RetryPolicy(fixed_delay=timedelta(minutes=7)))
    app = await setup(db, cls)
    before = utcnow()
    assert await app.schedule(db) == ["poll:acme:default"]
    await run_worker(app, db)  # the worker's own policy would retry at once
    [job] = await job_rows(db)
    assert job.status == "pending" and job.attempts == 1
    assert job.error_class == "transient"
    assert timedelta(minutes=7) <= job.run_at - before < timedelta(minutes=8)


async def test_committed_pages_are_progress_a_later_failure_spends_no_attempt(
    db: Database, api: FakeApi
) -> None:
    """A 503 after page 1 committed spends no attempt; a 503 before any page does."""
    api.override = lambda r: (503, {}, {}) if r.page == 2 else None
    cls = make(api, retry_policy=RetryPolicy(fixed_delay=timedelta(minutes=7)))
    app = await setup(db, cls)
    assert await app.schedule(db) == ["poll:acme:default"]
    await run_worker(app, db)
    [job] = await job_rows(db)
    assert job.status == "pending" and job.error_class == "transient"
    assert job.attempts == 0
    assert await load_checkpoint(db, "acme", "items", "default") == {"page": 1}
    # Now nothing commits: page 2 fails at once, and that attempt counts.
    await reschedule_job(db, job.id, utcnow())
    await run_worker(app, db)
    [job] = await job_rows(db)
    assert job.status == "pending" and job.attempts == 1
    assert await load_checkpoint(db, "acme", "items", "default") == {"page": 1}


async def test_the_next_page_is_fetched_while_the_last_one_commits(
    db: Database, api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page's commit (which waits its turn at the database) overlaps the fetch of the
    next page; that page's records are handled only once the commit is done, and a fetch
    that fails meanwhile leaves the page committed (progress)."""
    moments: list[tuple[str, int, float]] = []
    real = Database.write_grouped

    async def slow_turn(self: Database, fn: Any, commit: Any, **kwargs: Any) -> Any:
        # Waiting its turn at a busy database (the event loop stays free meanwhile).
        page = commit.cursor["page"]
        moments.append(("commit", page, time.monotonic()))

        async def next_asked() -> bool:
            return any(m[:2] == ("fetch", page + 1) for m in moments)

        if page < 3:  # it holds its turn until the next page is asked for: were that fetch
            # to wait for this commit, neither would ever end (EVENT_TIMEOUT fails it)
            await await_until(next_asked, f"page {page + 1} asked for", interval=0.01)
        try:
            return await real(self, fn, commit, **kwargs)
        finally:
            moments.append(("committed", page, time.monotonic()))

    monkeypatch.setattr(Database, "write_grouped", slow_turn)
    answer = api.override
    api.override = lambda r: (
        moments.append(("fetch", r.page, time.monotonic())) or (answer(r) if answer else None)
    )
    cls = make(api)
    app = await setup(db, cls)
    result = await app.poll(db, "acme")
    assert (result.pages, result.ok) == (3, 9)
    at = {(what, page): when for what, page, when in moments}
    # Page 2 was asked for before page 1's commit ended, and page 3 before page 2's.
    assert at[("fetch", 2)] < at[("committed", 1)]
    assert at[("fetch", 3)] < at[("committed", 2)]
    # Handling still follows the commit before it (the checkpoint each record saw).
    seen_during = dict(zip(cls.knobs.seen, cls.knobs.checkpoints_seen, strict=True))
    assert [seen_during[f"i{p}-0"] for p in (2, 3)] == [{"page": 1}, {"page": 2}]

    # Page 2 fails to come while page 1 commits: page 1 is committed all the same.
    moments.clear()
    at.clear()
    api.override = lambda r: (
        moments.append(("fetch", r.page, time.monotonic()))
        or ((503, {}, {}) if r.page == 2 else None)
    )
    cls2 = make(api, name="items2")
    app2 = await setup(db, cls2, "beta")
    with pytest.raises(Exception, match="503"):
        await app2.poll(db, "beta")
    assert await load_checkpoint(db, "beta", "items2", "default") == {"page": 1}
    at = {(what, page): when for what, page, when in moments}
    assert at[("fetch", 2)] < at[("committed", 1)]


async def test_rate_limit_in_handle_aborts_without_dead_lettering(
    db: Database, api: FakeApi
) -> None:
    """A 429 answering one record's write is about the API: the page is not committed."""
    api.override = lambda r: (
        (429, {"Retry-After": "60"}, {}) if r.path == "/sink" and r.json()["page"] == 2 else None
    )
    cls = make(api, knobs=Knobs(post=True))
    app = await setup(db, cls)
    with pytest.raises(RateLimited):
        await app.poll(db, "acme")
    assert await load_checkpoint(db, "acme", "items", "default") == {"page": 1}
    assert await dlq_rows(db) == {}
    assert (await get_resource(db, "items:acme")).next_available_at is not None


async def test_401_marks_the_tenant_needs_reauth(db: Database, api: FakeApi) -> None:
    """A 401 ends the cycle with NeedsReauth; the worker stops the tenant's jobs."""
    api.override = lambda r: (401, {}, {"error": "expired"}) if r.method == "GET" else None
    cls = make(api)
    app = await setup(db, cls)
    with pytest.raises(NeedsReauth):
        await app.poll(db, "acme")
    await app.schedule(db)
    await run_worker(app, db)
    async with db.begin() as conn:
        status = (await conn.execute(select(connections.c.status))).scalar()
    assert status == "needs_reauth"
    [job] = await job_rows(db)
    assert job.status == "pending"


async def test_exhausted_quota_on_a_success_defers_until_reset(db: Database, api: FakeApi) -> None:
    """X-RateLimit-Remaining: 0 on a 200 paces the tenant until the reset: a long wait ends
    the cycle (RateLimited), and no further request is sent meanwhile."""
    quota = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "600"}
    api.override = lambda r: (
        (200, quota, {"items": [{"id": "i1-0", "page": 1}], "next": 2}) if r.page == 1 else None
    )
    cls = make(api, max_inline_wait=timedelta(seconds=5))
    app = await setup(db, cls)
    before = utcnow()
    with pytest.raises(RateLimited, match="paced"):
        await app.poll(db, "acme")
    info = await get_resource(db, "items:acme")
    assert info.next_available_at is not None
    assert timedelta(seconds=595) < info.next_available_at - before < timedelta(seconds=610)
    assert [r.page for r in api.gets("/default")] == [1]
    assert await load_checkpoint(db, "acme", "items", "default") == {"page": 1}


async def test_a_short_quota_reset_is_waited_for_inline(db: Database, api: FakeApi) -> None:
    """An exhausted quota that resets within max_inline_wait is slept through."""
    quota = {"RateLimit": "limit=10, remaining=0, reset=1"}
    api.override = lambda r: (200, quota, {"items": [], "next": 2}) if r.page == 1 else None
    cls = make(api)
    app = await setup(db, cls)
    result = await app.poll(db, "acme")
    assert result.pages == 3
    page1, page2 = api.gets("/default")[:2]
    assert page2.at - page1.at >= 0.9


async def test_client_rate_limit_paces_requests(db: Database, api: FakeApi) -> None:
    """RateLimit(5/s, burst 1): six requests take at least a second, at the server."""
    api.pages["default"] = 6
    cls = make(api, rate_limit=RateLimit(5, burst=1))
    app = await setup(db, cls)
    started = time.monotonic()  # the server's clock; the slots are counted after it
    await app.poll(db, "acme")
    times = [r.at for r in api.gets("/default")]
    assert len(times) == 6
    # Request i has the i-th slot after the cycle's reservation: none ever comes before
    # it. The slots are not counted from the first request's arrival: a first request
    # that arrives late (a busy machine: it shares the loop with this server) lets the
    # next one follow it closer, so the arrivals' spacing alone is no bound.
    assert times[-1] - started >= 1.0 - 0.01, times[-1] - started
    assert all(t - started >= i * 0.2 - 0.01 for i, t in enumerate(times)), [
        round(t - started, 3) for t in times
    ]


# --- scheduling -------------------------------------------------------------------------------


async def test_scheduler_enqueues_one_cycle_per_due_tenant_and_stream(
    db: Database, api: FakeApi
) -> None:
    """Each (tenant, stream) gets one job with the tenant's resource key, never two."""
    cls = make(api, streams=(Stream("items"), Stream("users", schedule="every 1h")))
    app = await setup(db, cls, "acme", "globex")
    now = utcnow()
    fired = await app.schedule(db, now=now)
    assert sorted(fired) == [
        "poll:acme:items",
        "poll:acme:users",
        "poll:globex:items",
        "poll:globex:users",
    ]
    assert await app.schedule(db, now=now) == []
    assert await app.schedule(db, now=now + timedelta(hours=2)) == []  # still queued
    rows = await job_rows(db)
    assert len(rows) == 4
    assert {(r.unique_key, r.resource_key) for r in rows} == {
        (f"poll:{t}:{s}", f"items:{t}") for t in ("acme", "globex") for s in ("items", "users")
    }
    assert all(r.payload["connector"] == "items" for r in rows)


async def test_scheduler_fires_again_after_the_interval(db: Database, api: FakeApi) -> None:
    """After a cycle finished, the next one is enqueued at the next tick, not before."""
    cls = make(api)
    app = await setup(db, cls)
    now = utcnow()
    assert await app.schedule(db, now=now) == ["poll:acme:default"]
    await run_worker(app, db)
    assert [r.status for r in await job_rows(db)] == ["succeeded"]
    # The next tick is on the key's phase of five minutes: anywhere in the next five.
    tick = parse_schedule("every 5m").next_after(now, poll_key("acme", "default"))
    assert await app.schedule(db, now=tick - timedelta(milliseconds=1)) == []
    assert await app.schedule(db, now=tick) == ["poll:acme:default"]


async def test_paused_tenants_are_not_polled(db: Database, api: FakeApi) -> None:
    """A paused tenant gets no new cycle, and its queued cycle is not claimed."""
    from synckit import pause_tenant, resume_tenant

    cls = make(api)
    app = await setup(db, cls, "acme", "globex")
    await pause_tenant(db, "globex")
    assert await app.schedule(db) == ["poll:acme:default"]
    await resume_tenant(db, "globex")
    assert await app.schedule(db) == ["poll:globex:default"]
    await pause_tenant(db, "globex")
    await run_worker(app, db)
    status = {r.payload["tenant"]: r.status for r in await job_rows(db)}
    assert status == {"acme": "succeeded", "globex": "pending"}
    tokens = {r.headers["authorization"] for r in api.requests}
    assert tokens == {"Bearer tok-acme"}


async def test_streams_keep_separate_checkpoints(db: Database, api: FakeApi) -> None:
    """Two streams of one tenant: each cycle stores its own checkpoint and DLQ kind."""
    api.pages["users"] = 2
    cls = make(
        api,
        streams=(Stream("items"), Stream("users")),
        knobs=Knobs(fail={"u1-0": ValueError("bad user")}),
    )
    app = await setup(db, cls)
    await app.schedule(db)
    await run_worker(app, db)
    assert [r.status for r in await job_rows(db)] == ["succeeded", "succeeded"]
    assert await load_checkpoint(db, "acme", "items", "items") == {"page": 3}
    assert await load_checkpoint(db, "acme", "items", "users") == {"page": 2}
    assert {r.kind for r in (await dlq_rows(db)).values()} == {"record:users"}


# --- replay and intents -------------------------------------------------------------------------


async def test_replay_record_runs_handle_again(db: Database, api: FakeApi) -> None:
    """App.replay_record re-runs handle() on a payload, raising when it fails again."""
    knobs = Knobs(fail={"i2-1": ValueError("still bad")}, post=True)
    cls = make(api, knobs=knobs)
    app = await setup(db, cls)
    await app.poll(db, "acme")
    row = (await dlq_rows(db))["i2-1"]
    with pytest.raises(ValueError, match="still bad"):
        await app.replay_record(db, row.tenant, row.connector, row.kind, row.payload)
    knobs.fail.clear()
    await app.replay_record(db, row.tenant, row.connector, row.kind, row.payload)
    posted = [r.json()["id"] for r in api.requests if r.path == "/sink"]
    assert posted.count("i2-1") == 1
    with pytest.raises(Unreplayable, match="no tenant"):
        await app.replay_record(db, "gone", "items", "record:default", row.payload)
    with pytest.raises(Unreplayable, match="record kind"):
        await app.replay_record(db, "acme", "items", "synckit.poll", row.payload)


async def test_ctx_intent_creates_once_across_cycles(db: Database, api: FakeApi) -> None:
    """ctx.intent delegates to run_intent: re-polled records are not created twice."""
    cls = make(api, knobs=Knobs(intents=True), streams=(Stream("items", policy="hold"),))
    app = await setup(db, cls)
    await app.poll(db, "acme")
    async with db.begin() as conn:
        await conn.execute(dead_letters.delete())
    from synckit.store.checkpoints import save_checkpoint

    # Read everything again from the start.
    await db.write(save_checkpoint, "acme", "items", "items", None, utcnow())
    await app.poll(db, "acme")
    posted = Counter(r.json()["id"] for r in api.requests if r.path == "/sink")
    assert len(posted) == 9 and set(posted.values()) == {1}


async def test_run_cycle_reports_a_poll_that_is_not_a_generator(db: Database, api: FakeApi) -> None:
    """poll() yielding something other than Page fails clearly."""

    class Odd(ItemsBase):
        name = "odd"
        base_url = api.url
        knobs = Knobs()

        async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
            yield {"records": []}  # type: ignore[misc]

    app = App([Odd])
    await app.add_tenant(db, "acme", "odd", {"api_token": "x"})
    from synckit.errors.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match="not a Page"):
        async with app.context(db, "acme") as ctx:
            await run_cycle(db, ctx.connector, ctx)


async def test_queued_jobs_of_a_removed_tenant_are_discarded(db: Database, api: FakeApi) -> None:
    from synckit import remove_tenant

    cls = make(api)
    app = await setup(db, cls)
    await app.schedule(db)
    await remove_tenant(db, "acme")
    await run_worker(app, db)
    [job] = await job_rows(db)
    assert job.status == "discarded" and "removed" in job.last_error
    assert await admin.count_by_status(db) == {"discarded": 1}


async def test_update_tenant_validates_config_and_reschedules(db: Database, api: FakeApi) -> None:
    """A new config is validated like at add; a new schedule starts from its next tick."""
    from synckit import update_tenant
    from synckit.errors.exceptions import ConfigurationError

    cls = make(api)
    app = await setup(db, cls)
    now = utcnow()
    assert await app.schedule(db, now=now) == ["poll:acme:default"]
    await run_worker(app, db)
    with pytest.raises(ConfigurationError, match="api_token: Field required"):
        await update_tenant(db, "acme", config={}, app=app)
    updated = utcnow()
    t = await update_tenant(db, "acme", config={"api_token": "new"}, schedule="every 1h", app=app)
    assert t.config == {"api_token": "new"} and t.schedule == "every 1h"
    # The hourly tick falls on the key's phase of the hour: anywhere in the next hour
    # (asserting "none due 10 minutes on" failed one time of day in six).
    tick = parse_schedule("every 1h").next_after(updated, poll_key("acme", "default"))
    assert await app.schedule(db, now=tick - timedelta(milliseconds=1)) == []
    assert await app.schedule(db, now=tick) == ["poll:acme:default"]
    await app.poll(db, "acme")
    assert api.requests[-1].headers["authorization"] == "Bearer new"


@pytest.mark.parametrize(
    "cursor",
    [
        {"after": "abc\x00def"},
        ["x", {"k\x00": 1}],
        "lone \ud800 surrogate",
        {"$synckit_json": "not ours"},  # cursors that look like the stored form
        {"$synckit_json": "1"},
        {"page": 3},
    ],
)
async def test_a_checkpoint_with_nul_or_a_lone_surrogate_is_stored_and_read_back_exactly(
    db: Database, cursor: Any
) -> None:
    """PostgreSQL's JSON types refuse NUL: a cursor holding one failed its page's commit
    on every retry. It is stored escaped and read back as the connector gave it."""
    from synckit.runtime.sync.poll import read_cycle_start
    from synckit.store.checkpoints import list_checkpoints, save_checkpoint

    await db.write(save_checkpoint, "acme", "items", "default", cursor, utcnow())
    assert await load_checkpoint(db, "acme", "items", "default") == cursor
    start = await db.write(read_cycle_start, "acme", "items", "default")
    assert start.checkpoint == cursor
    assert [c[2] for c in await list_checkpoints(db, "acme")] == [cursor]


async def test_a_cycle_reads_its_pacing_with_its_tenant_not_per_request(
    db: Database, api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poll job reads the resource's pacing in the transaction that reads the tenant:
    the cycle's requests (no rate declared) make no pacing read of their own, and a pace
    stored on the resource is honoured from the first request."""
    from synckit.runtime.http import pacing

    reads: list[str] = []
    real = pacing.read_pace

    async def counted(db_: Database, key: str) -> Any:
        reads.append(key)
        return await real(db_, key)

    monkeypatch.setattr(pacing, "read_pace", counted)
    # A process re-reads a resource's pacing every half second (pacer.REFRESH_SECONDS):
    # a busy machine may take longer than that over the cycle's three pages, and that
    # read is not the one this test is about.
    monkeypatch.setattr("synckit.runtime.http.pacer.REFRESH_SECONDS", 3600.0)
    cls = make(api)
    app = await setup(db, cls)
    assert await app.schedule(db) == ["poll:acme:default"]
    await run_worker(app, db)
    assert len(api.gets("/default")) == 3
    assert reads == []
    # The view the job read is honoured from the first request: a pace in it is waited
    # out without any read of its own.
    from synckit.runtime.sync.context import open_context

    api.requests.clear()
    seeded = pacing.PaceView(utcnow() + timedelta(seconds=0.6), None)
    instance = cls("other", {"api_token": "tok-other"})
    t0 = time.monotonic()  # what FakeApi stamps requests with
    async with open_context(db, instance, resource_key="items:other", pace=seeded) as ctx:
        await ctx.http.get("/default", params={"page": 1})
    assert [r.page for r in api.requests] == [1]
    # (Nothing is stored for items:other: only the seeded view could make it wait.)
    assert api.requests[0].at - t0 >= 0.45, "the request went before the seeded pace ended"
