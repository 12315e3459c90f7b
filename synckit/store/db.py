"""The engine factory: ``open_database`` and :class:`Database` (driver errors become
synckit errors in :mod:`synckit.store.db_errors`; SQLite's one writer is
:mod:`synckit.store.sqlite_writer`).

``open_database(url)`` gives a :class:`Database`: an async SQLAlchemy engine configured
for the engine behind the URL.

* SQLite (the embedded default): WAL, ``busy_timeout``, foreign keys and
  ``synchronous=NORMAL`` on every connection, and every transaction opened with
  ``BEGIN IMMEDIATE`` so that a transaction that will write takes the write lock up
  front instead of failing with ``SQLITE_BUSY`` when it upgrades from a read; reads
  (:meth:`Database.read`) open a deferred transaction, which takes no lock.
  Write transactions run whole on a dedicated thread (:meth:`Database.write`), those
  that queue meanwhile grouped into one transaction (``sqlite_writer.WriteQueue``), and
  tiny ones right on the caller's thread when the write lock is free
  (``sqlite_writer.InlineSqlite``).
* PostgreSQL (through asyncpg): a connection pool without pre-ping; a connection found
  dead invalidates the pool and callers retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import weakref
from collections.abc import AsyncIterator, Callable, Generator
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
    NoSuchModuleError,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from synckit.clock import utcnow
from synckit.errors.exceptions import (
    ConfigurationError,
    DatabaseError,
    DatabaseUnavailable,
)
from synckit.store.db_errors import (
    driver_errors,
    is_statement_error,
    mask_url,
    savepoint,
    translate_db_error,
)
from synckit.store.sqlite_writer import (
    ALONE,
    BUSY,
    PIPELINE_DEPTH,
    READ_ONLY,
    Busy,
    InlineSqlite,
    QueuedWrite,
    WriteQueue,
    call_many,
    deliver,
    install_sqlite_pragmas,
    run_group,
    settle_future,
    yield_write_lock,
)
from synckit.store.urls import database_url_from_env

T = TypeVar("T")

# The connections operations run on, named here so that the modules above the store can
# annotate them without importing SQLAlchemy (tests/unit/test_layers.py): ``Conn`` as
# ``Database.begin()``/``read()`` give it, ``SyncConn`` inside ``Database.write``/``run_read``.
Conn: TypeAlias = AsyncConnection
SyncConn: TypeAlias = Connection

log = logging.getLogger(__name__)


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


def _close_kept(state: dict[str, Any]) -> None:
    """Close the connection a writer or reader thread keeps in ``state`` (if it has one)."""
    conn = state.pop("conn", None)
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()


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
    #: Writes waiting for the writer thread (group commit, :class:`WriteQueue`).
    _queue: WriteQueue = field(default_factory=WriteQueue, repr=False, compare=False)
    #: PostgreSQL: :meth:`write_grouped`'s waiting writes, per event loop.
    _grouped: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WriteQueue] = field(
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
        except driver_errors() as exc:
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
                await conn.execution_options(**{READ_ONLY: True})
                async with conn.begin():
                    yield conn
        except driver_errors() as exc:
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
        return self._kept_transaction(self._reader_state, fn, args, read_only=True)

    def _close_reader_connection(self) -> None:
        _close_kept(self._reader_state)

    def _kept_transaction(
        self, state: dict[str, Any], fn: Callable[..., T], args: tuple[Any, ...], *, read_only: bool
    ) -> T:
        """Run ``fn(conn, *args)`` in one transaction on the connection its thread (the
        writer's or the reader's) keeps in ``state``: checking a connection out of the pool
        and resetting it on return cost more than many of the transactions it runs."""
        assert self.sync_engine is not None
        conn = state.get("conn")
        try:
            try:
                if conn is None:
                    conn = self.sync_engine.connect()
                    if read_only:
                        conn = conn.execution_options(**{READ_ONLY: True})
                    state["conn"] = conn
                with conn.begin():
                    return fn(conn, *args)
            except BaseException:
                # Whatever state a failure left the connection in, the next transaction
                # starts on a fresh one.
                _close_kept(state)
                raise
        except driver_errors() as exc:
            raise self.translate(exc) from exc

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[AsyncConnection]:
        """A connection where each statement commits on its own (one round trip each).

        For single statements that are atomic by themselves; errors are translated as in
        :meth:`begin`.
        """
        try:
            async with self.engine.connect() as conn:
                yield await conn.execution_options(isolation_level="AUTOCOMMIT")
        except driver_errors() as exc:
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
        except driver_errors() as exc:
            raise self.translate(exc) from exc
        try:
            yield raw.driver_connection
        except driver_errors() as exc:
            if not is_statement_error(exc):
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
        except driver_errors() as exc:
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
        transaction, each in a savepoint of its own (group commit, :class:`WriteQueue`):
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
        item = QueuedWrite(fn, args, contextvars.copy_context(), loop, future, many=many)
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
            queue = self._grouped[loop] = WriteQueue()
        item = QueuedWrite(
            fn, args, contextvars.copy_context(), loop, future, order, many, pipeline
        )
        if queue.put(item, PIPELINE_DEPTH if pipeline else 1):
            task = loop.create_task(self._run_groups(queue))
            self._group_tasks.add(task)
            task.add_done_callback(self._group_tasks.discard)
        value = await future
        if value is ALONE:
            return await self.write(fn, *args)
        return cast(T, value)

    async def _run_groups(self, queue: WriteQueue) -> None:
        try:
            await self._run_queued_groups(queue)
        except BaseException:  # cancelled (the loop closing): the waiting write alone
            with queue.lock:
                rest, queue.items = queue.items, []
                queue.draining -= 1
            for item in rest:
                settle_future(item, ALONE)
            raise

    async def _run_queued_groups(self, queue: WriteQueue) -> None:
        while group := queue.take():
            group = [item for item in group if not item.future.done()]
            if not group:
                continue
            if len(group) == 1 and not group[0].pipeline:  # as write() would, in its task
                settle_future(group[0], ALONE)
                continue
            group.sort(key=lambda item: item.order)

            def run(conn: Connection, items: list[QueuedWrite] = group) -> list[Any]:
                return run_group(conn, items)

            try:
                async with self.engine.begin() as conn:
                    values = await conn.run_sync(run)
            except BaseException as exc:  # which write failed, and how, each learns alone
                for item in group:
                    settle_future(item, ALONE)
                if not isinstance(exc, Exception):
                    raise
                continue
            for item, value in zip(group, values, strict=True):
                settle_future(item, value)

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
                    deliver(item, False, exc)
                else:
                    deliver(item, True, result)
            elif group:
                self._write_group(group)
            yield_write_lock(self._writer_state.get("conn"))

    def _write_group(self, group: list[QueuedWrite]) -> None:
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
                            if isinstance(exc, driver_errors()):
                                exc = self.translate(exc)
                            outcomes.append((False, exc))
                        else:
                            outcomes.append((True, value))
            except BaseException:
                self._close_writer_connection()
                raise
        except BaseException as exc:
            failure = self.translate(exc) if isinstance(exc, driver_errors()) else exc
            for item in group:
                deliver(item, False, failure)
            return
        for item, (ok, value) in zip(group, outcomes, strict=True):
            deliver(item, ok, value)

    def _write_many(self, conn: Connection, group: list[QueuedWrite]) -> dict[QueuedWrite, Any]:
        """The writer thread's group: run the writes sharing a ``many`` (write_grouped)
        in one call each, in one savepoint; their results. A call that raises is rolled
        back and leaves its writes to run alone."""
        by_many: dict[Callable[..., Any], list[QueuedWrite]] = {}
        for item in group:
            if item.many is not None:
                by_many.setdefault(item.many, []).append(item)
        done: dict[QueuedWrite, Any] = {}
        for many, items in by_many.items():
            if len(items) < 2:
                continue
            try:
                with savepoint(conn):
                    values = call_many(conn, many, items)
            except Exception:
                continue
            done.update(zip(items, values, strict=True))
        return done

    def _write_sync(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        return self._kept_transaction(self._writer_state, fn, args, read_only=False)

    def _close_writer_connection(self) -> None:
        _close_kept(self._writer_state)

    def try_inline(self, fn: Callable[..., T], *args: Any) -> T | Busy:
        """SQLite: run ``fn(sqlite3_connection, *args)`` now on this thread, or :data:`BUSY`.

        See :class:`InlineSqlite`. Only for transactions of a few statements, and only
        with raw ``sqlite3`` calls. On PostgreSQL this always returns :data:`BUSY`.
        Must be called from a running event loop (checkpoints go to the writer thread).
        """
        if self._inline is None:
            return BUSY
        try:
            result = self._inline.try_run(fn, *args)
        except driver_errors() as exc:
            raise self.translate(exc) from exc
        every = InlineSqlite.CHECKPOINT_EVERY
        if not isinstance(result, Busy) and self._inline.commits % every == 0:
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
        install_sqlite_pragmas(engine)
        sync_url = parsed.set(drivername="sqlite+pysqlite")
        sync_engine = create_engine(sync_url)
        install_sqlite_pragmas(sync_engine)
        inline_engine = create_engine(
            sync_url, poolclass=NullPool, connect_args={"check_same_thread": False}
        )
        install_sqlite_pragmas(inline_engine)
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
