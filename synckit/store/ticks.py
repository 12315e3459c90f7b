"""Schedule ticks: ``cron_ticks`` (recurring jobs, :mod:`synckit.runtime.sync.cron`) and
``poll_ticks`` (each tenant's poll cycles, :mod:`synckit.runtime.sync.poll`'s scheduler).

The callers hold the transaction and make the decisions (which tick is due next, which
job a tick enqueues); these operations only read and write the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, delete, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.store.connections import poll_spec_marks_sql
from synckit.store.db import Database
from synckit.store.jobs.enqueueing import _insert
from synckit.store.row_arrays import RowStatements, list_param
from synckit.store.tables import UNSCHEDULED, cron_ticks, poll_ticks

__all__ = [
    "PollTicks",
    "add_cron_tick",
    "advance_cron_tick",
    "cron_specs",
    "delete_poll_ticks",
    "due_cron_ticks",
    "poll_ticks_of",
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


# --- poll_ticks -------------------------------------------------------------------------


#: The rows each set-based statement reads, as (name, PostgreSQL type): the statement's
#: FROM item and its parameters are both built from them (``source`` and ``rows``).
_TICKS = (("tenant", "text"), ("stream", "text"), ("connector", "text"), ("at", "timestamptz"))
_MARKS = (("tenant", "text"), ("marker", "text"))
_MOVES = (("tenant", "text"), ("stream", "text"), ("old", "timestamptz"), ("nxt", "timestamptz"))
_GONE = (("tenant", "text"), ("stream", "text"))


class PollTicks(RowStatements):
    """The scheduler's statements for one engine (:func:`poll_ticks_of`), and the
    operations that run them in the caller's transaction. Lists travel as arrays (PostgreSQL)
    or one JSON array (SQLite): the text and the parameter count never depend on how
    many rows a run handles, so each statement is prepared once."""

    def __init__(self, postgres: bool) -> None:
        super().__init__(postgres)
        lock = " FOR UPDATE SKIP LOCKED" if postgres else ""
        lock_t = " FOR UPDATE OF t SKIP LOCKED" if postgres else ""
        ours = (
            "= ANY(CAST(:connectors AS text[]))"
            if postgres
            else "IN (SELECT value FROM json_each(:connectors))"
        )
        self.changed_sql = text(
            "SELECT tenant, connector, schedule, status, poll_spec FROM connections"
            f" WHERE connector {ours} AND ({UNSCHEDULED}) LIMIT :limit{lock}"
        )
        self.due_sql = text(
            "SELECT t.tenant, t.stream, t.connector, t.next_tick_at, c.status, c.schedule,"
            " c.resource_key FROM poll_ticks t JOIN connections c ON c.tenant = t.tenant"
            f" WHERE t.next_tick_at <= :now AND t.connector {ours}"
            f" ORDER BY t.next_tick_at LIMIT :limit{lock_t}"
        ).bindparams(bindparam("now", type_=poll_ticks.c.next_tick_at.type))
        ticks = self.source(_TICKS)
        self.upsert_sql = text(
            "INSERT INTO poll_ticks (tenant, stream, connector, next_tick_at)"
            f" SELECT tenant, stream, connector, at FROM {ticks} WHERE true"
            " ON CONFLICT (tenant, stream) DO UPDATE SET next_tick_at = excluded.next_tick_at,"
            " connector = excluded.connector"
        )
        marks = self.source(_MARKS)
        self.mark_sql = poll_spec_marks_sql(marks)
        moves = self.source(_MOVES)
        # The compare-and-set on the old tick keeps a tick fired once even if two
        # schedulers read it (SKIP LOCKED already keeps them apart on PostgreSQL).
        self.advance_sql = text(
            "UPDATE poll_ticks SET last_tick_at = poll_ticks.next_tick_at, next_tick_at = v.nxt"
            f" FROM {moves} WHERE poll_ticks.tenant = v.tenant AND poll_ticks.stream = v.stream"
            " AND poll_ticks.next_tick_at = v.old RETURNING poll_ticks.tenant, poll_ticks.stream"
        )
        gone = self.source(_GONE)
        self.drop_sql = text(
            f"DELETE FROM poll_ticks WHERE (tenant, stream) IN (SELECT tenant, stream FROM {gone})"
        )
        # Tenants without a tick for a stream (a stream added to a connector since they
        # were scheduled): one set-based statement per stream, once per process.
        self.missing_sql = text(
            "INSERT INTO poll_ticks (tenant, stream, connector, next_tick_at)"
            " SELECT c.tenant, CAST(:stream AS varchar), c.connector, :now FROM connections c"
            " WHERE c.connector = :connector AND c.poll_spec IS NOT NULL AND NOT EXISTS"
            " (SELECT 1 FROM poll_ticks t WHERE t.tenant = c.tenant"
            " AND t.stream = CAST(:stream AS varchar))"
            " ON CONFLICT (tenant, stream) DO NOTHING"
        ).bindparams(bindparam("now", type_=poll_ticks.c.next_tick_at.type))

    async def changed(self, conn: AsyncConnection, connectors: Any, limit: int) -> list[Any]:
        """Up to ``limit`` tenants of ``connectors`` (:meth:`names`) whose ticks are not
        up to date (``tenant, connector, schedule, status, poll_spec``; locked, skipping
        those another scheduler holds, on PostgreSQL)."""
        return list(
            await conn.execute(self.changed_sql, {"connectors": connectors, "limit": limit})
        )

    async def due(
        self, conn: AsyncConnection, connectors: Any, now: datetime, limit: int
    ) -> list[Any]:
        """Up to ``limit`` ticks of ``connectors`` due at ``now``, earliest first, with
        their tenant's ``status``, ``schedule`` and ``resource_key``."""
        params = {"connectors": connectors, "now": now, "limit": limit}
        return list(await conn.execute(self.due_sql, params))

    async def upsert(
        self, conn: AsyncConnection, ticks: Sequence[tuple[str, str, str, datetime]]
    ) -> None:
        """Store the ticks ``(tenant, stream, connector, next_tick_at)``."""
        await conn.execute(self.upsert_sql, self.rows(_TICKS, ticks))

    async def mark(self, conn: AsyncConnection, marks: Sequence[tuple[str, str]]) -> None:
        """Record ``(tenant, marker)``: what the scheduler last saw of each tenant."""
        await conn.execute(self.mark_sql, self.rows(_MARKS, marks))

    async def drop(self, conn: AsyncConnection, gone: Sequence[tuple[str, str]]) -> None:
        """Delete the ticks ``(tenant, stream)``."""
        await conn.execute(self.drop_sql, self.rows(_GONE, gone))

    async def advance(
        self, conn: AsyncConnection, moves: Sequence[tuple[str, str, datetime, datetime]]
    ) -> Any:
        """Move each tick ``(tenant, stream, old, next)`` from ``old`` to ``next`` by a
        compare-and-set; the ``(tenant, stream)`` of those moved."""
        return await conn.execute(self.advance_sql, self.rows(_MOVES, moves))

    async def create_missing(
        self, conn: AsyncConnection, connector: str, stream: str, now: datetime
    ) -> None:
        """A tick due at ``now`` for every scheduled tenant of ``connector`` without one
        for ``stream``."""
        await conn.execute(self.missing_sql, {"connector": connector, "stream": stream, "now": now})

    def names(self, connectors: Sequence[str]) -> Any:
        return list_param(self.postgres, connectors)


_POLL_TICKS = {True: PollTicks(True), False: PollTicks(False)}


def poll_ticks_of(db: Database) -> PollTicks:
    """The scheduler's statements for ``db``'s engine (built once per engine)."""
    return _POLL_TICKS[db.is_postgres]


async def delete_poll_ticks(conn: AsyncConnection, tenant: str) -> None:
    """Forget the schedule ticks of ``tenant`` (its row's removal also deletes them)."""
    await conn.execute(delete(poll_ticks).where(poll_ticks.c.tenant == tenant))
