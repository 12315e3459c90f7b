"""The one lease: a row held by one process while it works outside any transaction.

``dead_letters`` (a replay), ``intents`` (a create on a remote API), ``outbox`` (a
publish to a broker), ``webhook_events`` and ``alerts`` (a delivery to the alert sinks,
migration 0017) carry the same two columns (migration 0011): ``lease_token``, who holds
the row, and ``lease_expires_at``, until when. The work they cover is network I/O,
so no transaction may stay open across it; the lease is what keeps other processes off
the row meanwhile. Three operations, all of them single statements:

* **claim** (:func:`claim`): take rows that are *free* (no token, or its lease ended)
  and write a fresh token and expiry, in the claimer's short transaction. On PostgreSQL
  the statement re-checks ``free`` on a row another transaction changed meanwhile (READ
  COMMITTED re-reads a row it waited for), and callers pick candidates with ``FOR UPDATE
  SKIP LOCKED``; SQLite runs write transactions one at a time (``BEGIN IMMEDIATE``). Two
  claimers therefore never both get a row, on either engine.
* **fence** (:func:`fenced`): a write that applies only while the row still carries the
  holder's token. A lease that ended but that nobody took over still holds: the late
  holder's outcome is the truth and is kept. Once another claim took the row, or an
  operator or a new failure released it (:data:`RELEASED`), the stale write changes
  nothing and the caller learns so from the rows it returns.
* **release**: a fenced write of :data:`RELEASED` (plus whatever outcome goes with it).

A claim updates the rows a locking select picked (:func:`picked`; a purge's batch is
picked the same way): on PostgreSQL their ids are an ``ARRAY(SELECT ...)``, run once,
and the rows are found by primary key. Written
as ``id IN (SELECT ... FOR UPDATE SKIP LOCKED)`` the planner may hash a scan of the whole
table per claim, or run the locking select again for every row of it: a job claim right
after a 100,000-job enqueue spun for minutes so (``tests/integration/test_claim_plans.py``).

A process that dies holding a lease leaves the row to be claimed again once the lease
ends: work covered by a lease runs at least once, and each table says what makes a
second run harmless (the DLQ's fencing, an intent's ``find``, an outbox message's id).
Expiry is judged by the claimer's clock, so hosts' clocks must agree to within the
margin a caller adds to its lease.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Boolean, ColumnElement, Select, Table, Update, any_, func, or_, update
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.visitors import InternalTraversal

from synckit.clock import utcnow

__all__ = [
    "LEASE_COLUMNS",
    "RELEASED",
    "Lease",
    "LeaseColumns",
    "claim",
    "ended",
    "fenced",
    "free",
    "held",
    "new_lease",
    "picked",
    "taken",
]


@dataclass(frozen=True)
class LeaseColumns:
    """The names of a table's lease columns: the holder's token and the lease's end, and
    optionally the holder's name. Every leased table uses :data:`LEASE_COLUMNS` but two
    whose leases predate them: ``connections`` (the OAuth refresh: ``refresh_owner``,
    ``refresh_until``) and ``jobs`` (``claim_token``, ``lease_expires_at``, ``locked_by``:
    see ``synckit.store.jobs._base.JOB_LEASE``)."""

    token: str = "lease_token"
    expires_at: str = "lease_expires_at"
    #: A column naming the holder (the jobs' worker id), written with the lease and
    #: cleared with it; None where the token is all there is.
    holder: str | None = None

    def released(self, *, keep_token: bool = False) -> dict[str, Any]:
        """The values of a row no lease holds. ``keep_token`` leaves the token in place
        as the record of which claim finished the row (a succeeded job keeps its
        ``claim_token``); the row is free all the same, having no lease end."""
        values: dict[str, Any] = {} if keep_token else {self.token: None}
        values[self.expires_at] = None
        if self.holder is not None:
            values[self.holder] = None
        return values

    def released_sql(self, *, keep_token: bool = False) -> str:
        """:meth:`released` as the SET list of raw SQL (``col = NULL, ...``), for statements
        prebuilt as text on a hot path."""
        return ", ".join(f"{c} = NULL" for c in self.released(keep_token=keep_token))

    def holding_sql(self, token: str, expires_at: str, holder: str | None = None) -> str:
        """:meth:`holding` as the SET list of raw SQL, the values given as SQL (parameter
        placeholders such as ``:token`` or ``$1``)."""
        return ", ".join(f"{c} = {v}" for c, v in self.holding(token, expires_at, holder).items())

    def holding(self, token: Any, expires_at: Any, holder: Any = None) -> dict[str, Any]:
        """The values that hold a row under ``token`` until ``expires_at`` (values or
        bound parameters: the jobs' claim is built once, with parameters)."""
        values = {self.token: token, self.expires_at: expires_at}
        if self.holder is not None:
            values[self.holder] = holder
        return values


#: The lease columns of migration 0011 (and 0020 for ``alerts``).
LEASE_COLUMNS = LeaseColumns()

#: The values of a row no lease holds.
RELEASED: Mapping[str, Any] = LEASE_COLUMNS.released()


@dataclass(frozen=True)
class Lease:
    """One claim's token and the end of its lease."""

    token: str
    expires_at: datetime

    def values(self, columns: LeaseColumns = LEASE_COLUMNS) -> dict[str, Any]:
        """The column values that hold a row under this lease."""
        return columns.holding(self.token, self.expires_at)


def new_lease(duration: timedelta, *, now: datetime | None = None) -> Lease:
    """A fresh lease (a random token) ending ``duration`` after ``now``."""
    return Lease(secrets.token_hex(16), (now or utcnow()) + duration)


def ended(table: Table, now: Any, columns: LeaseColumns = LEASE_COLUMNS) -> ColumnElement[bool]:
    """Rows of ``table`` whose lease ended before ``now`` (a rescue's test: the holder
    may still write its outcome until someone takes the row over)."""
    ended_: ColumnElement[bool] = table.c[columns.expires_at] < now
    return ended_


def free(table: Table, now: datetime, columns: LeaseColumns = LEASE_COLUMNS) -> ColumnElement[bool]:
    """Rows of ``table`` no lease holds at ``now``: no token, or a lease that ended."""
    token, until = table.c[columns.token], table.c[columns.expires_at]
    return or_(token.is_(None), until.is_(None), until <= now)


def held(table: Table, token: Any, columns: LeaseColumns = LEASE_COLUMNS) -> ColumnElement[bool]:
    """Rows of ``table`` still held under ``token`` (the fence); ``token`` is a value or a
    bound parameter."""
    fence: ColumnElement[bool] = table.c[columns.token] == token
    return fence


def taken(
    table: Table, now: datetime, columns: LeaseColumns = LEASE_COLUMNS
) -> ColumnElement[bool]:
    """Rows of ``table`` held at ``now`` under a lease that has not ended."""
    return ~free(table, now, columns)


def claim(
    table: Table,
    lease: Lease,
    *where: ColumnElement[bool],
    now: datetime,
    values: Mapping[str, Any] | None = None,
    columns: LeaseColumns = LEASE_COLUMNS,
) -> Update:
    """``UPDATE table`` that takes the free rows matching ``where`` under ``lease``.

    ``values`` are written with the lease (a DLQ row's next replay time, say). Callers
    add ``RETURNING`` and execute it in a short transaction they commit before the work.
    """
    return (
        update(table)
        .where(*where, free(table, now, columns))
        .values(**lease.values(columns), **(values or {}))
    )


def fenced(
    table: Table,
    token: str,
    *where: ColumnElement[bool],
    values: Mapping[str, Any],
    release: bool = True,
    columns: LeaseColumns = LEASE_COLUMNS,
) -> Update:
    """``UPDATE table`` writing ``values`` to the rows matching ``where`` that ``token``
    still holds; with ``release`` (the default) the lease ends with the write."""
    changes = {**(columns.released() if release else {}), **values}
    return update(table).where(*where, held(table, token, columns)).values(**changes)


class _Picked(ColumnElement[bool]):
    """SQL: ``column`` is one of the ids ``select`` locks (:func:`picked`)."""

    __visit_name__ = "synckit_picked"
    inherit_cache = True
    type = Boolean()
    _is_implicitly_boolean = True  # a condition as it is: no "= 1" on SQLite
    _traverse_internals = [
        ("column", InternalTraversal.dp_clauseelement),
        ("select", InternalTraversal.dp_clauseelement),
    ]

    def __init__(self, column: ColumnElement[Any], select: Select[Any]) -> None:
        self.column = column
        self.select = select


def picked(column: ColumnElement[Any], select: Select[Any]) -> ColumnElement[bool]:
    """SQL: ``column`` is among the ids ``select`` picks (and locks): on PostgreSQL
    ``column = ANY(ARRAY(select))``, an init plan run once, so that the statement finds
    its rows by ``column``'s index whatever the planner expects of the select; elsewhere
    ``column IN (select)``."""
    return _Picked(column, select)


@compiles(_Picked)
def _picked_in(element: _Picked, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.column.in_(element.select.scalar_subquery()), **kw))


@compiles(_Picked, "postgresql")
def _picked_any(element: _Picked, compiler: Any, **kw: Any) -> str:
    ids = any_(func.array(element.select.scalar_subquery()))
    return str(compiler.process(element.column == ids, **kw))
