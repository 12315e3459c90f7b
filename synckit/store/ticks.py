"""Schedule ticks: ``cron_ticks`` (recurring jobs, :mod:`synckit.runtime.cron`) and
``poll_ticks`` (each tenant's poll cycles, :mod:`synckit.runtime.poll`'s scheduler).

The callers hold the transaction and make the decisions (which tick is due next, which
job a tick enqueues); these operations only read and write the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.store.jobs import _insert
from synckit.store.tables import cron_ticks

__all__ = [
    "add_cron_tick",
    "advance_cron_tick",
    "cron_specs",
    "due_cron_ticks",
    "restart_cron_tick",
]


# --- cron_ticks -------------------------------------------------------------------------


async def cron_specs(conn: AsyncConnection, names: Sequence[str]) -> dict[str, str]:
    """The stored spec of each schedule of ``names`` that has its row."""
    return {
        r.name: r.spec
        for r in await conn.execute(
            select(cron_ticks.c.name, cron_ticks.c.spec).where(cron_ticks.c.name.in_(names))
        )
    }


async def add_cron_tick(
    conn: AsyncConnection, name: str, spec: str, next_tick_at: datetime
) -> None:
    """The row of a new schedule (left as it is when another worker made it first)."""
    ins = _insert(conn)(cron_ticks).values(
        name=name, spec=spec, next_tick_at=next_tick_at, enabled=True
    )
    await conn.execute(ins.on_conflict_do_nothing(index_elements=["name"]))


async def restart_cron_tick(
    conn: AsyncConnection, name: str, spec: str, next_tick_at: datetime
) -> None:
    """A changed spec: stored, and the schedule restarts from ``next_tick_at``."""
    await conn.execute(
        update(cron_ticks)
        .where(cron_ticks.c.name == name)
        .values(spec=spec, next_tick_at=next_tick_at)
    )


async def due_cron_ticks(conn: AsyncConnection, names: Sequence[str], now: datetime) -> list[Any]:
    """``(name, next_tick_at)`` of the enabled schedules of ``names`` due at ``now``."""
    return list(
        await conn.execute(
            select(cron_ticks.c.name, cron_ticks.c.next_tick_at).where(
                cron_ticks.c.name.in_(names),
                cron_ticks.c.enabled.is_(True),
                cron_ticks.c.next_tick_at <= now,
            )
        )
    )


async def advance_cron_tick(
    conn: AsyncConnection, name: str, tick: datetime, next_tick_at: datetime
) -> bool:
    """Move the schedule from ``tick`` to ``next_tick_at`` by a compare-and-set on the
    tick: True for the one caller that moved it, False when another already had."""
    won = await conn.execute(
        update(cron_ticks)
        .where(cron_ticks.c.name == name, cron_ticks.c.next_tick_at == tick)
        .values(last_tick_at=tick, next_tick_at=next_tick_at)
        .returning(cron_ticks.c.name)
    )
    return won.first() is not None
