"""The engine factory and the one seam where driver errors become synckit errors.

``open_database(url)`` gives a :class:`Database`: an async SQLAlchemy engine configured
for the engine behind the URL.

* SQLite (the embedded default): WAL, ``busy_timeout``, foreign keys and
  ``synchronous=NORMAL`` on every connection, and every transaction opened with
  ``BEGIN IMMEDIATE`` so that a transaction that will write takes the write lock up
  front instead of failing with ``SQLITE_BUSY`` when it upgrades from a read; reads
  (:meth:`Database.read`) open a deferred transaction, which takes no lock.
  Write transactions run whole on a dedicated thread (:meth:`Database.write`), those
  that queue meanwhile grouped into one transaction (:class:`_WriteQueue`), and tiny
  ones right on the caller's thread when the write lock is free (:class:`InlineSqlite`).
* PostgreSQL (through asyncpg): a connection pool without pre-ping; a connection found
  dead invalidates the pool and callers retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import re
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeAlias, TypeVar, cast

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    InterfaceError,
    NoSuchModuleError,
    OperationalError,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from synckit.clock import utcnow
from synckit.errors.exceptions import (
    ConfigurationError,
    DatabaseError,
    DatabaseUnavailable,
)
from synckit.store.urls import database_url_from_env

T = TypeVar("T")

# The connections operations run on, named here so that the modules above the store can
# annotate them without importing SQLAlchemy (tests/unit/test_layers.py): ``Conn`` as
# ``Database.begin()``/``read()`` give it, ``SyncConn`` inside ``Database.write``/``run_read``.
Conn: TypeAlias = AsyncConnection
SyncConn: TypeAlias = Connection

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000


def mask_url(url: str | URL) -> str:
    """The URL with any password replaced by ``***``, safe to print."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return re.sub(r"//([^:/@]*):[^@]*@", r"//\1:***@", str(url))


def url_problem(url: str) -> str | None:
    """What is wrong with ``url`` before anything opens (it does not parse, or names a
    port no socket has), in a line; None when nothing is."""
    try:
        port = make_url(url).port
    except (ArgumentError, ValueError) as exc:
        return f"cannot read the URL: {str(exc).splitlines()[0][:200]}"
    if port is not None and not 0 < port < 65536:
        return f"port {port} is not between 1 and 65535"
    return None


def normalize_url(url: str) -> URL:
    """Map a user's URL onto the async driver synckit uses for its engine.

    ``sqlite:///x.db`` becomes ``sqlite+aiosqlite:///x.db``; ``postgresql://``,
    ``postgres://`` and the psycopg/asyncpg variants become ``postgresql+asyncpg://``.
    Anything else is a :class:`ConfigurationError`.
    """
    raw = url.strip()
    if raw.startswith("postgres://"):
        raw = "postgresql://" + raw[len("postgres://") :]
    try:
        parsed = make_url(raw)
    except ArgumentError as exc:
        raise ConfigurationError(f"cannot parse database URL {mask_url(raw)!r}") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ConfigurationError(
                "an in-memory SQLite database cannot be shared by workers; "
                "use a file URL such as sqlite:///synckit.db"
            )
        return parsed.set(drivername="sqlite+aiosqlite")
    if backend == "postgresql":
        return parsed.set(drivername="postgresql+asyncpg")
    raise ConfigurationError(
        f"unsupported database URL {mask_url(raw)!r}: synckit runs on sqlite:/// or postgresql://"
    )


#: Execution option of a connection opened by :meth:`Database.read`.
_READ_ONLY = "synckit_read_only"


#: What every new PostgreSQL connection sets for its session (_install_pg_session).
PG_SESSION = ("SET jit = off",)


def _install_pg_session(engine: AsyncEngine, statements: tuple[str, ...] = PG_SESSION) -> None:
    """Every new PostgreSQL connection turns JIT off for its session (``statements``).

    synckit's statements are short, but a claim's lane update (whose correlated next-due
    subquery the planner costs at ~1,700 a row) passed ``jit_above_cost`` at 64 lanes,
    and PostgreSQL then spent ~8 ms compiling, at every claim, a statement that runs in
    0.4 ms. A ``SET`` on connect rather than a startup parameter: connection poolers
    (PgBouncer) refuse startup parameters they do not know. A server without JIT
    (before PostgreSQL 11) refuses the setting, and keeps its connection as it is."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        for statement in statements:
            try:
                dbapi_connection.run_async(lambda conn, sql=statement: conn.execute(sql))
            except Exception as exc:  # e.g. no JIT to turn off: nothing to do
                log.debug("PostgreSQL refused %r: %s", statement, exc)


def _install_sqlite_pragmas(engine: AsyncEngine | Engine) -> None:
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
        if conn.get_execution_options().get(_READ_ONLY):
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
                if not _is_busy(exc) or time.monotonic() >= deadline:
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


class _Busy:
    """The inline connection could not take SQLite's write lock without waiting."""


BUSY = _Busy()


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

    def try_run(self, fn: Callable[..., T], *args: Any) -> T | _Busy:
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
                if _is_busy(exc):
                    return BUSY
                raise
            try:
                result = fn(conn, *args)
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
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
class _Write:
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


class _WriteQueue:
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
        self.items: list[_Write] = []
        #: Drains running (SQLite's writer thread: at most one).
        self.draining = 0

    def put(self, item: _Write, drains: int = 1) -> bool:
        """Queue ``item``; True when the caller must start a drain (on the writer thread;
        on PostgreSQL a task), which it may while fewer than ``drains`` run."""
        with self.lock:
            self.items.append(item)
            if self.draining >= drains:
                return False
            self.draining += 1
            return True

    def take(self) -> list[_Write]:
        """The next group (empty: this drain ends, and a later put starts another)."""
        with self.lock:
            group, self.items = self.items[: self.MAX], self.items[self.MAX :]
            if not group:
                self.draining -= 1
            return group


def _run_group(conn: Connection, items: list[_Write]) -> list[Any]:
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
            out.extend(_call_many(conn, many, items[i:j]))
        else:
            out.append(items[i].context.run(items[i].fn, conn, *items[i].args))
        i = j
    return out


def _call_many(conn: Connection, many: Callable[..., list[Any]], items: list[_Write]) -> list[Any]:
    """``many`` on the writes ``items`` (``write_grouped``), in the first one's context:
    one result for each, or RuntimeError."""
    values = items[0].context.run(many, conn, [it.args[0] for it in items])
    if len(values) != len(items):
        raise RuntimeError(f"{many.__name__} gave {len(values)} results for {len(items)}")
    return values


def _deliver(item: _Write, ok: bool, value: Any) -> None:
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
_ALONE: Any = object()


def _settle(item: _Write, value: Any) -> None:
    if not item.future.done():
        item.future.set_result(value)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text_ = str(exc).lower()
    return "locked" in text_ or "busy" in text_


@dataclass(frozen=True)
class Database:
    """An engine and what synckit needs to know about it."""

    engine: AsyncEngine
    url: URL
    #: The URL as the user gave it (before the async driver was filled in).
    given_url: str
    #: SQLite only: a synchronous engine whose transactions run whole in one thread (see
    #: :meth:`write`).
    sync_engine: Engine | None = None
    _writer: ThreadPoolExecutor | None = field(default=None, repr=False)
    _inline: InlineSqlite | None = field(default=None, repr=False)
    #: The writer thread's own state (its connection); touched only on that thread.
    _writer_state: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: Writes waiting for the writer thread (group commit, :class:`_WriteQueue`).
    _queue: _WriteQueue = field(default_factory=_WriteQueue, repr=False, compare=False)
    #: PostgreSQL: :meth:`write_grouped`'s waiting writes, per event loop.
    _grouped: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _WriteQueue] = field(
        default_factory=weakref.WeakKeyDictionary, repr=False, compare=False
    )
    _group_tasks: set[asyncio.Task[None]] = field(default_factory=set, repr=False, compare=False)
    #: SQLite only: the thread that runs :meth:`run_read`'s functions, and its connection.
    _reader: ThreadPoolExecutor | None = field(default=None, repr=False)
    _reader_state: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: :attr:`clock`'s one cell (the dataclass is frozen; the clock is lent later).
    _clock: list[Callable[[], datetime]] = field(
        default_factory=lambda: [utcnow], repr=False, compare=False
    )

    @property
    def clock(self) -> Callable[[], datetime]:
        """The time rows written through this database are stamped with when the caller
        gives none (``enqueue``, ``enqueue_many``, ``add_tenant``): the wall clock, or the
        clock of an ``App(clock=...)`` that used this database (a test's FakeClock, so
        that jobs a test enqueues are due on the clock its worker runs by)."""
        return self._clock[0]

    def use_clock(self, clock: Callable[[], datetime]) -> None:
        """Make ``clock`` this database's :attr:`clock`."""
        self._clock[0] = clock

    def __await__(self) -> Generator[Any, None, Database]:
        """``await open_database(url)``: the database, connected and checked (as
        :meth:`check`), so that a script reads ``db = await open_database(url)`` then
        ``await migrate_database(db)``. The plain call connects nothing (first use does)."""

        async def checked() -> Database:
            try:
                await self.check()
            except BaseException:
                await self.dispose()  # the caller never gets it to dispose of
                raise
            return self

        return checked().__await__()

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self.engine.dialect.name

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    @property
    def display_url(self) -> str:
        """The user's URL with the password masked."""
        return mask_url(self.given_url)

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A connection in a transaction, committed on exit, rolled back on error.

        Driver errors are translated into :class:`DatabaseError` at this seam.
        """
        try:
            async with self.engine.begin() as conn:
                yield conn
        except _driver_errors() as exc:
            raise self.translate(exc) from exc

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A connection in a transaction for reading only.

        On SQLite the transaction is deferred: it reads a snapshot of the WAL and takes no
        lock, so a read never waits for a writer nor holds up one (:meth:`begin` takes the
        write lock up front, for transactions that will write). A write inside it fails
        or waits as SQLite decides; use :meth:`begin` or :meth:`write` to write. On
        PostgreSQL it is an ordinary transaction. Errors are translated as in :meth:`begin`.
        """
        try:
            async with self.engine.connect() as conn:
                await conn.execution_options(**{_READ_ONLY: True})
                async with conn.begin():
                    yield conn
        except _driver_errors() as exc:
            raise self.translate(exc) from exc

    async def run_read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` in one read transaction and return its result.

        The reading counterpart of :meth:`write`, for the short reads of hot paths: on
        SQLite the whole transaction runs in one hop to a reader thread, deferred (a WAL
        snapshot, no lock), where :meth:`read` through aiosqlite costs a thread round
        trip per statement; on PostgreSQL it is :meth:`read` with ``run_sync``. ``fn`` is
        synchronous SQLAlchemy Core code that only reads.
        """
        if self.sync_engine is None or self._reader is None:
            async with self.read() as conn:
                return await conn.run_sync(fn, *args)
        loop = asyncio.get_running_loop()
        run = contextvars.copy_context().run
        return await loop.run_in_executor(self._reader, run, self._read_sync, fn, args)

    def _read_sync(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        assert self.sync_engine is not None
        conn = self._reader_state.get("conn")
        try:
            try:
                if conn is None:
                    conn = self.sync_engine.connect().execution_options(**{_READ_ONLY: True})
                    self._reader_state["conn"] = conn
                with conn.begin():
                    return fn(conn, *args)
            except BaseException:
                self._close_reader_connection()
                raise
        except _driver_errors() as exc:
            raise self.translate(exc) from exc

    def _close_reader_connection(self) -> None:
        conn = self._reader_state.pop("conn", None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[AsyncConnection]:
        """A connection where each statement commits on its own (one round trip each).

        For single statements that are atomic by themselves; errors are translated as in
        :meth:`begin`.
        """
        try:
            async with self.engine.connect() as conn:
                yield await conn.execution_options(isolation_level="AUTOCOMMIT")
        except _driver_errors() as exc:
            raise self.translate(exc) from exc

    @asynccontextmanager
    async def raw_pg(self) -> AsyncIterator[Any]:
        """PostgreSQL: a pooled connection's own asyncpg connection, outside any transaction.

        For the few hot single statements where SQLAlchemy's per-execution work costs as
        much as the round trip (one enqueued job). Each statement commits on its own.
        Errors are translated as in :meth:`begin`; a connection that failed at the
        connection level is invalidated rather than returned to the pool.
        """
        try:
            raw = await self.engine.raw_connection()
        except _driver_errors() as exc:
            raise self.translate(exc) from exc
        try:
            yield raw.driver_connection
        except _driver_errors() as exc:
            if not _is_statement_error(exc):
                # The server went away (a restart, say): every pooled connection is as
                # dead as this one, so start a new pool, as SQLAlchemy does itself when
                # a statement finds a disconnect.
                raw.invalidate(exc)
                await self.engine.dispose(close=False)
            raise self.translate(exc) from exc
        finally:
            raw.close()

    def translate(self, exc: BaseException) -> DatabaseError:
        """A driver or network error as the one-line synckit error naming this database."""
        if isinstance(exc, OSError):
            return DatabaseUnavailable(f"cannot reach database {self.display_url}: {exc}")
        return translate_db_error(exc, self.given_url)

    async def check(self) -> None:
        """Connect and prove the database is usable for writing; raise a clear error if not."""
        async with self.begin() as conn:
            await conn.execute(text("SELECT 1"))
            if self.dialect == "sqlite":
                # A read-only file opens fine and only fails on the first write.
                mode = (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar()
                if str(mode).lower() != "wal":
                    raise DatabaseError(
                        f"database {self.display_url} is not writable (journal mode {mode})"
                    )
                await conn.exec_driver_sql("CREATE TEMP TABLE IF NOT EXISTS _synckit_probe(x)")

    async def check_schema(self) -> None:
        """Raise a one-line :class:`DatabaseError` saying to run ``synckit db upgrade`` when
        the schema is missing or older than this synckit's; create nothing on the way.

        A SQLite file that does not exist is reported as such before any connection
        (connecting would create it, empty).
        """
        if self.dialect == "sqlite":
            path = self.url.database
            local = bool(path) and path != ":memory:" and not str(path).startswith("file:")
            # One stat of a local file, before any connection: no thread hop is worth it.
            if local and not os.path.exists(str(path)):  # noqa: ASYNC240
                raise DatabaseError(
                    f"database {self.display_url} does not exist: "
                    "run `synckit db upgrade` to create it"
                )
        try:
            # The first connection of every command: an unreachable server, an unknown
            # database or role is one line here, as in :meth:`begin`.
            async with self.engine.connect() as conn:
                present = await conn.run_sync(lambda c: inspect(c).has_table("alembic_version"))
                rev = None
                if present:
                    query = text("SELECT version_num FROM alembic_version")
                    rev = (await conn.execute(query)).scalar()
        except _driver_errors() as exc:
            raise self.translate(exc) from exc
        if rev is None:
            raise DatabaseError(
                f"database {self.display_url} has no synckit schema: run `synckit db upgrade`"
            )
        known = schema_revisions()
        if rev != known[-1]:
            if rev in known:
                raise DatabaseError(
                    f"database {self.display_url} is at schema revision {rev}, this synckit "
                    f"needs {known[-1]}: run `synckit db upgrade`"
                )
            raise DatabaseError(
                f"database {self.display_url} is at schema revision {rev}, which this synckit "
                f"does not know (its newest is {known[-1]}): upgrade synckit"
            )

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` in one write transaction and return its result.

        On SQLite the whole transaction runs in one hop to a dedicated thread with a
        synchronous connection: through aiosqlite every statement, the BEGIN and the
        COMMIT each cost a thread round trip, which dominates short transactions (3x
        slower enqueues). Writes that queue while that thread is busy share one
        transaction, each in a savepoint of its own (group commit, :class:`_WriteQueue`):
        a write that raises fails alone, and each returns once it is committed. On
        PostgreSQL it runs on the async engine via ``run_sync``. ``fn`` is plain
        synchronous SQLAlchemy Core code either way, and sees the caller's context
        variables on both engines (a tenant's secret values bound for redaction, the job's
        log context), as it would through ``run_sync``.
        """
        return await self._write(fn, args, None)

    async def _write(
        self, fn: Callable[..., T], args: tuple[Any, ...], many: Callable[..., Any] | None
    ) -> T:
        if self.sync_engine is None or self._writer is None:
            async with self.begin() as conn:
                return await conn.run_sync(fn, *args)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        item = _Write(fn, args, contextvars.copy_context(), loop, future, many=many)
        if self._queue.put(item):
            self._writer.submit(self._drain)
        return await future

    async def write_grouped(
        self,
        fn: Callable[..., T],
        *args: Any,
        order: tuple[str, ...] = (),
        many: Callable[[SyncConn, list[Any]], list[T]] | None = None,
        pipeline: bool = False,
    ) -> T:
        """:meth:`write`, for short writes that many tasks make at once and that rarely
        fail (a poll page's commit). On SQLite it is :meth:`write` (whose group commit
        already takes them together). On PostgreSQL the writes that queue while a group
        runs share the next transaction, one after another with no savepoint between
        them (a savepoint costs the client as much as a transaction of its own; without
        one a write costs a quarter of that). When any write of a group raises, the group
        is rolled back whole and each of its writes runs again alone through
        :meth:`write`, in its caller's task: every caller then gets its own write's
        result or error, as if it had had a transaction of its own. So ``fn`` must do
        nothing but its statements (it may run twice, the first time rolled back).
        Each ``fn`` sees its caller's context variables. A caller cancelled before its
        group began does not write; one cancelled later may find its write committed.

        ``order``: a group runs its writes sorted by it (equal ones in the order they
        came), so that writes locking rows other groups may lock too (a tenant's audit
        bucket of the minute) take them in one order in every group. Two workers' groups
        taking two tenants' buckets in opposite orders deadlocked on PostgreSQL (each
        then waits ``deadlock_timeout``, and the cancelled group re-runs write by write).

        ``many``: the writes of a group that give the same ``many`` run as one call,
        ``many(conn, [arg, ...])``, which returns each one's result in turn: set-based
        statements where ``fn`` would run one statement per write. On PostgreSQL those
        of them that come together in the group's order do; on SQLite all of the writer
        thread's group, in one savepoint (the group's writes are concurrent: any order is
        theirs). It must do what ``fn`` does for each: when it raises, each write runs
        alone through ``fn`` (on PostgreSQL the group is redone write by write; on SQLite
        each in a savepoint of its own). It runs in the first one's context.

        ``pipeline`` (PostgreSQL): a write that finds no group to share runs as a group
        of one rather than alone beside the groups, so that the writes arriving meanwhile
        wait for it and share a later transaction: at most :data:`PIPELINE_DEPTH`
        transactions at a time, each taking all that waits when it begins (a flood of
        one-statement writes, such as webhook deliveries, then costs a transaction per
        group, not per write, and a group's statements overlap another's commit).
        """
        if many is not None and len(args) != 1:
            raise TypeError("write_grouped(many=...) takes writes of one argument")
        if not self.is_postgres:
            return await self._write(fn, args, many)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        queue = self._grouped.get(loop)
        if queue is None:
            queue = self._grouped[loop] = _WriteQueue()
        item = _Write(fn, args, contextvars.copy_context(), loop, future, order, many, pipeline)
        if queue.put(item, PIPELINE_DEPTH if pipeline else 1):
            task = loop.create_task(self._run_groups(queue))
            self._group_tasks.add(task)
            task.add_done_callback(self._group_tasks.discard)
        value = await future
        if value is _ALONE:
            return await self.write(fn, *args)
        return cast(T, value)

    async def _run_groups(self, queue: _WriteQueue) -> None:
        try:
            await self._run_queued_groups(queue)
        except BaseException:  # cancelled (the loop closing): the waiting write alone
            with queue.lock:
                rest, queue.items = queue.items, []
                queue.draining -= 1
            for item in rest:
                _settle(item, _ALONE)
            raise

    async def _run_queued_groups(self, queue: _WriteQueue) -> None:
        while group := queue.take():
            group = [item for item in group if not item.future.done()]
            if not group:
                continue
            if len(group) == 1 and not group[0].pipeline:  # as write() would, in its task
                _settle(group[0], _ALONE)
                continue
            group.sort(key=lambda item: item.order)

            def run(conn: Connection, items: list[_Write] = group) -> list[Any]:
                return _run_group(conn, items)

            try:
                async with self.engine.begin() as conn:
                    values = await conn.run_sync(run)
            except BaseException as exc:  # which write failed, and how, each learns alone
                for item in group:
                    _settle(item, _ALONE)
                if not isinstance(exc, Exception):
                    raise
                continue
            for item, value in zip(group, values, strict=True):
                _settle(item, value)

    def _drain(self) -> None:
        """The writer thread: run queued writes, a group per transaction, until none wait."""
        while group := self._queue.take():
            # A caller cancelled before its write started: the write does not run (as
            # with run_in_executor, whose pending work is dropped on cancellation).
            group = [item for item in group if not item.future.done()]
            if len(group) == 1:
                item = group[0]
                try:
                    result = item.context.run(self._write_sync, item.fn, item.args)
                except BaseException as exc:
                    _deliver(item, False, exc)
                else:
                    _deliver(item, True, result)
            elif group:
                self._write_group(group)
            yield_write_lock(self._writer_state.get("conn"))

    def _write_group(self, group: list[_Write]) -> None:
        assert self.sync_engine is not None
        outcomes: list[tuple[bool, Any]] = []
        try:
            try:
                conn = self._writer_state.get("conn")
                if conn is None:
                    conn = self._writer_state["conn"] = self.sync_engine.connect()
                with conn.begin():
                    done = self._write_many(conn, group)
                    for item in group:
                        if item in done:
                            outcomes.append((True, done[item]))
                            continue
                        try:
                            with savepoint(conn):
                                value = item.context.run(item.fn, conn, *item.args)
                        except Exception as exc:
                            if isinstance(exc, _driver_errors()):
                                exc = self.translate(exc)
                            outcomes.append((False, exc))
                        else:
                            outcomes.append((True, value))
            except BaseException:
                self._close_writer_connection()
                raise
        except BaseException as exc:
            failure = self.translate(exc) if isinstance(exc, _driver_errors()) else exc
            for item in group:
                _deliver(item, False, failure)
            return
        for item, (ok, value) in zip(group, outcomes, strict=True):
            _deliver(item, ok, value)

    def _write_many(self, conn: Connection, group: list[_Write]) -> dict[_Write, Any]:
        """The writer thread's group: run the writes sharing a ``many`` (write_grouped)
        in one call each, in one savepoint; their results. A call that raises is rolled
        back and leaves its writes to run alone."""
        by_many: dict[Callable[..., Any], list[_Write]] = {}
        for item in group:
            if item.many is not None:
                by_many.setdefault(item.many, []).append(item)
        done: dict[_Write, Any] = {}
        for many, items in by_many.items():
            if len(items) < 2:
                continue
            try:
                with savepoint(conn):
                    values = _call_many(conn, many, items)
            except Exception:
                continue
            done.update(zip(items, values, strict=True))
        return done

    def _write_sync(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        assert self.sync_engine is not None
        # The writer thread keeps one connection: checking a connection out of the pool
        # and resetting it on return cost more than many of the transactions it runs.
        conn = self._writer_state.get("conn")
        try:
            try:
                if conn is None:
                    conn = self._writer_state["conn"] = self.sync_engine.connect()
                with conn.begin():
                    return fn(conn, *args)
            except BaseException:
                # Whatever state a failure left the connection in, the next transaction
                # starts on a fresh one.
                self._close_writer_connection()
                raise
        except _driver_errors() as exc:
            raise self.translate(exc) from exc

    def _close_writer_connection(self) -> None:
        conn = self._writer_state.pop("conn", None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def try_inline(self, fn: Callable[..., T], *args: Any) -> T | _Busy:
        """SQLite: run ``fn(sqlite3_connection, *args)`` now on this thread, or :data:`BUSY`.

        See :class:`InlineSqlite`. Only for transactions of a few statements, and only
        with raw ``sqlite3`` calls. On PostgreSQL this always returns :data:`BUSY`.
        Must be called from a running event loop (checkpoints go to the writer thread).
        """
        if self._inline is None:
            return BUSY
        try:
            result = self._inline.try_run(fn, *args)
        except _driver_errors() as exc:
            raise self.translate(exc) from exc
        every = InlineSqlite.CHECKPOINT_EVERY
        if not isinstance(result, _Busy) and self._inline.commits % every == 0:
            asyncio.get_running_loop().run_in_executor(self._writer, self._checkpoint)
        return result

    def _checkpoint(self) -> None:
        assert self.sync_engine is not None
        try:
            # The raw connection: SQLAlchemy's would open a transaction first (the begin
            # event), and SQLite refuses a checkpoint inside one.
            raw = self.sync_engine.raw_connection()
            try:
                raw.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)")  # type: ignore[union-attr]
            finally:
                raw.close()
        except Exception as exc:  # a later checkpoint will do; never fail the caller
            log.warning("WAL checkpoint failed: %s", str(exc).splitlines()[0])

    async def dispose(self) -> None:
        if self._inline is not None:
            self._inline.close()
        if self._writer is not None and self._writer_state:
            await asyncio.get_running_loop().run_in_executor(
                self._writer, self._close_writer_connection
            )
        if self._reader is not None and self._reader_state:
            await asyncio.get_running_loop().run_in_executor(
                self._reader, self._close_reader_connection
            )
        await self.engine.dispose()
        if self._writer is not None:
            self._writer.shutdown(wait=False)
        if self._reader is not None:
            self._reader.shutdown(wait=False)
        if self.sync_engine is not None:
            self.sync_engine.dispose()


_BASE_DRIVER_ERRORS: tuple[type[BaseException], ...] = (DBAPIError, OSError, sqlite3.Error)


def _driver_errors() -> tuple[type[BaseException], ...]:
    """What a database call can raise that the seam turns into a DatabaseError:
    SQLAlchemy's wrapped driver errors, network errors, sqlite3's (inline) and asyncpg's
    own (raised while connecting, when the server is starting or shutting down, and on
    raw_pg connections).

    asyncpg's only once something imported it (a PostgreSQL engine does, when it is
    created): no asyncpg error exists before, and a SQLite process (every CLI command on
    SQLite) need not import it (~30 ms). Called in ``except`` clauses, which evaluate it
    only when an exception is raised."""
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is None:
        return _BASE_DRIVER_ERRORS
    return (*_BASE_DRIVER_ERRORS, asyncpg.PostgresError, asyncpg.InterfaceError)


def _is_statement_error(exc: BaseException) -> bool:
    """An error the server raised for one statement (the connection is still good)."""
    try:
        import asyncpg
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, asyncpg.PostgresError) and not isinstance(
        exc, asyncpg.exceptions.PostgresConnectionError | asyncpg.exceptions.AdminShutdownError
    )


def translate_db_error(exc: BaseException, url: URL | str) -> DatabaseError:
    """Turn a driver error into a one-line :class:`DatabaseError` naming the database."""
    shown = mask_url(url)
    orig = getattr(exc, "orig", None) or exc
    message = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    lowered = message.lower()
    if "readonly" in lowered or "read-only" in lowered or "read only" in lowered:
        return DatabaseError(f"database {shown} is read-only: {message}")
    if "unable to open database file" in lowered:
        return DatabaseError(f"cannot open database {shown}: {message}")
    unavailable_markers = (
        "connection refused",
        "could not connect",
        "connect call failed",
        "connection was closed",
        "connection is closed",
        "connectiondoesnotexist",
        "cannot connect",
        "the database system is starting up",
        "the database system is shutting down",
        "too many connections",
        "terminating connection",
        "timeout",
    )
    if getattr(exc, "connection_invalidated", False) or any(
        m in lowered for m in unavailable_markers
    ):
        return DatabaseUnavailable(f"cannot reach database {shown}: {message}")
    return DatabaseError(f"database {shown}: {message}")


def is_driver_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a driver error as SQLAlchemy raises it (:meth:`Database.translate`
    makes it the one-line :class:`DatabaseError`)."""
    return isinstance(exc, DBAPIError)


def connection_lost(conn: Connection, exc: BaseException) -> bool:
    """Whether ``exc``, raised on ``conn``, means the connection (not this one statement)
    failed."""
    if conn.invalidated or conn.closed:
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OperationalError | InterfaceError)


#: ``conn.info`` key: how many :func:`savepoint` blocks are open on the connection.
_SAVEPOINTS = "synckit_savepoints"


@contextlib.contextmanager
def savepoint(conn: Connection) -> Iterator[None]:
    """Run the block in a savepoint: an exception leaving it rolls back what the block
    wrote, and the transaction goes on; otherwise its writes stay in the transaction.

    What ``conn.begin_nested()`` does, for a fraction of its cost: SQLAlchemy's nested
    transaction cost ~100 µs on SQLite, and on PostgreSQL (asyncpg) ~1.1 ms of CPU,
    since each of its savepoints has a name of its own, which asyncpg prepares anew
    (two more round trips each time). Here the names are fixed per nesting depth
    (``synckit_sp1``, ``synckit_sp2`` ...), so the statements are prepared once: ~20 µs
    and ~0.4 ms. Only for blocks whose exceptions are Python's (statements and code run
    between the savepoint and its release). When the rollback itself fails (the
    connection is lost), the block's exception is raised; the connection is then
    invalidated, as the caller can see.
    """
    depth = conn.info.get(_SAVEPOINTS, 0) + 1
    name = f"synckit_sp{depth}"
    conn.exec_driver_sql(f"SAVEPOINT {name}")
    conn.info[_SAVEPOINTS] = depth
    try:
        yield
    except BaseException:
        conn.info[_SAVEPOINTS] = depth - 1
        with contextlib.suppress(Exception):
            conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {name}")
            conn.exec_driver_sql(f"RELEASE SAVEPOINT {name}")
        raise
    conn.info[_SAVEPOINTS] = depth - 1
    conn.exec_driver_sql(f"RELEASE SAVEPOINT {name}")


def schema_revisions() -> list[str]:
    """The schema revisions this synckit ships, oldest first.

    Read from the migration files' names (each starts with its revision id), so that
    checking a database's revision does not import Alembic; a test holds the last one
    to Alembic's head.
    """
    versions = Path(__file__).parent / "migrations" / "versions"
    return sorted(p.name.split("_", 1)[0] for p in versions.glob("[0-9]*_*.py"))


def open_database(
    url: str | None = None,
    *,
    pool_size: int = 10,
    echo: bool = False,
    pg_schema: str | None = None,
) -> Database:
    """Create the engine for ``url`` (see :func:`database_url_from_env` for the default).

    ``pg_schema`` puts synckit's tables in that PostgreSQL schema (its ``search_path``);
    tests use it to give every test a database of its own. Raises
    :class:`ConfigurationError` for a URL synckit cannot use. Nothing is connected until
    first use; call :meth:`Database.check` to fail fast, or open it as the async API
    does elsewhere: ``db = await open_database(url)`` connects and checks it (then
    ``await migrate_database(db)`` brings its schema up to date).
    """
    given = database_url_from_env(url)
    parsed = normalize_url(given)
    # ``?search_path=name`` on a PostgreSQL URL selects the schema, so that a URL alone
    # (passed to a worker process, say) says everything about where the tables live.
    url_schema = parsed.query.get("search_path")
    if isinstance(url_schema, tuple):
        url_schema = url_schema[-1]
    parsed = parsed.difference_update_query(["search_path"])
    pg_schema = pg_schema or url_schema
    kwargs: dict[str, Any] = {"echo": echo}
    if parsed.get_backend_name() == "postgresql":
        # No pre-ping: it costs a round trip per checkout. A connection found dead fails
        # its statement, SQLAlchemy then invalidates the whole pool, and every caller
        # (the worker included) retries database errors with backoff.
        # Every connection the pool opens stays open: a worker's 64 concurrent cycles
        # went past a pool of 10 (+10 overflow) all the time, and each overflow
        # connection was closed on its return and opened again for the next transaction
        # (asyncpg connect: ~6% of a PostgreSQL worker's CPU in bench.tenants). The pool is
        # at most ``pool_size``; callers past it wait for a connection (transactions are
        # short, and none holds one connection while it waits for another).
        kwargs.update(pool_size=pool_size, max_overflow=0)
        connect_args: dict[str, Any] = {"timeout": 10}
        if pg_schema:
            connect_args["server_settings"] = {"search_path": pg_schema}
        kwargs["connect_args"] = connect_args
    try:
        engine = create_async_engine(parsed, **kwargs)
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        hint = " (install synckit[postgres])" if "asyncpg" in str(exc) else ""
        raise ConfigurationError(
            f"cannot create an engine for {mask_url(parsed)}: {exc}{hint}"
        ) from exc
    if engine.dialect.name == "postgresql":
        _install_pg_session(engine)
        # The partial indexes' PostgreSQL predicates, set once the dialect is in use.
        from synckit.store.tables import postgresql_partial_indexes

        postgresql_partial_indexes()
    if engine.dialect.name == "sqlite":
        _install_sqlite_pragmas(engine)
        sync_url = parsed.set(drivername="sqlite+pysqlite")
        sync_engine = create_engine(sync_url)
        _install_sqlite_pragmas(sync_engine)
        inline_engine = create_engine(
            sync_url, poolclass=NullPool, connect_args={"check_same_thread": False}
        )
        _install_sqlite_pragmas(inline_engine)
        return Database(
            engine=engine,
            url=parsed,
            given_url=given,
            sync_engine=sync_engine,
            _writer=ThreadPoolExecutor(1, thread_name_prefix="synckit-sqlite-writer"),
            _inline=InlineSqlite(inline_engine),
            _reader=ThreadPoolExecutor(1, thread_name_prefix="synckit-sqlite-reader"),
        )
    return Database(engine=engine, url=parsed, given_url=given)
