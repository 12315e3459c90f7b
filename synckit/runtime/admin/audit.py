"""Audit counts of the worker's outcomes, and the window arithmetic of the reports.

The counters and their SQL live in :mod:`synckit.store.audit` (what the counters mean and
how the JSON counts are merged is said there); this module decides what a batch of
outcomes counts as (:func:`tally_outcomes`) and hands the worker an observer that records
the tallies inside the transaction that records the outcomes (:func:`audit_observer`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from synckit.store.audit import (
    AuditCounts,
    current_app_version,
    minute_of,
    record_audit_many_sync,
)
from synckit.store.db import SyncConn

if TYPE_CHECKING:  # the worker imports this module's observer, not the other way round
    from synckit.runtime.jobs.recorder import OutcomeObserver, RecordedOutcome


@dataclass
class _Tally:
    ok: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    retried: dict[str, int] = field(default_factory=dict)
    paced: int = 0


def outcome_subject(job_payload: Any, resource_key: str | None) -> tuple[str, str]:
    """``(tenant, connector)`` of a job: payload keys, else the resource key and ``""``."""
    tenant = connector = ""
    if isinstance(job_payload, Mapping):
        tenant = str(job_payload.get("tenant") or "")
        connector = str(job_payload.get("connector") or "")
    return tenant or (resource_key or ""), connector


def tally_outcomes(
    outcomes: Iterable[RecordedOutcome],
) -> dict[tuple[str, str], _Tally]:
    """Counts by ``(tenant, connector)``: succeeded is ok, dead a final failure, a
    scheduled retry a retried attempt, a paced attempt paced; snoozes, cancels, discards
    and jobs with no tenant at all (internal jobs such as the alert evaluator) are not
    counted."""
    out: dict[tuple[str, str], _Tally] = {}
    for o in outcomes:
        subject = outcome_subject(o.job.payload, o.job.resource_key)
        if not subject[0]:
            continue
        cls = o.error_class or "unknown"
        if o.status == "succeeded":
            out.setdefault(subject, _Tally()).ok += 1
        elif o.status == "dead":
            t = out.setdefault(subject, _Tally())
            t.failed[cls] = t.failed.get(cls, 0) + 1
        elif o.status == "pending":
            t = out.setdefault(subject, _Tally())
            t.retried[cls] = t.retried.get(cls, 0) + 1
        elif o.status == "paced":
            out.setdefault(subject, _Tally()).paced += 1
    return out


def audit_observer(app_version: str | None = None) -> OutcomeObserver:
    """An outcome observer for :class:`~synckit.runtime.jobs.worker.Worker` that counts outcomes.

    ``app_version`` defaults to :func:`current_app_version`, read once, now.
    """
    version = current_app_version() if app_version is None else app_version

    def observe(conn: SyncConn, outcomes: list[RecordedOutcome], now: datetime) -> None:
        tallies = tally_outcomes(outcomes)
        record_audit_many_sync(
            conn,
            [
                AuditCounts(tenant, connector, t.ok, t.failed, t.retried, t.paced)
                for (tenant, connector), t in tallies.items()
            ],
            now,
            app_version=version,
        )

    return observe


def window_start(now: datetime, window: timedelta) -> datetime:
    """The first minute bucket of the ``window`` that ends with the bucket of ``now``."""
    return minute_of(now) - window + timedelta(minutes=1)


__all__ = [
    "audit_observer",
    "outcome_subject",
    "tally_outcomes",
    "window_start",
]
