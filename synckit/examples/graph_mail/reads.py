"""What ``synckit demo`` reads of the runtime's tables, named.

The demo reads while its worker runs, through a plain synchronous SQLite connection
(:class:`DemoReader`): in WAL mode it never blocks the worker's writes. Two reads: what
the live display shows (:func:`snapshot_rows`) and the rows of the final summary
(:func:`summary_rows`). Rows come back as the driver gives them (attributes named after
the columns); the demo turns them into its figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import Connection

from synckit.store.tables import (
    audit_buckets,
    checkpoints,
    connections,
    dead_letters,
    intents,
    jobs,
    resources,
)

__all__ = ["DemoReader", "SnapshotRows", "SummaryRows", "snapshot_rows", "summary_rows"]

T = TypeVar("T")


class DemoReader:
    """A synchronous reader of the demo's SQLite file, beside the worker's own engine."""

    def __init__(self, path: Path) -> None:
        self._engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 30})

    def read(self, fn: Callable[[Connection], T]) -> T:
        """``fn`` run on a connection of its own."""
        with self._engine.connect() as conn:
            return fn(conn)

    def close(self) -> None:
        self._engine.dispose()


@dataclass(frozen=True)
class SnapshotRows:
    """What the live display shows: rows per table."""

    connections: list[Any]  # tenant, status, status_reason
    resources: list[Any]  # resource_key, state, opened_at
    checkpoints: list[Any]  # tenant, cursor
    dead_letters: list[tuple[str, int]]  # per tenant
    sends_done: list[tuple[str, int]]  # done intents per tenant
    audit: list[Any]  # tenant, failed_by_class


def snapshot_rows(c: Connection) -> SnapshotRows:
    """The rows of the live display."""
    return SnapshotRows(
        connections=list(
            c.execute(
                select(connections.c.tenant, connections.c.status, connections.c.status_reason)
            )
        ),
        resources=list(
            c.execute(select(resources.c.resource_key, resources.c.state, resources.c.opened_at))
        ),
        checkpoints=list(c.execute(select(checkpoints.c.tenant, checkpoints.c.cursor))),
        dead_letters=[
            (str(t), int(n))
            for t, n in c.execute(
                select(dead_letters.c.tenant, func.count()).group_by(dead_letters.c.tenant)
            )
        ],
        sends_done=[
            (str(t), int(n))
            for t, n in c.execute(
                select(intents.c.tenant, func.count())
                .where(intents.c.status == "done")
                .group_by(intents.c.tenant)
            )
        ],
        audit=list(c.execute(select(audit_buckets.c.tenant, audit_buckets.c.failed_by_class))),
    )


@dataclass(frozen=True)
class SummaryRows:
    """The rows the final summary is computed from."""

    audit: list[Any]  # tenant, ok, failed
    jobs: list[Any]  # kind, payload, status, attempts, errors
    dead_letters: list[Any]  # tenant, kind, record_id, error_class, status, ...
    intents: list[Any]  # tenant, intent_key, status, attempts, remote_id, result
    breakers: list[Any]  # resource_key, state, last_error_class (tenants' resources)
    unfinished_resources: list[str | None]  # resource_key of each pending or running job


def summary_rows(c: Connection) -> SummaryRows:
    """The rows of the final summary."""
    return SummaryRows(
        audit=list(
            c.execute(select(audit_buckets.c.tenant, audit_buckets.c.ok, audit_buckets.c.failed))
        ),
        jobs=list(
            c.execute(
                select(jobs.c.kind, jobs.c.payload, jobs.c.status, jobs.c.attempts, jobs.c.errors)
            )
        ),
        dead_letters=list(
            c.execute(
                select(
                    dead_letters.c.tenant,
                    dead_letters.c.kind,
                    dead_letters.c.record_id,
                    dead_letters.c.error_class,
                    dead_letters.c.status,
                    dead_letters.c.error_message,
                    dead_letters.c.attempt_count,
                ).order_by(dead_letters.c.tenant, dead_letters.c.record_id)
            )
        ),
        intents=list(
            c.execute(
                select(
                    intents.c.tenant,
                    intents.c.intent_key,
                    intents.c.status,
                    intents.c.attempts,
                    intents.c.remote_id,
                    intents.c.result,
                )
            )
        ),
        breakers=list(
            c.execute(
                select(resources.c.resource_key, resources.c.state, resources.c.last_error_class)
                .where(resources.c.resource_key.not_like("api:%"))
                .order_by(resources.c.resource_key)
            )
        ),
        unfinished_resources=[
            r[0]
            for r in c.execute(
                select(jobs.c.resource_key).where(jobs.c.status.in_(["pending", "running"]))
            )
        ],
    )
