"""A page's statements on the records tables: the change sequences and the merge.

The change sequence: ``record_tables.last_seq`` is advanced by ``UPDATE ... RETURNING``
in the page's own transaction (:func:`take_seqs`), which holds that row's lock until
the transaction ends. So the transaction that took seqs ``101..200`` cannot commit
before the one that took ``1..100`` has (it waited for the lock until then): a reader
that saw ``_seq = c`` committed can never later see a row commit with ``_seq <= c``.
(A PostgreSQL sequence would hand out numbers without that order: a transaction that
took 5 could commit after one that took 6, and a reader at 6 would skip 5 for ever.)
A group of pages takes the locks of its tables in name order first (:func:`lock_seqs`).

The merge (:meth:`TableSql.upsert`) is one statement per table per page: ``unnest`` of one
array per column on PostgreSQL, ``executemany`` on SQLite. A row whose values did not
change keeps its ``_seq`` and ``_synced_at`` (a re-run reports no change).
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Table,
    select,
    text,
)
from sqlalchemy.engine import Connection

from synckit.errors.exceptions import RecordsSchemaError
from synckit.store.records.schema import ColumnSpec, TableSpec, kind_of, sa_table

# --- change sequences ---------------------------------------------------------------------

_TAKE = text(
    "UPDATE record_tables SET last_seq = last_seq + :n WHERE name = :name RETURNING last_seq"
)
_TAKE_SQLITE = "UPDATE record_tables SET last_seq = last_seq + ? WHERE name = ? RETURNING last_seq"
_LOCK_PG = text(
    "SELECT name FROM record_tables WHERE name = ANY(CAST(:names AS text[]))"
    " ORDER BY name FOR UPDATE"
)


def take_seqs(conn: Connection, table: str, n: int) -> int:
    """Take ``n`` change sequence numbers of ``table`` in the caller's transaction, which
    then holds the table's sequence until it ends; the first of them."""
    if conn.dialect.name == "sqlite":  # sqlite3's own cursor: a tenth of SQLAlchemy's cost
        row = raw_sqlite(conn).execute(_TAKE_SQLITE, (n, table)).fetchone()
        last = None if row is None else row[0]
    else:
        last = conn.execute(_TAKE, {"n": n, "name": table}).scalar()
    if last is None:
        raise _missing(table)
    return int(last) - n + 1


def _missing(table: str) -> RecordsSchemaError:
    return RecordsSchemaError(
        f"records table {table!r} does not exist: run `synckit db upgrade --app ...`"
    )


def lock_seqs(conn: Connection, tables: Sequence[str]) -> None:
    """Take the sequences of ``tables`` in name order (PostgreSQL; SQLite has one writer),
    so that transactions landing in several tables never wait for each other in a cycle."""
    if conn.dialect.name == "postgresql" and len(tables) > 1:
        conn.execute(_LOCK_PG, {"names": sorted(tables)})


# --- the page's statements ----------------------------------------------------------------

_PG_ARRAY = {
    "text": "text",
    "int": "bigint",
    "float": "double precision",
    "bool": "boolean",
    "timestamp": "timestamptz",
    "date": "date",
    "decimal": "numeric",
    "json": "text",
}


def _sqlite_ts(v: Any) -> Any:
    if isinstance(v, dt.datetime):
        return v.astimezone(dt.UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
    return v


def _sqlite_value(kind: str) -> Any:
    if kind == "timestamp":
        return _sqlite_ts
    if kind == "date":
        return lambda v: v.isoformat() if isinstance(v, dt.date) else v
    if kind == "decimal":
        return lambda v: str(v) if isinstance(v, decimal.Decimal) else v
    return None


def _merge_tail(spec: TableSpec, data: list[str], postgres: bool) -> tuple[str, list[str]]:
    """The ``ON CONFLICT ... DO UPDATE`` clause of an upsert into ``spec``'s table, and
    the columns it inserts: a row takes a new seq only when its data changed."""
    cols = [c.name for c in spec.columns]
    keys = list(spec.key)
    distinct = "IS DISTINCT FROM" if postgres else "IS NOT"
    changed = " OR ".join(
        [f"r.{c} {distinct} excluded.{c}" for c in data] + ["r._deleted_at IS NOT NULL"]
    )
    if spec.child:
        changed += f" OR r._parent {distinct} excluded._parent"
    sync_new = "COALESCE(excluded._sync, r._sync)"
    sets = [f"{c} = excluded.{c}" for c in data] + [
        f"_seq = CASE WHEN {changed} THEN excluded._seq ELSE r._seq END",
        f"_synced_at = CASE WHEN {changed} THEN excluded._synced_at ELSE r._synced_at END",
        "_deleted_at = NULL",
        f"_sync = {sync_new}",
    ]
    if spec.child:
        sets.append("_parent = excluded._parent")
    where = f"({changed}) OR r._sync {distinct} {sync_new}"
    if spec.version is not None:
        # An older version (or none, where the row has one) never regresses the row.
        v = spec.version
        where = f"({where}) AND (r.{v} IS NULL OR excluded.{v} >= r.{v})"
    extra = ["_parent"] if spec.child else []
    all_cols = ["tenant", *cols, "_synced_at", "_seq", "_added_seq", "_sync", *extra]
    conflict = ", ".join(["tenant", *keys])
    tail = f" ON CONFLICT ({conflict}) DO UPDATE SET {', '.join(sets)} WHERE {where}"
    return tail, all_cols


class TableSql:
    """The statements of one records table on one engine, built once."""

    def __init__(self, spec: TableSpec, postgres: bool) -> None:
        self.spec = spec
        self.postgres = postgres
        self.table = sa_table(spec)
        t = spec.table
        cols = [c.name for c in spec.columns]
        keys = list(spec.key)
        data = [c for c in cols if c not in keys]
        tail, all_cols = _merge_tail(spec, data, postgres)
        if postgres:
            self._build_pg(tail, all_cols, keys)
        else:
            self._build_sqlite(tail, all_cols, keys)
        self.unswept_q = text(
            f"SELECT {', '.join(keys)} FROM {t} WHERE tenant = :tenant AND _deleted_at IS NULL"
            f" AND (_sync IS NULL OR _sync <> :sync)"
        )

    def _build_pg(self, tail: str, all_cols: list[str], keys: list[str]) -> None:
        """The PostgreSQL statements: whole pages as arrays, ``unnest`` to rows."""
        spec, t = self.spec, self.spec.table
        arrays = [f"CAST(:c{i} AS {_PG_ARRAY[c.kind]}[])" for i, c in enumerate(spec.columns)]
        names = [f"c{i}" for i in range(len(spec.columns))]
        picks = [
            f"CAST(v.{n} AS jsonb)" if c.kind == "json" else f"v.{n}"
            for n, c in zip(names, spec.columns, strict=True)
        ]
        if spec.child:
            arrays.append("CAST(:parents AS text[])")
            names.append("parent")
        values = ", ".join(
            [":tenant", *picks, ":now", ":base + v.n", ":base + v.n", ":sync"]
            + (["v.parent"] if spec.child else [])
        )
        # The rows whose data changed took one of this statement's seqs (> :base);
        # the others were only marked seen by a full sync (``_sync``): not a change.
        self.upsert_many = text(
            f"WITH u AS (INSERT INTO {t} AS r ({', '.join(all_cols)}) SELECT {values}"
            f" FROM unnest({', '.join(arrays)}) WITH ORDINALITY AS v({', '.join(names)}, n)"
            f"{tail} RETURNING r._seq) SELECT count(*) FROM u WHERE _seq > :base"
        )
        # The same merge taking its seqs itself (``record_tables``' row, locked until
        # the transaction ends, as take_seqs leaves it) and notifying listeners when a
        # row changed: one round trip where three were (each ~0.3-0.6 ms of a
        # PostgreSQL worker's CPU, per page).
        taking = values.replace(":base + v.n", "s.base + v.n")
        self.upsert_taking_pg = text(
            "WITH s AS (UPDATE record_tables SET last_seq = last_seq + CAST(:n AS bigint)"
            " WHERE name = :table RETURNING last_seq - CAST(:n AS bigint) AS base),"
            f" u AS (INSERT INTO {t} AS r ({', '.join(all_cols)}) SELECT {taking}"
            f" FROM s, unnest({', '.join(arrays)}) WITH ORDINALITY AS v({', '.join(names)}, n)"
            f"{tail} RETURNING r._seq)"
            " SELECT s.base, c.n, (SELECT count(*) FROM (SELECT pg_notify("
            f"'{NOTIFY_CHANNEL}', CAST(:payload AS text)) WHERE c.n > 0) AS x)"
            " FROM s, (SELECT count(*) AS n FROM u, s WHERE u._seq > s.base) AS c"
        )
        one_values = ", ".join(
            [":tenant"]
            + [
                f"CAST(:c{i} AS jsonb)"
                if c.kind == "json"
                else f"CAST(:c{i} AS {_PG_ARRAY[c.kind]})"
                for i, c in enumerate(spec.columns)
            ]
            + [":now", ":base", ":base", ":sync"]
            + (["CAST(:parents AS text)"] if spec.child else [])
        )
        self.upsert_one = text(
            f"WITH u AS (INSERT INTO {t} AS r ({', '.join(all_cols)}) VALUES ({one_values})"
            f"{tail} RETURNING r._seq) SELECT count(*) FROM u WHERE _seq >= :base"
        )
        kcols = ", ".join(
            f"CAST(:k{i} AS {_PG_ARRAY[kind_of(spec, k)]}[])" for i, k in enumerate(keys)
        )
        knames = ", ".join(f"k{i}" for i in range(len(keys)))
        match = " AND ".join(f"r.{k} = v.k{i}" for i, k in enumerate(keys))
        self.delete_pg = text(
            f"UPDATE {t} AS r SET _deleted_at = :now, _synced_at = :now, _seq = :base + v.n"
            f" FROM unnest({kcols}) WITH ORDINALITY AS v({knames}, n)"
            f" WHERE r.tenant = :tenant AND {match} AND r._deleted_at IS NULL"
        )
        self.touch_pg = text(
            f"UPDATE {t} AS r SET _sync = :sync FROM unnest({kcols}) AS v({knames})"
            f" WHERE r.tenant = :tenant AND {match}"
        )
        self.children_of = text(
            f"SELECT {', '.join(keys)}, _parent FROM {t} WHERE tenant = :tenant"
            " AND _parent = ANY(CAST(:parents AS text[])) AND _deleted_at IS NULL"
        )

    def _build_sqlite(self, tail: str, all_cols: list[str], keys: list[str]) -> None:
        """The SQLite statements: one row per execution, ``?`` parameters."""
        spec, t = self.spec, self.spec.table
        marks = ", ".join("?" for _ in all_cols)
        self.upsert_sqlite = f"INSERT INTO {t} AS r ({', '.join(all_cols)}) VALUES ({marks}){tail}"
        self.convert = [(i, f) for i, c in enumerate(spec.columns) if (f := _sqlite_value(c.kind))]
        match = " AND ".join(f"{k} = ?" for k in keys)
        self.delete_sqlite = (
            f"UPDATE {t} SET _deleted_at = ?, _synced_at = ?, _seq = ?"
            f" WHERE tenant = ? AND {match} AND _deleted_at IS NULL"
        )
        self.touch_sqlite = f"UPDATE {t} SET _sync = ? WHERE tenant = ? AND {match}"
        self.seqs_sqlite = f"SELECT count(*) FROM {t} WHERE tenant = ? AND _seq >= ? AND _seq < ?"
        self.children_sqlite = (
            f"SELECT {', '.join(keys)}, _parent FROM {t} WHERE tenant = ?"
            " AND _parent IN (SELECT value FROM json_each(?)) AND _deleted_at IS NULL"
        )

    # -- writes (in the caller's transaction) --

    def _sqlite_row(self, values: Sequence[Any]) -> list[Any]:
        out = list(values)
        for i, f in self.convert:
            out[i] = f(out[i])
        return out

    def upsert(
        self,
        conn: Connection,
        tenant: str,
        rows: Sequence[tuple[Any, ...]],
        *,
        base: int,
        now: dt.datetime,
        sync: str | None,
        parents: Sequence[str] | None = None,
    ) -> int:
        """Merge ``rows`` (column values, in ``spec.columns`` order; no key twice), the
        i-th with ``_seq`` ``base + i``: one statement. Raises what the database raises
        for any row (the caller then lands them one by one). How many rows changed (a row
        a full sync only marked seen did not)."""
        if not rows:
            return 0
        if self.postgres:
            params: dict[str, Any] = {
                f"c{i}": [r[i] for r in rows] for i in range(len(self.spec.columns))
            }
            params.update(tenant=tenant, now=now, base=base - 1, sync=sync)
            if self.spec.child:
                params["parents"] = list(parents or ())
            return int(conn.execute(self.upsert_many, params).scalar() or 0)
        stamp = _sqlite_ts(now)
        extra = self.spec.child
        batch = [
            [tenant, *self._sqlite_row(r), stamp, base + i, base + i, sync]
            + ([parents[i]] if extra and parents is not None else [])
            for i, r in enumerate(rows)
        ]
        touched = _executemany(conn, self.upsert_sqlite, batch)
        if sync is None or not touched:  # no full sync: every row it touched changed
            return touched
        # A full sync also marks unchanged rows seen (``_sync``): only those that took one
        # of this batch's seqs changed (index ``(tenant, _seq)``).
        args = (tenant, base, base + len(rows))
        return int(raw_sqlite(conn).execute(self.seqs_sqlite, args).fetchone()[0])

    def upsert_taking(
        self,
        conn: Connection,
        tenant: str,
        rows: Sequence[tuple[Any, ...]],
        *,
        n: int,
        now: dt.datetime,
        sync: str | None,
        notify: str,
    ) -> tuple[int, int]:
        """PostgreSQL, a table without children: :meth:`upsert` of ``rows`` taking the
        ``n`` (>= len(rows)) seqs itself, as :func:`take_seqs` would, and notifying as
        :func:`notify_changes` would (stream ``notify``) when a row changed: one
        statement. The first seq, and how many rows changed."""
        params: dict[str, Any] = {
            f"c{i}": [r[i] for r in rows] for i in range(len(self.spec.columns))
        }
        params.update(
            tenant=tenant, now=now, sync=sync, n=n, table=self.spec.table,
            payload=_notify_payload(tenant, notify),
        )  # fmt: skip
        found = conn.execute(self.upsert_taking_pg, params).first()
        if found is None:
            raise _missing(self.spec.table)
        return int(found[0]) + 1, int(found[1])

    def upsert_row(
        self,
        conn: Connection,
        tenant: str,
        row: tuple[Any, ...],
        *,
        seq: int,
        now: dt.datetime,
        sync: str | None,
        parent: str | None = None,
    ) -> int:
        """Merge one row with ``_seq`` ``seq`` (the caller holds a savepoint: the database
        may refuse it); 1 if it changed."""
        if self.postgres:
            params: dict[str, Any] = {f"c{j}": v for j, v in enumerate(row)}
            params.update(tenant=tenant, now=now, base=seq, sync=sync)
            if self.spec.child:
                params["parents"] = parent
            return int(conn.execute(self.upsert_one, params).scalar() or 0)
        return self.upsert(
            conn, tenant, [row], base=seq, now=now, sync=sync,
            parents=[parent] if self.spec.child and parent is not None else None,
        )  # fmt: skip

    def delete(
        self,
        conn: Connection,
        tenant: str,
        keys: Sequence[tuple[Any, ...]],
        *,
        base: int,
        now: dt.datetime,
    ) -> int:
        """Soft-delete the rows of ``keys`` (the i-th with ``_seq`` ``base + i``); how many."""
        if not keys:
            return 0
        if self.postgres:
            params: dict[str, Any] = {
                f"k{i}": [k[i] for k in keys] for i in range(len(self.spec.key))
            }
            params.update(tenant=tenant, now=now, base=base - 1)
            return int(conn.execute(self.delete_pg, params).rowcount or 0)
        stamp = _sqlite_ts(now)
        batch = [[stamp, stamp, base + i, tenant, *k] for i, k in enumerate(keys)]
        return _executemany(conn, self.delete_sqlite, batch)

    def touch(
        self, conn: Connection, tenant: str, keys: Sequence[tuple[Any, ...]], sync: str
    ) -> None:
        """Mark the rows of ``keys`` seen by full sync ``sync`` (records that failed to land
        in it still exist: a sweep must not delete their rows)."""
        if not keys:
            return
        if self.postgres:
            params: dict[str, Any] = {
                f"k{i}": [k[i] for k in keys] for i in range(len(self.spec.key))
            }
            params.update(tenant=tenant, sync=sync)
            conn.execute(self.touch_pg, params)
        else:
            _executemany(conn, self.touch_sqlite, [[sync, tenant, *k] for k in keys])

    def unswept(self, conn: Connection, tenant: str, sync: str) -> list[tuple[Any, ...]]:
        """The keys of live rows full sync ``sync`` did not see."""
        return [tuple(r) for r in conn.execute(self.unswept_q, {"tenant": tenant, "sync": sync})]

    def children(
        self, conn: Connection, tenant: str, parents: Sequence[str]
    ) -> list[tuple[tuple[Any, ...], str]]:
        """The live child rows of ``parents``: (key, parent)."""
        if not parents:
            return []
        n = len(self.spec.key)
        rows: Sequence[Sequence[Any]]
        if self.postgres:
            params = {"tenant": tenant, "parents": list(parents)}
            rows = list(conn.execute(self.children_of, params))
        else:
            args = (tenant, json.dumps(list(parents)))
            rows = raw_sqlite(conn).execute(self.children_sqlite, args).fetchall()
        return [(tuple(r[:n]), str(r[n])) for r in rows]

    # -- reads --

    def select_columns(self, columns: Sequence[ColumnSpec] | None = None) -> Table:
        return sa_table(self.spec, columns)


def raw_sqlite(conn: Connection) -> sqlite3.Connection:
    raw = conn.connection.driver_connection
    assert isinstance(raw, sqlite3.Connection)
    return raw


def _executemany(conn: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> int:
    """SQLite: ``executemany`` on the connection's own sqlite3 connection (SQLAlchemy's
    parameter handling cost more than the statement); how many rows it changed."""
    return int(raw_sqlite(conn).executemany(sql, rows).rowcount or 0)


def is_record_error(conn: Connection, exc: BaseException) -> bool:
    """Whether ``exc`` is the database refusing one row's values (a data exception or an
    integrity constraint: SQLSTATE classes 22 and 23), the connection still good; any
    other error (a missing table, a lost connection) is the page's, not the record's."""
    if conn.invalidated or conn.closed:
        return False
    if isinstance(exc, ValueError | TypeError | OverflowError):  # a value the driver refused
        return True
    orig = getattr(exc, "orig", exc)
    if isinstance(orig, sqlite3.IntegrityError | sqlite3.DataError):
        return True
    code = str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")
    return code[:2] in ("22", "23")


@functools.lru_cache(maxsize=512)
def _cached(spec: TableSpec, postgres: bool) -> TableSql:
    return TableSql(spec, postgres)


def table_sql(spec: TableSpec, postgres: bool) -> TableSql:
    """The statements of ``spec``'s table on one engine (built once per process)."""
    return _cached(spec, postgres)


def live_keys(conn: Connection, spec: TableSpec) -> dict[str, set[tuple[Any, ...]]]:
    """The keys of every tenant's live rows of ``spec``'s table, on a synchronous
    connection (the demo's reader, which reads beside the running worker)."""
    t = sa_table(spec)
    q = select(t.c.tenant, *(t.c[k] for k in spec.key)).where(t.c["_deleted_at"].is_(None))
    out: dict[str, set[tuple[Any, ...]]] = {}
    for r in conn.execute(q):
        out.setdefault(r[0], set()).add(tuple(r[1:]))
    return out


def notify_changes(conn: Connection, tenant: str, stream: str) -> None:
    """PostgreSQL: tell ``LISTEN synckit_records`` listeners, once this transaction
    commits, that rows of ``tenant``'s ``stream`` changed (payload ``tenant stream``)."""
    conn.execute(_NOTIFY, {"payload": _notify_payload(tenant, stream)})


def _notify_payload(tenant: str, stream: str) -> str:
    return f"{tenant} {stream}"[:7000]


_NOTIFY = text("SELECT pg_notify('synckit_records', :payload)")
#: The channel :func:`notify_changes` notifies.
NOTIFY_CHANNEL = "synckit_records"
