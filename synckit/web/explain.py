"""Why a tenant is not working right now, in words: a pure decision, no I/O.

The runtime keeps the reasons in several places (the connection's status and reason,
the resource's breaker, pacing and in-flight limit); an operator wants them in one line
each. :func:`tenant_why` reads values already loaded and the clock as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from synckit.clock import DURATION_UNITS, duration_unit
from synckit.errors.gate import LaneFacts, gate

__all__ = ["CycleFacts", "Why", "duration_text", "tenant_why"]


@dataclass(frozen=True)
class Why:
    """One reason: ``kind`` (paused, needs_reauth, breaker, paced, in_flight, retry_wait,
    cycle_dead, not_scheduled, no_worker) and text. ``blocks``: the claim takes none of the
    tenant's jobs while it holds (the same conditions as :func:`synckit.store.jobs.claim`:
    an inactive connection, a resource paced or whose breaker denies, the in-flight limit
    reached, a job not due); a reason that does not block (a breaker whose cool-down is
    over, no worker running the claim) is still worth saying."""

    kind: str
    text: str
    blocks: bool = True


@dataclass(frozen=True)
class CycleFacts:
    """The tenant's newest poll cycle job, as the claim sees it."""

    id: int
    status: str
    run_at: datetime | None
    attempts: int
    max_attempts: int
    last_error: str | None
    error_class: str | None = None


def duration_text(seconds: float) -> str:
    """``42s``, ``3m 05s``, ``2h 10m``, ``3d 4h``: short and exact enough to act on."""
    s = max(0, int(seconds))
    i = duration_unit(s)
    unit, size = DURATION_UNITS[i]
    if size == 1:
        return f"{s}s"
    # The unit below it as well: minutes and seconds in two digits, hours after days not.
    below, below_size = DURATION_UNITS[i + 1]
    width = 1 if unit == "d" else 2
    return f"{s // size}{unit} {s % size // below_size:0{width}d}{below}"


def _moment(until: datetime | None) -> datetime:
    assert until is not None  # a breaker, probe or pace hold always has an end
    return until


def _at(moment: datetime, now: datetime) -> str:
    left = duration_text((moment - now).total_seconds())
    return f"{moment.strftime('%Y-%m-%d %H:%M:%S')} UTC (in {left})"


def tenant_why(
    *,
    status: str,
    status_reason: str | None,
    breaker: str,
    cooldown_until: datetime | None,
    next_available_at: datetime | None,
    paced_reason: str | None,
    max_in_flight: int | None,
    running: int,
    now: datetime,
    cycle: CycleFacts | None = None,
    scheduled: bool | None = None,
    workers_alive: int | None = None,
    probe_until: datetime | None = None,
) -> list[Why]:
    """Every reason the tenant's work waits at ``now``, most fundamental first; empty
    when nothing holds it back.

    ``next_available_at`` is the breaker's cool-down end while the breaker is open and
    the pace's end otherwise (both write it); ``paced_reason`` names the signal that set
    the pace (``Retry-After``, ``X-RateLimit-Reset``, a default pace). ``cycle`` is the
    newest poll cycle (None: never one), ``scheduled`` whether the scheduler has a tick
    for the tenant (None: not known), ``workers_alive`` how many workers heartbeat (None:
    not known), ``probe_until`` when a half-open breaker's running probe is presumed lost
    (None: no probe runs). What holds the lane is :func:`synckit.errors.gate.gate`'s
    decision, the claim's own.
    """
    out: list[Why] = []
    if status == "paused":
        out.append(Why("paused", f"paused: {status_reason or 'no reason given'}"))
    elif status == "needs_reauth":
        out.append(
            Why("needs_reauth", f"needs re-authorisation: {status_reason or 'no reason given'}")
        )
    elif status not in ("active", "-"):
        out.append(Why(status, f"{status}: {status_reason or 'no reason given'}"))
    # The claim's own gate decides what holds the lane; the words are said here.
    held = {
        h.kind: h.until
        for h in gate(
            LaneFacts(
                state=breaker,
                cooldown_until=(cooldown_until or next_available_at) if breaker == "open" else None,
                next_available_at=next_available_at,
                probe_in_flight=probe_until is not None,
                probe_expires_at=probe_until,
                max_in_flight=max_in_flight,
                running=running,
            ),
            now,
        ).holds
    }
    if "breaker" in held:
        out.append(Why("breaker", f"breaker open until {_at(_moment(held['breaker']), now)}"))
    elif breaker == "open":
        out.append(Why("breaker", "breaker open, cool-down over: the next job is a probe", False))
    if "probe" in held:
        until = _at(_moment(held["probe"]), now)
        out.append(Why("breaker", f"breaker half-open: its probe job runs (presumed lost {until})"))
    elif breaker == "half_open":
        out.append(Why("breaker", "breaker half-open: one probe job at a time", False))
    # While the breaker is open, next_available_at is its cool-down's end: said once.
    if "paced" in held and held["paced"] != held.get("breaker"):
        because = f" ({paced_reason})" if paced_reason else ""
        out.append(Why("paced", f"paced until {_at(_moment(held['paced']), now)}{because}"))
    if "in_flight" in held:
        out.append(
            Why("in_flight", f"in-flight limit reached: {running} of {max_in_flight} running")
        )
    out += _cycle_whys(cycle, scheduled, now)
    if workers_alive == 0:
        out.append(Why("no_worker", "no worker alive: nothing claims its jobs", blocks=False))
    return out


def _cycle_whys(cycle: CycleFacts | None, scheduled: bool | None, now: datetime) -> list[Why]:
    """What the tenant's newest cycle says about its work."""
    if cycle is not None and cycle.status == "pending" and cycle.run_at and cycle.run_at > now:
        if cycle.attempts > 0:
            error = f"{cycle.error_class}: " if cycle.error_class else ""
            return [
                Why(
                    "retry_wait",
                    f"waiting to retry until {_at(cycle.run_at, now)} after error "
                    f"{error}{cycle.last_error or 'not recorded'} (attempt {cycle.attempts} "
                    f"of {cycle.max_attempts} failed; cycle job {cycle.id})",
                )
            ]
        return [Why("retry_wait", f"next cycle (job {cycle.id}) due at {_at(cycle.run_at, now)}")]
    if cycle is not None and cycle.status in ("pending", "running"):
        return []
    out: list[Why] = []
    if cycle is not None and cycle.status == "dead":
        error = f"{cycle.error_class}: " if cycle.error_class else ""
        out.append(
            Why(
                "cycle_dead",
                f"last cycle dead (job {cycle.id}, {cycle.attempts} attempts): "
                f"{error}{cycle.last_error or 'no error recorded'}",
            )
        )
    if scheduled is False:
        out.append(
            Why(
                "not_scheduled",
                "not scheduled: no cycle queued and the scheduler holds no tick for it (a "
                "worker with --app schedules it; or sync now)",
            )
        )
    return out
