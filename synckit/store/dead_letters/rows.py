"""A ``dead_letters`` row as the DLQ's callers see it, and what every writer shares.

:class:`DeadLetter` maps a row (:data:`BASE_COLUMNS`, read by the capture's RETURNING, the
replay claim and every listing); :class:`DlqFilter` says which rows an operation applies
to; the texts every writer stores are cleaned one way (:func:`clean`) and every history
entry has one shape (:func:`history_entry`).

**Corrupt rows.** ``payload`` and ``history`` are read as text and parsed here, the
timestamps guarded (:func:`~synckit.store.moments.guarded_moment`) and parsed here too. A
payload that does not parse (text in SQLite, a JSONB number past Python's digit limit)
shows up as :attr:`DeadLetter.payload_error`; a history or timestamp that cannot be read
('garbage' in SQLite, year 20000 in PostgreSQL) is None; each is named in
:attr:`DeadLetter.unreadable`. Either way the row is read, not the query failed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import (
    ColumnElement,
    Row,
    Text,
    cast,
    or_,
    type_coerce,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.redaction import redact_text
from synckit.store.moments import from_row, guarded_moment, read_moments, storable_text
from synckit.store.tables import dead_letters

Status = Literal["pending", "resolved", "ignored", "review"]
STATUSES: tuple[Status, ...] = ("pending", "resolved", "ignored", "review")
#: History keeps the most recent entries only, so a record failing for months stays small.
HISTORY_LIMIT = 20

_MESSAGE_LIMIT = 4000
_HISTORY_MESSAGE_LIMIT = 500
_TRACEBACK_LIMIT = 20_000
_REASON_LIMIT = 1000


def _parse_json(raw: Any) -> tuple[Any, str | None]:
    """(value, None), or (None, why) when the stored text is not JSON."""
    if raw is None:
        return None, None
    if not isinstance(raw, str | bytes | bytearray):
        return raw, None  # a driver that already decoded it
    try:
        return json.loads(raw), None
    except (ValueError, RecursionError) as exc:
        return None, f"{type(exc).__name__}: {exc}"[:200]


@dataclass(frozen=True)
class DeadLetter:
    """One row of ``dead_letters``, as the DLQ's callers and replayers see it.

    ``payload`` is the stored JSON value; when the stored text does not parse,
    ``payload`` is None and ``payload_error`` says why (``payload_raw`` keeps the text).
    A timestamp or the history that cannot be read is None (the history: empty).
    ``unreadable`` maps each column that could not be read (the payload too) to a
    one-line reason.
    ``traceback`` is only read where it is shown (``get``, exports), else None.
    """

    id: int
    tenant: str
    connector: str
    kind: str
    record_id: str
    job_id: int | None
    resource_key: str | None
    payload: Any
    error_class: str
    error_message: str
    trace_id: str | None
    attempt_count: int
    replay_attempts: int
    status: str
    status_reason: str | None
    first_failed_at: datetime | None
    last_attempt_at: datetime | None
    next_retry_at: datetime | None
    resolved_at: datetime | None
    history: list[dict[str, Any]] = field(default_factory=list)
    traceback: str | None = None
    payload_error: str | None = None
    payload_raw: str | None = None
    unreadable: dict[str, str] = field(default_factory=dict)
    #: The replay lease on the row (:mod:`synckit.store.leases`), if one holds it.
    lease_token: str | None = None
    lease_expires_at: datetime | None = None

    @property
    def is_job(self) -> bool:
        """A dead job (record id ``job:<id>``) rather than a record of a stream."""
        return self.record_id.startswith("job:")

    @property
    def leased(self) -> bool:
        """Held by a replay processor right now (as of the time the row was read)."""
        return self.status == "pending" and self.lease_token is not None

    @classmethod
    def from_row(cls, r: Row[Any]) -> DeadLetter:
        m = r._mapping
        bad: dict[str, str] = {}
        payload, payload_error = _parse_json(m["payload_text"])
        if payload_error is not None:
            bad["payload"] = payload_error
        history, history_error = _parse_json(m["history_text"])
        if history_error is not None:
            bad["history"] = history_error
        elif history is not None and not isinstance(history, list):
            bad["history"] = f"not a list: a JSON {type(history).__name__}"
        if not isinstance(history, list):
            history = []
        moments = read_moments(m, _MOMENTS, bad)
        return from_row(
            cls,
            r,
            payload=payload,
            history=[h for h in history if isinstance(h, dict)],
            traceback=m.get("traceback"),
            payload_error=payload_error,
            payload_raw=m["payload_text"] if payload_error is not None else None,
            unreadable=bad,
            **moments,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: timestamps as ISO 8601, payload and history as stored."""
        data: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            data[name] = value.isoformat() if isinstance(value, datetime) else value
        if self.payload_error is None:
            del data["payload_error"], data["payload_raw"]
        if not self.unreadable:
            del data["unreadable"]
        return data


_MOMENTS = (
    "first_failed_at",
    "last_attempt_at",
    "next_retry_at",
    "resolved_at",
    "lease_expires_at",
)


_BASE_COLUMNS: list[Any] = [
    dead_letters.c.id,
    dead_letters.c.tenant,
    dead_letters.c.connector,
    dead_letters.c.kind,
    dead_letters.c.record_id,
    dead_letters.c.job_id,
    dead_letters.c.resource_key,
    # As text, parsed by DeadLetter.from_row: corrupt JSON must not break the query.
    # CAST in SQL, not type_coerce: asyncpg decodes jsonb itself, and a payload that is a
    # JSON string came back as the bare string, which then failed to parse.
    cast(dead_letters.c.payload, Text).label("payload_text"),
    cast(dead_letters.c.history, Text).label("history_text"),
    dead_letters.c.error_class,
    dead_letters.c.error_message,
    dead_letters.c.trace_id,
    dead_letters.c.attempt_count,
    dead_letters.c.replay_attempts,
    dead_letters.c.status,
    dead_letters.c.status_reason,
    dead_letters.c.lease_token,
    # Guarded, parsed by DeadLetter.from_row: a value no datetime holds would fail the
    # whole fetch (the drivers raise while reading it), every listing and replay claim.
    *(guarded_moment(dead_letters.c[name]) for name in _MOMENTS),
]
_FULL_COLUMNS: list[Any] = [*_BASE_COLUMNS, dead_letters.c.traceback]
# For RETURNING on SQLite, whose RETURNING reads ``col IS NULL`` as false for a NULL
# column (3.40), so the guard would mark every empty time unreadable: the times come back
# as the stored text instead, which DeadLetter.from_row parses just the same (SQLite's
# driver fails on no value; only the datetime type's own parsing did).
_SQLITE_RETURNED: list[Any] = [
    type_coerce(dead_letters.c[c.name], Text).label(c.name) if c.name in _MOMENTS else c
    for c in _BASE_COLUMNS
]


def _returned(conn: AsyncConnection) -> list[Any]:
    """:data:`_BASE_COLUMNS` for a RETURNING clause on ``conn``'s engine."""
    return _BASE_COLUMNS if conn.dialect.name == "postgresql" else _SQLITE_RETURNED


# --- filters ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DlqFilter:
    """Which rows an operation applies to; every field given must match (empty: any).

    ``kinds`` entries ending in ``*`` match by prefix (``record:*``). ``since`` keeps
    rows whose last failure or replay was at or after that time.
    """

    ids: tuple[int, ...] = ()
    tenants: tuple[str, ...] = ()
    connectors: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    error_classes: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    since: datetime | None = None

    @property
    def is_empty(self) -> bool:
        return not (
            self.ids
            or self.tenants
            or self.connectors
            or self.kinds
            or self.error_classes
            or self.statuses
            or self.since
        )

    def clauses(self) -> list[ColumnElement[bool]]:
        c = dead_letters.c
        out: list[ColumnElement[bool]] = []
        if self.ids:
            out.append(c.id.in_(list(self.ids)))
        if self.tenants:
            out.append(c.tenant.in_(list(self.tenants)))
        if self.connectors:
            out.append(c.connector.in_(list(self.connectors)))
        if self.kinds:
            exact = [k for k in self.kinds if not k.endswith("*")]
            prefixes = [k[:-1] for k in self.kinds if k.endswith("*")]
            terms: list[ColumnElement[bool]] = []
            if exact:
                terms.append(c.kind.in_(exact))
            terms.extend(c.kind.startswith(p, autoescape=True) for p in prefixes)
            out.append(or_(*terms))
        if self.error_classes:
            out.append(c.error_class.in_(list(self.error_classes)))
        if self.statuses:
            out.append(c.status.in_(list(self.statuses)))
        if self.since is not None:
            out.append(c.last_attempt_at >= self.since)
        return out

    def narrowed(self, statuses: Sequence[str]) -> DlqFilter:
        """This filter, restricted to ``statuses`` (intersected with its own, if any)."""
        keep = tuple(s for s in statuses if not self.statuses or s in self.statuses)
        # No status is spelt "(none)": the filter matches nothing. (A NUL sentinel was a
        # driver error on PostgreSQL, whose text cannot hold one.)
        return replace(self, statuses=keep or ("(none)",))


def _clean(text: str | None, limit: int, *, tail: bool = False) -> str | None:
    """Stored text: redacted first (a secret cut in half would escape the patterns), made
    storable (:func:`storable_text`), then cut to ``limit``."""
    if text is None:
        return None
    text = storable_text(redact_text(text))
    return text[-limit:] if tail else text[:limit]


#: The kind of a poll cycle job (``synckit.runtime.sync.poll.POLL_KIND``; not imported: the


def _history_entry(
    now: datetime,
    source: str,
    error_class: str,
    message: str,
    attempt: int,
    trace_id: str | None = None,
) -> dict[str, Any]:
    """One history entry; every writer of ``dead_letters.history`` (captures from poll
    cycles, jobs and the outbox, and replays) writes this shape."""
    return {
        "at": now.isoformat(),
        "source": source,
        "error_class": error_class,
        "message": message[:_HISTORY_MESSAGE_LIMIT],
        "attempt": attempt,
        "trace_id": trace_id,
    }


def _appended(history: Sequence[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [*history, entry][-HISTORY_LIMIT:]
