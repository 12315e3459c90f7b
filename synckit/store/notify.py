"""Wake-ups: the one waker registry and the one LISTEN loop (the job queue and the outbox).

A writer wakes whoever waits for its rows once its transaction commits, never before (a
woken reader must find the rows) and never after a rollback:

* **in this process** (every engine; SQLite has no LISTEN/NOTIFY): waiters register an
  :class:`asyncio.Event` per database and channel (:func:`register`); a writer sets them
  after its commit (:func:`wake_after_commit`) or, when it knows the commit happened,
  at once (:func:`wake`);
* **across processes** (PostgreSQL): the writer's transaction sends ``NOTIFY <channel>``
  (delivered at commit, dropped on rollback) and :func:`listen` keeps one LISTEN
  connection per waiter open, reconnecting with backoff when it drops, and wakes the
  waiter on every notification and on every (re)connect, since notifications sent while
  it was away are lost;
* **across processes** (SQLite, a database file): :func:`watch_sqlite` reads ``PRAGMA
  data_version`` on a connection of its own every 50 ms, a number that changes whenever
  another connection commits to the file (a look at the WAL index in shared memory, no
  lock and no read of the database), and wakes the waiter when it changed. A job another
  process enqueues is then claimed within ~50 ms instead of a poll interval (1 s).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection

from synckit.store.db import Database

__all__ = [
    "NOTIFY_CHANNEL",
    "listen",
    "register",
    "unregister",
    "wake",
    "wake_after_commit",
    "watch_sqlite",
]

#: The job queue's channel: an enqueue wakes the workers on it (``NOTIFY`` on PostgreSQL,
#: :func:`wake` in this process), and a connection made active again wakes them too.
NOTIFY_CHANNEL = "synckit_jobs"

#: How often :func:`watch_sqlite` looks for another connection's commit (seconds).
WATCH_INTERVAL = 0.05

# (database URL, channel) -> the events of this process's waiters.
_wakers: dict[tuple[str, str], set[asyncio.Event]] = {}


def register(db: Database, channel: str, waker: asyncio.Event) -> None:
    """Set ``waker`` whenever a write on ``channel`` of ``db`` commits in this process."""
    _wakers.setdefault((str(db.url), channel), set()).add(waker)


def unregister(db: Database, channel: str, waker: asyncio.Event) -> None:
    _wakers.get((str(db.url), channel), set()).discard(waker)


def wake(db: Database, channel: str) -> None:
    """Wake this process's waiters on ``channel`` of ``db`` (on the event loop, after the
    commit that made their work)."""
    for ev in list(_wakers.get((str(db.url), channel), ())):
        ev.set()


def wake_after_commit(conn: AsyncConnection, channel: str) -> None:
    """Wake this process's waiters on ``channel`` when ``conn``'s transaction commits."""
    key = (str(conn.engine.url), channel)
    sync_conn = conn.sync_connection
    if not _wakers.get(key) or sync_conn is None:
        return

    def on_commit(_conn: Any) -> None:
        for ev in list(_wakers.get(key, ())):
            ev.set()

    # One listener per channel and connection: a second write before the commit adds none.
    listeners = sync_conn.info.setdefault("synckit_wake_on_commit", {})
    if channel in listeners and event.contains(sync_conn, "commit", listeners[channel]):
        return
    listeners[channel] = on_commit
    event.listen(sync_conn, "commit", on_commit, once=True)


async def listen(
    db: Database,
    channel: str,
    on_notify: Callable[[], object],
    *,
    delay: Callable[[int], float],
    on_failure: Callable[[BaseException], object] = lambda _exc: None,
) -> None:
    """LISTEN on ``channel`` of ``db`` (PostgreSQL) until cancelled, calling ``on_notify``
    for each notification and after each (re)connect; a failed or dropped connection is
    reported to ``on_failure`` and retried after ``delay(consecutive failures)`` seconds."""
    import asyncpg

    dsn = db.url.set(drivername="postgresql").render_as_string(hide_password=False)
    failures = 0
    while True:
        conn = None
        try:
            conn = await asyncpg.connect(dsn, timeout=10)
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _c, ev=lost: ev.set())
            await conn.add_listener(channel, lambda *_a: on_notify())
            failures = 0
            on_notify()  # anything written while we were not listening
            await lost.wait()
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            failures += 1
            on_failure(exc)
            await asyncio.sleep(delay(failures))
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()


async def watch_sqlite(
    db: Database,
    on_change: Callable[[], object],
    *,
    interval: float = WATCH_INTERVAL,
    on_failure: Callable[[BaseException], object] = lambda _exc: None,
) -> None:
    """Call ``on_change`` whenever a commit by another connection to ``db``'s SQLite
    file may have happened, until cancelled: ``PRAGMA data_version`` read every
    ``interval`` seconds on a connection held for it (the number is per connection: it
    changes when any other connection, this process's writer too, commits). A failed
    read is reported to ``on_failure``, wakes the waiter (it may have missed a change)
    and is tried again on a new connection."""
    import sqlite3

    path = db.url.database
    if not path or path == ":memory:":  # open_database refuses these: nothing shares them
        return
    conn: sqlite3.Connection | None = None
    seen: object = None
    try:
        while True:
            try:
                if conn is None:
                    conn = sqlite3.connect(path, timeout=0, uri=path.startswith("file:"))
                    conn.execute("PRAGMA busy_timeout = 0")
                version = conn.execute("PRAGMA data_version").fetchone()[0]
            except sqlite3.Error as exc:
                on_failure(exc)
                on_change()
                if conn is not None:
                    with contextlib.suppress(sqlite3.Error):
                        conn.close()
                conn, seen = None, None
                await asyncio.sleep(max(interval, 1.0))
                continue
            if seen is not None and version != seen:
                on_change()
            seen = version
            await asyncio.sleep(interval)
    finally:
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
