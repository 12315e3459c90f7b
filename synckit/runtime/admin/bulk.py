"""Bulk tenant operations: many tenants added in a few set-based statements.

:func:`add_tenants` validates every row as :func:`~synckit.runtime.admin.tenants.add_tenant`
does (name, connector, config against the connector's model, schedule, keys), names
each bad row by its line, and writes valid rows in batches: one statement for their
resources (limits as the connector declares them), one for their parents and one for
the connections, whatever the batch size (rows travel as arrays on PostgreSQL, as one
JSON array on SQLite). New tenants get their poll ticks from the scheduler's next run.

:func:`read_rows` reads a file of JSON lines or CSV (``tenant,connector,schedule,
resource_key,parent_key,config`` with ``config`` a JSON object, or ``config.<field>``
columns).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synckit.clock import utcnow
from synckit.connectors.base import Connector
from synckit.connectors.schedule import DEFAULT_SCHEDULE
from synckit.errors.exceptions import ConfigurationError, SynckitError
from synckit.runtime.admin.tenants import (
    ConnectorSource,
    _check_schedule,
    _plain_config,
    check_resource_keys,
    check_tenant_name,
)
from synckit.store import connections as connection_store
from synckit.store.db import Database

__all__ = ["BulkResult", "NewTenant", "RowError", "add_tenants", "read_rows"]

#: Rows written per transaction.
BULK_BATCH = 5000
_FIELDS = frozenset({"tenant", "connector", "config", "schedule", "resource_key", "parent_key"})


@dataclass(frozen=True)
class RowError:
    """A row that was not added, and why (``line`` is 1-based in the input)."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(frozen=True)
class NewTenant:
    """A validated row, as it is written."""

    line: int
    tenant: str
    connector: str
    config_json: str
    schedule: str
    resource_key: str
    parent_key: str
    max_in_flight: int | None
    rate: float | None
    burst: int | None


@dataclass(frozen=True)
class BulkResult:
    """``added`` tenants were written; ``errors`` name the rows that were not."""

    added: int
    errors: list[RowError] = field(default_factory=list)


# --- reading ------------------------------------------------------------------------------


def read_rows(path: str | Path) -> Iterator[tuple[int, Mapping[str, Any]] | RowError]:
    """The rows of a JSON-lines or CSV file with their line numbers, or an error per
    unreadable line. The format is CSV when the file ends in ``.csv``, else JSON lines."""
    p = Path(path)
    undecodable: set[int] = set()
    with p.open("rb") as f:
        lines = _decoded(f, undecodable)
        if p.suffix.lower() == ".csv":
            yield from _csv_rows(lines, undecodable)
        else:
            yield from _json_rows(lines, undecodable)


def _decoded(f: Iterable[bytes], undecodable: set[int]) -> Iterator[str]:
    """The file's lines as text (UTF-8, a byte order mark allowed on the first). A line
    that is not UTF-8 comes with its bad bytes replaced and its number in
    ``undecodable``: that row is refused by its line, the rest still read."""
    for n, raw in enumerate(f, 1):
        if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            undecodable.add(n)
            yield raw.decode("utf-8", errors="replace")


def _not_utf8(undecodable: set[int], first: int, last: int) -> RowError | None:
    bad = sorted(n for n in undecodable if first <= n <= last)
    return RowError(bad[0], "not UTF-8 text") if bad else None


def _json_rows(
    f: Iterable[str], undecodable: set[int]
) -> Iterator[tuple[int, Mapping[str, Any]] | RowError]:
    for n, line in enumerate(f, 1):
        if n in undecodable:
            yield RowError(n, "not UTF-8 text")
            continue
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            yield RowError(n, f"not JSON: {exc}")
            continue
        if not isinstance(row, dict):
            yield RowError(n, f"expected a JSON object, got {type(row).__name__}")
            continue
        yield n, row


def _csv_rows(
    f: Iterable[str], undecodable: set[int]
) -> Iterator[tuple[int, Mapping[str, Any]] | RowError]:
    reader = csv.DictReader(f)
    try:
        if reader.fieldnames is None:
            return  # an empty file
    except csv.Error as exc:
        yield RowError(reader.line_num, f"the header is not CSV: {exc}")
        return
    after = reader.line_num  # the last line of the record before
    if _not_utf8(undecodable, 1, after) is not None:
        yield RowError(1, "the header is not UTF-8 text")
        return
    while True:
        try:
            raw = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # a NUL byte, a field past the csv module's limit
            if reader.line_num == after:
                return  # nothing more was read: no way past it
            after = reader.line_num
            yield RowError(after, f"not CSV: {exc}")
            continue
        first, n, after = after + 1, reader.line_num, reader.line_num
        bad_text = _not_utf8(undecodable, first, n)
        if bad_text is not None:
            yield bad_text
            continue
        if None in raw:
            yield RowError(n, "more fields than the header names")
            continue
        row: dict[str, Any] = {}
        config: dict[str, Any] = {}
        bad = None
        for key, value in raw.items():
            if value is None or value == "":
                continue
            if key == "config":
                try:
                    config.update(json.loads(value))
                except (ValueError, TypeError) as exc:
                    bad = f"config is not a JSON object: {exc}"
            elif key.startswith("config."):
                config[key[len("config.") :]] = value
            else:
                row[key] = value
        if bad is not None:
            yield RowError(n, bad)
            continue
        if config:
            row["config"] = config
        yield n, row


# --- validating ---------------------------------------------------------------------------


def _validate(
    line: int,
    row: Mapping[str, Any],
    *,
    app: ConnectorSource,
    connector: str | None,
    schedule: str,
    classes: dict[str, type[Connector[Any]]],
) -> NewTenant:
    unknown = sorted(str(k) for k in row if k not in _FIELDS)
    if unknown:
        raise ConfigurationError(
            f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"(fields: {', '.join(sorted(_FIELDS))})"
        )
    tenant = row.get("tenant")
    if not isinstance(tenant, str):
        raise ConfigurationError("no tenant name")
    check_tenant_name(tenant)
    name = row.get("connector") or connector
    if not isinstance(name, str) or not name:
        raise ConfigurationError("no connector (give one per row or a default)")
    cls = classes.get(name)
    if cls is None:
        cls = classes[name] = app.connector(name)
    plain = _plain_config(cls, tenant, row.get("config"))
    sched = _check_schedule(str(row.get("schedule") or schedule))
    resource_key = str(row.get("resource_key") or f"{cls.name}:{tenant}")
    parent_key = str(row.get("parent_key") or f"api:{cls.name}")
    check_resource_keys(resource_key, parent_key)
    rate = cls.rate_limit
    return NewTenant(
        line=line,
        tenant=tenant,
        connector=cls.name,
        config_json=json.dumps(plain),
        schedule=sched,
        resource_key=resource_key,
        parent_key=parent_key,
        max_in_flight=cls.max_in_flight,
        rate=rate.per_second if rate else None,
        burst=rate.burst if rate else None,
    )


# --- writing ------------------------------------------------------------------------------


def _values(t: NewTenant) -> tuple[Any, ...]:
    # In the order of synckit.store.connections.BULK_FIELDS.
    return (
        t.tenant,
        t.connector,
        t.config_json,
        t.schedule,
        t.resource_key,
        t.parent_key,
        t.max_in_flight,
        t.rate,
        t.burst,
    )


async def add_tenants(
    db: Database,
    rows: Iterable[tuple[int, Mapping[str, Any]] | RowError | Mapping[str, Any]],
    *,
    app: ConnectorSource,
    connector: str | None = None,
    schedule: str = DEFAULT_SCHEDULE,
    skip_invalid: bool = False,
    batch: int = BULK_BATCH,
    progress: Callable[[int, int], None] | None = None,
) -> BulkResult:
    """Add many tenants of ``app``'s connectors.

    ``rows`` are mappings with the fields of :func:`~synckit.runtime.admin.tenants.add_tenant`
    (``tenant``, ``connector`` (default ``connector``), ``config``, ``schedule`` (default
    ``schedule``), ``resource_key``, ``parent_key``), or ``(line, mapping)`` pairs and
    :class:`RowError` as :func:`read_rows` yields them. Every row is validated first;
    a row that is invalid, names a tenant twice or a tenant that exists is an error
    naming its line. With any error nothing is written unless ``skip_invalid``, which
    adds the valid rows. ``progress(done, total)`` is called after each batch written.
    A tenant added concurrently by someone else between the check and the write is
    reported as existing, the rest of its batch written.
    """
    errors: list[RowError] = []
    valid: list[NewTenant] = []
    seen: dict[str, int] = {}
    classes: dict[str, type[Connector[Any]]] = {}
    for n, item in enumerate(rows, 1):
        if isinstance(item, RowError):
            errors.append(item)
            continue
        line, row = item if isinstance(item, tuple) else (n, item)
        try:
            t = _validate(
                line, row, app=app, connector=connector, schedule=schedule, classes=classes
            )
        except SynckitError as exc:
            errors.append(RowError(line, str(exc)))
            continue
        first = seen.setdefault(t.tenant, line)
        if first != line:
            errors.append(RowError(line, f"tenant {t.tenant!r} is also on line {first}"))
            continue
        valid.append(t)
    for start in range(0, len(valid), batch):
        batch_names = [t.tenant for t in valid[start : start + batch]]
        async with db.begin() as conn:
            present = await connection_store.existing_tenants(conn, batch_names)
        errors.extend(
            RowError(t.line, f"tenant {t.tenant!r} exists already")
            for t in valid[start : start + batch]
            if t.tenant in present
        )
    errors.sort(key=lambda e: e.line)
    if errors and not skip_invalid:
        return BulkResult(0, errors)
    failed = {e.line for e in errors}
    todo = [t for t in valid if t.line not in failed]
    added = 0
    for start in range(0, len(todo), batch):
        chunk = todo[start : start + batch]
        async with db.begin() as conn:
            created = await connection_store.insert_connections(
                conn, [_values(t) for t in chunk], now=utcnow()
            )
        added += len(created)
        errors.extend(
            RowError(t.line, f"tenant {t.tenant!r} exists already")
            for t in chunk
            if t.tenant not in created
        )
        if progress is not None:
            progress(start + len(chunk), len(todo))
    errors.sort(key=lambda e: e.line)
    return BulkResult(added, errors)
