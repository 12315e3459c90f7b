"""``checkpoints.save_checkpoints_held``: a group's page checkpoints in one statement
(PostgreSQL), each written only while its job holds its claim, stored exactly as
``save_checkpoint_held`` stores one (both engines)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Text, cast, select, text

from synckit.store.checkpoints import (
    HeldCheckpoint,
    save_checkpoint_held,
    save_checkpoints_held,
)
from synckit.store.db import Database
from synckit.store.jobs import claiming, enqueueing
from synckit.store.jobs._base import ClaimedJob
from synckit.store.tables import checkpoints

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
CURSORS: list[Any] = [
    None,
    {"next": 2, "since": "2026-11-01T00:00:00Z"},
    ["a", 1, None, {"deep": [True, 1.5]}],
    "plain",
    17,
    {"nul": "a\x00b"},  # stored in its NUL-safe form
    {"$synckit_json": "looks stored"},  # wrapped too, so it reads back as itself
]


async def _claimed(db: Database, n: int) -> list[ClaimedJob]:
    for i in range(n):
        await enqueueing.enqueue(db, "k", {"i": i}, now=NOW)
    return await claiming.claim(db, "w", n, now=NOW)


async def _stored(db: Database, connector: str) -> dict[tuple[str, str], Any]:
    """The stored cursors, and their stored text (SQL NULL and JSON null differ there) and
    time's."""
    async with db.begin() as conn:
        rows = await conn.execute(
            select(
                checkpoints.c.tenant,
                checkpoints.c.stream,
                checkpoints.c.cursor,
                cast(checkpoints.c.cursor, Text).label("raw"),
                cast(checkpoints.c.updated_at, Text).label("at"),
            ).where(checkpoints.c.connector == connector)
        )
        return {(r.tenant, r.stream): (r.cursor, r.raw, r.at) for r in rows}


async def test_a_group_of_checkpoints_is_stored_as_one_by_one(db: Database) -> None:
    jobs = await _claimed(db, 2 * len(CURSORS) + 2)
    one, many, lost = jobs[: len(CURSORS)], jobs[len(CURSORS) : -2], jobs[-2:]
    gone, done = lost
    # One job's claim moved on (another token), another's job finished: nothing of theirs.
    pages = [
        HeldCheckpoint(f"t{i}", "many", "s", c, NOW, job_id=j.id, token=j.claim_token)
        for i, (c, j) in enumerate(zip(CURSORS, many, strict=True))
    ] + [  # one's claim moved on, the other's job finished
        HeldCheckpoint("gone", "many", "s", 1, NOW, job_id=gone.id, token=gone.claim_token + 9),
        HeldCheckpoint("done", "many", "s", 1, NOW, job_id=done.id, token=done.claim_token),
    ]  # fmt: skip
    async with db.begin() as conn:
        await conn.execute(
            text("UPDATE jobs SET status = 'succeeded' WHERE id = :id"), {"id": done.id}
        )

    def write_one_by_one(conn: Any) -> list[bool]:
        return [
            save_checkpoint_held(
                conn, f"t{i}", "one", "s", c, NOW, job_id=j.id, token=j.claim_token
            )
            for i, (c, j) in enumerate(zip(CURSORS, one, strict=True))
        ]

    assert await db.write(write_one_by_one) == [True] * len(CURSORS)
    written = await db.write(save_checkpoints_held, pages)
    assert written == [True] * len(CURSORS) + [False, False]
    assert await _stored(db, "many") == await _stored(db, "one")
    assert len(await _stored(db, "many")) == len(CURSORS)


async def test_a_group_of_checkpoints_updates_the_stored_ones(db: Database) -> None:
    jobs = await _claimed(db, 3)
    first = [
        HeldCheckpoint(f"t{i}", "c", "s", {"v": 1}, NOW, job_id=j.id, token=j.claim_token)
        for i, j in enumerate(jobs)
    ]
    assert await db.write(save_checkpoints_held, first) == [True] * 3
    later = [
        HeldCheckpoint(p.tenant, "c", "s", {"v": 2}, NOW, job_id=p.job_id, token=p.token)
        for p in first
    ]
    assert await db.write(save_checkpoints_held, later) == [True] * 3
    assert {k: v[0] for k, v in (await _stored(db, "c")).items()} == {
        (f"t{i}", "s"): {"v": 2} for i in range(3)
    }
