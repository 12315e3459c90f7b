"""Keyset pages and bounded counts: how the operator's views read tables of any size.

A page is newest (or first by name) first and reads one row more than asked, so the
caller knows whether a next page exists without counting; its cursor is a key (an id, a
name), never an offset, so page 1,000 costs what page 1 costs. A filter no index serves
in id order reads at most :data:`SCAN_WINDOW` rows below its cursor and says which ids
it searched (:attr:`Page.searched`).

**Counts are bounded.** A page refreshed every two seconds cannot count a million rows
each time. :class:`Count` is read through an index and no further than ``cap`` rows:
exact below it, "at least" at it (``10,000+``); on PostgreSQL a capped count carries the
planner's estimate (``pg_class.reltuples`` times the value's frequency in ``pg_stats``),
shown as an estimate.

Used by the page reads of :mod:`synckit.store.jobs`, :mod:`synckit.store.dead_letters`
and :mod:`synckit.store.console`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Table, func, literal, literal_column, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = [
    "COUNT_CAP",
    "MAX_PAGE",
    "SCAN_WINDOW",
    "Count",
    "Page",
    "bounded",
    "estimates",
    "off_index",
    "page_size",
    "paged",
    "scan_window",
]

MAX_PAGE = 200
#: Counts on the overview read no further than this many rows.
COUNT_CAP = 10_000
#: A page whose filter no index serves in id order reads at most this many rows below
#: its cursor, and says which ids it searched (``Page.searched``).
SCAN_WINDOW = 20_000


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """Rows of one page; ``next_cursor`` continues after the last (None: no more).

    ``searched`` is set when the page stopped at its scan window rather than at a full
    page: ``(lowest, highest)`` ids read, the next page going on below ``lowest``.
    """

    rows: list[T]
    next_cursor: str | None
    searched: tuple[int, int] | None = None


def page_size(limit: int) -> int:
    return max(1, min(limit, MAX_PAGE))


# --- bounded counts ---------------------------------------------------------------------


@dataclass(frozen=True)
class Count:
    """A count read no further than a cap: exactly ``n`` unless ``more`` (then at least
    ``n``). ``estimate`` is PostgreSQL's statistics' figure for a capped count."""

    n: int
    more: bool = False
    estimate: int | None = None

    def __add__(self, other: Count) -> Count:
        estimate = None
        if self.more or other.more:
            estimate = (self.estimate if self.more else self.n) or 0
            estimate += (other.estimate if other.more else other.n) or 0
            estimate = estimate if (self.estimate or other.estimate) else None
        return Count(self.n + other.n, self.more or other.more, estimate)

    @property
    def text(self) -> str:
        """``1,234``; ``10,000+``; ``10,000+ (~1,200,000 estimated)``."""
        if not self.more:
            return f"{self.n:,}"
        shown = f"{self.n:,}+"
        if self.estimate is not None and self.estimate > self.n:
            shown += f" (~{self.estimate:,} estimated)"
        return shown


async def bounded(conn: AsyncConnection, table: Table, *where: Any, cap: int) -> Count:
    inner = select(literal(1).label("one")).select_from(table).where(*where).limit(cap + 1)
    n = int((await conn.execute(select(func.count()).select_from(inner.subquery()))).scalar_one())
    return Count(min(n, cap), n > cap)


async def estimates(conn: AsyncConnection, table: str, column: str) -> dict[str, int]:
    """PostgreSQL's estimate of the rows holding each common value of ``column``: the
    table's ``reltuples`` times the value's frequency (empty before the first ANALYZE,
    and on SQLite, which keeps no such statistics unless told to)."""
    if conn.dialect.name != "postgresql":
        return {}
    # Two steps: pg_stats joined to pg_class by name seq-scans pg_attribute; by constant
    # schema and table names it reads a few index entries.
    rel = (
        await conn.execute(
            text(
                "SELECT n.nspname, c.relname, c.reltuples FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.oid = to_regclass(:table)"
            ),
            {"table": table},
        )
    ).first()
    if rel is None or rel.reltuples is None or rel.reltuples < 0:
        return {}
    row = (
        await conn.execute(
            text(
                "SELECT most_common_vals::text::text[], most_common_freqs FROM pg_stats"
                " WHERE schemaname = :schema AND tablename = :table AND attname = :column"
            ),
            {"schema": rel.nspname, "table": rel.relname, "column": column},
        )
    ).first()
    if row is None or row[0] is None:
        return {}
    return {str(v): int(rel.reltuples * f) for v, f in zip(row[0], row[1], strict=False)}


def off_index(conn: AsyncConnection, column: Any) -> Any:
    """``column`` in a term SQLite must not pick an index for.

    Without statistics SQLite takes any index an equality matches, even one that yields
    every row of a common value to be sorted when the walk in id order would stop after
    a page; a unary plus keeps the term out of its choice. PostgreSQL chooses by its
    statistics and gets the column itself.
    """
    if conn.dialect.name == "sqlite":
        return literal_column(f"+{column.table.name}.{column.name}", column.type)
    return column


async def scan_window(
    conn: AsyncConnection, table: Table, before_id: int | None
) -> tuple[int | None, int]:
    """``(floor, top)``: the :data:`SCAN_WINDOW` ids below ``before_id`` (or the newest)
    are ``floor <= id < top``; ``floor`` is None when fewer rows are left."""
    ids = table.c.id
    top = before_id
    if top is None:
        newest = (await conn.execute(select(func.max(ids)))).scalar_one()
        top = int(newest) + 1 if newest is not None else 1
    floor = (
        await conn.execute(
            select(ids).where(ids < top).order_by(ids.desc()).offset(SCAN_WINDOW - 1).limit(1)
        )
    ).scalar_one_or_none()
    return (int(floor) if floor is not None else None), top


def paged(
    rows: list[T], size: int, cursor: Callable[[T], Any], floor: int | None, top: int
) -> Page[T]:
    """A page of ``rows`` (``size + 1`` read): the next cursor after its last row, or,
    when the scan window ended it first, below the window."""
    if len(rows) > size:
        rows = rows[:size]
        return Page(rows, str(cursor(rows[-1])))
    if floor is not None:
        return Page(rows, str(floor), searched=(floor, top - 1))
    return Page(rows, None)
