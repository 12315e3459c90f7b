"""Records tables' schema: a stream's :class:`~synckit.connectors.records.Records`
declaration becomes a table here (:func:`upgrade_tables`, run by ``synckit db upgrade
--app``), registered in ``record_tables`` with the columns it was created with. Every row
carries ``tenant``, the model's columns, ``_synced_at`` (when a sync last changed it),
``_deleted_at`` (soft delete), ``_seq`` (the table's change sequence at its last change),
``_added_seq`` (at its first), ``_sync`` (the full sync that last saw it) and, in a child
table, ``_parent`` (its parent's key). A destination database (records tables in another
database) keeps its own ``record_landings``: where each stream's landing stands.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
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
)
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateIndex, CreateTable

from synckit.errors.exceptions import RecordsSchemaError
from synckit.store.db import Database
from synckit.store.tables import JSONType, UTCDateTime, record_tables


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


def kind_of(spec: TableSpec, name: str) -> str:
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


def columns_of(recorded: Sequence[Mapping[str, Any]]) -> tuple[ColumnSpec, ...]:
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
