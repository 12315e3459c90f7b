"""Landing a page's records in their declared tables, in the page's transaction.

:func:`prepare` runs in the cycle's task, before the commit: it maps and validates a
page's records (:class:`~synckit.connectors.records.Records`) into the rows of each table,
and the failures of the records the model refuses (a dead letter naming the fields).
:func:`land` runs inside the page's transaction (``page_commit._commit_page``): per table, it
takes the rows' change sequence numbers, merges the rows in one statement, soft-deletes
the deleted ones and the children their parents no longer have, and, on the last page
of a full sync, sweeps what that sync did not see. A row the database refuses (a NUL, a
constraint) fails alone: the batch is rolled back to its savepoint and its rows are
landed one by one, each in its own; the refused ones become dead letters in the same
transaction.

:class:`RecordsReader` is the app's read side (``app.records(tenant, stream)``): rows,
and changes since a cursor.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import operator
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from synckit.connectors.records import (
    Deleted,
    Records,
    TableSpec,
    converters,
    describe_record_error,
    key_from_raw,
    key_text,
)
from synckit.errors.exceptions import ConfigurationError, PermanentError
from synckit.store.db import Database, SyncConn, open_database
from synckit.store.db_errors import savepoint
from synckit.store.records import reads as record_reads
from synckit.store.records import schema as record_schema
from synckit.store.records import statements as record_sql

__all__ = [
    "Change",
    "Changes",
    "Landing",
    "RecordsReader",
    "destination",
    "land",
    "prepare",
]

FailureOf = Callable[[Any, Exception], Any]  # (raw record, exception) -> RecordFailure


@dataclass
class _Batch:
    """One table's part of a page."""

    spec: TableSpec
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    keys: list[tuple[Any, ...]] = field(default_factory=list)
    #: the index in Landing.raws of the record each row came from
    owners: list[int] = field(default_factory=list)
    #: child tables: each row's parent key (text)
    parents: list[str] = field(default_factory=list)
    deletes: list[tuple[Any, ...]] = field(default_factory=list)
    #: child tables: parents whose children this page replaces (upserted or deleted)
    replaced: list[str] = field(default_factory=list)


@dataclass
class Landing:
    """What a page lands: rows per table (the declared table first, then its children),
    prepared before the commit; :func:`land` fills in ``refused`` and ``changed``."""

    tenant: str
    stream: str
    decl: Records
    batches: list[_Batch]
    raws: list[Any]
    failure_of: FailureOf
    sync: str | None = None
    sweep: bool = False
    #: keys of records that failed in a full sync: their rows still exist (no sweep)
    failed_keys: list[tuple[Any, ...]] = field(default_factory=list)
    refused: list[Any] = field(default_factory=list)
    refused_owners: set[int] = field(default_factory=set)
    changed: int = 0
    #: PostgreSQL: listeners were notified of this page's changes (the merge did it)
    notified: bool = False

    @property
    def tables(self) -> list[str]:
        return [b.spec.table for b in self.batches]


@dataclass(frozen=True)
class _Shape:
    """How a validated model becomes a row: its fields' values in column order (one C
    call), then the few columns that need converting (JSON, text from enums, times)."""

    values: Callable[[Any], tuple[Any, ...]]
    fixes: tuple[tuple[int, Callable[[Any], Any]], ...]
    key: Callable[[Any], tuple[Any, ...]]


def _shape(spec: TableSpec, model: type[BaseModel]) -> _Shape:
    names = [c.name for c in spec.columns]
    fixes = tuple((i, f) for i, (_, f) in enumerate(converters(spec, model)) if f is not None)
    get = operator.itemgetter(*names)
    getkey = operator.itemgetter(*spec.key)
    return _Shape(
        values=(lambda d: get(d)) if len(names) > 1 else (lambda d: (get(d),)),
        fixes=fixes,
        key=(lambda d: getkey(d)) if len(spec.key) > 1 else (lambda d: (getkey(d),)),
    )


def _conversions(decl: Records) -> dict[str, _Shape]:
    cached = decl.__dict__.get("_conversions")
    if cached is None:
        cached = {r.table: _shape(r.spec, r.model) for r in decl.tables()}
        object.__setattr__(decl, "_conversions", cached)
    return cached


def _validate_page(decl: Records, records: Sequence[Any]) -> list[Any] | None:
    """The page's records validated by ``decl.model`` in one call (a list adapter: a
    call per record cost ~1 µs more), when they go to the model as they are (no
    ``deleted``, no ``map``); None when one of them is refused (each is then validated
    alone, for its own error) or they do not go as they are."""
    if decl.deleted is not None or decl.map is not None or len(records) < 2:
        return None
    if "_page_adapter" not in decl.__dict__:
        model = decl.model
        # A model with a model_validate of its own is asked record by record.
        own = getattr(model.model_validate, "__func__", None) is not _MODEL_VALIDATE
        made = None if own else TypeAdapter(list[model])  # type: ignore[valid-type]
        object.__setattr__(decl, "_page_adapter", made)
    adapter: TypeAdapter[list[Any]] | None = decl.__dict__["_page_adapter"]
    if adapter is None:
        return None
    try:
        out: list[Any] = adapter.validate_python(records)
    except ValidationError:
        return None
    return out


_R = TypeVar("_R")

_MODEL_VALIDATE = BaseModel.model_validate.__func__  # type: ignore[attr-defined]


def _row(obj: Any, spec: TableSpec, shape: _Shape) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    d = obj.__dict__
    values = shape.values(d)
    if shape.fixes:
        out = list(values)
        for i, f in shape.fixes:
            out[i] = f(out[i])
        values = tuple(out)
    return shape.key(d), values


def _refusal(decl: Records, exc: ValidationError) -> PermanentError:
    return PermanentError(
        f"{decl.model.__name__} refused the record: {describe_record_error(exc)}"[:2000]
    )


def _child_rows(decl: Records, data: Any, conv: dict[str, _Shape]) -> list[list[Any]]:
    """The rows of each child table of one mapped record (raises the refusal of a child
    the model refuses)."""
    kids: list[list[Any]] = []
    for child in decl.children:
        assert child.rows is not None
        crows: list[Any] = []
        cconv = conv[child.table]
        for c in child.rows(data) or ():
            try:
                cobj = child.model.model_validate(c)
            except ValidationError as exc:
                raise _refusal(child, exc) from None
            crows.append(_row(cobj, child.spec, cconv))
        kids.append(crows)
    return kids


def _batches(
    decl: Records,
    upserts: dict[tuple[Any, ...], tuple[int, tuple[Any, ...], list[list[Any]]]],
    deletes: dict[tuple[Any, ...], int],
) -> tuple[_Batch, list[_Batch]]:
    """The parent table's batch and each child table's, from the page's kept upserts and
    deletes."""
    parent = _Batch(decl.spec)
    children = [_Batch(c.spec) for c in decl.children]
    for key, (i, values, kids) in upserts.items():
        parent.rows.append(values)
        parent.keys.append(key)
        parent.owners.append(i)
        if not children:
            continue
        pkey = key_text(key)
        for batch, crows in zip(children, kids, strict=True):
            batch.replaced.append(pkey)
            seen: dict[tuple[Any, ...], int] = {}
            for ckey, cvalues in crows:
                if ckey in seen:  # one child twice: the last wins
                    batch.rows[seen[ckey]] = cvalues
                    continue
                seen[ckey] = len(batch.rows)
                batch.rows.append(cvalues)
                batch.keys.append(ckey)
                batch.owners.append(i)
                batch.parents.append(pkey)
    for key in deletes:
        parent.deletes.append(key)
        for batch in children:
            batch.replaced.append(key_text(key))
    return parent, children


def prepare(
    decl: Records,
    tenant: str,
    stream: str,
    records: Sequence[Any],
    failure_of: FailureOf,
    *,
    sync: str | None = None,
    sweep: bool = False,
) -> tuple[Landing, list[Any], list[int]]:
    """The page's :class:`Landing`, the failures of the records that cannot land (the
    model refused them, or ``map`` raised), and the indexes in ``records`` of those."""
    conv = _conversions(decl)
    model = decl.model
    validate = model.model_validate
    spec = decl.spec
    pconv = conv[decl.table]
    failures: list[Any] = []
    failed: list[int] = []
    # Later records of one key win (an upsert may not touch one row twice).
    upserts: dict[tuple[Any, ...], tuple[int, tuple[Any, ...], list[list[Any]]]] = {}
    deletes: dict[tuple[Any, ...], int] = {}
    failed_keys: list[tuple[Any, ...]] = []
    # With a version column, the newest record of a key wins, whatever its place.
    vi = [c.name for c in spec.columns].index(spec.version) if spec.version is not None else None
    validated = _validate_page(decl, records)
    for i, raw in enumerate(records):
        try:
            if decl.deleted is not None and decl.deleted(raw):
                key = key_from_raw(raw, spec)
                if key is None:
                    raise PermanentError(
                        f"a deleted record without its key ({', '.join(spec.key)})"
                    )
                upserts.pop(key, None)
                deletes[key] = i
                continue
            data = decl.map(raw) if decl.map is not None else raw
            if data is None:
                continue  # dropped by the mapping
            if isinstance(data, Deleted):
                key = tuple(data.key)
                upserts.pop(key, None)
                deletes[key] = i
                continue
            try:
                obj = validate(data) if validated is None else validated[i]
            except ValidationError as exc:
                raise _refusal(decl, exc) from None
            key, values = _row(obj, spec, pconv)
            kids = _child_rows(decl, data, conv)
        except Exception as exc:
            failures.append(failure_of(raw, exc))
            failed.append(i)
            if sync is not None and (k := key_from_raw(raw, spec)) is not None:
                failed_keys.append(k)
            continue
        if vi is not None and key in upserts:
            seen_v, new_v = upserts[key][1][vi], values[vi]
            if seen_v is not None and (new_v is None or new_v < seen_v):
                continue  # older than a record of the same key on this page
        deletes.pop(key, None)
        upserts.pop(key, None)  # re-inserted last: the row keeps the last record's place
        upserts[key] = (i, values, kids)
    parent, children = _batches(decl, upserts, deletes)
    landing = Landing(
        tenant=tenant,
        stream=stream,
        decl=decl,
        batches=[parent, *children],
        raws=list(records),
        failure_of=failure_of,
        sync=sync if decl.sweep else None,
        sweep=sweep,
        failed_keys=failed_keys,
    )
    return landing, failures, failed


# --- another database ------------------------------------------------------------------------

_DESTINATIONS: dict[str, tuple[asyncio.AbstractEventLoop, Database]] = {}


def destination(decl: Records) -> Database | None:
    """The database ``decl``'s tables live in when it is not synckit's own
    (``Records(database=URL)``): one engine per URL and event loop, opened on first use."""
    if decl.database is None:
        return None
    loop = asyncio.get_running_loop()
    found = _DESTINATIONS.get(decl.database)
    if found is None or found[0] is not loop:
        found = (loop, open_database(decl.database))
        _DESTINATIONS[decl.database] = found
    return found[1]


# --- in the page's transaction -------------------------------------------------------------


def _refuse(landing: Landing, owner: int, table: str, exc: BaseException) -> None:
    if owner in landing.refused_owners:
        return
    landing.refused_owners.add(owner)
    line = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    reason = line[0][:500] if line else type(exc).__name__
    err = PermanentError(f"the database refused the record ({table}): {reason}")
    landing.refused.append(landing.failure_of(landing.raws[owner], err))


def _upsert_taking(conn: SyncConn, landing: Landing, n: int, now: dt.datetime) -> int:
    """PostgreSQL, a page of one table with rows: merge them taking the page's ``n`` seqs
    and notifying in the same statement (:meth:`TableSql.upsert_taking`), in a savepoint;
    the first seq. When the database refuses a row, that is rolled back (the seqs with
    it), the seqs are taken again and each record lands alone, as in :func:`_upsert_all`."""
    batch = landing.batches[0]
    sql = record_sql.table_sql(batch.spec, True)
    try:
        with savepoint(conn):
            base, changed = sql.upsert_taking(
                conn, landing.tenant, batch.rows, n=n, now=now, sync=landing.sync,
                notify=landing.stream,
            )  # fmt: skip
        landing.changed += changed
        landing.notified = changed > 0
        return base
    except Exception as exc:
        if not record_sql.is_record_error(conn, exc):
            raise
    base = record_sql.take_seqs(conn, batch.spec.table, n)
    _upsert_all(conn, landing, [(batch, base)], now, batch_first=False)
    return base


def _upsert_all(
    conn: SyncConn,
    landing: Landing,
    parts: Sequence[tuple[_Batch, int]],
    now: dt.datetime,
    *,
    batch_first: bool = True,
) -> None:
    """Merge the rows of every table of the page (``parts``: each batch, and the first of
    its seqs): one statement per table, all in one savepoint. When the database refuses
    a row (or at once, without ``batch_first``), that is rolled back and each record
    lands alone, in its own savepoint, with its child rows: a record and its children
    land together or fail together."""
    postgres = conn.dialect.name == "postgresql"
    sqls = [record_sql.table_sql(batch.spec, postgres) for batch, _ in parts]
    try:
        if batch_first:
            changed = 0
            with savepoint(conn):
                for sql, (batch, base) in zip(sqls, parts, strict=True):
                    changed += sql.upsert(
                        conn, landing.tenant, batch.rows, base=base, now=now,
                        sync=landing.sync,
                        parents=batch.parents if batch.spec.child else None,
                    )  # fmt: skip
            landing.changed += changed
            return
    except Exception as exc:
        if not record_sql.is_record_error(conn, exc):
            raise
    # One record at a time: its rows in every table (by the record they came from).
    by_owner: dict[int, list[tuple[int, int]]] = {}
    for t, (batch, _) in enumerate(parts):
        for i, owner in enumerate(batch.owners):
            by_owner.setdefault(owner, []).append((t, i))
    for owner, places in by_owner.items():
        changed = 0
        at = 0
        try:
            with savepoint(conn):
                for at, i in places:
                    batch, base = parts[at]
                    changed += sqls[at].upsert_row(
                        conn, landing.tenant, batch.rows[i], seq=base + i, now=now,
                        sync=landing.sync,
                        parent=batch.parents[i] if batch.spec.child else None,
                    )  # fmt: skip
        except Exception as exc:
            if not record_sql.is_record_error(conn, exc):
                raise
            _refuse(landing, owner, parts[at][0].spec.table, exc)
            continue
        landing.changed += changed


def land(conn: SyncConn, landing: Landing, now: dt.datetime) -> None:
    """Land ``landing`` in the caller's transaction (see the module docstring); the
    records the database refused are in ``landing.refused`` after it."""
    landing.refused = []
    landing.refused_owners = set()
    landing.changed = 0
    landing.notified = False
    postgres = conn.dialect.name == "postgresql"
    parent, children = landing.batches[0], landing.batches[1:]
    if children:  # the tables' sequences in name order, as every group takes them
        record_sql.lock_seqs(conn, landing.tables)
    psql = record_sql.table_sql(parent.spec, postgres)
    n = len(parent.rows) + len(parent.deletes)
    # One table on PostgreSQL: the seqs taken by the merge's own statement.
    taking = postgres and not children and bool(parent.rows)
    if taking:
        pbase = _upsert_taking(conn, landing, n, now)
    else:
        pbase = record_sql.take_seqs(conn, parent.spec.table, n) if n else 0
    parts: list[tuple[_Batch, int]] = [(parent, pbase)]
    # Child rows of the replaced parents that this page does not land again: deleted,
    # unless their parent is refused (it keeps its rows as they were).
    stale: list[list[tuple[tuple[Any, ...], str]]] = []
    for batch in children:
        csql = record_sql.table_sql(batch.spec, postgres)
        landed = set(batch.keys)
        gone = [
            (k, p)
            for k, p in csql.children(conn, landing.tenant, batch.replaced)
            if k not in landed
        ]
        n = len(batch.rows) + len(gone)
        parts.append((batch, record_sql.take_seqs(conn, batch.spec.table, n) if n else 0))
        stale.append(gone)
    if not taking:
        _upsert_all(conn, landing, [(b, base) for b, base in parts if b.rows], now)
    if parent.deletes:
        landing.changed += psql.delete(
            conn, landing.tenant, parent.deletes, base=pbase + len(parent.rows), now=now
        )
    swept: list[tuple[Any, ...]] = []
    if landing.sync is not None:
        if landing.failed_keys or landing.refused_owners:
            keys = list(landing.failed_keys)
            keys += [
                parent.keys[i]
                for i, owner in enumerate(parent.owners)
                if owner in landing.refused_owners
            ]
            psql.touch(conn, landing.tenant, keys, landing.sync)
        if landing.sweep:
            swept = psql.unswept(conn, landing.tenant, landing.sync)
            if swept:
                base = record_sql.take_seqs(conn, parent.spec.table, len(swept))
                landing.changed += psql.delete(conn, landing.tenant, swept, base=base, now=now)
    refused_parents = {
        key_text(parent.keys[i]) for i, o in enumerate(parent.owners) if o in landing.refused_owners
    }
    for (batch, base), gone in zip(parts[1:], stale, strict=True):
        csql = record_sql.table_sql(batch.spec, postgres)
        keys = [k for k, p in gone if p not in refused_parents]
        if keys:
            landing.changed += csql.delete(
                conn, landing.tenant, keys, base=base + len(batch.rows), now=now
            )
        if swept:
            orphans = [
                k for k, _ in csql.children(conn, landing.tenant, [key_text(k) for k in swept])
            ]
            if orphans:
                more = record_sql.take_seqs(conn, batch.spec.table, len(orphans))
                landing.changed += csql.delete(conn, landing.tenant, orphans, base=more, now=now)
    if landing.changed and postgres and not landing.notified:
        record_sql.notify_changes(conn, landing.tenant, landing.stream)


# --- reading ---------------------------------------------------------------------------------

Op = Literal["added", "updated", "deleted"]


@dataclass(frozen=True)
class Change:
    """One row as it changed: ``op`` is ``added`` (new since the reader's cursor),
    ``updated`` or ``deleted``; ``data`` is the row's columns (as last written)."""

    op: Op
    key: tuple[Any, ...]
    seq: int
    synced_at: dt.datetime
    data: dict[str, Any]


@dataclass(frozen=True)
class Changes:
    """A page of changes, and the cursor to read the next page from (``more``: there may
    be more now)."""

    changes: list[Change]
    cursor: int
    more: bool


class RecordsReader:
    """The rows of one tenant's stream, for the app (``app.records(tenant, stream)``)."""

    def __init__(
        self,
        db: Database | Callable[[], Awaitable[Database]],
        decl: Records,
        tenant: str,
    ) -> None:
        self._db = db
        self.decl = decl
        self.tenant = tenant
        self._spec: Any = None  # the table's columns as created, read once

    async def database(self) -> Database:
        return self._db if isinstance(self._db, Database) else await self._db()

    async def _recorded(self) -> Any:
        if self._spec is not None:
            return self._spec
        recorded = await record_schema.recorded_spec(await self.database(), self.decl.table)
        if recorded is None:
            raise ConfigurationError(
                f"records table {self.decl.table!r} does not exist: run "
                "`synckit db upgrade --app ...`"
            )
        self._spec = recorded
        return recorded

    async def _read(self, read: Callable[..., Awaitable[_R]], **kw: Any) -> _R:
        """``read`` (a read of :mod:`synckit.store.records.reads`) of this tenant's rows."""
        return await read(
            await self.database(), self.decl.spec, await self._recorded(), self.tenant, **kw
        )

    async def changes(self, since: int = 0, limit: int = 100) -> Changes:
        """The changes after cursor ``since`` (0: from the start), oldest first, at most
        ``limit``; read the next page from the returned cursor. A row changed several
        times since the cursor appears once, as it is now."""
        if not isinstance(since, int) or since < 0:
            raise ConfigurationError(f"cursor {since!r}: expected a non-negative integer")
        limit = max(1, min(int(limit), 10_000))
        rows = await self._read(record_reads.read_changes, since=since, limit=limit)
        out = [
            Change(
                op="deleted"
                if r.deleted_at is not None
                else ("added" if r.added_seq > since else "updated"),
                key=r.key,
                seq=r.seq,
                synced_at=r.synced_at,
                data=r.data,
            )
            for r in rows
        ]
        return Changes(out, out[-1].seq if out else since, len(out) == limit)

    async def rows(self, *, deleted: bool = False, limit: int = 100) -> list[dict[str, Any]]:
        """The tenant's rows in key order (live ones unless ``deleted``), at most ``limit``."""
        found = await self._read(record_reads.read_rows, deleted=deleted, limit=limit)
        return [_with_meta(r) for r in found]

    async def get(self, *key: Any) -> dict[str, Any] | None:
        """The row of ``key`` (deleted or not), or None."""
        found = await self._read(record_reads.read_rows, key=tuple(key), deleted=True, limit=1)
        return _with_meta(found[0]) if found else None


def _with_meta(r: record_reads.StoredRow) -> dict[str, Any]:
    return {**r.data, "_seq": r.seq, "_synced_at": r.synced_at, "_deleted_at": r.deleted_at}
