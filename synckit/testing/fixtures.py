"""pytest fixtures for testing connectors built on synckit.

With ``pip install 'synckit[testing]'`` they are there with no configuration: the
pytest plugin :mod:`synckit.testing.plugin` (entry point ``pytest11``) loads them and
sets pytest-asyncio to ``auto`` unless the project chose a mode. Without the plugin
(``-p no:synckit``), enable them in a test suite::

    # conftest.py
    pytest_plugins = ["synckit.testing.fixtures"]

Fixtures:

* ``synckit_db``: a migrated SQLite database in ``tmp_path`` (a
  :class:`~synckit.store.db.Database`), disposed of afterwards;
* ``synckit_clock``: a :class:`~synckit.testing.clock.FakeClock`;
* ``instant_retries``: every retry waits zero seconds for the test
  (:func:`synckit.errors.set_testing`), restored afterwards;
* ``run_until_idle``: ``await run_until_idle(registry_or_app)`` runs a worker with instant
  retries on ``synckit_db`` until nothing is due, and returns its
  :class:`~synckit.runtime.jobs.recorder.WorkerStats`;
* ``fake_api``: a fresh :class:`~synckit.testing.fakeapi.FakeAPI`.

The async fixtures are declared with ``pytest_asyncio.fixture``, so they work in
pytest-asyncio's strict mode as well as in auto mode. The helpers behind them
(:func:`migrated_sqlite`, :func:`instant_retries_enabled`, :func:`run_worker_until_idle`)
are usable without pytest.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import pytest
import pytest_asyncio

from synckit.errors import RetryPolicy, is_testing, set_testing
from synckit.errors.exceptions import NothingDueWarning
from synckit.runtime.jobs.handlers import Registry
from synckit.runtime.jobs.recorder import WorkerStats
from synckit.runtime.jobs.worker import Worker
from synckit.store import migrate
from synckit.store.db import Database, open_database
from synckit.testing.clock import FakeClock
from synckit.testing.fakeapi import FakeAPI

__all__ = [
    "RunUntilIdle",
    "fake_api",
    "instant_retries",
    "instant_retries_enabled",
    "migrated_sqlite",
    "run_until_idle",
    "run_worker_until_idle",
    "synckit_clock",
    "synckit_db",
]


class RunUntilIdle(Protocol):
    """The ``run_until_idle`` fixture's type, for annotating tests."""

    async def __call__(
        self,
        target: Any,
        *,
        db: Database | None = None,
        clock: Callable[[], datetime] | None = None,
        **worker_options: Any,
    ) -> WorkerStats: ...


# --- helpers usable without pytest ------------------------------------------------------------


@contextlib.asynccontextmanager
async def migrated_sqlite(path: Path) -> AsyncIterator[Database]:
    """A SQLite database file at ``path`` with synckit's schema at head."""
    db = open_database(f"sqlite:///{path}")
    try:
        await migrate.upgrade(db)
        yield db
    finally:
        await db.dispose()


@contextlib.contextmanager
def instant_retries_enabled() -> Iterator[None]:
    """Zero-delay retries process-wide inside the block (attempt limits still apply).

    Afterwards, testing mode is switched off again unless it was on before (then it is
    left on, with zero delay).
    """
    was_testing = is_testing()
    set_testing(True)
    try:
        yield
    finally:
        set_testing(was_testing)


def _worker_for(target: Any, db: Database, options: dict[str, Any]) -> Worker:
    if isinstance(target, Registry):
        return Worker(db, target, **options)
    registry = getattr(target, "registry", None)
    if not isinstance(registry, Registry):
        raise TypeError(
            f"run_until_idle needs a synckit Registry or an object with a .registry "
            f"attribute holding one, not {target!r}"
        )
    make_worker = getattr(target, "worker", None)
    if callable(make_worker):
        # An App's worker() also binds the App's handlers to this database.
        worker = make_worker(db, **options)
        if isinstance(worker, Worker):
            return worker
    return Worker(db, registry, **options)


async def run_worker_until_idle(
    target: Any,
    db: Database,
    *,
    clock: Callable[[], datetime] | None = None,
    **worker_options: Any,
) -> WorkerStats:
    """Run every due job of ``target`` (a :class:`Registry`, or an object with a
    ``.registry`` such as an App) on ``db``, and what they enqueue, then return the stats.

    Retries are instant: the worker gets ``RetryPolicy.deterministic()`` unless
    ``retry_policy`` is given, and testing mode is on while it runs. ``clock`` is the
    worker's clock (leave it unset unless jobs are enqueued by the same clock).
    """
    options: dict[str, Any] = {"retry_policy": RetryPolicy.deterministic(), **worker_options}
    if clock is not None:
        options["clock"] = clock
    worker = _worker_for(target, db, options)
    with instant_retries_enabled():
        stats = await worker.run_until_idle()
    if stats.claimed == 0:
        await _say_why_nothing_ran(db, worker.clock())
    return stats


async def _say_why_nothing_ran(db: Database, now: datetime) -> None:
    """Warn when pending jobs exist but none is due on the worker's clock: a test that
    enqueued by another clock than the worker's would otherwise see nothing happen and
    no reason why."""
    from synckit.store.jobs.admin import list_jobs

    later = [
        j
        for j in await list_jobs(db, status="pending", limit=100)
        if j.run_at is not None and j.run_at > now
    ]
    if later:
        first = min(j.run_at for j in later if j.run_at is not None)
        warnings.warn(
            f"run_until_idle ran nothing: {len(later)} pending job(s) are due later than the "
            f"worker's clock ({now.isoformat()}; the first at {first.isoformat()}). Enqueue "
            "through the App's database (App(clock=...) lends it its clock) or advance the "
            "clock.",
            NothingDueWarning,
            stacklevel=3,
        )


# --- fixtures ------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def synckit_db(tmp_path: Path) -> AsyncIterator[Database]:
    """A migrated SQLite database in ``tmp_path``."""
    async with migrated_sqlite(tmp_path / "synckit.db") as db:
        yield db


@pytest.fixture
def synckit_clock() -> FakeClock:
    """A fake clock starting at 2024-01-01T00:00:00Z."""
    return FakeClock()


@pytest.fixture
def instant_retries() -> Iterator[None]:
    """Zero-delay retries for the duration of the test."""
    with instant_retries_enabled():
        yield


@pytest.fixture
def run_until_idle(synckit_db: Database, instant_retries: None) -> RunUntilIdle:
    """``await run_until_idle(registry_or_app, **worker_options)``: drain the queue of
    ``synckit_db`` (or of ``db=``) with instant retries; returns the worker's stats."""

    async def run(
        target: Any,
        *,
        db: Database | None = None,
        clock: Callable[[], datetime] | None = None,
        **worker_options: Any,
    ) -> WorkerStats:
        return await run_worker_until_idle(target, db or synckit_db, clock=clock, **worker_options)

    return run


@pytest.fixture
def fake_api() -> FakeAPI:
    """A fresh fake API with no routes."""
    return FakeAPI()
