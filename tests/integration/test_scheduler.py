"""The scheduler at scale and its ticks, and bulk tenant adds, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select

from synckit import App, Connector, Page, Stream, SyncContext
from synckit.clock import utcnow
from synckit.connectors.schedule import parse_schedule
from synckit.runtime.admin.bulk import RowError, add_tenants, read_rows
from synckit.runtime.admin.tenants import add_tenant, pause_tenant, remove_tenant, resume_tenant
from synckit.runtime.sync import scheduler
from synckit.runtime.sync.poll import poll_key
from synckit.runtime.sync.scheduler import schedule_polls, schedule_run
from synckit.store.db import Database
from synckit.store.tables import connections, jobs, poll_ticks, resources


class Cfg(BaseModel):
    token: str


class Trivial(Connector[Cfg]):
    name = "trivial"
    base_url = "http://127.0.0.1:9"
    config_model = Cfg
    max_in_flight = 3

    async def poll(self, ctx: SyncContext, checkpoint: Any) -> AsyncIterator[Page]:
        yield Page([], checkpoint)

    async def handle(self, ctx: SyncContext, record: Any) -> None:
        return None


class TwoStreams(Trivial):
    name = "two"
    streams: ClassVar[tuple[Stream, ...]] = (Stream("a"), Stream("b", schedule="every 1h"))


APP = App([Trivial, TwoStreams])
CONNECTORS = {"trivial": Trivial, "two": TwoStreams}


def rows(n: int, prefix: str = "t", connector: str = "trivial") -> list[dict[str, Any]]:
    return [
        {"tenant": f"{prefix}{i:06d}", "connector": connector, "config": {"token": f"k{i}"}}
        for i in range(n)
    ]


async def count(db: Database, table: Any, *where: Any) -> int:
    async with db.begin() as conn:
        return int(
            (await conn.execute(select(func.count()).select_from(table).where(*where))).scalar_one()
        )


async def test_twenty_thousand_new_tenants_are_all_enqueued_by_the_first_run(
    db: Database, engine_name: str
) -> None:
    """20,000 tenants added at once: the first scheduler call enqueues every one of them,
    in bounded transactions of at most SCHEDULE_BATCH due ticks each."""
    if engine_name != "postgresql":
        pytest.skip("the scale test runs on PostgreSQL")
    # About 15 s on a quiet 2-core machine; generous for a busy one (each tick in a
    # transaction of its own would take many times longer).
    SCALE_BUDGET = 120.0
    started = time.monotonic()
    result = await add_tenants(db, rows(20_000), app=APP)
    assert result.added == 20_000 and result.errors == []
    now = utcnow()
    runs: list[scheduler.ScheduleRun] = []
    real = scheduler.schedule_run

    async def spy(*args: Any, **kw: Any) -> scheduler.ScheduleRun:
        run = await real(*args, **kw)
        runs.append(run)
        return run

    scheduler.schedule_run = spy  # type: ignore[assignment]
    try:
        fired = await schedule_polls(db, CONNECTORS, now=now)
    finally:
        scheduler.schedule_run = real  # type: ignore[assignment]
    assert len(fired) == len(set(fired)) == 20_000
    assert await count(db, jobs, jobs.c.kind == "synckit.poll") == 20_000
    batch = scheduler.SCHEDULE_BATCH
    assert all(r.due <= batch and r.changed <= batch for r in runs)
    assert len(runs) >= 20_000 // scheduler.SCHEDULE_BATCH
    # Nothing more is due, and the none-due run reads nothing.
    again = await schedule_run(db, CONNECTORS, now=now)
    assert (again.fired, again.due, again.changed) == ([], 0, 0)
    assert time.monotonic() - started < SCALE_BUDGET


async def test_bounded_runs_take_the_earliest_ticks_and_leave_the_rest(db: Database) -> None:
    """Each run fires at most its batch, earliest tick first; the runs together fire all."""
    await add_tenants(db, rows(7), app=APP)
    now = utcnow()
    first = await schedule_run(db, CONNECTORS, now=now, batch=3)
    assert (len(first.fired), first.full) == (3, True)
    fired = list(first.fired)
    while True:
        run = await schedule_run(db, CONNECTORS, now=now, batch=3)
        assert len(run.fired) <= 3
        fired += run.fired
        if not run.full:
            break
    assert sorted(fired) == [f"poll:t{i:06d}:default" for i in range(7)]
    assert await schedule_polls(db, CONNECTORS, now=now, batch=3) == []


async def test_ticks_go_with_the_tenant_and_follow_pause_resume_and_reschedule(
    db: Database,
) -> None:
    """A tick per (tenant, stream); paused ticks pass unpolled; resuming fires at once;
    a new schedule starts from its next tick; removing the tenant deletes its ticks."""
    await add_tenant(db, "acme", TwoStreams, {"token": "x"})
    now = utcnow()
    assert sorted(await schedule_polls(db, CONNECTORS, now=now)) == [
        "poll:acme:a",
        "poll:acme:b",
    ]
    assert await count(db, poll_ticks) == 2
    await pause_tenant(db, "acme")
    async with db.begin() as conn:
        await conn.execute(jobs.delete())  # cycles finished
    later = now + timedelta(hours=2)
    assert await schedule_polls(db, CONNECTORS, now=later) == []
    async with db.begin() as conn:
        ticks = {r.stream: r.next_tick_at for r in await conn.execute(select(poll_ticks))}
    assert all(t > later for t in ticks.values())  # advanced, not left due
    await resume_tenant(db, "acme")
    assert sorted(await schedule_polls(db, CONNECTORS, now=later)) == [
        "poll:acme:a",
        "poll:acme:b",
    ]
    async with db.begin() as conn:
        await conn.execute(jobs.delete())
        await conn.execute(connections.update().values(schedule="every 1d"))
    # A moment after `later`, before any tick could come round (stream b's hourly tick
    # may be a minute after `later`, on its key's phase).
    soon = later + timedelta(milliseconds=1)
    assert await schedule_polls(db, CONNECTORS, now=soon) == []
    async with db.begin() as conn:
        a = (
            await conn.execute(select(poll_ticks.c.next_tick_at).where(poll_ticks.c.stream == "a"))
        ).scalar_one()
    # Stream a follows the tenant's new daily schedule, on its key's phase of the day
    # (which may fall within the hour: the tick is exact, not merely far off).
    daily = parse_schedule("every 1d").next_after(soon, poll_key("acme", "a"))
    assert a == daily and a != parse_schedule("every 5m").next_after(soon, poll_key("acme", "a"))
    await remove_tenant(db, "acme")
    assert await count(db, poll_ticks) == 0
    await add_tenant(db, "other", Trivial, {"token": "x"})
    async with db.begin() as conn:
        await conn.execute(connections.delete())  # even without remove_tenant
    assert await count(db, poll_ticks) == 0


async def test_streams_added_and_removed_in_code(db: Database) -> None:
    """A stream no longer declared loses its ticks; a new stream gets ticks for every
    tenant scheduled before it existed (once per process)."""
    await add_tenants(db, rows(3, connector="two"), app=APP)
    now = utcnow()
    assert len(await schedule_polls(db, CONNECTORS, now=now)) == 6

    class OnlyA(TwoStreams):
        streams: ClassVar[tuple[Stream, ...]] = (Stream("a"), Stream("c"))

    async with db.begin() as conn:
        await conn.execute(jobs.delete())
    fired = await schedule_polls(db, {"two": OnlyA}, now=now + timedelta(hours=2))
    assert sorted(k.rsplit(":", 1)[1] for k in fired) == ["a", "a", "a", "c", "c", "c"]
    async with db.begin() as conn:
        streams = sorted(r[0] for r in await conn.execute(select(poll_ticks.c.stream)))
    assert streams == ["a", "a", "a", "c", "c", "c"]


async def test_other_applications_tenants_are_left_alone(db: Database) -> None:
    """Tenants of a connector this app does not know are neither ticked nor marked."""
    await add_tenants(db, rows(2, connector="two") + rows(2, prefix="u"), app=APP)
    fired = await schedule_polls(db, {"trivial": Trivial}, now=utcnow())
    assert sorted(fired) == ["poll:u000000:default", "poll:u000001:default"]
    assert await count(db, connections, connections.c.poll_spec.is_(None)) == 2


async def test_add_tenants_writes_resources_with_the_connectors_limits(db: Database) -> None:
    """Bulk-added tenants are as add_tenant makes them: config, schedule, resource limits,
    parent; and they poll."""
    seen: list[tuple[int, int]] = []
    result = await add_tenants(
        db,
        [
            *rows(5),
            {"tenant": "x", "connector": "two", "config": {"token": "t"}, "schedule": "every 1m"},
        ],
        app=APP,
        batch=2,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert result.added == 6 and result.errors == []
    assert seen == [(2, 6), (4, 6), (6, 6)]
    async with db.begin() as conn:
        c = (await conn.execute(select(connections).where(connections.c.tenant == "x"))).one()
        r = (await conn.execute(select(resources).where(resources.c.resource_key == "two:x"))).one()
        parents = await conn.execute(
            select(resources.c.resource_key).where(resources.c.resource_key.like("api:%"))
        )
        assert sorted(p[0] for p in parents) == ["api:trivial", "api:two"]
    assert (c.connector, c.config, c.schedule, c.status) == (
        "two",
        {"token": "t"},
        "every 1m",
        "active",
    )
    assert (r.parent_key, r.max_in_flight) == ("api:two", 3)
    assert len(await schedule_polls(db, CONNECTORS, now=utcnow())) == 7


async def test_add_tenants_names_every_bad_line_and_adds_nothing(db: Database) -> None:
    """Invalid config, unknown connector or field, bad name or schedule, a duplicate and
    an existing tenant are each reported by line; nothing is written unless asked."""
    await add_tenant(db, "old", Trivial, {"token": "x"})
    given = [
        {"tenant": "ok1", "connector": "trivial", "config": {"token": "a"}},
        {"tenant": "bad", "connector": "trivial", "config": {}},
        {"tenant": "nope", "connector": "missing"},
        {"tenant": "b d", "connector": "trivial", "config": {"token": "a"}},
        {"tenant": "s", "connector": "trivial", "config": {"token": "a"}, "schedule": "often"},
        {"tenant": "ok1", "connector": "trivial", "config": {"token": "b"}},
        {"tenant": "old", "connector": "trivial", "config": {"token": "a"}},
        {"tenant": "f", "connector": "trivial", "config": {"token": "a"}, "colour": "red"},
        {"tenant": "ok2", "connector": "trivial", "config": {"token": "c"}},
    ]
    result = await add_tenants(db, given, app=APP)
    assert result.added == 0
    assert [e.line for e in result.errors] == [2, 3, 4, 5, 6, 7, 8]
    text = [str(e) for e in result.errors]
    assert "token" in text[0] and "missing" in text[1] and "tenant name" in text[2]
    assert "often" in text[3] and "also on line 1" in text[4] and "exists already" in text[5]
    assert "colour" in text[6]
    assert await count(db, connections) == 1
    partial = await add_tenants(db, given, app=APP, skip_invalid=True)
    assert partial.added == 2 and len(partial.errors) == 7
    assert await count(db, connections) == 3


async def test_import_files_json_lines_and_csv(db: Database, tmp_path: Path) -> None:
    """read_rows: JSON lines (bad lines named) and CSV with config.FIELD columns."""
    jl = tmp_path / "t.jsonl"
    jl.write_text(
        '{"tenant": "a1", "connector": "trivial", "config": {"token": "x"}}\n'
        "\n"
        "not json\n"
        '["a list"]\n'
        '{"tenant": "a2", "connector": "trivial", "config": {"token": "y"}}\n'
    )
    got = list(read_rows(jl))
    assert [g.line if isinstance(g, RowError) else g[0] for g in got] == [1, 3, 4, 5]
    result = await add_tenants(db, got, app=APP, skip_invalid=True)
    assert result.added == 2 and [e.line for e in result.errors] == [3, 4]
    cs = tmp_path / "t.csv"
    cs.write_text("tenant,connector,config.token,schedule\nc1,trivial,tok,every 1m\nc2,trivial,,\n")
    result = await add_tenants(db, read_rows(cs), app=APP, skip_invalid=True)
    assert result.added == 1 and [e.line for e in result.errors] == [3]
    async with db.begin() as conn:
        c1 = (await conn.execute(select(connections).where(connections.c.tenant == "c1"))).one()
    assert (c1.config, c1.schedule) == ({"token": "tok"}, "every 1m")
