"""Intent-first creates in one process, on SQLite and PostgreSQL (and the pure helpers)."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, date, datetime, timedelta
from typing import Any

import httpx
import pytest
import structlog
from sqlalchemy import select

from synckit.errors import RetryPolicy, set_testing
from synckit.errors.exceptions import IntentConflict, PermanentError
from synckit.runtime.jobs.handlers import Registry
from synckit.runtime.jobs.worker import Worker
from synckit.runtime.writes.intents import (
    WRITE_KIND,
    RemoteRecord,
    current_idempotency_headers,
    fingerprint,
    idempotency_headers,
    idempotency_key,
    idempotency_request_hook,
    run_intent,
    run_write,
    write_job,
    write_job_handler,
)
from synckit.store.db import Database, open_database
from synckit.store.jobs import admin, enqueueing
from synckit.store.tables import dead_letters, intents

# --- pure helpers ---------------------------------------------------------------------


def test_fingerprint_ignores_key_order_and_sees_every_value() -> None:
    """Canonical JSON: key order does not change the fingerprint; any value does."""
    a = fingerprint({"to": ["x@y"], "subject": "hi", "n": 1})
    assert a == fingerprint({"n": 1, "subject": "hi", "to": ["x@y"]})
    assert a != fingerprint({"n": 2, "subject": "hi", "to": ["x@y"]})
    assert len(a) == 64
    assert fingerprint(None) != fingerprint({})


def test_fingerprint_takes_dates_and_refuses_arbitrary_objects() -> None:
    """Dates are canonicalised; an object with no canonical form is a PermanentError."""
    assert fingerprint({"d": date(2024, 1, 2)}) == fingerprint({"d": "2024-01-02"})
    with pytest.raises(PermanentError, match="not JSON-serialisable"):
        fingerprint({"x": object()})


def test_idempotency_key_is_stable_per_intent_and_distinct_across_tenants() -> None:
    """The same (tenant, connector, key) always gives the same UUID; another tenant not."""
    k = idempotency_key("acme", "graph", "invoice-1")
    assert k == idempotency_key("acme", "graph", "invoice-1")
    assert k != idempotency_key("globex", "graph", "invoice-1")
    assert k != idempotency_key("acme", "other", "invoice-1")
    assert idempotency_headers(k) == {"Idempotency-Key": k}
    assert idempotency_headers(k, "X-Request-Id") == {"X-Request-Id": k}


# --- a fake remote API --------------------------------------------------------------------


class Remote:
    """An in-memory API: creates count, and a create can 'lose its response'."""

    def __init__(self) -> None:
        self.items: dict[str, list[str]] = {}
        self.ids = itertools.count(1)
        self.creates = 0
        self.finds = 0
        self.keys: list[str] = []
        self.lose_next = 0
        self.delay = 0.0
        self.called = asyncio.Event()

    def create_for(self, ref: str) -> Any:
        async def create(idem: str) -> RemoteRecord:
            self.creates += 1
            self.called.set()
            self.keys.append(idem)
            rid = f"r{next(self.ids)}"
            self.items.setdefault(ref, []).append(rid)  # committed remotely...
            if self.delay:
                await asyncio.sleep(self.delay)  # ...and the response is slow
            if self.lose_next:
                self.lose_next -= 1
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            return RemoteRecord(rid, {"ref": ref, "at": datetime(2024, 1, 1, tzinfo=UTC)})

        return create

    def find_for(self, ref: str) -> Any:
        async def find() -> RemoteRecord | None:
            self.finds += 1
            found = self.items.get(ref)
            return RemoteRecord(found[0], {"ref": ref}) if found else None

        return find


async def intent_row(db: Database, key: str) -> Any:
    async with db.begin() as conn:
        return (await conn.execute(select(intents).where(intents.c.intent_key == key))).one()


def ids(key: str = "k1") -> dict[str, str]:
    return {"tenant": "acme", "connector": "demo", "key": key}


# --- run_intent ---------------------------------------------------------------------------


async def test_the_intent_is_pending_before_the_call_and_done_before_the_return(
    db: Database,
) -> None:
    """Persisted (pending, fingerprint, leased, attempt 1) before create runs; done after."""
    remote = Remote()
    seen: list[Any] = []
    inner = remote.create_for("a")

    async def create(idem: str) -> RemoteRecord:
        seen.append(await intent_row(db, "k1"))
        return await inner(idem)

    result = await run_intent(db, **ids(), create=create, request={"ref": "a"})
    (during,) = seen
    assert during.status == "pending" and during.attempts == 1
    assert during.fingerprint == fingerprint({"ref": "a"})
    assert during.lease_token is not None and during.lease_expires_at is not None
    row = await intent_row(db, "k1")
    assert (row.status, row.remote_id) == ("done", "r1")
    assert row.result == {"ref": "a", "at": "2024-01-01 00:00:00+00:00"}
    assert (result.outcome, result.remote_id, result.attempts) == ("created", "r1", 1)


async def test_a_done_intent_returns_its_stored_result_without_calling_the_api(
    db: Database,
) -> None:
    """Second run of a done intent: no create, no find; the stored remote id."""
    remote = Remote()
    first = await run_intent(db, **ids(), create=remote.create_for("a"), request={"ref": "a"})
    again = await run_intent(
        db, **ids(), create=remote.create_for("a"), find=remote.find_for("a"), request={"ref": "a"}
    )
    assert (remote.creates, remote.finds) == (1, 0)
    assert again.outcome == "stored" and again.remote_id == first.remote_id
    assert again.result == first.result


async def test_a_lost_response_is_found_on_the_retry_not_created_again(db: Database) -> None:
    """Create committed remotely but its response lost: the retry finds it; one resource."""
    remote = Remote()
    remote.lose_next = 1
    kw: dict[str, Any] = {
        "create": remote.create_for("a"),
        "find": remote.find_for("a"),
        "request": {"ref": "a"},
    }
    with pytest.raises(httpx.RemoteProtocolError):
        await run_intent(db, **ids(), **kw)
    pending = await intent_row(db, "k1")
    assert pending.status == "pending" and pending.attempts == 1
    assert pending.lease_token is None  # released at once: the retry need not wait
    assert "RemoteProtocolError" in pending.result["_last_error"]
    result = await run_intent(db, **ids(), **kw)
    assert (result.outcome, result.remote_id, result.attempts) == ("found", "r1", 2)
    assert remote.creates == 1 and remote.items == {"a": ["r1"]}


async def test_nothing_found_means_create_again_with_the_same_idempotency_key(
    db: Database,
) -> None:
    """A failed attempt that created nothing: find says so, create runs again, same key."""
    remote = Remote()

    async def failing(idem: str) -> RemoteRecord:
        remote.keys.append(idem)
        raise httpx.ConnectError("connection refused")

    with pytest.raises(httpx.ConnectError):
        await run_intent(db, **ids(), create=failing, request={"ref": "a"})
    result = await run_intent(
        db, **ids(), create=remote.create_for("a"), find=remote.find_for("a"), request={"ref": "a"}
    )
    assert (result.outcome, result.attempts, remote.finds) == ("created", 2, 1)
    assert remote.keys == [idempotency_key("acme", "demo", "k1")] * 2


async def test_without_find_a_retry_after_a_lost_response_duplicates(db: Database) -> None:
    """No find: the retry is blind (logged as such) and the API gets a second resource."""
    remote = Remote()
    remote.lose_next = 1
    with pytest.raises(httpx.RemoteProtocolError):
        await run_intent(db, **ids(), create=remote.create_for("a"), request={"ref": "a"})
    with structlog.testing.capture_logs() as logs:
        await run_intent(db, **ids(), create=remote.create_for("a"), request={"ref": "a"})
    assert remote.items == {"a": ["r1", "r2"]}
    assert "intent.blind_retry" in [e["event"] for e in logs]


async def test_the_same_key_with_another_request_is_a_conflict(db: Database) -> None:
    """A reused key with a different fingerprint raises IntentConflict, done or pending."""
    remote = Remote()
    await run_intent(db, **ids(), create=remote.create_for("a"), request={"ref": "a"})
    with pytest.raises(IntentConflict, match="different request"):
        await run_intent(db, **ids(), create=remote.create_for("b"), request={"ref": "b"})
    remote.lose_next = 1
    with pytest.raises(httpx.RemoteProtocolError):
        await run_intent(db, **ids("k2"), create=remote.create_for("c"), request={"ref": "c"})
    with pytest.raises(IntentConflict):
        await run_intent(db, **ids("k2"), create=remote.create_for("d"), request={"ref": "d"})
    assert remote.creates == 2
    assert isinstance(IntentConflict("x"), PermanentError)  # never retried: dead-lettered


async def test_keys_are_per_tenant_and_connector(db: Database) -> None:
    """The same intent key for two tenants is two intents."""
    remote = Remote()
    a = await run_intent(
        db, tenant="acme", connector="demo", key="k", create=remote.create_for("1")
    )
    b = await run_intent(
        db, tenant="globex", connector="demo", key="k", create=remote.create_for("2")
    )
    assert a.created and b.created and a.remote_id != b.remote_id


async def test_concurrent_runs_of_one_intent_create_once(migrated_url: str) -> None:
    """Four runs at once, each with its own engine (as separate processes): one create."""
    remote = Remote()
    remote.delay = 0.3
    engines = [open_database(migrated_url) for _ in range(4)]
    try:
        results = await asyncio.gather(
            *(
                run_intent(
                    d,
                    **ids(),
                    create=remote.create_for("a"),
                    find=remote.find_for("a"),
                    request={"ref": "a"},
                )
                for d in engines
            )
        )
    finally:
        for d in engines:
            await d.dispose()
    assert remote.creates == 1
    assert {r.remote_id for r in results} == {"r1"}
    assert sorted(r.outcome for r in results) == ["created", "stored", "stored", "stored"]


#: Generous: the default lease (35 s) would overshoot it; a busy machine will not.
LEASE_WAIT_BUDGET = 20.0


async def test_a_dead_workers_lease_is_waited_out_then_find_runs(db: Database) -> None:
    """A run killed mid-create leaves its lease; the next run waits for it, then finds."""
    remote = Remote()
    remote.delay = 30  # the "worker" dies during this call
    kw: dict[str, Any] = {"find": remote.find_for("a"), "request": {"ref": "a"}}
    margin = timedelta(seconds=0.2)
    victim = asyncio.create_task(
        run_intent(
            db, **ids(), create=remote.create_for("a"), call_timeout=1, lease_margin=margin, **kw
        )
    )
    await remote.called.wait()
    victim.cancel()  # like kill -9: no cleanup runs
    with pytest.raises(asyncio.CancelledError):
        await victim
    remote.items = {"a": ["r-landed"]}  # the killed call had reached the API
    assert (await intent_row(db, "k1")).lease_token is not None
    loop = asyncio.get_running_loop()
    started = loop.time()
    remote.delay = 0
    result = await run_intent(db, **ids(), create=remote.create_for("a"), **kw)
    waited = loop.time() - started
    # The rest of the 1.2 s lease, not the 35 s default: a lower bound, and an upper one
    # far from both (a busy machine stretches the wait, never to the default's length).
    assert 0.7 < waited < LEASE_WAIT_BUDGET, waited
    assert (result.outcome, result.remote_id, remote.creates) == ("found", "r-landed", 1)


async def test_a_timed_out_call_keeps_its_lease(db: Database) -> None:
    """A call cut off by call_timeout may still land: its lease is kept until it expires."""
    remote = Remote()
    remote.delay = 5
    with pytest.raises(TimeoutError):
        await run_intent(
            db, **ids(), create=remote.create_for("a"), request={"ref": "a"}, call_timeout=0.1
        )
    row = await intent_row(db, "k1")
    assert row.status == "pending" and row.lease_token is not None
    later = datetime.now(UTC) + timedelta(hours=1)  # a run after the lease expired
    remote.delay = 0
    result = await run_intent(
        db,
        **ids(),
        create=remote.create_for("a"),
        find=remote.find_for("a"),
        request={"ref": "a"},
        clock=lambda: later,
    )
    assert result.outcome == "found" and result.attempts == 2


async def test_create_must_return_a_remote_record(db: Database) -> None:
    """A create returning something else is a PermanentError, and the intent stays pending."""

    async def sloppy(idem: str) -> Any:
        return {"id": "1"}

    with pytest.raises(PermanentError, match="RemoteRecord"):
        await run_intent(db, **ids(), create=sloppy)
    assert (await intent_row(db, "k1")).status == "pending"


async def test_the_idempotency_header_is_added_to_the_creates_requests(db: Database) -> None:
    """With idempotency_header, the hook adds it to POSTs inside create; not elsewhere."""
    sent: list[httpx.Request] = []

    def api(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(201, json={"id": "x1"})

    client = httpx.AsyncClient(
        transport=httpx.MockTransport(api), event_hooks={"request": [idempotency_request_hook]}
    )

    async def create(idem: str) -> RemoteRecord:
        assert current_idempotency_headers() == {"X-Idem": idem}
        await client.get("https://api.example/lookup")
        r = await client.post("https://api.example/items", json={})
        return RemoteRecord(r.json()["id"])

    async with client:
        await run_intent(db, **ids(), create=create, idempotency_header="X-Idem")
        await client.post("https://api.example/other", json={})
    key = idempotency_key("acme", "demo", "k1")
    assert [r.headers.get("X-Idem") for r in sent] == [None, key, None]
    assert current_idempotency_headers() == {}


# --- writes as jobs ------------------------------------------------------------------------


class Writer:
    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    async def create(self, operation: str, request: Any, *, idempotency_key: str) -> RemoteRecord:
        create: Any = self.remote.create_for(request["ref"])
        record: RemoteRecord = await create(idempotency_key)
        return record

    async def find(self, operation: str, request: Any) -> RemoteRecord | None:
        find: Any = self.remote.find_for(request["ref"])
        found: RemoteRecord | None = await find()
        return found


async def test_write_jobs_create_once_through_lost_responses_and_retries(db: Database) -> None:
    """synckit.write jobs via the Worker: lost responses retried, each resource made once."""
    remote = Remote()
    remote.lose_next = 3
    writer = Writer(remote)

    async def resolve(tenant: str, connector: str) -> Writer:
        return writer

    reg = Registry()
    reg.add(WRITE_KIND, write_job_handler(db, resolve))
    specs = [
        write_job(tenant="acme", connector="demo", key=f"w{i}", request={"ref": f"w{i}"})
        for i in range(10)
    ]
    specs.append(specs[0])  # the same write enqueued twice: two jobs, one create
    await enqueueing.enqueue_many(db, specs)
    worker = Worker(
        db, reg, concurrency=1, poll_interval=0.02, retry_policy=RetryPolicy.deterministic()
    )
    set_testing(True)
    try:
        await worker.run_until_idle()
    finally:
        set_testing(False)
    assert await admin.count_by_status(db) == {"succeeded": 11}
    assert {ref: len(v) for ref, v in remote.items.items()} == {f"w{i}": 1 for i in range(10)}
    assert remote.creates == 10  # the three lost responses were found, not re-created


async def test_a_malformed_write_payload_is_dead_lettered_not_a_crash(db: Database) -> None:
    """A write job with a broken payload fails permanently into the DLQ; the worker lives."""

    async def resolve(tenant: str, connector: str) -> Writer:
        return Writer(Remote())

    reg = Registry()
    reg.add(WRITE_KIND, write_job_handler(db, resolve))
    await enqueueing.enqueue(db, WRITE_KIND, {"tenant": "acme", "connector": "demo"})  # no key
    await enqueueing.enqueue(db, WRITE_KIND, ["not", "an", "object"])
    await Worker(db, reg, poll_interval=0.02).run_until_idle()
    assert await admin.count_by_status(db) == {"dead": 2}
    async with db.begin() as conn:
        rows = list(await conn.execute(select(dead_letters.c.error_class)))
    assert [r.error_class for r in rows] == ["validation", "validation"]
    with pytest.raises(PermanentError, match="'key'"):
        await run_write(db, Writer(Remote()), {"tenant": "a", "connector": "b", "operation": "c"})
