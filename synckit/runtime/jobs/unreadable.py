"""Pending jobs whose ``run_at`` no reader can read, and so may never run.

A claim takes a pending job once ``run_at <= now``. A stored ``run_at`` that no Python
datetime holds (SQLite text ``'garbage'``, a PostgreSQL year 20000 or ``infinity``)
compares as later than any real time, so that job stays pending forever without a
word; one below the readable range is claimed and quarantined by the claim itself.
This module finds both, by the same range :func:`synckit.store.moments.guarded_moment`
guards, for ``synckit status``, ``synckit jobs ls`` and the alert rule
:class:`synckit.runtime.observe.alert_rules.UnreadableRunAt` (which the worker's periodic alert
evaluation runs, so that the claim path pays nothing for it).

Each query walks the two partial indexes of pending jobs (``ix_jobs_due``,
``ix_jobs_lane_due``, which hold ``run_at``), never the finished bulk of the table.
"""

from __future__ import annotations

# The reads live with every other statement on jobs (synckit.store.jobs).

__all__ = []
