"""The gate: whether a lane's next job may run now and, if not, until when and why.

A lane is a resource (a tenant's, or an API's as a whole): its breaker, its pace, the
breaker's probe and its in-flight limit each can hold its jobs back. :func:`gate` is the
one decision; the claim's SQL (``synckit.store.jobs.claiming``) is the same rule written for the
database (a property test holds the two together on both engines), and the claim's room
per lane, the worker's put-back of a job claimed ahead, the DLQ replay's wait
(:func:`synckit.errors.dlq_policy.blocked_until`), ``synckit status`` and the console's
explanation all read it from here.

Pure: values in, a frozen value out, the clock as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

__all__ = ["Gate", "Hold", "HoldKind", "LaneFacts", "gate"]

#: What holds a lane back: an open breaker's cool-down, a pace (``Retry-After``, a
#: rate), a half-open breaker's probe still running, the in-flight limit reached.
HoldKind = Literal["breaker", "paced", "probe", "in_flight"]


@dataclass(frozen=True)
class LaneFacts:
    """A lane's row as stored (``resources``), and how many of its jobs run now.

    ``probe_in_flight``: a probe job is recorded (``probe_job_id``); it holds the lane
    only until ``probe_expires_at`` (then it is presumed lost). ``running`` counts only
    where ``max_in_flight`` is set."""

    state: str = "closed"
    cooldown_until: datetime | None = None
    next_available_at: datetime | None = None
    probe_in_flight: bool = False
    probe_expires_at: datetime | None = None
    max_in_flight: int | None = None
    running: int = 0


@dataclass(frozen=True)
class Hold:
    """One reason the lane waits: ``until`` None means until a running job ends."""

    kind: HoldKind
    until: datetime | None


@dataclass(frozen=True)
class Gate:
    """The decision. ``holds``: every reason the lane waits now (empty: it may run).
    ``probe``: the next job is the breaker's one trial call. ``room``: how many jobs may
    start now (None: no limit)."""

    holds: tuple[Hold, ...] = ()
    probe: bool = False
    room: int | None = None

    @property
    def open(self) -> bool:
        """Whether a job of the lane may start now."""
        return not self.holds

    @property
    def until(self) -> datetime | None:
        """When the lane may run again: the latest timed hold (None: now, or when a
        running job ends)."""
        times = [h.until for h in self.holds if h.until is not None]
        return max(times) if times else None

    @property
    def why(self) -> HoldKind | None:
        """The hold that lasts longest (a timed one before the in-flight limit; on a tie
        the breaker's, then the probe's, then the pace's)."""
        if not self.holds:
            return None
        until = self.until
        for h in self.holds:
            if h.until == until:
                return h.kind
        return self.holds[0].kind


def gate(facts: LaneFacts, now: datetime) -> Gate:
    """Whether the lane's next job may run at ``now``, and if not until when and why.

    Held while: its pace runs (``next_available_at`` after ``now``); its breaker is open
    and cooling down (``cooldown_until`` after ``now``); its breaker is half-open and a
    probe runs that has not expired. Otherwise a breaker that is not closed lets exactly
    one job through, the probe (whatever runs already); a closed one lets through what
    ``max_in_flight`` leaves, held while none is left.
    """
    # In this order: on a tie the first is the why (an open breaker writes its cool-down
    # end into next_available_at too: it is the breaker that holds).
    holds: list[Hold] = []
    if facts.state == "open" and _after(facts.cooldown_until, now):
        holds.append(Hold("breaker", facts.cooldown_until))
    if facts.state == "half_open" and facts.probe_in_flight and _after(facts.probe_expires_at, now):
        holds.append(Hold("probe", facts.probe_expires_at))
    if _after(facts.next_available_at, now):
        holds.append(Hold("paced", facts.next_available_at))
    if facts.state in ("open", "half_open"):
        # The probe goes whatever runs already.
        return Gate(tuple(holds), probe=not holds, room=0 if holds else 1)
    room = None if facts.max_in_flight is None else max(0, facts.max_in_flight - facts.running)
    if room == 0:
        holds.append(Hold("in_flight", None))
    return Gate(tuple(holds), room=0 if holds else room)


def _after(moment: datetime | None, now: datetime) -> bool:
    # A naive timestamp (a hand-edited row, a driver without zones) is UTC.
    if moment is None:
        return False
    return _utc(moment) > _utc(now)


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
