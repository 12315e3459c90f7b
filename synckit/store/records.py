"""Records tables: their DDL, their change sequences, the page's merge, and reads.

A stream's :class:`~synckit.connectors.records.Records` declaration becomes a table here
(:func:`upgrade_tables`, run by ``synckit db upgrade --app``), registered in
``record_tables`` with the columns it was created with. Every row carries ``tenant``, the
model's columns, ``_synced_at`` (when a sync last changed it), ``_deleted_at`` (soft
delete), ``_seq`` (the table's change sequence at its last change), ``_added_seq`` (at
its first), ``_sync`` (the full sync that last saw it) and, in a child table,
``_parent`` (its parent's key).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    Float,
    Index,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateIndex, CreateTable

from synckit.errors.exceptions import RecordsSchemaError
from synckit.store.db import Database
from synckit.store.tables import JSONType, UTCDateTime, record_tables

__all__ = [
    "NOTIFY_CHANNEL",
    "NO_LANDING",
    "StoredRow",
    "TableOwner",
    "TableSql",
    "is_record_error",
    "live_keys",
    "lock_seqs",
    "notify_changes",
    "plan_upgrade",
    "prepare_destination",
    "read_changes",
    "read_landing",
    "read_landing_page",
    "read_rows",
    "record_landings",
    "recorded_spec",
    "recorded_specs",
    "save_landing",
    "table_sql",
    "take_seqs",
    "upgrade_tables",
]


class ColumnSpec(Protocol):
    """A column of a records table (``synckit.connectors.records.ColumnSpec``)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def nullable(self) -> bool: ...


class TableSpec(Protocol):
    """A records table as declared (``synckit.connectors.records.TableSpec``)."""

    @property
    def table(self) -> str: ...
    @property
    def columns(self) -> Sequence[ColumnSpec]: ...
    @property
    def key(self) -> tuple[str, ...]: ...
    @property
    def child(self) -> bool: ...
    @property
    def version(self) -> str | None: ...
    def as_json(self) -> list[dict[str, Any]]: ...
    def __hash__(self) -> int: ...


@dataclass(frozen=True)
class _Column:
    """A column as ``record_tables.spec`` recorded it."""

    name: str
    kind: str
    nullable: bool


def _kind(spec: TableSpec, name: str) -> str:
    return next(c.kind for c in spec.columns if c.name == name)


@dataclass(frozen=True)
class TableOwner:
    """A table to create or extend, and the stream that declares it."""

    spec: TableSpec
    connector: str
    stream: str
    #: the URL of the database it lives in, when not synckit's own
    database: str | None = None


# --- the schema plan (a pure decision) ------------------------------------------------


def plan_upgrade(spec: TableSpec, recorded: Sequence[Mapping[str, Any]] | None) -> list[ColumnSpec]:
    """The columns to add to bring a table created with ``recorded`` columns to ``spec``
    (all of them for a new table, ``recorded`` None); raise :class:`RecordsSchemaError`,
    one line naming field and table and what to do, for a change that cannot be applied.
    """
    if recorded is None:
        return list(spec.columns)
    old = {str(c["name"]): c for c in recorded}
    add: list[ColumnSpec] = []
    for c in spec.columns:
        was = old.get(c.name)
        if was is None:
            if not c.nullable:
                raise RecordsSchemaError(
                    f"table {spec.table!r}: new field {c.name!r} is required and the table "
                    "has rows without it: make it optional (a default or `| None`), or "
                    "declare a new table"
                )
            add.append(c)
        elif was.get("kind") != c.kind:
            raise RecordsSchemaError(
                f"table {spec.table!r}: field {c.name!r} changed type ({was.get('kind')} -> "
                f"{c.kind}): add a new field with the new type (or declare a new table) "
                "instead of changing this one"
            )
        elif not c.nullable and was.get("nullable"):
            raise RecordsSchemaError(
                f"table {spec.table!r}: field {c.name!r} became required and stored rows may "
                "lack it: keep it optional, or declare a new table"
            )
    declared = {c.name for c in spec.columns}
    for name, was in old.items():
        if name not in declared and not was.get("nullable"):
            raise RecordsSchemaError(
                f"table {spec.table!r}: required field {name!r} was removed from the model: "
                "keep it (optional) in the model, or declare a new table"
            )
    return add


# --- the table as SQLAlchemy sees it ---------------------------------------------------


def _sa_type(kind: str) -> Any:
    return {
        "text": Text(),
        "int": BigInteger(),
        "float": Float(53),
        "bool": Boolean(),
        "timestamp": UTCDateTime(),
        "date": Date(),
        "decimal": Numeric(),
        "json": JSONType,
    }[kind]


def _columns_of(recorded: Sequence[Mapping[str, Any]]) -> tuple[ColumnSpec, ...]:
    return tuple(
        _Column(str(c["name"]), str(c["kind"]), bool(c.get("nullable", True))) for c in recorded
    )


def sa_table(spec: TableSpec, columns: Sequence[ColumnSpec] | None = None) -> Table:
    """The SQLAlchemy table of ``spec`` (with ``columns``: those it was created with);
    one object per process for each, so that SQLAlchemy compiles its statements once."""
    return _sa_table(spec, tuple(columns) if columns is not None else None)


@functools.lru_cache(maxsize=256)
def _sa_table(spec: TableSpec, columns: tuple[ColumnSpec, ...] | None) -> Table:
    md = MetaData()
    cols: list[Column[Any]] = [Column("tenant", String(200), nullable=False)]
    for c in columns if columns is not None else spec.columns:
        cols.append(
            Column(c.name, _sa_type(c.kind), nullable=c.nullable and c.name not in spec.key)
        )
    cols += [
        Column("_synced_at", UTCDateTime(), nullable=False),
        Column("_deleted_at", UTCDateTime()),
        Column("_seq", BigInteger, nullable=False),
        Column("_added_seq", BigInteger, nullable=False),
        Column("_sync", Text),
    ]
    if spec.child:
        cols.append(Column("_parent", Text))
    table = Table(
        spec.table,
        md,
        *cols,
        PrimaryKeyConstraint("tenant", *spec.key, name=f"pk_{spec.table}"),
    )
    Index(f"ix_{spec.table}_seq", table.c.tenant, table.c["_seq"])
    if spec.child:
        Index(f"ix_{spec.table}_parent", table.c.tenant, table.c["_parent"])
    return table


# --- db upgrade --app -------------------------------------------------------------------


async def upgrade_tables(db: Database, owners: Sequence[TableOwner], now: dt.datetime) -> list[str]:
    """Create or extend every declared table (one transaction); lines saying what was
    done. Raises :class:`RecordsSchemaError` (nothing changed) for a change that cannot be
    applied. Two processes running it at once: the second waits for the first (an
    advisory lock on PostgreSQL, the write lock on SQLite) and then finds nothing to do.
    """

    def run(conn: Connection) -> list[str]:
        from synckit.store.migrate import lock_schema  # (Alembic: only for this)

        lock_schema(conn)
        done: list[str] = []
        for o in owners:
            done.extend(_upgrade_one(conn, o, now))
        return done

    async with db.begin() as conn:
        return await conn.run_sync(run)


def _upgrade_one(conn: Connection, o: TableOwner, now: dt.datetime) -> list[str]:
    spec = o.spec
    row = conn.execute(
        select(record_tables.c.spec, record_tables.c.connector, record_tables.c.stream).where(
            record_tables.c.name == spec.table
        )
    ).first()
    if row is None:
        if inspect(conn).has_table(spec.table):
            raise RecordsSchemaError(
                f"table {spec.table!r} exists and was not created by synckit: rename or drop "
                "it, or declare another table name"
            )
        table = sa_table(spec)
        conn.execute(CreateTable(table))
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            conn.execute(CreateIndex(index))
        conn.execute(
            record_tables.insert().values(
                name=spec.table, connector=o.connector, stream=o.stream,
                spec={"columns": spec.as_json(), "key": list(spec.key), "child": spec.child},
                last_seq=0, created_at=now, updated_at=now,
            )
        )  # fmt: skip
        return [f"created table {spec.table} ({o.connector}/{o.stream})"]
    if (row.connector, row.stream) != (o.connector, o.stream):
        raise RecordsSchemaError(
            f"table {spec.table!r} belongs to {row.connector}/{row.stream}, not "
            f"{o.connector}/{o.stream}: declare another table name"
        )
    recorded = row.spec.get("columns", [])
    if list(row.spec.get("key", [])) != list(spec.key):
        raise RecordsSchemaError(
            f"table {spec.table!r}: key changed ({row.spec.get('key')} -> {list(spec.key)}): "
            "declare a new table"
        )
    add = plan_upgrade(spec, recorded)
    if not add:
        return []
    table = sa_table(spec)
    for c in add:
        sql_type = table.c[c.name].type.compile(dialect=conn.dialect)
        conn.exec_driver_sql(f"ALTER TABLE {spec.table} ADD COLUMN {c.name} {sql_type}")
    names = {c.name for c in spec.columns}
    kept = [c for c in recorded if c["name"] not in names]  # removed optional fields stay
    conn.execute(
        record_tables.update()
        .where(record_tables.c.name == spec.table)
        .values(
            spec={"columns": spec.as_json() + kept, "key": list(spec.key), "child": spec.child},
            updated_at=now,
        )
    )
    return [f"table {spec.table}: added {', '.join(c.name for c in add)}"]


async def recorded_spec(db: Database, name: str) -> Any:
    """The ``spec`` column of table ``name``'s ``record_tables`` row, or None."""

    def run(conn: Connection) -> Any:
        q = select(record_tables.c.spec).where(record_tables.c.name == name)
        return conn.execute(q).scalar()

    return await db.run_read(run)


async def recorded_specs(db: Database) -> dict[str, Any]:
    """``record_tables``' rows by name: ``(connector, stream, spec, last_seq)``."""
    async with db.read() as conn:
        rows = await conn.execute(select(record_tables))
        return {r.name: r for r in rows}


# --- a destination database (records tables in another database) -----------------------

#: In a destination database (``Records(database=URL)``): each stream's checkpoint as of
#: the rows landed there, written in the same transaction as those rows. The runtime's
#: own checkpoint is written after, in its database; a crash between the two leaves this
#: one ahead, and the next cycle starts from it (``poll.run_cycle``).
record_landings = Table(
    "record_landings",
    MetaData(),
    Column("tenant", String(200), nullable=False),
    Column("connector", String(200), nullable=False),
    Column("stream", String(200), nullable=False),
    Column("cursor", Text, nullable=False),
    # What the runtime's commit of that page writes besides the checkpoint (its dead
    # letters, its audit counts), as JSON: written there again if that commit was lost.
    Column("page", Text),
    Column("updated_at", UTCDateTime(), nullable=False),
    PrimaryKeyConstraint("tenant", "connector", "stream", name="pk_record_landings"),
)


def prepare_destination(conn: Connection) -> None:
    """Create, in a destination database, the tables synckit keeps there beside the
    records tables: ``record_tables`` (their columns, their change sequences) and
    :data:`record_landings`. Idempotent; under the schema lock."""
    from synckit.store.migrate import lock_schema  # (Alembic: only for this)

    lock_schema(conn)
    record_tables.create(conn, checkfirst=True)
    record_landings.create(conn, checkfirst=True)


def save_landing(
    conn: Connection,
    tenant: str,
    connector: str,
    stream: str,
    cursor: Any,
    now: dt.datetime,
    page: Any = None,
) -> None:
    """Store ``cursor`` as the stream's landed checkpoint, in the caller's transaction
    (the one landing the page's rows), and ``page``: what the runtime's commit of that
    page writes besides (JSON; values it cannot encode as text)."""
    values = {
        "cursor": json.dumps(cursor, sort_keys=True),
        "page": None if page is None else json.dumps(page, default=str),
        "updated_at": now,
    }
    done = conn.execute(
        record_landings.update()
        .where(record_landings.c.tenant == tenant)
        .where(record_landings.c.connector == connector)
        .where(record_landings.c.stream == stream)
        .values(**values)
    )
    if not done.rowcount:
        conn.execute(
            record_landings.insert().values(
                tenant=tenant, connector=connector, stream=stream, **values
            )
        )


#: :func:`read_landing` of a stream that has landed no checkpoint.
NO_LANDING: Any = object()


def read_landing(conn: Connection, tenant: str, connector: str, stream: str) -> Any:
    """The stream's landed checkpoint, or :data:`NO_LANDING`."""
    return read_landing_page(conn, tenant, connector, stream)[0]


def read_landing_page(
    conn: Connection, tenant: str, connector: str, stream: str
) -> tuple[Any, Any]:
    """The stream's landed checkpoint (or :data:`NO_LANDING`) and its page's ``page``
    (:func:`save_landing`; None)."""
    found = conn.execute(
        select(record_landings.c.cursor, record_landings.c.page)
        .where(record_landings.c.tenant == tenant)
        .where(record_landings.c.connector == connector)
        .where(record_landings.c.stream == stream)
    ).first()
    if found is None:
        return NO_LANDING, None
    return json.loads(found.cursor), None if found.page is None else json.loads(found.page)


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
        row = _raw(conn).execute(_TAKE_SQLITE, (n, table)).fetchone()
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
            f"CAST(:k{i} AS {_PG_ARRAY[_kind(spec, k)]}[])" for i, k in enumerate(keys)
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
        return int(_raw(conn).execute(self.seqs_sqlite, args).fetchone()[0])

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
            rows = _raw(conn).execute(self.children_sqlite, args).fetchall()
        return [(tuple(r[:n]), str(r[n])) for r in rows]

    # -- reads --

    def select_columns(self, columns: Sequence[ColumnSpec] | None = None) -> Table:
        return sa_table(self.spec, columns)


def _raw(conn: Connection) -> sqlite3.Connection:
    raw = conn.connection.driver_connection
    assert isinstance(raw, sqlite3.Connection)
    return raw


def _executemany(conn: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> int:
    """SQLite: ``executemany`` on the connection's own sqlite3 connection (SQLAlchemy's
    parameter handling cost more than the statement); how many rows it changed."""
    return int(_raw(conn).executemany(sql, rows).rowcount or 0)


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


# --- reads: rows and changes --------------------------------------------------------------


@dataclass(frozen=True)
class StoredRow:
    """A row of a records table, as read: the model's columns, and synckit's."""

    key: tuple[Any, ...]
    data: dict[str, Any]
    seq: int
    added_seq: int
    synced_at: dt.datetime
    deleted_at: dt.datetime | None


def _columns_for_read(recorded: Mapping[str, Any] | None, spec: TableSpec) -> Sequence[ColumnSpec]:
    if recorded is None:
        return spec.columns
    return _columns_of(recorded.get("columns", []))


_META = ("_synced_at", "_deleted_at", "_seq", "_added_seq")


def _json_value(v: Any) -> Any:
    return json.loads(v) if isinstance(v, str | bytes) else v


def _sqlite_time(v: Any) -> Any:
    if isinstance(v, str):
        parsed = dt.datetime.fromisoformat(v)
        return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed
    return v


def _stored(row: Any, spec: TableSpec, columns: Sequence[ColumnSpec]) -> StoredRow:
    m = row._mapping
    return StoredRow(
        key=tuple(m[k] for k in spec.key),
        data={c.name: m[c.name] for c in columns},
        seq=int(m["_seq"]),
        added_seq=int(m["_added_seq"]),
        synced_at=m["_synced_at"],
        deleted_at=m["_deleted_at"],
    )


async def read_changes(
    db: Database,
    spec: TableSpec,
    recorded: Mapping[str, Any] | None,
    tenant: str,
    *,
    since: int,
    limit: int,
) -> list[StoredRow]:
    """Rows of ``tenant`` whose ``_seq`` is past ``since``, in ``_seq`` order, at most
    ``limit`` (index ``(tenant, _seq)``)."""
    columns = _columns_for_read(recorded, spec)
    names = [*(c.name for c in columns), *_META]
    at = {n: i for i, n in enumerate(names)}
    sqlite_read: dict[str, Any] = {
        "json": _json_value,
        "timestamp": _sqlite_time,
        "bool": bool,
        "date": lambda v: dt.date.fromisoformat(v) if isinstance(v, str) else v,
        "decimal": lambda v: decimal.Decimal(str(v)),
    }

    def run(conn: Connection) -> list[StoredRow]:
        # The sqlite3 cursor itself, values decoded here: SQLAlchemy's result machinery
        # cost more than the index range it reads.
        sql = (
            f"SELECT {', '.join(names)} FROM {spec.table} WHERE tenant = ? AND _seq > ?"
            " ORDER BY _seq LIMIT ?"
        )
        out = []
        for r in _raw(conn).execute(sql, (tenant, since, limit)):
            data = {}
            for c in columns:
                v = r[at[c.name]]
                f = sqlite_read.get(c.kind)
                data[c.name] = f(v) if f is not None and v is not None else v
            n = len(columns)
            out.append(
                StoredRow(
                    key=tuple(data[k] for k in spec.key),
                    data=data,
                    seq=int(r[n + 2]),
                    added_seq=int(r[n + 3]),
                    synced_at=_sqlite_time(r[n]),
                    deleted_at=_sqlite_time(r[n + 1]) if r[n + 1] is not None else None,
                )
            )
        return out

    if db.is_postgres:
        # The app's hot read: one statement on asyncpg's own connection, atomic alone (no
        # BEGIN and COMMIT round trips), its rows decoded here. Through SQLAlchemy's
        # result machinery a page of 100 took ~8 ms on a busy 2-core machine, ~0.8 here.
        names = ["tenant", *(c.name for c in columns), *_META]
        sql = (
            f"SELECT {', '.join(names)} FROM {spec.table} WHERE tenant = $1 AND _seq > $2"
            " ORDER BY _seq LIMIT $3"
        )
        jsons = {c.name for c in columns if c.kind == "json"}
        async with db.raw_pg() as raw:
            found = await raw.fetch(sql, tenant, since, limit)
        out = []
        for r in found:
            data = {c.name: r[c.name] for c in columns}
            for name in jsons:  # SQLAlchemy's pool gives jsonb decoded; a bare one, text
                if isinstance(data[name], str):
                    data[name] = json.loads(data[name])
            out.append(
                StoredRow(
                    key=tuple(r[k] for k in spec.key),
                    data=data,
                    seq=int(r["_seq"]),
                    added_seq=int(r["_added_seq"]),
                    synced_at=r["_synced_at"],
                    deleted_at=r["_deleted_at"],
                )
            )
        return out
    return await db.run_read(run)


async def read_rows(
    db: Database,
    spec: TableSpec,
    recorded: Mapping[str, Any] | None,
    tenant: str,
    *,
    key: tuple[Any, ...] | None = None,
    deleted: bool = False,
    limit: int = 100,
) -> list[StoredRow]:
    """The rows of ``tenant`` (one, with ``key``), live ones unless ``deleted``, in key order."""
    columns = _columns_for_read(recorded, spec)
    t = sa_table(spec, columns)

    def run(conn: Connection) -> list[StoredRow]:
        q = select(t).where(t.c.tenant == tenant)
        if key is not None:
            for k, v in zip(spec.key, key, strict=True):
                q = q.where(t.c[k] == v)
        if not deleted:
            q = q.where(t.c["_deleted_at"].is_(None))
        q = q.order_by(*(t.c[k] for k in spec.key)).limit(limit)
        return [_stored(r, spec, columns) for r in conn.execute(q)]

    return await db.run_read(run)
