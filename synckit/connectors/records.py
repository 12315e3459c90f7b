"""Declared destinations: what a stream's records become, as data (no SQL here).

A stream that declares :class:`Records` hands its records to the runtime, which owns
the rest (:mod:`synckit.runtime.sync.records`, :mod:`synckit.store.records`)::

    class Message(BaseModel):
        id: str
        subject: str
        received_at: AwareDatetime = Field(alias="receivedDateTime")

    class Mail(Connector[MailConfig]):
        streams = (Stream("messages", records=Records(Message, table="mail_messages")),)

* ``synckit db upgrade --app myapp:app`` creates the table: the model's fields as columns
  (scalars typed, nested models, lists and dicts as JSON), plus ``tenant``,
  ``_synced_at``, ``_deleted_at``, ``_seq``, ``_added_seq`` and ``_sync``;
* each page's records are validated by the model and merged (upsert on tenant + key) in
  the page's transaction, with its checkpoint: one statement per table per page;
* ``map`` turns the API's JSON into the model's input, or drops a record (``None``);
  ``deleted`` says which records are deletions (``@removed``); ``children`` fan a record
  out into child tables (an invoice's lines) in the same transaction;
* ``sweep=True``: the last page of a full sync (``Page(full_sync=..., sweep=True)``)
  soft-deletes the rows that full sync did not see.

Everything here is pure: the column plan of a model, the rows of a page.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import json
import re
import types
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic_core
from pydantic import BaseModel, ValidationError

from synckit.errors.exceptions import ConfigurationError

__all__ = [
    "RESERVED_COLUMNS",
    "ColumnKind",
    "ColumnSpec",
    "Deleted",
    "PreparedRow",
    "Records",
    "TableSpec",
    "columns_of",
    "describe_record_error",
]

ColumnKind = Literal["text", "int", "float", "bool", "timestamp", "date", "decimal", "json"]

#: Columns synckit adds to every records table; a model field may not use these names.
RESERVED_COLUMNS = ("tenant", "_synced_at", "_deleted_at", "_seq", "_added_seq", "_sync", "_parent")

_TABLE = re.compile(r"[a-z][a-z0-9_]{0,62}", re.ASCII)
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}", re.ASCII)


@dataclass(frozen=True)
class Deleted:
    """What ``Records.map`` returns for a record that says its row is gone: the key's
    values (in ``key`` order)."""

    key: tuple[Any, ...]


@dataclass(frozen=True)
class Records:
    """Where a stream's records land (see the module docstring).

    ``model``: a pydantic model; its fields are the table's columns. ``table``: the
    table's name (lower case, unique in the app). ``key``: the field(s) naming a record
    within a tenant (default ``id``). ``map``: API JSON to the model's input, ``None`` to
    drop the record, or :class:`Deleted`. ``deleted``: a predicate on the API JSON for
    deletion records (their key is read from the record by the key fields' aliases).
    ``sweep``: rows a completed full sync did not see are soft-deleted. ``children``:
    child tables, each a ``Records`` with ``rows``, a function of the parent's (mapped)
    record giving its child records; a child's rows are replaced with its parent's.
    ``version``: a field (int, timestamp, date or text ordered as its value, such as
    ``updated_at``) that orders a record's versions; a record older than its row (or
    without a version, when the row has one) leaves the row as it is, whatever order
    webhook deliveries and poll pages arrive in.
    ``database``: the URL of another database (SQLite or PostgreSQL) to keep the tables
    in, children included (default: synckit's own database).
    """

    model: type[BaseModel]
    table: str
    key: str | tuple[str, ...] = "id"
    map: Callable[[Any], Any] | None = None
    deleted: Callable[[Any], bool] | None = None
    sweep: bool = False
    children: tuple[Records, ...] = ()
    rows: Callable[[Any], Iterable[Any]] | None = None
    version: str | None = None
    #: Another database (an SQLAlchemy URL, SQLite or PostgreSQL) to create the tables
    #: in; None: synckit's own. See "Records" in docs/architecture.md for what is atomic.
    database: str | None = None
    spec: TableSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"records table {self.table!r}"
        if not isinstance(self.table, str) or not _TABLE.fullmatch(self.table):
            raise ConfigurationError(
                f"records table name {self.table!r}: use lower-case letters, digits and '_' "
                "(at most 63, starting with a letter)"
            )
        if not (isinstance(self.model, type) and issubclass(self.model, BaseModel)):
            raise ConfigurationError(f"{where}: model must be a pydantic BaseModel subclass")
        keys = (self.key,) if isinstance(self.key, str) else tuple(self.key)
        object.__setattr__(self, "key", keys)
        object.__setattr__(self, "children", tuple(self.children))
        for child in self.children:
            if not isinstance(child, Records) or child.rows is None:
                raise ConfigurationError(
                    f"{where}: a child must be Records(..., rows=function of the parent)"
                )
            if child.sweep or child.children:
                raise ConfigurationError(f"{where}: a child table cannot sweep or have children")
            if child.database is not None:
                raise ConfigurationError(
                    f"{where}: a child table lands in its parent's database (drop its database=)"
                )
        if self.database is not None and not (
            isinstance(self.database, str)
            and self.database.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql")
        ):
            raise ConfigurationError(
                f"{where}: database must be an SQLite or PostgreSQL URL (sqlite:///path, "
                "postgresql://...)"
            )
        object.__setattr__(self, "spec", _spec_of(self))

    @property
    def keys(self) -> tuple[str, ...]:
        return typing.cast(tuple[str, ...], self.key)

    def tables(self) -> tuple[Records, ...]:
        """This declaration and its children, parent first."""
        return (self, *self.children)


@dataclass(frozen=True)
class ColumnSpec:
    """One column of a records table, from a model field."""

    name: str
    kind: ColumnKind
    nullable: bool
    #: The field's alias, when it has one (the API JSON's name for it).
    alias: str | None = None


@dataclass(frozen=True)
class TableSpec:
    """A records table as synckit creates it: the model's columns, and its key."""

    table: str
    columns: tuple[ColumnSpec, ...]
    key: tuple[str, ...]
    child: bool = False
    #: The column ordering a row's versions (``Records.version``), if any.
    version: str | None = None

    def column(self, name: str) -> ColumnSpec:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    def as_json(self) -> list[dict[str, Any]]:
        return [{"name": c.name, "kind": c.kind, "nullable": c.nullable} for c in self.columns]


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """The annotation without ``None`` in a union, and whether ``None`` was there."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        if len(args) == 1:
            inner, more = _unwrap(args[0])
            return inner, optional or more
        return annotation, optional
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    return annotation, False


def _kind_of(annotation: Any) -> ColumnKind:
    if typing.get_origin(annotation) is Literal:
        values = typing.get_args(annotation)
        if all(isinstance(v, str) for v in values):
            return "text"
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return "int"
        return "json"
    if not isinstance(annotation, type):
        return "json"
    if issubclass(annotation, bool):
        return "bool"
    if issubclass(annotation, enum.Enum):
        return "text"
    if issubclass(annotation, str | uuid.UUID):
        return "text"
    if issubclass(annotation, int):
        return "int"
    if issubclass(annotation, float):
        return "float"
    if issubclass(annotation, decimal.Decimal):
        return "decimal"
    if issubclass(annotation, dt.datetime):
        return "timestamp"
    if issubclass(annotation, dt.date):
        return "date"
    return "json"


def columns_of(model: type[BaseModel], *, where: str) -> tuple[ColumnSpec, ...]:
    """The columns of ``model``'s fields, in field order (a pure function of the model)."""
    out: list[ColumnSpec] = []
    for name, info in model.model_fields.items():
        if name in RESERVED_COLUMNS or name.startswith("_"):
            raise ConfigurationError(
                f"{where}: field {name!r} of {model.__name__} is a name synckit uses "
                f"({', '.join(RESERVED_COLUMNS)}); rename it (an alias keeps the API's name)"
            )
        if not _COLUMN.fullmatch(name):
            raise ConfigurationError(f"{where}: field {name!r} cannot be a column name")
        inner, optional = _unwrap(info.annotation)
        nullable = optional or not info.is_required()
        alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
        out.append(ColumnSpec(name, _kind_of(inner), nullable, alias))
    return tuple(out)


def _spec_of(r: Records) -> TableSpec:
    where = f"records table {r.table!r}"
    columns = columns_of(r.model, where=where)
    names = {c.name: c for c in columns}
    for k in r.keys:
        c = names.get(k)
        if c is None:
            raise ConfigurationError(
                f"{where}: key field {k!r} is not a field of {r.model.__name__}"
            )
        if c.kind not in ("text", "int") or c.nullable:
            raise ConfigurationError(
                f"{where}: key field {k!r} must be a required str or int field"
            )
    if r.version is not None:
        v = names.get(r.version)
        if v is None:
            raise ConfigurationError(
                f"{where}: version field {r.version!r} is not a field of {r.model.__name__}"
            )
        if v.kind not in ("int", "timestamp", "date", "text") or r.version in r.keys:
            raise ConfigurationError(
                f"{where}: version field {r.version!r} must be an int, datetime, date or str "
                "field outside the key"
            )
    return TableSpec(r.table, columns, r.keys, child=r.rows is not None, version=r.version)


def describe_record_error(exc: ValidationError, *, whole: str = "(record)") -> str:
    """One line naming every field at fault: ``subject: Field required; ...`` (an error
    of no one field is named ``whole``)."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ())) or whole
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or str(exc).splitlines()[0]


# --- a record as row values ------------------------------------------------------------


def _text(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, enum.Enum):
        return str(v.value)
    return str(v)


def _json(v: Any) -> Any:
    return None if v is None else pydantic_core.to_json(v).decode()


def _same(v: Any) -> Any:
    return v


def _timestamp(v: Any) -> Any:
    if isinstance(v, dt.datetime) and v.tzinfo is None:
        # A naive time is taken as UTC (the model did not ask for AwareDatetime).
        return v.replace(tzinfo=dt.UTC)
    return v


def _float(v: Any) -> Any:
    return None if v is None else float(v)


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "text": _text,
    "int": _same,
    "float": _float,
    "bool": _same,
    "timestamp": _timestamp,
    "date": _same,
    "decimal": _same,
    "json": _json,
}


def _validators(model: type[BaseModel]) -> bool:
    d = model.__pydantic_decorators__
    return bool(d.field_validators or d.model_validators or d.validators or d.root_validators)


#: Column kinds whose validated values are stored as they are.
_STORED_AS_VALIDATED = frozenset(("int", "bool", "date", "decimal", "float"))


def converters(
    spec: TableSpec, model: type[BaseModel] | None = None
) -> tuple[tuple[str, Callable[[Any], Any] | None], ...]:
    """``(field, value -> column value)`` for each column of ``spec``, in order; None
    for a column whose validated value is stored as it is (numbers, dates and, given the
    ``model``, the text of a field declared ``str``, which pydantic gives as a ``str``
    when no validator of the model's may return something else)."""
    fields = model.model_fields if model is not None and not _validators(model) else {}
    out: list[tuple[str, Callable[[Any], Any] | None]] = []
    for c in spec.columns:
        info = fields.get(c.name)
        plain_text = (
            c.kind == "text"
            and info is not None
            and not info.metadata
            and _unwrap(info.annotation)[0] is str
        )
        same = c.kind in _STORED_AS_VALIDATED or plain_text
        out.append((c.name, None if same else _CONVERT[c.kind]))
    return tuple(out)


@dataclass(frozen=True)
class PreparedRow:
    """A validated record as column values (``spec.columns`` order), with its key."""

    key: tuple[Any, ...]
    values: tuple[Any, ...]


def key_from_raw(raw: Any, spec: TableSpec) -> tuple[Any, ...] | None:
    """The key of a raw API record (a deletion marker), by the key fields' aliases or
    names; None when it has none."""
    if not isinstance(raw, Mapping):
        return None
    out: list[Any] = []
    for k in spec.key:
        c = spec.column(k)
        value = raw.get(c.alias) if c.alias and c.alias in raw else raw.get(k)
        if value is None:
            return None
        if c.kind == "text":
            value = str(value)
        elif c.kind == "int":
            try:
                value = int(value)
            except (TypeError, ValueError):
                return None
        out.append(value)
    return tuple(out)


def key_text(key: Sequence[Any]) -> str:
    """A key as the text stored in a child row's ``_parent``."""
    return json.dumps(list(key), separators=(",", ":"), default=str)
