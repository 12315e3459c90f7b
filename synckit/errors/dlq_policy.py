"""The DLQ's decisions, as pure functions: what a capture does to a row, when to replay
next, and whether a resource waits.

Nothing here touches the database, the clock or a global random source: the time and
the random source are arguments, so every rule is tested exhaustively.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from synckit.errors.backoff import backoff_delay
from synckit.errors.gate import LaneFacts, gate

__all__ = [
    "BASE_DELAY",
    "DEAD_CYCLES_REASON",
    "DEAD_CYCLES_TO_PAUSE",
    "JITTER",
    "MAX_DELAY",
    "PROBE_WAIT",
    "REVIEW_CLASSES",
    "CaptureDecision",
    "UniformSource",
    "blocked_until",
    "dead_cycle_streak",
    "decide_capture",
    "next_retry_delay",
]

#: The delay before the first replay of a freshly captured row (``2 ** 0`` minutes).
BASE_DELAY = timedelta(minutes=1)
#: No replay waits longer than this, however many attempts failed.
MAX_DELAY = timedelta(hours=24)
#: The share of a delay that jitter may take off: delays lie in ``[(1 - JITTER) d, d]``.
JITTER = 0.25
#: How long rows wait while a half-open breaker's single probe is in flight.
PROBE_WAIT = timedelta(seconds=30)
#: Error classes that no replay can fix: they go to manual review at once.
REVIEW_CLASSES = frozenset({"validation", "authorization"})

#: Dead poll cycles of one tenant/stream in a row that pause the tenant (with an alert):
#: past this, more cycles only add load on an API that keeps failing them.
DEAD_CYCLES_TO_PAUSE = 5
#: How the pause reason starts (the ``dead_cycles`` alert rule looks for it).
DEAD_CYCLES_REASON = "dead poll cycles:"


def dead_cycle_streak(previous_status: str | None, previous_streak: object) -> int:
    """Dead cycles in a row, this one included: a new row, or one resolved since (a cycle
    went through), starts over at 1; otherwise the row's streak grows by one."""
    if previous_status is None or previous_status == "resolved":
        return 1
    if isinstance(previous_streak, bool) or not isinstance(previous_streak, int):
        return 1  # a row from before streaks were kept, or hand-edited
    return max(previous_streak, 0) + 1


@dataclass(frozen=True)
class CaptureDecision:
    """What a captured failure does to its row (:func:`decide_capture`).

    ``reopen`` False means the row stays as an operator left it (``ignored``): its
    status, reason, replay time, resolution time and replay count are kept, and only
    the failure itself (error, payload, counts, history) is recorded.
    """

    status: str
    next_retry_at: datetime | None
    reopen: bool
    reset_replays: bool


def decide_capture(
    previous_status: str | None,
    error_class: str,
    *,
    now: datetime,
    retry_at: datetime | None = None,
    keep_replay_count: bool = False,
) -> CaptureDecision:
    """The one rule for a failure of a record, a job or an outbox message.

    ``previous_status`` is the status of the row the failure lands on (None: no row
    yet). An ``ignored`` row stays ignored: an operator's decision stands. Any other
    row is (re)opened: ``review`` at once for the :data:`REVIEW_CLASSES`, else
    ``pending`` with its first replay at ``retry_at`` (default ``now`` +
    :data:`BASE_DELAY`), and with a fresh replay budget unless ``keep_replay_count``
    (a dead job re-run by a replay that died again: its budget must run out, not
    start over).
    """
    if previous_status == "ignored":
        return CaptureDecision("ignored", None, reopen=False, reset_replays=False)
    if error_class in REVIEW_CLASSES:
        return CaptureDecision("review", None, reopen=True, reset_replays=not keep_replay_count)
    return CaptureDecision(
        "pending", retry_at or now + BASE_DELAY, reopen=True, reset_replays=not keep_replay_count
    )


class UniformSource(Protocol):
    """What :func:`next_retry_delay` needs of a random source (``random.Random`` fits)."""

    def random(self) -> float: ...


def next_retry_delay(attempt: int, rng: UniformSource, *, jitter: float = JITTER) -> timedelta:
    """The wait before the next replay after ``attempt`` failed replays.

    The nominal delay is ``min(2 ** attempt minutes, 24 h)``; jitter takes off up to
    ``jitter`` of it (``d * (1 - jitter * u)``, ``u`` uniform in [0, 1)), so that rows that
    failed together spread out while the waits still grow. Whatever ``rng`` returns, the
    result lies in ``[(1 - jitter) * d, d]`` and never exceeds 24 hours. It is
    :func:`synckit.errors.backoff.backoff_delay` from :data:`BASE_DELAY` doubling up to
    :data:`MAX_DELAY`, counting the capture as the first attempt.
    """
    if attempt < 0:
        raise ValueError(f"attempt must not be negative, got {attempt}")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError(f"jitter must be in [0, 1], got {jitter}")
    return backoff_delay(
        attempt + 1, float(rng.random()), base=BASE_DELAY, cap=MAX_DELAY, jitter=jitter
    )


def blocked_until(
    *,
    state: str | None,
    cooldown_until: datetime | None,
    next_available_at: datetime | None,
    probe_in_flight: bool,
    probe_expires_at: datetime | None,
    now: datetime,
) -> datetime | None:
    """When a resource lets replays call it again, or None when it does now.

    The claim's gate (:func:`synckit.errors.gate.gate`) decides: a replay waits while the
    resource's breaker cools down, while it is paced, and while a half-open breaker's
    probe runs and has not expired (a lost probe holds nothing). A live probe is waited
    for in steps of at most :data:`PROBE_WAIT` (it may end long before it would
    expire). The latest of these wins. Replays are not held by the in-flight limit.
    """
    facts = LaneFacts(
        state=state or "closed",
        cooldown_until=cooldown_until,
        next_available_at=next_available_at,
        probe_in_flight=probe_in_flight,
        probe_expires_at=probe_expires_at,
    )
    waits = [
        min(h.until, now + PROBE_WAIT) if h.kind == "probe" else h.until
        for h in gate(facts, now).holds
        if h.until is not None
    ]
    return max(waits) if waits else None
