"""`tenants ls` at scale: keyset pages by name, counts by status in SQL, filters."""

from __future__ import annotations

from typing import Any

from quiet_app import Quiet  # tests/apps

from synckit import App
from synckit.runtime.admin.bulk import add_tenants
from synckit.runtime.admin.tenant_pages import page_tenants
from synckit.runtime.admin.tenants import pause_tenant
from synckit.store.db import Database


class Other(Quiet):
    name = "other"


async def test_pages_follow_next_after_to_the_end_with_counts_of_all(db: Database) -> None:
    """Pages of 3 over 7 tenants by name end with next_after None (also when the last
    page is exactly full); counts cover every tenant matching the filters."""
    rows: list[dict[str, Any]] = [
        {"tenant": f"t{i:02d}", "connector": "quiet", "config": {"token": f"k{i}"}}
        for i in range(6)
    ]
    rows.append({"tenant": "t06", "connector": "other"})
    await add_tenants(db, rows, app=App([Quiet, Other]))
    await pause_tenant(db, "t03")
    seen: list[str] = []
    after = None
    while True:
        page = await page_tenants(db, limit=3, after=after)
        assert page.by_status == {"active": 6, "paused": 1} and page.total == 7
        seen += [t.tenant for t in page.tenants]
        if page.next_after is None:
            break
        assert page.next_after == page.tenants[-1].tenant
        after = page.next_after
    assert seen == [f"t{i:02d}" for i in range(7)]
    quiet = await page_tenants(db, limit=3, connector="quiet", after="t02")
    assert [t.tenant for t in quiet.tenants] == ["t03", "t04", "t05"]
    assert quiet.next_after is None and quiet.by_status == {"active": 5, "paused": 1}
    paused = await page_tenants(db, limit=10, status="paused")
    assert [t.tenant for t in paused.tenants] == ["t03"] and paused.total == 1
    assert paused.tenants[0].config == {"token": "k3"}
    empty = await page_tenants(db, limit=5, after="zzz")
    assert empty.tenants == [] and empty.next_after is None and empty.total == 7
