"""SQLite's one writer: every connection's pragmas (WAL, ``busy_timeout``, foreign keys,
``synchronous=NORMAL``), write transactions opened with ``BEGIN IMMEDIATE`` (the lock
taken up front, polled fairly while another holds it: :func:`yield_write_lock`), tiny
writes run on the caller's thread when the lock is free (:class:`InlineSqlite`), and
the queue of writes that :class:`~synckit.store.db.Database`'s writer thread commits in
groups (:class:`WriteQueue`)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Engine, event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")

log = logging.getLogger("synckit.store.db")

SQLITE_BUSY_TIMEOUT_MS = 30_000
#: Execution option of a connection opened by :meth:`Database.read`.
READ_ONLY = "synckit_read_only"


def install_sqlite_pragmas(engine: AsyncEngine | Engine) -> None:
    target = engine.sync_engine if isinstance(engine, AsyncEngine) else engine

    @event.listens_for(target, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below own transaction control.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(target, "begin")
    def _on_begin(conn: Any) -> None:
        # A read (Database.read) takes no lock: WAL gives it a snapshot. Anything else
        # takes the write lock up front.
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN DEFERRED")
            return
        raw = conn.connection.driver_connection
        if isinstance(raw, sqlite3.Connection):  # a thread's own connection (the writer's)
            _begin_immediate(conn, raw)
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")


#: A writer tries for SQLite's write lock again after this long, doubling up to the cap.
LOCK_POLL_FIRST = 0.0002
LOCK_POLL_CAP = 0.0005
#: ``conn.info`` key: when a BEGIN on this connection last found the lock taken.
_CONTENDED_AT = "synckit_contended_at"


def _begin_immediate(conn: Connection, raw: sqlite3.Connection) -> None:
    """BEGIN IMMEDIATE, trying for the write lock every 0.2-0.5 ms, for up to the busy
    timeout.

    SQLite's own busy handler sleeps between tries for 1, 2, 5, 10 ... then 25, 50 and
    100 ms: a writer of another process that commits and begins again at once holds the
    lock whenever the sleeper wakes. In ``bench.sync``'s declared run a worker's writer
    thread waited p90 110 ms, p99 ~1 s, up to 1.8 s for each BEGIN (half its time); two
    processes writing back to back, one got 1 transaction in 3 s. Tried often, the lock
    is taken within a few ms of its release, and with the pause after a contended commit
    (:func:`yield_write_lock`) the processes take turns. When the timeout passes, the
    BEGIN is run once more through SQLAlchemy, which raises its error as before.
    """
    raw.execute("PRAGMA busy_timeout = 0")
    try:
        deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
        delay = LOCK_POLL_FIRST
        while True:
            try:
                raw.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() >= deadline:
                    break
            conn.info[_CONTENDED_AT] = time.monotonic()
            time.sleep(delay)
            delay = min(delay * 2, LOCK_POLL_CAP)
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # raises (or, freed just now, begins)
    finally:
        raw.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")


#: How long a writer that found the lock taken lately waits before its next BEGIN.
LOCK_YIELD = 0.0005


def yield_write_lock(conn: Connection | None) -> None:
    """After a commit: if this connection had to wait for SQLite's write lock in the last
    second, sleep :data:`LOCK_YIELD`, so that another process trying for it every
    0.2-0.5 ms takes it now, rather than this writer again at once."""
    if conn is not None and time.monotonic() - conn.info.get(_CONTENDED_AT, -60.0) < 1.0:
        time.sleep(LOCK_YIELD)


class Busy:
    """The inline connection could not take SQLite's write lock without waiting."""


BUSY = Busy()


class InlineSqlite:
    """SQLite: one connection used on the caller's own thread, never waiting for a lock.

    On this kind of machine handing a transaction to the writer thread and back costs
    more (about 100-170 µs) than a one-row insert and its commit (about 50 µs). For tiny
    transactions, such as one enqueued job, :meth:`try_run` runs the transaction right
    here instead, but only if SQLite's write lock is free this instant: the connection's
    ``busy_timeout`` is 0, so a lock held by another connection or process returns
    :data:`BUSY` at once, having written nothing, and the caller takes the writer thread,
    which waits. The event loop is therefore never blocked behind another writer.

    The connection never checkpoints the WAL itself (``wal_autocheckpoint = 0``): a
    checkpoint can take milliseconds. :meth:`Database.try_inline` asks the writer thread
    for a passive checkpoint every :attr:`CHECKPOINT_EVERY` commits instead.
    """

    CHECKPOINT_EVERY = 500

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self.commits = 0

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raw = self._engine.raw_connection()
            conn = raw.driver_connection
            assert isinstance(conn, sqlite3.Connection)
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            self._raw = raw  # keeps the pooled connection checked out
            self._conn = conn
        return self._conn

    def try_run(self, fn: Callable[..., T], *args: Any) -> T | Busy:
        """``fn(sqlite3_connection, *args)`` in one transaction, or :data:`BUSY` (having
        written nothing) if it would have had to wait for a lock at any step. ``fn`` must
        have no effect outside the transaction: on BUSY it may be run again elsewhere."""
        if not self._lock.acquire(blocking=False):  # another thread is using it
            return BUSY
        try:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if is_busy(exc):
                    return BUSY
                raise
            try:
                result = fn(conn, *args)
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError) and is_busy(exc):
                    return BUSY  # rolled back, nothing written: the caller waits instead
                raise
            self.commits += 1
            return result
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._raw.close()
                self._conn = None


@dataclass(eq=False)  # each write is itself (a key of _write_many's results)
class QueuedWrite:
    """One :meth:`Database.write` waiting for the SQLite writer thread."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    context: contextvars.Context
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    #: :meth:`Database.write_grouped`'s ``order``: a group runs its writes sorted by it.
    order: tuple[str, ...] = ()
    #: :meth:`Database.write_grouped`'s ``many``: runs the group's writes that share it.
    many: Callable[..., list[Any]] | None = None
    #: :meth:`Database.write_grouped`'s ``pipeline``: a group of one runs as a group.
    pipeline: bool = False


class WriteQueue:
    """SQLite's group commit: writes waiting for the writer thread, taken together.

    Every write transaction on SQLite takes the one write lock of the file, which the
    worker processes hand to each other through ``busy_timeout``'s sleeps; a
    transaction's BEGIN IMMEDIATE and COMMIT cost more than the few statements of most
    of synckit's. So the writer thread runs the writes that queued while it was busy in
    one transaction, each inside a savepoint of its own: a write that raises is rolled
    back alone and fails alone, as if it had had a transaction of its own, and the others
    commit together. At most :attr:`MAX` writes share one transaction (the lock is held
    for a bounded time). A failure of the transaction itself (BEGIN or COMMIT) fails each
    write of the group with it; nothing of the group is committed.
    """

    MAX = 64

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[QueuedWrite] = []
        #: Drains running (SQLite's writer thread: at most one).
        self.draining = 0

    def put(self, item: QueuedWrite, drains: int = 1) -> bool:
        """Queue ``item``; True when the caller must start a drain (on the writer thread;
        on PostgreSQL a task), which it may while fewer than ``drains`` run."""
        with self.lock:
            self.items.append(item)
            if self.draining >= drains:
                return False
            self.draining += 1
            return True

    def take(self) -> list[QueuedWrite]:
        """The next group (empty: this drain ends, and a later put starts another)."""
        with self.lock:
            group, self.items = self.items[: self.MAX], self.items[self.MAX :]
            if not group:
                self.draining -= 1
            return group


def run_group(conn: Connection, items: list[QueuedWrite]) -> list[Any]:
    """The results of a PostgreSQL group's writes, in order: each ``fn`` in its caller's
    context, or a run of writes sharing ``many`` in one call (``write_grouped``)."""
    out: list[Any] = []
    i = 0
    while i < len(items):
        many = items[i].many
        j = i + 1
        while many is not None and j < len(items) and items[j].many is many:
            j += 1
        if j - i > 1:
            assert many is not None
            out.extend(call_many(conn, many, items[i:j]))
        else:
            out.append(items[i].context.run(items[i].fn, conn, *items[i].args))
        i = j
    return out


def call_many(
    conn: Connection, many: Callable[..., list[Any]], items: list[QueuedWrite]
) -> list[Any]:
    """``many`` on the writes ``items`` (``write_grouped``), in the first one's context:
    one result for each, or RuntimeError."""
    values = items[0].context.run(many, conn, [it.args[0] for it in items])
    if len(values) != len(items):
        raise RuntimeError(f"{many.__name__} gave {len(values)} results for {len(items)}")
    return values


def deliver(item: QueuedWrite, ok: bool, value: Any) -> None:
    def settle() -> None:
        if item.future.done():  # the caller was cancelled meanwhile
            return
        if ok:
            item.future.set_result(value)
        else:
            item.future.set_exception(value)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
        item.loop.call_soon_threadsafe(settle)


#: :meth:`Database.write_grouped(pipeline=True) <Database.write_grouped>`: the groups in
#: flight at once on one event loop, so that groups' statements run while others commit
#: (bench.webhooks at load ~9, interleaved pairs: 2 gave 919 and 1,219 acks/s, p99 111
#: and 73 ms; 4 gave 1,556 and 1,863 acks/s, p99 61 and 39 ms; the same CPU per ack).
PIPELINE_DEPTH = 4

#: :meth:`Database.write_grouped`'s answer to a caller whose write must run alone.
ALONE: Any = object()


def settle_future(item: QueuedWrite, value: Any) -> None:
    if not item.future.done():
        item.future.set_result(value)


def is_busy(exc: sqlite3.OperationalError) -> bool:
    text_ = str(exc).lower()
    return "locked" in text_ or "busy" in text_
