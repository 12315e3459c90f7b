"""Stored values read so that one corrupt row cannot fail a statement: timestamps
guarded in SQL (:func:`guarded_moment`) and parsed per row (:func:`read_moment`), JSON
read as text and parsed per row (:func:`read_payload`), and the NUL check of JSON text
before it is stored (:func:`json_holds_nul`), text made storable on both engines
(:func:`storable_text`), and a row read into a dataclass of the same field names
(:func:`from_row`). Every store module reads through these."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Text, and_, case, cast, literal_column, type_coerce

from synckit.store.tables import UTCDateTime

_D = TypeVar("_D")

__all__ = [
    "MOMENT_HI",
    "MOMENT_LO",
    "OUT_OF_RANGE",
    "OUT_OF_RANGE_SQL",
    "REPLACEMENT",
    "from_row",
    "guarded_columns",
    "guarded_moment",
    "json_holds_nul",
    "read_moment",
    "read_payload",
    "storable_text",
]

# Timestamps a Python datetime can hold, in any offset: PostgreSQL stores years up to
# 294276 and BC ones, which the driver cannot give back (it raises while fetching, so one
# such row would fail the whole statement). Literal text compares as time on PostgreSQL
# and as text on SQLite, where synckit stores fixed-width ISO text.
MOMENT_LO = "'0001-01-02 00:00:00+00:00'"
MOMENT_HI = "'9999-12-30 00:00:00+00:00'"
#: What :func:`guarded_moment` gives for a stored value out of that range.
OUT_OF_RANGE = datetime(2, 2, 2, 2, 2, 2, 20202, tzinfo=UTC)
OUT_OF_RANGE_SQL = "'0002-02-02 02:02:02.020202+00:00'"


def guarded_moment(col: Any) -> Any:
    """``col`` for a read that must survive a corrupt row: the stored value as the driver
    has it (text on SQLite, a datetime on PostgreSQL), :data:`OUT_OF_RANGE` when no
    datetime can hold it; parse it with :func:`read_moment`."""
    in_range = and_(col >= literal_column(MOMENT_LO), col <= literal_column(MOMENT_HI))
    return type_coerce(
        case((col.is_(None), None), (in_range, col), else_=literal_column(OUT_OF_RANGE_SQL)),
        Text,
    ).label(col.name)


def guarded_columns(columns: Iterable[Any], *, as_text: Iterable[str] = ()) -> list[Any]:
    """``columns`` for a read that must survive a corrupt row: timestamps guarded
    (:func:`guarded_moment`) and the columns named in ``as_text`` (JSON) cast to text, each
    parsed per row by the reader, since the drivers would fail the whole fetch on one
    corrupt value."""
    text_names = frozenset(as_text)
    return [
        cast(c, Text).label(c.name)
        if c.name in text_names
        else guarded_moment(c)
        if isinstance(c.type, UTCDateTime)
        else c
        for c in columns
    ]


def read_moment(value: object) -> datetime | None:
    """A timestamp read through :func:`guarded_moment`: UTC aware, or ``ValueError``
    naming what is stored instead."""
    if value is None:
        return None
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"not a timestamp: {value[:60]!r}") from None
    else:
        raise ValueError(f"not a timestamp: {str(value)[:60]!r}")
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
    if moment == OUT_OF_RANGE:
        raise ValueError("a timestamp out of range")
    try:
        return moment.astimezone(UTC)
    except OverflowError:  # '0001-01-01T00:00+14:00' has no UTC moment
        raise ValueError(f"not a timestamp: {str(value)[:60]!r}") from None


def read_moments(
    row: Mapping[Any, Any], names: Iterable[str], bad: dict[str, str]
) -> dict[str, datetime | None]:
    """The timestamps ``names`` of ``row`` (a row's ``_mapping``), each read by
    :func:`read_moment`; one that cannot be read is None, its reason put in ``bad``."""
    moments: dict[str, datetime | None] = {}
    for name in names:
        try:
            moments[name] = read_moment(row[name])
        except ValueError as exc:
            moments[name], bad[name] = None, str(exc)
    return moments


def from_row(cls: type[_D], row: Any, **given: Any) -> _D:
    """The dataclass ``cls`` built from a stored row: each field not ``given`` is the
    row's attribute of the same name (a row of a ``select`` or a mapped record)."""
    names = _init_fields(cls)  # type: ignore[arg-type]  # a class is hashable
    taken = {name: getattr(row, name) for name in names if name not in given}
    return cls(**taken, **given)


@functools.cache
def _init_fields(cls: type) -> tuple[str, ...]:
    """The names of the dataclass ``cls``'s fields its constructor takes (read once: a
    claim builds a job from every row it claims)."""
    return tuple(f.name for f in fields(cls) if f.init)


def read_payload(value: object) -> Any:
    """A JSON column read as text (``cast(col, Text)``): the value, or
    ``ValueError`` naming why not. JSONB holds only valid JSON, yet a number of 5,000
    digits in it is past what Python's ``json`` reads."""
    if not isinstance(value, str):
        return value  # a driver that decoded it already
    try:
        return json.loads(value)
    except RecursionError:
        raise ValueError("payload nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"payload is not JSON: {str(exc)[:120]}") from None


#: An unescaped NUL in serialised JSON: an odd run of backslashes before ``u0000``.
NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def json_holds_nul(text: str) -> bool:
    """Whether JSON text (as :func:`json.dumps` writes it) holds a NUL character, which
    PostgreSQL's jsonb refuses: refused on every engine, so that an application is
    portable instead of failing only in production."""
    return "\\u0000" in text and NUL_ESCAPE.search(text) is not None


#: What a NUL or a lone surrogate in a stored text becomes (see :func:`storable_text`).
REPLACEMENT = "\ufffd"


def storable_text(text: str) -> str:
    """``text`` with every NUL and lone surrogate replaced by U+FFFD.

    PostgreSQL's ``text`` and ``jsonb`` refuse NUL, and no driver encodes a lone
    surrogate as UTF-8: a record carrying either would fail its page's commit on every
    retry. U+FFFD, not an escape such as ``\\u0000``: it is Unicode's own mark for "a
    character that could not be represented", so nobody reads it as what the API sent
    (a literal ``\\u0000`` is six ordinary characters an API can send, and a replay would
    hand them to ``handle()`` as if it had), and it is one character, so no limit moves.
    """
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Pairs join into their character, lone halves become U+FFFD.
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
