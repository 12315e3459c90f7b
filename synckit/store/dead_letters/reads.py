"""Reading dead letters: one row, streams of rows, counts and the console's pages.

**Streaming.** Listing and bulk operations walk the table by keyset pagination on ``id``
(pages of ``batch`` rows, each page its own short read), so 100,000 matching rows are
never in memory at once and no long transaction pins the database.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    case,
    func,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.errors.exceptions import DeadLetterNotFound, DlqError
from synckit.store.db import Database
from synckit.store.dead_letters.rows import _BASE_COLUMNS, _FULL_COLUMNS, DeadLetter, DlqFilter
from synckit.store.pages import Page, off_index, page_size, paged, scan_window
from synckit.store.tables import dead_letters

_GROUP_COLUMNS = {
    "tenant": dead_letters.c.tenant,
    "connector": dead_letters.c.connector,
    "kind": dead_letters.c.kind,
    "class": dead_letters.c.error_class,
    "status": dead_letters.c.status,
}

# --- reading ------------------------------------------------------------------------------


async def get(db: Database, row_id: int) -> DeadLetter:
    """One row with its traceback; :class:`DeadLetterNotFound` if there is none."""
    async with db.read() as conn:
        row = (
            await conn.execute(select(*_FULL_COLUMNS).where(dead_letters.c.id == row_id))
        ).first()
    if row is None:
        raise DeadLetterNotFound(f"no dead letter with id {row_id}")
    return DeadLetter.from_row(row)


async def iter_rows(
    db: Database,
    flt: DlqFilter = DlqFilter(),
    *,
    batch: int = 1000,
    newest_first: bool = False,
    limit: int | None = None,
    full: bool = False,
    after_id: int | None = None,
) -> AsyncIterator[DeadLetter]:
    """Stream matching rows in id order (``newest_first``: descending), ``batch`` at a time,
    starting after the id ``after_id`` in that order (a caller's next page: with
    ``newest_first``, the rows older than it).

    Each page is a short read of its own (keyset pagination on ``id``), so memory stays
    at one page and rows written meanwhile are simply included or not. ``full`` adds the
    traceback.
    """
    c = dead_letters.c
    cols = _FULL_COLUMNS if full else _BASE_COLUMNS
    clauses = flt.clauses()
    last: int | None = after_id
    yielded = 0
    while limit is None or yielded < limit:
        size = batch if limit is None else min(batch, limit - yielded)
        stmt = select(*cols).where(*clauses)
        if last is not None:
            stmt = stmt.where(c.id < last if newest_first else c.id > last)
        stmt = stmt.order_by(c.id.desc() if newest_first else c.id).limit(size)
        async with db.read() as conn:
            page = [DeadLetter.from_row(r) for r in await conn.execute(stmt)]
        for row in page:
            yield row
        yielded += len(page)
        if len(page) < size:
            return
        last = page[-1].id


async def iter_ids(
    db: Database, flt: DlqFilter = DlqFilter(), *, batch: int = 1000
) -> AsyncIterator[list[int]]:
    """Stream the ids of matching rows in ascending pages of at most ``batch``."""
    c = dead_letters.c
    clauses = flt.clauses()
    last = 0
    while True:
        stmt = select(c.id).where(*clauses, c.id > last).order_by(c.id).limit(batch)
        async with db.read() as conn:
            page = [int(r[0]) for r in await conn.execute(stmt)]
        if page:
            yield page
        if len(page) < batch:
            return
        last = page[-1]


async def count(db: Database, flt: DlqFilter = DlqFilter()) -> int:
    """How many rows match."""
    async with db.read() as conn:
        stmt = select(func.count()).select_from(dead_letters).where(*flt.clauses())
        return int((await conn.execute(stmt)).scalar_one())


@dataclass(frozen=True)
class GroupCount:
    """One group of :func:`group_counts`: its key values (in ``group_by`` order) and size."""

    key: tuple[str, ...]
    count: int


async def group_counts(
    db: Database, group_by: Sequence[str], flt: DlqFilter = DlqFilter()
) -> list[GroupCount]:
    """Counts of matching rows per group, largest first.

    ``group_by`` names columns among ``tenant``, ``connector``, ``kind``, ``class``
    (error class) and ``status``.
    """
    unknown = [g for g in group_by if g not in _GROUP_COLUMNS]
    if unknown or not group_by:
        raise DlqError(
            f"cannot group by {', '.join(unknown) or 'nothing'}: "
            f"choose among {', '.join(_GROUP_COLUMNS)}"
        )
    cols = [_GROUP_COLUMNS[g] for g in group_by]
    n = func.count().label("n")
    stmt = select(*cols, n).where(*flt.clauses()).group_by(*cols).order_by(n.desc(), *cols)
    async with db.read() as conn:
        return [
            GroupCount(tuple(str(v) for v in r[:-1]), int(r[-1])) for r in await conn.execute(stmt)
        ]


# --- the operator's pages of dead letters (the console) ----------------------------------
# Keyset pages and groups read at the cost of a page (see synckit.store.pages); the
# console reads dead letters through these, `synckit dlq list` through iter_rows above.


def _dlq_where(conn: AsyncConnection, flt: DlqFilter) -> list[Any]:
    """``flt``'s clauses, its states kept off SQLite's index choice: led by status,
    ``ix_dead_letters_status_last`` would yield every resolved row to be sorted by id
    (or grouped by tenant) where a walk in id (or tenant) order stops after a page."""
    clauses = dataclass_replace(flt, statuses=()).clauses()
    if flt.statuses:
        clauses.append(off_index(conn, dead_letters.c.status).in_(list(flt.statuses)))
    return clauses


async def dlq_page(
    db: Database, flt: DlqFilter, *, before_id: int | None = None, limit: int = 50
) -> Page[DeadLetter]:
    """Dead letters matching ``flt``, newest first, with ids below ``before_id``.

    Unfiltered, or by tenant (``ix_dead_letters_tenant_status``), a page reads its rows;
    any other filter is checked on the rows walked in id order, at most
    :data:`SCAN_WINDOW` of them below the cursor (``searched`` says which).
    """
    size = page_size(limit)
    d = dead_letters.c
    windowed = not flt.tenants and not flt.ids and not flt.is_empty
    async with db.read() as conn:
        floor, top = await scan_window(conn, dead_letters, before_id) if windowed else (None, 0)
        bounds = [d.id < before_id] if before_id is not None else []
        bounds += [d.id >= floor] if floor is not None else []
        stmt = (
            select(*_BASE_COLUMNS)
            .where(*_dlq_where(conn, flt), *bounds)
            .order_by(d.id.desc())
            .limit(size + 1)
        )
        rows = [DeadLetter.from_row(r) for r in await conn.execute(stmt)]
    return paged(rows, size, lambda r: r.id, floor, top)


@dataclass(frozen=True)
class DlqGroup:
    """Matching dead letters of one tenant and error class: how many, and how many of
    them last failed since the trend's start (the last 24 hours)."""

    tenant: str
    error_class: str
    count: int
    recent: int


async def dlq_groups(
    db: Database,
    flt: DlqFilter,
    *,
    after: str | None = None,
    tenants: int = 25,
    recent_since: datetime,
) -> Page[DlqGroup]:
    """Groups (tenant and error class) of the rows matching ``flt``, a page of tenants at a
    time by name after ``after``.

    Reads only the page's rows: the page's tenants by walking
    ``ix_dead_letters_tenant_status`` in tenant order, then their rows grouped. Largest
    first would read every matching row on each refresh; by name, a page costs what its
    rows cost however many dead letters there are.
    """
    d = dead_letters.c
    async with db.read() as conn:
        where = _dlq_where(conn, flt)
        names_stmt = (
            select(d.tenant).where(*where).group_by(d.tenant).order_by(d.tenant).limit(tenants + 1)
        )
        if after is not None:
            names_stmt = names_stmt.where(d.tenant > after)
        names = [str(t) for (t,) in await conn.execute(names_stmt)]
        more = len(names) > tenants
        names = names[:tenants]
        groups: list[DlqGroup] = []
        if names:
            recent = func.sum(case((d.last_attempt_at >= recent_since, 1), else_=0))
            rows = await conn.execute(
                select(d.tenant, d.error_class, func.count(), recent)
                .where(*where, d.tenant.in_(names))
                .group_by(d.tenant, d.error_class)
                .order_by(d.tenant, d.error_class)
            )
            groups = [DlqGroup(str(t), str(c), int(n), int(r or 0)) for t, c, n, r in rows]
    return Page(groups, names[-1] if more else None)
