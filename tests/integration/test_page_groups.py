"""A group's page commits (``page_commit._commit_pages``, ``write_grouped``'s ``many``) write
what each page's own commit (``page_commit._commit_page``) writes: checkpoints, dead letters,
resolutions and audit counts, on both engines; a page whose job lost its claim writes
nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from synckit.runtime.sync.page_commit import (
    _KEEP,
    RecordFailure,
    _commit_page,
    _commit_pages,
    _PageCommit,
)
from synckit.store.db import Database
from synckit.store.jobs import claiming, enqueueing
from synckit.store.jobs._base import ClaimedJob

NOW = datetime(2026, 11, 27, 12, 0, 30, tzinfo=UTC)


def _fail(rid: str, error_class: str) -> RecordFailure:
    return RecordFailure(rid, {"id": rid}, error_class, f"{rid} failed", None)


def _pages(connector: str, jobs: list[ClaimedJob]) -> list[_PageCommit]:
    """Six pages over two tenants and two minutes: plain successes, failures, a kept
    checkpoint, resolutions, and one whose job lost its claim (token moved on)."""
    specs: list[dict[str, Any]] = [
        {"tenant": "t1", "stream": "a", "cursor": {"n": 1}, "ok": 100},
        {"tenant": "t1", "stream": "b", "cursor": None, "ok": 3,
         "failures": [_fail("r1", "validation"), _fail("r2", "server_error")]},
        {"tenant": "t2", "stream": "a", "cursor": _KEEP, "ok": 7},
        {"tenant": "t2", "stream": "b", "cursor": "c", "ok": 2, "succeeded": ["r9"],
         "resolve": True, "now": NOW + timedelta(minutes=1)},
        {"tenant": "t3", "stream": "a", "cursor": [1, 2], "ok": 0},
        {"tenant": "t3", "stream": "b", "cursor": {"n": 9}, "ok": 50, "lost": True},
    ]  # fmt: skip
    out = []
    for spec, job in zip(specs, jobs, strict=True):
        if spec.get("lost"):
            job = ClaimedJob(**{**vars(job), "claim_token": job.claim_token + 1})
        out.append(
            _PageCommit(
                tenant=spec["tenant"],
                connector=connector,
                stream=spec["stream"],
                kind="synckit.poll",
                job=job,
                cursor=spec["cursor"],
                failures=spec.get("failures", []),
                succeeded=spec.get("succeeded", []),
                resolve=spec.get("resolve", False),
                ok=spec["ok"],
                trace_id="trace",
                resource_key=f"{connector}:{spec['tenant']}",
                now=spec.get("now", NOW),
            )
        )
    return out


async def _written(db: Database, connector: str) -> dict[str, Any]:
    async with db.begin() as conn:
        params = {"c": connector}
        checkpoints = (
            await conn.execute(
                text(
                    "SELECT tenant, stream, CAST(cursor AS TEXT) FROM checkpoints"
                    " WHERE connector = :c ORDER BY 1, 2"
                ),
                params,
            )
        ).all()
        audit = (
            await conn.execute(
                text(
                    "SELECT tenant, minute, ok, failed, CAST(failed_by_class AS TEXT)"
                    " FROM audit_buckets WHERE connector = :c ORDER BY 1, 2"
                ),
                params,
            )
        ).all()
        letters = (
            await conn.execute(
                text(
                    "SELECT tenant, record_id, error_class, status FROM dead_letters"
                    " WHERE connector = :c ORDER BY 1, 2"
                ),
                params,
            )
        ).all()
    return {"checkpoints": checkpoints, "audit": audit, "letters": letters}


async def test_a_group_of_page_commits_writes_what_each_would(db: Database) -> None:
    for i in range(12):
        await enqueueing.enqueue(db, "synckit.poll", {"i": i}, now=NOW)
    claimed = await claiming.claim(db, "w", 12, now=NOW)
    one_by_one, grouped = claimed[:6], claimed[6:]

    def each(conn: Any) -> list[bool]:
        return [_commit_page(conn, p) for p in _pages("one", one_by_one)]

    alone = await db.write(each)
    together = await db.write(_commit_pages, _pages("many", grouped))
    assert alone == together == [True, True, True, True, True, False]
    assert await _written(db, "many") == await _written(db, "one")
    written = await _written(db, "many")
    assert len(written["checkpoints"]) == 4  # the kept one and the lost one wrote none
    assert [(r[0], r[2], r[3]) for r in written["audit"]] == [
        ("t1", 103, 2),
        ("t2", 7, 0),
        ("t2", 2, 0),
    ]
    assert [r[1] for r in written["letters"]] == ["r1", "r2"]
