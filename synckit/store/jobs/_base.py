"""What the job store's modules share: the job's statuses, its lease, the claimed job
and the small SQL pieces every outcome is written with."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import and_, case, literal_column
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql.elements import ColumnElement

from synckit.errors.exceptions import PayloadError
from synckit.store import leases
from synckit.store.moments import json_holds_nul
from synckit.store.tables import jobs, resources

JobStatus = Literal["pending", "running", "succeeded", "dead", "cancelled", "discarded"]
FINISHED: tuple[JobStatus, ...] = ("succeeded", "dead", "cancelled", "discarded")
DEFAULT_MAX_ATTEMPTS = 5
#: The lease of a job claimed ahead and not started, renewed by its worker's heartbeat
#: (every third of it): when the worker dies, such jobs go back to the queue, uncharged,
#: within about this long plus one rescue pass, whatever the full lease is.
START_LEASE = timedelta(seconds=2)

#: The jobs' lease on the one mechanism of :mod:`synckit.store.leases`: a claim writes
#: its batch's token (``claim_token``, one per claim batch, so that one statement fences
#: a whole batch), the lease's end and the worker's id; every outcome is fenced on the
#: token (:func:`fence`), so a worker whose lease ran out and whose job was rescued and
#: claimed again cannot finish it. The raw SQL of the hot paths (``_CLAIM_LANES_PG``,
#: ``_PG_START_SQL``, ``_SQLITE_START_MANY``, ``_SQLITE_COMPLETE_MANY``,
#: ``_PG_COMPLETE_AND_START``, ``_HELD``) is text prebuilt once at import, its lease
#: columns taken from this description (:meth:`~synckit.store.leases.LeaseColumns.holding_sql`,
#: ``released_sql``), so it costs nothing at run time and cannot drift from it.
JOB_LEASE = leases.LeaseColumns(
    token="claim_token", expires_at="lease_expires_at", holder="locked_by"
)

# Literals, not bound parameters: the planners of both engines can only use a partial
# index when the query's predicate visibly implies the index's.
PENDING: Any = literal_column("'pending'")
RUNNING: Any = literal_column("'running'")


def check_payload(kind: str, payload: Any) -> str:
    """The payload as JSON text, or :class:`PayloadError`."""
    try:
        text = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload of job {kind!r} is not JSON-serialisable: {exc}") from exc
    if json_holds_nul(text):
        raise PayloadError(
            f"payload of job {kind!r} contains a NUL character (U+0000), "
            "which PostgreSQL cannot store in JSON"
        )
    return text


#: The database's integer columns: ``Integer`` (priority, attempts) and ``BigInteger`` (ids).
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker holds: the fields a handler sees, and the fencing token."""

    id: int
    kind: str
    payload: Any
    resource_key: str | None
    attempts: int
    max_attempts: int
    priority: int
    trace_id: str | None
    run_at: datetime
    claim_token: int
    probe: bool = False
    #: Its start is recorded (attempt charged); False for a job claimed ahead.
    started: bool = False
    #: The W3C traceparent it was enqueued under (:attr:`JobSpec.trace_parent`).
    trace_parent: str | None = None


def fence(token: Any) -> ColumnElement[bool]:
    """The jobs still held under ``token`` (a value or a bound parameter): the token is on
    the row and the job is running. A rescue clears the token, so once another claim took
    the job over, a late holder's outcome matches no row."""
    return and_(leases.held(jobs, token, JOB_LEASE), jobs.c.status == RUNNING)


# Gives back the attempt a started job was charged; a job claimed ahead was charged none.
UNCHARGED: Any = jobs.c.attempts - case((jobs.c.started_at.is_(None), 0), else_=1)

SQLITE_TIMESTAMP: Any = resources.c.updated_at.type.bind_processor(sqlite.dialect())


__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "FINISHED",
    "INT32",
    "INT64",
    "JOB_LEASE",
    "START_LEASE",
    "ClaimedJob",
    "JobStatus",
]
