"""The ``audit_buckets`` operations: outcome counts per tenant, connector, minute and
application version.

``audit_buckets`` holds counters, never a row per operation: one row per
``(tenant, connector, minute, app_version)`` whose ``ok``, ``failed`` and ``paced`` grow by upserts
that add. Writers call :func:`record_audit_sync` inside their own transaction (the worker's
:func:`synckit.runtime.admin.audit.audit_observer` runs inside the transaction that records job
outcomes), so a count commits atomically with the outcome it counts.

What the counters mean
    ``ok`` counts final successes, ``failed`` counts final failures (a job that went
    dead, a record that was dead-lettered). ``failed_by_class`` is a JSON object of
    counts by error class; its plain keys (``"server_error"``) sum to ``failed``. Failed
    attempts that were retried are not failures of the operation, but the alert rules
    need them (five 500s in five minutes matter even when the retries succeed), so they
    are counted under ``"retried:<class>"`` keys, which are *not* part of ``failed``.
    :class:`ClassCounts` splits the two. ``failed_by_class`` is NULL while a row has
    neither, so "rows with any failure" is a plain ``IS NOT NULL`` on both engines.
    ``paced`` counts attempts that ended paced (rate limited: rescheduled for when the
    resource is available, no attempt spent): neither a success nor a failure, so no
    rate or budget reads it; the console's throughput chart draws it.

How the JSON counts are merged
    Adding to counts inside a JSON value needs engine-specific SQL (``jsonb_set`` and
    friends on PostgreSQL, ``json_set`` on SQLite), so the merge is a read-modify-write
    under the row lock instead: one upsert adds ``ok``/``failed`` and returns the row's
    current ``failed_by_class`` while holding the row lock (PostgreSQL's
    ``ON CONFLICT DO UPDATE`` locks the row until commit; SQLite's ``BEGIN IMMEDIATE``
    holds the database write lock), then Python merges and one ``UPDATE`` writes the
    result. Keys are written in sorted order so two workers never lock rows in opposite
    orders.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Text, bindparam, cast, func, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.store.moments import from_row, guarded_moment, read_moment, read_payload
from synckit.store.tables import audit_buckets

ENV_APP_VERSION = "SYNCKIT_APP_VERSION"
RETRIED_PREFIX = "retried:"


def current_app_version() -> str:
    """The application version outcomes are recorded under: ``$SYNCKIT_APP_VERSION`` or ``""``."""
    return os.environ.get(ENV_APP_VERSION, "")[:64]


def minute_of(moment: datetime) -> datetime:
    """The start of the minute ``moment`` falls in (its audit bucket)."""
    return moment.replace(second=0, microsecond=0)


def merge_counts(*counts: Mapping[str, int] | None) -> dict[str, int]:
    """The key-wise sum of count objects (``None`` counts as empty); zero entries dropped."""
    out: dict[str, int] = {}
    for c in counts:
        for k, v in (c or {}).items():
            out[k] = out.get(k, 0) + int(v)
    return {k: v for k, v in sorted(out.items()) if v}


@dataclass(frozen=True)
class ClassCounts:
    """``failed_by_class`` split into final failures and retried attempts, by class."""

    final: Mapping[str, int] = field(default_factory=dict)
    retried: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> ClassCounts:
        final: dict[str, int] = {}
        retried: dict[str, int] = {}
        for k, v in (raw or {}).items():
            if not isinstance(v, int | float):
                continue  # a hand-edited row must not break a report
            if k.startswith(RETRIED_PREFIX):
                retried[k[len(RETRIED_PREFIX) :]] = int(v)
            else:
                final[k] = int(v)
        return cls(final, retried)

    def attempts(self) -> dict[str, int]:
        """Every failed attempt by class, final or retried."""
        return merge_counts(self.final, self.retried)


@dataclass(frozen=True)
class AuditRow:
    """One ``audit_buckets`` row."""

    tenant: str
    connector: str
    minute: datetime
    app_version: str
    ok: int
    failed: int
    failed_by_class: Mapping[str, int] = field(default_factory=dict)
    paced: int = 0

    @property
    def classes(self) -> ClassCounts:
        return ClassCounts.parse(self.failed_by_class)

    @property
    def failed_attempts(self) -> int:
        """Final failures plus retried attempts."""
        return self.failed + sum(self.classes.retried.values())


# Built once: SQLAlchemy does not cache a dialect's insert().on_conflict_do_update() (it
# was compiled at every poll page and recording batch). The same text runs on SQLite and
# PostgreSQL; failed_by_class starts as SQL NULL, not JSON null, so "rows with failures"
# is a plain IS NOT NULL.
_ADD_SQL = (
    "INSERT INTO audit_buckets"
    " (tenant, connector, minute, app_version, ok, failed, paced, failed_by_class)"
    " VALUES (:tenant, :connector, :minute, :app_version, :ok, :failed, :paced, NULL)"
    " ON CONFLICT (tenant, connector, minute, app_version) DO UPDATE SET"
    " ok = audit_buckets.ok + excluded.ok, failed = audit_buckets.failed + excluded.failed,"
    " paced = audit_buckets.paced + excluded.paced"
)
_MINUTE = bindparam("minute", type_=audit_buckets.c.minute.type)
_UPSERT = (
    text(_ADD_SQL + " RETURNING failed_by_class")
    .bindparams(_MINUTE)
    .columns(audit_buckets.c.failed_by_class)
)
# The same upsert without RETURNING, run as one executemany for every bucket of a batch
# whose counts carry no classes (a batch of successes: the common case).
_ADD_COUNTS = text(_ADD_SQL).bindparams(_MINUTE)
_SET_CLASSES = (
    update(audit_buckets)
    .where(
        # Not the columns' own names: an UPDATE reserves those for its SET clause.
        audit_buckets.c.tenant == bindparam("k_tenant"),
        audit_buckets.c.connector == bindparam("k_connector"),
        audit_buckets.c.minute == bindparam("k_minute"),
        audit_buckets.c.app_version == bindparam("k_app_version"),
    )
    .values(failed_by_class=bindparam("merged"))
)


def record_audit_sync(
    conn: Connection,
    tenant: str,
    connector: str,
    now: datetime,
    ok: int,
    failed_by_class: Mapping[str, int],
    *,
    app_version: str | None = None,
    retried_by_class: Mapping[str, int] | None = None,
    paced: int = 0,
) -> None:
    """Add ``ok`` successes and ``failed_by_class`` final failures to the bucket of ``now``.

    Runs in the caller's transaction. ``retried_by_class`` counts failed attempts that
    will be retried (not failures of the operation); ``paced`` attempts that ended paced.
    ``app_version`` defaults to :func:`current_app_version`.
    """
    failed_by_class = {k: int(v) for k, v in failed_by_class.items() if v}
    retried = {k: int(v) for k, v in (retried_by_class or {}).items() if v}
    if any(v < 0 for v in (ok, paced, *failed_by_class.values(), *retried.values())):
        raise ValueError("audit counts cannot be negative")
    if not ok and not paced and not failed_by_class and not retried:
        return
    version = current_app_version() if app_version is None else app_version[:64]
    key = {
        "tenant": tenant[:200],
        "connector": connector[:200],
        "minute": minute_of(now),
        "app_version": version,
    }
    current = conn.execute(
        _UPSERT, {**key, "ok": ok, "failed": sum(failed_by_class.values()), "paced": paced}
    ).scalar()
    delta = merge_counts(failed_by_class, {RETRIED_PREFIX + k: v for k, v in retried.items()})
    if not delta:
        return
    # The upsert above holds the row lock until commit, so this read-modify-write cannot
    # lose a concurrent writer's counts.
    merged = merge_counts(current if isinstance(current, Mapping) else None, delta)
    conn.execute(_SET_CLASSES, {**{f"k_{k}": v for k, v in key.items()}, "merged": merged})


@dataclass(frozen=True)
class AuditCounts:
    """One bucket's additions for :func:`record_audit_many_sync`."""

    tenant: str
    connector: str
    ok: int
    failed_by_class: Mapping[str, int] = field(default_factory=dict)
    retried_by_class: Mapping[str, int] = field(default_factory=dict)
    paced: int = 0


def record_audit_many_sync(
    conn: Connection,
    counts: list[AuditCounts],
    now: datetime,
    *,
    app_version: str | None = None,
) -> None:
    """:func:`record_audit_sync` for many buckets of the minute of ``now``: the ones that
    add plain successes in one statement (executemany), in key order like the rest, so
    that two writers never lock buckets in opposite orders; those with classes one by one.
    """
    version = current_app_version() if app_version is None else app_version[:64]
    minute = minute_of(now)
    plain: list[dict[str, Any]] = []
    classed: list[AuditCounts] = []
    for c in sorted(counts, key=lambda c: (c.tenant[:200], c.connector[:200])):
        if any(c.failed_by_class.values()) or any(c.retried_by_class.values()):
            classed.append(c)
        elif c.ok < 0 or c.paced < 0:
            raise ValueError("audit counts cannot be negative")
        elif c.ok or c.paced:
            key = {"tenant": c.tenant[:200], "connector": c.connector[:200]}
            plain.append(
                {
                    **key,
                    "minute": minute,
                    "app_version": version,
                    "ok": c.ok,
                    "failed": 0,
                    "paced": c.paced,
                }
            )
    if plain:
        conn.execute(_ADD_COUNTS, plain)
    for c in classed:
        record_audit_sync(
            conn,
            c.tenant,
            c.connector,
            now,
            c.ok,
            c.failed_by_class,
            app_version=version,
            retried_by_class=c.retried_by_class,
            paced=c.paced,
        )


# --- reading ---------------------------------------------------------------------------


async def read_audit(
    conn: AsyncConnection,
    *,
    since: datetime,
    until: datetime | None = None,
    only_failures: bool = False,
) -> list[AuditRow]:
    """Rows whose minute is in ``[since, until)``; ``only_failures`` skips clean rows."""
    c = audit_buckets.c
    stmt = select(
        c.tenant,
        c.connector,
        # Guarded and as text, parsed per row: one corrupt bucket must not fail a report.
        guarded_moment(c.minute),
        c.app_version,
        c.ok,
        c.failed,
        cast(c.failed_by_class, Text).label("failed_by_class"),
        c.paced,
    ).where(c.minute >= since)
    if until is not None:
        stmt = stmt.where(c.minute < until)
    if only_failures:
        stmt = stmt.where(c.failed_by_class.is_not(None))
    out: list[AuditRow] = []
    for r in await conn.execute(stmt.order_by(c.minute)):
        try:
            minute = read_moment(r.minute)
            counts = read_payload(r.failed_by_class)
        except ValueError:
            continue  # a bucket that cannot be read counts for nothing
        if minute is None:
            continue
        out.append(
            from_row(
                AuditRow,
                r,
                minute=minute,
                failed_by_class=dict(counts) if isinstance(counts, dict) else {},
                paced=int(r.paced or 0),
            )
        )
    return out


@dataclass(frozen=True)
class Totals:
    ok: int = 0
    failed: int = 0

    @property
    def operations(self) -> int:
        return self.ok + self.failed


async def totals_by_tenant(
    conn: AsyncConnection, *, since: datetime, until: datetime | None = None
) -> dict[str, Totals]:
    """Summed ``ok``/``failed`` per tenant (all connectors and versions) since ``since``."""
    stmt = (
        select(
            audit_buckets.c.tenant,
            func.coalesce(func.sum(audit_buckets.c.ok), 0),
            func.coalesce(func.sum(audit_buckets.c.failed), 0),
        )
        .where(audit_buckets.c.minute >= since)
        .group_by(audit_buckets.c.tenant)
    )
    if until is not None:
        stmt = stmt.where(audit_buckets.c.minute < until)
    return {t: Totals(int(ok), int(failed)) for t, ok, failed in await conn.execute(stmt)}


@dataclass(frozen=True)
class VersionTotals:
    """What one connector did under one application version."""

    connector: str
    app_version: str
    first_seen: datetime
    ok: int
    failed: int
    attempts_by_class: Mapping[str, int] = field(default_factory=dict)

    @property
    def operations(self) -> int:
        """Successes plus every failed attempt (final or retried)."""
        return self.ok + sum(self.attempts_by_class.values())


async def totals_by_version(conn: AsyncConnection, *, since: datetime) -> list[VersionTotals]:
    """Per connector and version since ``since``: counts and failed attempts by class.

    Counts are summed in SQL; only the rows that carry failures are read to merge their
    JSON class counts.
    """
    sums = await conn.execute(
        select(
            audit_buckets.c.connector,
            audit_buckets.c.app_version,
            # Guarded after MIN: an out-of-range minute (year 20000) sorts last and is
            # passed over; only a group with no readable minute yields the marker.
            guarded_moment(func.min(audit_buckets.c.minute)),
            func.coalesce(func.sum(audit_buckets.c.ok), 0),
            func.coalesce(func.sum(audit_buckets.c.failed), 0),
        )
        .where(audit_buckets.c.minute >= since)
        .group_by(audit_buckets.c.connector, audit_buckets.c.app_version)
    )
    base = {(c, v): (first, int(ok), int(failed)) for c, v, first, ok, failed in sums}
    classes: dict[tuple[str, str], dict[str, int]] = {}
    for row in await read_audit(conn, since=since, only_failures=True):
        k = (row.connector, row.app_version)
        classes[k] = merge_counts(classes.get(k), row.classes.attempts())
    out: list[VersionTotals] = []
    for (c, v), (first, ok, failed) in sorted(base.items()):
        try:
            first_seen = read_moment(first) or since
        except ValueError:
            # No readable first minute: taken as old as the window, so that a corrupt
            # bucket never passes for the newest deploy.
            first_seen = since
        out.append(VersionTotals(c, v, first_seen, ok, failed, classes.get((c, v), {})))
    return out


__all__ = [
    "ENV_APP_VERSION",
    "RETRIED_PREFIX",
    "AuditCounts",
    "AuditRow",
    "ClassCounts",
    "Totals",
    "VersionTotals",
    "current_app_version",
    "merge_counts",
    "minute_of",
    "read_audit",
    "record_audit_many_sync",
    "record_audit_sync",
    "totals_by_tenant",
    "totals_by_version",
]
