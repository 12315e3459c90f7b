"""Bounded waits: one cap on every wait, and moments that cannot overflow.

Every wait synckit honours, whether a server sent it (``Retry-After``, a quota reset) or
a handler raised it (``RetryableError(retry_after=...)``), is clamped to a cap (default
:data:`DEFAULT_MAX_WAIT`, 24 hours; a connector sets its own with ``max_wait``), never
discarded: a longer wait asked for never gives a shorter wait honoured. And ``now +
wait`` is computed by :func:`moment_after`, which cannot raise however large the wait.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

__all__ = ["DEFAULT_MAX_WAIT", "clamp_wait", "moment_after", "seconds_wait"]

#: The longest wait honoured unless a connector says otherwise.
DEFAULT_MAX_WAIT = timedelta(hours=24)

_ZERO = timedelta(0)


def clamp_wait(wait: timedelta | None, cap: timedelta = DEFAULT_MAX_WAIT) -> timedelta | None:
    """``wait`` within ``[0, cap]``; None stays None (no wait was given)."""
    if wait is None:
        return None
    cap = max(cap, _ZERO)
    if wait < _ZERO:
        return _ZERO
    return min(wait, cap)


def seconds_wait(seconds: float, cap: timedelta = DEFAULT_MAX_WAIT) -> timedelta:
    """A wait of ``seconds`` (any float, NaN and infinities included) within ``[0, cap]``."""
    cap = max(cap, _ZERO)
    if math.isnan(seconds) or seconds <= 0:
        return _ZERO
    if seconds >= cap.total_seconds():
        return cap
    return timedelta(seconds=seconds)


def moment_after(
    now: datetime, wait: timedelta | None, cap: timedelta = DEFAULT_MAX_WAIT
) -> datetime:
    """``now + wait``, the wait clamped to ``[0, cap]``; never raises.

    A naive ``now`` is taken as UTC. Should even the clamped sum pass the largest
    datetime (a cap of centuries near year 9999), the largest datetime is returned.
    """
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    clamped = clamp_wait(wait if wait is not None else _ZERO, cap) or _ZERO
    try:
        return now + clamped
    except OverflowError:
        return datetime.max.replace(tzinfo=now.tzinfo)
