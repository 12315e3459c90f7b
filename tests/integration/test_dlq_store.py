"""DLQ persistence on both engines: capture, leases, streaming filters, counts, purge."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text, update

from synckit.errors.exceptions import DlqError
from synckit.store.db import Database
from synckit.store.dead_letters import capture as dlq_capture
from synckit.store.dead_letters import reads as dlq_reads
from synckit.store.dead_letters import replay as dlq_replay
from synckit.store.dead_letters import rows as dlq_rows
from synckit.store.dead_letters.rows import DlqFilter
from synckit.store.leases import Lease
from synckit.store.tables import dead_letters

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
FIVE = timedelta(minutes=5)


async def cap(db: Database, record_id: str = "r1", **kw: Any) -> dlq_capture.Captured:
    args: dict[str, Any] = {
        "tenant": "acme",
        "connector": "mail",
        "kind": "record:messages",
        "record_id": record_id,
        "payload": {"id": record_id},
        "error_class": "transient",
        "message": "boom",
        "now": NOW,
        **kw,
    }
    async with db.begin() as conn:
        return await dlq_capture.capture(conn, **args)


async def test_capture_writes_one_pending_row_due_in_a_minute(db: Database) -> None:
    """A first capture is pending, counted once, with one history entry and a 1 min delay."""
    c = await cap(db, trace_id="t-1", resource_key="acme-mail", traceback="Traceback...")
    assert c.created and c.status == "pending"
    row = await dlq_reads.get(db, c.id)
    assert (row.tenant, row.kind, row.record_id, row.payload) == (
        "acme",
        "record:messages",
        "r1",
        {"id": "r1"},
    )
    assert row.attempt_count == 1 and row.replay_attempts == 0
    assert row.next_retry_at == NOW + timedelta(minutes=1)
    assert row.traceback == "Traceback..." and row.trace_id == "t-1"
    assert [h["source"] for h in row.history] == ["capture"]


async def test_a_repeat_capture_updates_the_same_row(db: Database) -> None:
    """Same key again: one row, attempt_count + 1, latest error and payload, history grows."""
    first = await cap(db)
    later = NOW + timedelta(hours=1)
    again = await cap(
        db, payload={"id": "r1", "v": 2}, message="second", error_class="server_error", now=later
    )
    assert again.id == first.id and not again.created
    async with db.begin() as conn:
        n = (await conn.execute(select(dead_letters.c.id))).all()
    assert len(n) == 1
    row = await dlq_reads.get(db, first.id)
    assert row.attempt_count == 2
    assert row.error_message == "second" and row.error_class == "server_error"
    assert row.payload == {"id": "r1", "v": 2}
    assert [h["message"] for h in row.history] == ["boom", "second"]
    assert row.first_failed_at == NOW and row.last_attempt_at == later


async def test_history_keeps_only_the_latest_entries(db: Database) -> None:
    """After 30 failures of one record the history holds the last HISTORY_LIMIT."""
    for i in range(30):
        await cap(db, message=f"m{i}", now=NOW + timedelta(seconds=i))
    async with db.begin() as conn:
        rid = (await conn.execute(select(dead_letters.c.id))).scalar_one()
    row = await dlq_reads.get(db, rid)
    assert row.attempt_count == 30
    assert len(row.history) == dlq_rows.HISTORY_LIMIT
    assert row.history[-1]["message"] == "m29" and row.history[0]["message"] == "m10"


async def test_capture_rolls_back_with_the_surrounding_transaction(db: Database) -> None:
    """Captured inside a transaction that fails: nothing is left behind."""

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with db.begin() as conn:
            await dlq_capture.capture(
                conn,
                tenant="acme",
                connector="mail",
                kind="record:messages",
                record_id="r1",
                payload={},
                error_class="transient",
                message="x",
                now=NOW,
            )
            raise Boom
    assert await dlq_reads.count(db) == 0


@pytest.mark.parametrize("error_class", ["validation", "authorization"])
async def test_validation_and_authorization_go_straight_to_review(
    db: Database, error_class: str
) -> None:
    """No replay can fix these: review at once, not pending."""
    c = await cap(db, error_class=error_class)
    assert c.status == "review"
    row = await dlq_reads.get(db, c.id)
    assert row.status == "review" and row.next_retry_at is None


async def test_a_repeat_reopens_resolved_rows_but_not_ignored_ones(db: Database) -> None:
    """A new failure reopens a resolved row with a fresh budget; an operator's ignore sticks."""
    a = await cap(db, "a")
    b = await cap(db, "b")
    async with db.begin() as conn:
        await dlq_replay.mark_resolved(conn, [a.id], now=NOW)
        await dlq_replay.mark_ignored(conn, [b.id], "known garbage", now=NOW)
        await conn.execute(
            update(dead_letters).where(dead_letters.c.id == a.id).values(replay_attempts=4)
        )
    assert (await cap(db, "a")).status == "pending"
    assert (await cap(db, "b")).status == "ignored"
    ra, rb = await dlq_reads.get(db, a.id), await dlq_reads.get(db, b.id)
    assert ra.replay_attempts == 0 and ra.resolved_at is None
    assert rb.status_reason == "known garbage" and rb.attempt_count == 2


async def test_an_unserialisable_payload_is_kept_as_text_not_an_error(db: Database) -> None:
    """A record JSON cannot hold does not break the capture (one bad record never stops a page)."""
    c = await cap(db, payload={"when": datetime(2020, 1, 1), "n": float("nan")})
    row = await dlq_reads.get(db, c.id)
    assert "_unserialisable" in row.payload and "datetime" in row.payload["_unserialisable"]


async def test_claims_lease_due_rows_once_and_skip_leased_ones(db: Database) -> None:
    """claim_due takes due rows soonest first; a second claim finds none of them due."""
    for i in range(5):
        await cap(db, f"r{i}", retry_at=NOW + timedelta(seconds=i))
    await cap(db, "future", retry_at=NOW + timedelta(hours=1))
    later = NOW + timedelta(minutes=1)
    async with db.begin() as conn:
        got = await dlq_replay.claim_due(conn, now=later, limit=3, lease=Lease("a", later + FIVE))
    assert [r.record_id for r in got] == ["r0", "r1", "r2"]
    assert all(r.lease_token == "a" and r.leased for r in got)
    assert all(r.lease_expires_at == later + FIVE for r in got)
    async with db.begin() as conn:
        rest = await dlq_replay.claim_due(conn, now=later, limit=10, lease=Lease("b", later + FIVE))
        # A manual claim does not take rows another processor holds.
        manual = await dlq_replay.claim_ids(
            conn, [r.id for r in got], now=later, lease=Lease("c", later + FIVE)
        )
    assert [r.record_id for r in rest] == ["r3", "r4"]
    assert manual == []


async def test_outcomes_are_fenced_by_the_lease_token(db: Database) -> None:
    """A row re-captured during its replay keeps the newer failure; the stale outcome is dropped."""
    c = await cap(db)
    later = NOW + timedelta(minutes=2)
    async with db.begin() as conn:
        [_row] = await dlq_replay.claim_due(
            conn, now=later, limit=1, lease=Lease("x", later + FIVE)
        )
    await cap(db, message="failed again meanwhile", now=later)
    async with db.begin() as conn:
        assert await dlq_replay.mark_resolved(conn, [c.id], now=later, token="x") == []
    fresh = await dlq_reads.get(db, c.id)
    assert fresh.status == "pending" and fresh.error_message == "failed again meanwhile"


async def test_due_rows_respects_the_attempt_limit(db: Database) -> None:
    """due_rows with max_attempts leaves out rows that have spent their replays."""
    a = await cap(db, "a")
    await cap(db, "b")
    async with db.begin() as conn:
        await conn.execute(
            update(dead_letters).where(dead_letters.c.id == a.id).values(replay_attempts=10)
        )
    later = NOW + timedelta(minutes=5)
    async with db.begin() as conn:
        assert len(await dlq_replay.due_rows(conn, later, 10)) == 2
        assert [
            r.record_id for r in await dlq_replay.due_rows(conn, later, 10, max_attempts=10)
        ] == ["b"]


async def seed_mix(db: Database) -> None:
    rows = []
    for i in range(60):
        rows.append(
            {
                "tenant": f"t{i % 3}",
                "connector": "mail" if i % 2 else "crm",
                "kind": "record:messages" if i % 4 else "sync_job",
                "record_id": f"r{i}",
                "payload": {"i": i},
                "error_class": ["transient", "validation", "server_error"][i % 3],
                "error_message": "x",
                "status": ["pending", "review", "resolved", "ignored"][i % 4],
                "first_failed_at": NOW,
                "last_attempt_at": NOW - timedelta(days=i),
                "next_retry_at": NOW,
                "resolved_at": NOW - timedelta(days=i) if i % 4 in (2, 3) else None,
            }
        )
    async with db.begin() as conn:
        await conn.execute(dead_letters.insert(), rows)


async def test_filters_stream_matching_rows_in_pages(db: Database) -> None:
    """iter_rows walks every match by id pages; filters combine; kind accepts a prefix."""
    await seed_mix(db)
    every = [r.id async for r in dlq_reads.iter_rows(db, batch=7)]
    assert len(every) == 60 and every == sorted(every)
    newest = [r.id async for r in dlq_reads.iter_rows(db, batch=7, newest_first=True, limit=10)]
    assert newest == sorted(every, reverse=True)[:10]
    flt = DlqFilter(tenants=("t0",), statuses=("pending",))
    got = [r async for r in dlq_reads.iter_rows(db, flt, batch=3)]
    assert got and all(r.tenant == "t0" and r.status == "pending" for r in got)
    assert len(got) == await dlq_reads.count(db, flt)
    records = [r async for r in dlq_reads.iter_rows(db, DlqFilter(kinds=("record:*",)))]
    assert len(records) == 45
    since = [r async for r in dlq_reads.iter_rows(db, DlqFilter(since=NOW - timedelta(days=9)))]
    assert len(since) == 10
    pages = [
        p async for p in dlq_reads.iter_ids(db, DlqFilter(error_classes=("validation",)), batch=6)
    ]
    assert [len(p) for p in pages] == [6, 6, 6, 2]


async def test_a_filter_narrowed_to_no_status_matches_nothing(db: Database) -> None:
    """`dlq replay --status resolved` narrows resolved to the replayable statuses: no
    status is left, and the filter matches no row, on both engines (its sentinel was a
    NUL, which PostgreSQL's text cannot hold: a driver error)."""
    await seed_mix(db)
    resolved = DlqFilter(statuses=("resolved",))
    assert await dlq_reads.count(db, resolved) > 0
    narrowed = resolved.narrowed(("pending", "review"))
    assert [r async for r in dlq_reads.iter_rows(db, narrowed)] == []
    assert await dlq_reads.count(db, narrowed) == 0


async def test_iter_rows_starts_after_the_given_id_in_its_order(db: Database) -> None:
    """after_id: newest first, the rows older than it; ascending, the newer ones; with a
    filter and a limit, pages that chain without a gap or a repeat."""
    await seed_mix(db)
    every = [r.id async for r in dlq_reads.iter_rows(db)]
    pivot = every[30]
    older = [r.id async for r in dlq_reads.iter_rows(db, newest_first=True, after_id=pivot)]
    assert older == sorted(every[:30], reverse=True)
    newer = [r.id async for r in dlq_reads.iter_rows(db, after_id=pivot, batch=7)]
    assert newer == every[31:]
    flt = DlqFilter(tenants=("t1",))
    pages: list[list[int]] = []
    last: int | None = None
    while True:
        page = [
            r.id
            async for r in dlq_reads.iter_rows(db, flt, newest_first=True, limit=6, after_id=last)
        ]
        if not page:
            break
        pages.append(page)
        last = page[-1]
    walked = [i for p in pages for i in p]
    assert [len(p) for p in pages] == [6, 6, 6, 2]
    assert walked == [r.id async for r in dlq_reads.iter_rows(db, flt, newest_first=True)]


async def test_group_counts(db: Database) -> None:
    """Counts per (tenant, class), largest first; unknown columns are refused."""
    await seed_mix(db)
    groups = await dlq_reads.group_counts(db, ["tenant", "class"])
    assert sum(g.count for g in groups) == 60
    assert {g.key for g in groups} == {
        ("t0", "transient"),
        ("t1", "validation"),
        ("t2", "server_error"),
    }
    by_status = await dlq_reads.group_counts(db, ["status"], DlqFilter(tenants=("t1",)))
    assert sum(g.count for g in by_status) == 20
    with pytest.raises(DlqError):
        await dlq_reads.group_counts(db, ["payload"])


async def test_purge_deletes_only_old_resolved_and_ignored_rows(db: Database) -> None:
    """purge --older-than 30d: resolved/ignored closed before then go; pending/review stay."""
    await seed_mix(db)
    n = await dlq_replay.purge(db, older_than=timedelta(days=30), now=NOW, batch=4)
    left = [r async for r in dlq_reads.iter_rows(db)]
    assert n == 60 - len(left)
    assert n == sum(1 for i in range(60) if i % 4 in (2, 3) and i > 30)
    assert all(
        r.status in ("pending", "review") or (r.resolved_at or NOW) >= NOW - timedelta(days=30)
        for r in left
    )


async def test_resolve_and_ignore_by_filter(db: Database) -> None:
    """Bulk resolve/ignore change only open rows matching the filter."""
    await seed_mix(db)
    n = await dlq_replay.ignore_matching(
        db, DlqFilter(tenants=("t0",)), reason="noise", now=NOW, batch=4
    )
    assert n == sum(1 for i in range(60) if i % 3 == 0 and i % 4 in (0, 1))
    m = await dlq_replay.resolve_matching(
        db, DlqFilter(statuses=("review",)), reason="fixed", now=NOW
    )
    assert m == sum(1 for i in range(60) if i % 4 == 1 and i % 3 != 0)
    assert await dlq_reads.count(db, DlqFilter(statuses=("review",))) == 0


async def test_corrupt_json_is_reported_not_raised(db: Database) -> None:
    """A payload whose stored text is not JSON reads back with payload_error (SQLite only can
    hold one); the query that read it does not fail."""
    if db.is_postgres:
        pytest.skip("JSONB cannot hold text that is not JSON")
    c = await cap(db)
    async with db.begin() as conn:
        await conn.execute(
            text("UPDATE dead_letters SET payload = '{not json', history = 'nope' WHERE id = :i"),
            {"i": c.id},
        )
    row = await dlq_reads.get(db, c.id)
    assert row.payload is None and row.payload_error and row.payload_raw == "{not json"
    assert row.history == [] and row.unreadable["history"].startswith("JSONDecodeError")
    assert row.unreadable["payload"] == row.payload_error
    assert [r.id async for r in dlq_reads.iter_rows(db)] == [c.id]


#: A timestamp no reader takes: SQLite keeps any text, PostgreSQL a year no datetime holds.
BAD_TIME = {"sqlite": "'garbage'", "postgresql": "'20000-01-01'::timestamptz"}
#: JSON no reader takes: SQLite keeps any text; JSONB holds only JSON, but a number of
#: 5,000 digits is past what Python's json reads.
BAD_JSON = {"sqlite": "'{not json'", "postgresql": "('1' || repeat('0', 5000))::jsonb"}


async def test_unreadable_times_and_json_are_named_on_every_read(db: Database) -> None:
    """A timestamp no datetime holds (each of the four) and a payload or history JSON that
    does not read: get, iter_rows, due_rows and claim_due give the row with the value None
    and its reason, the other rows as they are; the replay claim takes a due one."""
    engine = "postgresql" if db.is_postgres else "sqlite"
    ids = {name: (await cap(db, name)).id for name in ("first", "last", "resolved", "json", "ok")}
    corrupt = {
        "first": "first_failed_at = {time}",
        "last": "last_attempt_at = {time}",
        "resolved": "resolved_at = {time}, next_retry_at = {time}",
        "json": "payload = {json}, history = {json}",
    }
    async with db.begin() as conn:
        for name, sets in corrupt.items():
            sql = sets.format(time=BAD_TIME[engine], json=BAD_JSON[engine])
            await conn.execute(text(f"UPDATE dead_letters SET {sql} WHERE id = {ids[name]}"))
    out_of_range = "a timestamp out of range"
    expected = {
        "first": {"first_failed_at": out_of_range},
        "last": {"last_attempt_at": out_of_range},
        "resolved": {"resolved_at": out_of_range, "next_retry_at": out_of_range},
        "ok": {},
    }
    listed = {r.record_id: r async for r in dlq_reads.iter_rows(db, batch=2)}
    for name, bad in expected.items():
        for row in (await dlq_reads.get(db, ids[name]), listed[name]):
            assert row.unreadable == bad, (name, row.unreadable)
            assert all(getattr(row, column) is None for column in bad)
            assert row.payload == {"id": name} and len(row.history) == 1
    assert listed["ok"].first_failed_at == NOW and listed["ok"].next_retry_at is not None
    junk = await dlq_reads.get(db, ids["json"])
    assert junk.payload is None and junk.history == []
    assert junk.payload_error is not None and set(junk.unreadable) == {"payload", "history"}
    if db.is_postgres:
        assert "4300 digits" in junk.payload_error and "4300" in junk.unreadable["history"]
    later = NOW + timedelta(minutes=5)
    async with db.begin() as conn:
        due = {r.record_id for r in await dlq_replay.due_rows(conn, later, 10)}
        claimed = await dlq_replay.claim_due(
            conn, now=later, limit=10, lease=Lease("m", later + FIVE)
        )
    # "resolved" has a next_retry_at no one can read: never due, never claimed.
    assert due == {r.record_id for r in claimed} == {"first", "last", "json", "ok"}
    first = next(r for r in claimed if r.record_id == "first")
    assert set(first.unreadable) == {"first_failed_at"} and first.lease_token == "m"
    assert all(r.next_retry_at == later + timedelta(minutes=5) for r in claimed)
    assert next(r for r in claimed if r.record_id == "ok").unreadable == {}
