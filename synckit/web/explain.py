"""Why a tenant is not working right now, in words: a pure decision, no I/O.

The runtime keeps the reasons in several places (the connection's status and reason,
the resource's breaker, pacing and in-flight limit); an operator wants them in one line
each. :func:`tenant_why` reads values already loaded and the clock as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = ["Why", "duration_text", "tenant_why"]


@dataclass(frozen=True)
class Why:
    """One reason: ``kind`` (paused, needs_reauth, breaker, paced, in_flight) and text."""

    kind: str
    text: str


def duration_text(seconds: float) -> str:
    """``42s``, ``3m 05s``, ``2h 10m``, ``3d 4h``: short and exact enough to act on."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


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
) -> list[Why]:
    """Every reason the tenant's work waits at ``now``, most fundamental first; empty
    when nothing holds it back.

    ``next_available_at`` is the breaker's cool-down end while the breaker is open and
    the pace's end otherwise (both write it); ``paced_reason`` names the signal that set
    the pace (``Retry-After``, ``X-RateLimit-Reset``, a default pace).
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
    if breaker == "open":
        until = cooldown_until or next_available_at
        text = (
            f"breaker open until {_at(until, now)}"
            if until and until > now
            else ("breaker open, cool-down over: the next job is a probe")
        )
        out.append(Why("breaker", text))
    elif breaker == "half_open":
        out.append(Why("breaker", "breaker half-open: one probe job at a time"))
    if breaker == "closed" and next_available_at is not None and next_available_at > now:
        because = f" ({paced_reason})" if paced_reason else ""
        out.append(Why("paced", f"paced until {_at(next_available_at, now)}{because}"))
    if max_in_flight is not None and running >= max_in_flight:
        out.append(
            Why("in_flight", f"in-flight limit reached: {running} of {max_in_flight} running")
        )
    return out
