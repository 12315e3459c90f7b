"""Records tables in another database (``Records(database=URL)``): a PostgreSQL runtime
landing in SQLite and an SQLite runtime landing in PostgreSQL. The rows commit there with
the checkpoint that covers them (``record_landings``); a process killed between that
commit and the runtime's own lands no page twice and skips none."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from services import PG_URL, pg_execute, postgres_problem, service_unavailable
from sqlalchemy import text

from synckit.store.checkpoints import list_checkpoints
from synckit.store.db import Database, open_database
from synckit.store.records.schema import NO_LANDING, read_landing

sys.path.insert(0, str(Path(__file__).parents[1] / "apps"))
import records_app
from records_app import OrdersApi, order
from waits import PROCESS_TIMEOUT

APPS = Path(__file__).parents[1] / "apps"


@pytest.fixture
def far_url(engine_name: str, tmp_path: Path) -> Iterator[str]:
    """A database of the other engine than the runtime's, for the records tables."""
    if engine_name == "postgresql":
        yield f"sqlite:///{tmp_path / 'far.db'}"
        return
    if (problem := postgres_problem()) is not None:
        service_unavailable("PostgreSQL", problem)
    schema = f"far_{uuid.uuid4().hex[:16]}"
    pg_execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}search_path={schema}"
    finally:
        pg_execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[OrdersApi]:
    server = OrdersApi(per_page=100)
    monkeypatch.setattr(records_app.Shop, "base_url", server.url)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
async def far(far_url: str) -> AsyncIterator[Database]:
    d = open_database(far_url)
    try:
        yield d
    finally:
        await d.dispose()


@pytest.fixture
async def shop(db: Database, api: OrdersApi, far_url: str) -> records_app.App:
    app = records_app.far_app(far_url)
    app.bind(db)
    done = await app.upgrade_records(db)
    assert [line.split(" (")[0] for line in done] == [
        "created table orders",
        "created table order_lines",
    ]
    await app.add_tenant(db, "acme", "shop")
    return app


async def rows(d: Database, table: str) -> dict[Any, Any]:
    async with d.read() as conn:
        found = await conn.execute(text(f"SELECT * FROM {table} WHERE tenant = 'acme'"))
        out = {}
        for r in found:
            m = dict(r._mapping)
            out[m["id"] if "id" in m else (m["order_id"], m["n"])] = m
        return out


async def has_table(d: Database, table: str) -> bool:
    from sqlalchemy import inspect

    async with d.read() as conn:
        return bool(await conn.run_sync(lambda c: inspect(c).has_table(table)))


async def checkpoint(db: Database) -> Any:
    found = await list_checkpoints(db, "acme")
    return found[0][2] if found else None


async def landing(far: Database) -> Any:
    return await far.run_read(read_landing, "acme", "shop", "orders")


async def test_records_land_in_the_other_database_with_their_checkpoint(
    db: Database, far: Database, api: OrdersApi, shop: records_app.App
) -> None:
    """250 orders (3 pages) land in the other database, none in the runtime's; the
    checkpoint landed there with them equals the runtime's; the app reads the change
    feed there; a re-run changes nothing."""
    api.data["acme"] = [order(i, lines=2) for i in range(250)]
    result = await shop.poll(db, "acme", "orders")
    assert (result.pages, result.ok, result.failed) == (3, 250, 0)
    assert not await has_table(db, "orders")
    assert len(await rows(far, "orders")) == 250 and len(await rows(far, "order_lines")) == 500
    cp = await checkpoint(db)
    assert "done" in cp and await landing(far) == cp
    feed = shop.records("acme", "orders")
    first = await feed.changes(since=0, limit=1000)
    assert len(first.changes) == 250
    await shop.poll(db, "acme", "orders")
    assert (await feed.changes(since=first.cursor)).changes == []


async def test_a_kill_between_the_two_commits_lands_no_page_twice(
    db: Database,
    far: Database,
    api: OrdersApi,
    shop: records_app.App,
    migrated_url: str,
    far_url: str,
) -> None:
    """A cycle killed (SIGKILL) right after page 2's rows and landed checkpoint committed
    in the records' database, before its runtime checkpoint did: the runtime is a page
    behind. The next cycle starts from the landed checkpoint (page 3): page 2 is not read
    or landed again, nothing is missing, every table equals the API's data, and the two
    checkpoints agree."""
    api.data["acme"] = [order(i, lines=1) for i in range(300)]
    del api.data["acme"][150]["customer"]  # on page 2: the model refuses it
    env = {**os.environ, "RECORDS_APP_URL": api.url, "PYTHONPATH": str(APPS)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(APPS / "records_far.py"), migrated_url, far_url, "acme", "2",
        env=env, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), PROCESS_TIMEOUT)
    assert proc.returncode == -9, err.decode()[-2000:]
    landed = await landing(far)
    assert landed is not NO_LANDING and landed["page"] == 3
    assert (await checkpoint(db))["page"] == 2  # the runtime's commit of page 2 was lost
    before = await rows(far, "orders")
    assert set(before) == {f"o{i:06d}" for i in range(200) if i != 150}
    assert await dead(db) == []  # lost with the runtime's commit of page 2
    gets = api.gets
    result = await shop.poll(db, "acme", "orders")
    assert result.pages == 1 and api.gets - gets == 1  # page 3 only
    after = await rows(far, "orders")
    assert set(after) == {f"o{i:06d}" for i in range(300) if i != 150}
    for key, row in before.items():  # landed once: not rewritten
        assert after[key]["_seq"] == row["_seq"], key
    # The page's dead letter, written by the next cycle from what landed with the rows.
    assert [r[0] for r in await dead(db)] == ["o000150"]
    for i, want in enumerate(api.data["acme"]):
        if i == 150:
            continue
        got = after[want["id"]]
        assert (got["customer"], float(got["total"])) == (want["customer"], want["total"]), i
        assert got["_deleted_at"] is None
    assert len(await rows(far, "order_lines")) == 299
    cp = await checkpoint(db)
    assert "done" in cp and await landing(far) == cp
    feed = await shop.records("acme", "orders").changes(since=0, limit=1000)
    assert sorted(c.key[0] for c in feed.changes) == sorted(after)
    assert {c.op for c in feed.changes} == {"added"}
    async with db.read() as conn:
        audit = await conn.execute(
            text("SELECT sum(ok), sum(failed) FROM audit_buckets WHERE tenant = 'acme'")
        )
        assert tuple(audit.one()) == (299, 1)  # page 2's counts too, once


async def dead(db: Database) -> list[Any]:
    async with db.read() as conn:
        found = await conn.execute(text("SELECT record_id, error_message FROM dead_letters"))
        return [tuple(r) for r in found]
