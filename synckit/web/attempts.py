"""A job's attempts as the worker counts them, in words: a pure function, no I/O.

The worker stores each failed run in the job's ``errors`` (``synckit.store.jobs.fail_sync``):
``run`` numbers the failed runs, ``attempt`` is the attempts counted once it failed, and
``counted`` says whether it spent one (a paced run, one waiting for re-authorisation, or
one that committed progress does not). The limit is the worker's own rule,
:meth:`synckit.runtime.jobs.handlers.Registry.attempt_limit`. Entries written before runs were
numbered are numbered by their place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["run_label", "uncounted_runs"]


def run_label(entry: Any, place: int, limit: int) -> str:
    """``run 3 failed (attempt 2 of 20)``, or ``run 2 failed (not counted)``; ``place``
    (from 1) numbers an entry that has no ``run``."""
    if not isinstance(entry, dict):
        return f"run {place} failed"
    run = entry.get("run")
    run = run if isinstance(run, int) and not isinstance(run, bool) else place
    if entry.get("counted") is False:
        return f"run {run} failed (not counted)"
    attempt = entry.get("attempt")
    of = entry.get("of", limit)
    if isinstance(attempt, int) and not isinstance(attempt, bool):
        return f"run {run} failed (attempt {attempt} of {of})"
    return f"run {run} failed"


def uncounted_runs(errors: Sequence[Any]) -> int:
    """How many of the recorded failed runs spent no attempt."""
    return sum(1 for e in errors if isinstance(e, dict) and e.get("counted") is False)
