"""Many rows as one parameter: the source of rows of the set-based statements.

PostgreSQL takes one array per column (``unnest``), SQLite one JSON array of rows
(``json_each``). Either way the parameter count never depends on how many rows a statement
handles, and its text is the same for every call, so each statement is prepared once.
Used by the DLQ's capture, the scheduler's poll ticks and the bulk tenant import.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.dialects import sqlite

from synckit.store.tables import UTCDateTime

__all__ = ["RowStatements", "list_param", "rows_params", "rows_source"]

_SQLITE = sqlite.dialect()
# The text SQLite stores for a timestamp (json_each hands values over as they are).
_SQLITE_TS: Any = UTCDateTime().dialect_impl(_SQLITE).bind_processor(_SQLITE)


def rows_source(postgres: bool, cols: Sequence[tuple[str, str]]) -> str:
    """A FROM item ``v`` with the columns ``cols`` (name, PostgreSQL type), one row per
    element of the parameters :func:`rows_params` gives."""
    names = ", ".join(n for n, _ in cols)
    if postgres:
        arrays = ", ".join(f"CAST(:{n} AS {t}[])" for n, t in cols)
        return f"unnest({arrays}) AS v({names})"
    picks = ", ".join(f"json_extract(value, '$[{i}]') AS {n}" for i, (n, _) in enumerate(cols))
    return f"(SELECT {picks} FROM json_each(:rows)) AS v"


def rows_params(
    postgres: bool, cols: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
) -> dict[str, Any]:
    """The parameters of :func:`rows_source` ``(cols)`` for ``rows`` (values in ``cols``
    order); on SQLite, the ``timestamptz`` columns' values as the text SQLite stores (only
    theirs are looked at: a check of every value cost a tenth of a bulk tenant import)."""
    if postgres:
        return {n: [r[i] for r in rows] for i, (n, _) in enumerate(cols)}
    stamps = [i for i, (_, t) in enumerate(cols) if t == "timestamptz"]
    if stamps:
        rows = [_stored_stamps(r, stamps) for r in rows]
    return {"rows": json.dumps(rows)}


def _stored_stamps(row: Sequence[Any], stamps: Sequence[int]) -> list[Any]:
    out = list(row)
    for i in stamps:
        if isinstance(out[i], datetime):
            out[i] = _SQLITE_TS(out[i])
    return out


def list_param(postgres: bool, values: Sequence[Any]) -> Any:
    """One list as one parameter: an array, or a JSON array on SQLite (``json_each``)."""
    return list(values) if postgres else json.dumps(list(values))


class RowStatements:
    """The base of a set of statements built once per engine (``postgres``) that read
    rows through :func:`rows_source` (the DLQ capture's, the scheduler's poll ticks')."""

    def __init__(self, postgres: bool) -> None:
        self.postgres = postgres

    def source(self, cols: Sequence[tuple[str, str]]) -> str:
        """The FROM item ``v`` of the rows ``cols`` (:func:`rows_source`)."""
        return rows_source(self.postgres, cols)

    def rows(
        self, cols: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
    ) -> dict[str, Any]:
        """The parameters for ``rows`` of a statement that reads :meth:`source` ``(cols)``."""
        return rows_params(self.postgres, cols, rows)
