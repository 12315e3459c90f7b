"""Deletes of old rows in transactions of a bounded size: each prune (of jobs, outbox
messages, dead letters) builds its DELETE of at most ``batch`` rows in its table's writer
module, and :func:`delete_in_batches` runs it until fewer than ``batch`` rows go, so a
prune of millions never holds one long transaction."""

from __future__ import annotations

from typing import Any

from synckit.store.db import Database

__all__ = ["delete_in_batches"]


async def delete_in_batches(db: Database, statement: Any, batch: int) -> int:
    """Run ``statement`` (a DELETE of at most ``batch`` rows), each time in a transaction
    of its own, until it deletes fewer than ``batch``; how many rows it deleted."""
    total = 0
    while True:
        async with db.begin() as conn:
            res = await conn.execute(statement)
            n = res.rowcount or 0
        total += n
        if n < batch:
            return total
