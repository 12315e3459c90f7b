"""The worker's per-resource bookkeeping as it records outcomes (:class:`ResourceBook`):
each outcome folded into its resource's circuit breaker (successes in the rate window, a
failure's transition, the API-wide parent opened when many of its tenants' breakers are),
a rate limit paced (:mod:`synckit.runtime.http.pacing`), and what this worker learnt of each
lane (paced until, open until) for the gate to put back jobs it claimed ahead.

The rows are read and written through a :class:`~synckit.store.resources.BreakerStore`
(``Worker.breakers``), inside the recorder's transaction; the decisions are the pure
functions of :mod:`synckit.errors`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import datetime
from typing import Any

from synckit.errors import (
    BreakerOutcome,
    BreakerPolicy,
    BreakerSnapshot,
    BreakerState,
    Classification,
    ErrorClass,
    breaker_open,
    breaker_outcome,
    breaker_transition,
    global_breaker_trips,
)
from synckit.errors.gate import LaneFacts
from synckit.errors.pace import PacePolicy
from synckit.runtime.http import pacing
from synckit.runtime.jobs.handlers import Registry
from synckit.runtime.observe.logging import redact_text
from synckit.store.db import SyncConn
from synckit.store.jobs._base import ClaimedJob
from synckit.store.moments import read_moment
from synckit.store.resources import BreakerStore

__all__ = ["ResourceBook"]

_RESOURCE_MOMENTS = (
    "opened_at",
    "cooldown_until",
    "probe_expires_at",
    "window_start",
    "next_available_at",
)


def _moment_or_none(value: object) -> datetime | None:
    try:
        return read_moment(value)
    except ValueError:
        return None  # unreadable: no pace to keep (the claim reads it so too)


class ResourceBook:
    """Breakers and pacing of the resources whose outcomes a worker records."""

    def __init__(
        self,
        breakers: BreakerStore,
        registry: Registry,
        *,
        breaker_policy: BreakerPolicy,
        pace_policy: PacePolicy,
        log: Any,
    ) -> None:
        self.breakers = breakers
        self.registry = registry
        self.breaker_policy = breaker_policy
        self.pace_policy = pace_policy
        self.log = log
        #: What this worker's own outcomes taught it of each lane (paced or opened): jobs
        #: of theirs that were claimed ahead are put back instead of run (other workers'
        #: changes are seen by the next claim, and by ctx.http before every request).
        self.learnt: dict[str, LaneFacts] = {}
        #: What a traced job's recording decided (its pace, its breaker's move), by job id.
        self.decisions: dict[int, dict[str, Any]] = {}

    def snapshot(self, r: Any) -> BreakerSnapshot:
        """The breaker of a row read with its timestamps guarded (``store.resources``'s
        breaker reads). What cannot be read (an unknown state, a timestamp no datetime
        holds) reads as closed or unset, with a warning: one corrupt row must not fail
        the batch, and writing the snapshot back repairs it."""
        moments: dict[str, datetime | None] = {}
        bad: list[str] = []
        for name in _RESOURCE_MOMENTS:
            try:
                moments[name] = read_moment(r._mapping[name])
            except ValueError as exc:
                moments[name] = None
                bad.append(f"{name}: {exc}")
        try:
            state = BreakerState(r.state)
        except ValueError:
            state = BreakerState.CLOSED
            bad.append(f"unknown state {str(r.state)[:60]!r}")
        if bad:
            self.log.warning(
                "resource.unreadable", resource_key=r.resource_key, reasons=bad, read_as="closed"
            )
        return BreakerSnapshot(
            state=state,
            consecutive_failures=r.consecutive_failures,
            opened_at=moments["opened_at"],
            reopen_count=r.reopen_count,
            cooldown_until=moments["cooldown_until"],
            probe_in_flight=r.probe_job_id is not None,
            probe_expires_at=moments["probe_expires_at"],
            window_start=moments["window_start"],
            window_calls=r.window_calls,
            window_failures=r.window_failures,
        )

    def store_snapshot(
        self,
        conn: SyncConn,
        key: str,
        before: BreakerSnapshot,
        after: BreakerSnapshot,
        now: datetime,
        **extra: Any,
    ) -> None:
        values: dict[str, Any] = {
            "state": after.state.value,
            "consecutive_failures": after.consecutive_failures,
            "opened_at": after.opened_at,
            "reopen_count": after.reopen_count,
            "cooldown_until": after.cooldown_until,
            "window_start": after.window_start,
            "window_calls": after.window_calls,
            "window_failures": after.window_failures,
            "updated_at": now,
            **extra,
        }
        if not after.probe_in_flight:
            values["probe_job_id"] = None
            values["probe_expires_at"] = None
        self.breakers.write_resource_sync(conn, key, values)
        if after.state != before.state:
            event = {
                "open": "breaker.opened",
                "closed": "breaker.closed",
                "half_open": "breaker.half_open",
            }[after.state.value]
            self.log.warning(
                event,
                resource_key=key,
                failures=after.consecutive_failures,
                cooldown_until=after.cooldown_until,
            )

    def success(self, conn: SyncConn, keys: Counter[str], now: datetime) -> None:
        rows = self.breakers.dirty_breakers_sync(conn, sorted(keys))
        parents: set[str] = set()
        for r in rows:
            before = after = self.snapshot(r)
            for _ in range(keys[r.resource_key]):  # each success counts in the rate window
                after = breaker_transition(after, BreakerOutcome.SUCCESS, now, self.breaker_policy)
            self.store_snapshot(conn, r.resource_key, before, after, now)
            if r.parent_key:
                parents.add(r.parent_key)
        if parents:
            # A tenant call that succeeds once the API-wide cool-down is over is its probe.
            for p in self.breakers.unclosed_breakers_sync(conn, sorted(parents)):
                before = self.snapshot(p)
                after = breaker_transition(before, BreakerOutcome.SUCCESS, now, self.breaker_policy)
                self.store_snapshot(conn, p.resource_key, before, after, now)

    def failure(
        self,
        conn: SyncConn,
        job: ClaimedJob,
        c: Classification,
        now: datetime,
        retry_at: datetime | None,
        *,
        sent_at: datetime | None = None,
        traced: bool = False,
    ) -> datetime | None:
        """Fold a failure into the resource's breaker and, for a rate limit, its pace;
        returns when the resource is next available (None: not paced). ``traced``: the
        job has a span, told the pace and the breaker's move (:attr:`decisions`)."""
        key = job.resource_key
        r = self.breakers.breaker_row_sync(conn, key)
        if r is None:
            return None
        extra: dict[str, Any] = {
            "last_error_class": c.error_class.value,
            "last_error": redact_text(c.reason)[:500],
        }
        paced: datetime | None = None
        if c.error_class is ErrorClass.RATE_LIMITED and key:
            paced = self._pace(
                conn, job, key, c, now, sent_at, _moment_or_none(r.next_available_at)
            )
            if paced is not None:
                self.block(key, paced=paced)
                self.log.info("resource.throttled", resource_key=key, until=paced)
        before = self.snapshot(r)
        after = breaker_transition(
            before, breaker_outcome(c), now, self.breaker_policy, server_wait=c.retry_after
        )
        if after.state is BreakerState.OPEN and after.cooldown_until is not None:
            self.block(r.resource_key, open_until=after.cooldown_until)
        if traced:  # what the job's span tells: the pace and the breaker
            self.decisions[job.id] = {
                "synckit__pace__until": paced.isoformat() if paced is not None else None,
                "synckit__breaker__state": after.state.value,
                "synckit__breaker__transition": (
                    f"{before.state.value}->{after.state.value}"
                    if before.state is not after.state
                    else None
                ),
            }
        self.store_snapshot(conn, r.resource_key, before, after, now, **extra)
        if r.parent_key and after.state is BreakerState.OPEN and before.state is not after.state:
            self._maybe_open_parent(conn, r.parent_key, now)
        return paced

    def pace_policy_of(self, job: ClaimedJob) -> PacePolicy:
        """The registry's pace policy for this job (its connector's ``pace``), else the
        worker's."""
        choose = self.registry.pace_policy_for
        chosen = choose(job) if choose is not None else None
        return chosen if chosen is not None else self.pace_policy

    def _pace(
        self,
        conn: SyncConn,
        job: ClaimedJob,
        key: str,
        c: Classification,
        now: datetime,
        sent_at: datetime | None,
        current: datetime | None,
    ) -> datetime | None:
        """Pace the resource: no worker calls it before the server's time is up."""
        # Requests sent before the current event's pace ended are that event (a burst
        # of in-flight 429s is one); the handler's start bounds when its requests went.
        until = pacing.record_rate_limit_sync(
            conn, key, c, sent_at=sent_at, now=now, policy=self.pace_policy_of(job)
        )
        return until if until is not None else current

    def _maybe_open_parent(self, conn: SyncConn, parent_key: str, now: datetime) -> None:
        """Open the API-wide breaker when many of its tenants' breakers are open together."""
        children = self.breakers.child_states_sync(conn, parent_key)
        open_children = sum(1 for state in children if state != "closed")
        if not global_breaker_trips(open_children, len(children), self.breaker_policy):
            return
        p = self.breakers.breaker_row_sync(conn, parent_key)
        if p is None or p.state == "open":
            return
        before = self.snapshot(p)
        after = breaker_open(before, now, self.breaker_policy)
        self.store_snapshot(
            conn,
            parent_key,
            before,
            after,
            now,
            last_error=f"{open_children} of {len(children)} tenants failing",
        )

    def block(
        self, key: str, *, paced: datetime | None = None, open_until: datetime | None = None
    ) -> None:
        """Remember that ``key`` is paced until ``paced`` or its breaker open until
        ``open_until`` (the later of what was learnt wins), for :func:`gate`."""
        # Written from the database writer thread, read on the event loop: a plain dict
        # assignment is atomic under the GIL, and a stale read only delays the put-back.
        facts = self.learnt.get(key, LaneFacts())
        if paced is not None and (facts.next_available_at or paced) <= paced:
            facts = replace(facts, next_available_at=paced)
        if open_until is not None and (facts.cooldown_until or open_until) <= open_until:
            facts = replace(facts, state="open", cooldown_until=open_until)
        self.learnt[key] = facts
