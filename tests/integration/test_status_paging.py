"""`synckit status` at scale: counts in SQL, tenants by keyset pages, stored text escaped."""

from __future__ import annotations

import asyncio
import io
import sqlite3

from quiet_app import Quiet  # tests/apps
from rich.console import Console
from waits import EVENT_TIMEOUT  # tests/

from synckit import App
from synckit.cli.status import render_status
from synckit.runtime.admin.bulk import add_tenants
from synckit.runtime.admin.status import read_status
from synckit.runtime.admin.tenants import pause_tenant
from synckit.store.db import Database


async def test_status_pages_tenants_and_sums_them_in_sql(db: Database) -> None:
    """Pages of `limit` tenants by name follow `next_after` to the end; the totals count
    every tenant whatever the page."""
    await add_tenants(
        db, [{"tenant": f"t{i:02d}", "connector": "quiet"} for i in range(7)], app=App([Quiet])
    )
    await pause_tenant(db, "t03")
    seen: list[str] = []
    after = None
    while True:
        page = await read_status(db, limit=3, after=after)
        assert page.tenants_by_status == {"active": 6, "paused": 1}
        assert len(page.tenants) <= 3
        seen += [t.tenant for t in page.tenants]
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == [f"t{i:02d}" for i in range(7)]
    assert (await read_status(db, limit=3)).tenants[0].connector == "quiet"


async def test_stored_text_is_never_rich_markup(db: Database) -> None:
    """A pause reason full of rich markup is printed as it was written."""
    await add_tenants(db, [{"tenant": "acme", "connector": "quiet"}], app=App([Quiet]))
    await pause_tenant(db, "acme", reason="[red]boom[/red] [link=http://x]y[/link]")
    out = io.StringIO()
    render_status(await read_status(db, limit=10), Console(file=out, width=300, color_system=None))
    text = out.getvalue()
    assert "[red]boom[/red]" in text
    assert "Tenants: 1 (1 paused)" in text


async def test_status_reads_while_another_process_holds_the_write_lock(db: Database) -> None:
    """`synckit status` reads a snapshot: on SQLite it takes no write lock, so a writer
    holding one (a worker's long transaction) does not make it wait out busy_timeout."""
    if db.engine.dialect.name != "sqlite":
        return  # PostgreSQL readers never wait for a writer's lock
    await add_tenants(db, [{"tenant": "t1", "connector": "quiet"}], app=App([Quiet]))
    writer = sqlite3.connect(str(db.engine.url.database), isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        status = await asyncio.wait_for(read_status(db, limit=10), timeout=EVENT_TIMEOUT)
        assert [t.tenant for t in status.tenants] == ["t1"]
        assert status.tenants_by_status == {"active": 1}
    finally:
        writer.execute("ROLLBACK")
        writer.close()
