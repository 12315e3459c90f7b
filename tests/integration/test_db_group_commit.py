"""``Database.write``: each write is its own all-or-nothing unit, on both engines.

On SQLite writes that queue for the writer thread share one transaction (group commit),
each in a savepoint: these tests hold that grouping to the promise of one transaction per
write (a write that raises leaves nothing and fails alone; the others commit) and show
that grouping happens at all. On PostgreSQL the same promises hold write by write, and
for ``write_grouped`` (a group's transaction without savepoints, redone write by write
when one of them fails).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from synckit.errors.exceptions import DatabaseError
from synckit.store.db import Database
from synckit.store.db_errors import savepoint


async def _table(db: Database) -> None:
    async with db.begin() as conn:
        await conn.execute(text("CREATE TABLE gc_probe (k VARCHAR(20) PRIMARY KEY, v INTEGER)"))


def _insert(conn: Connection, key: str, fail_after: bool) -> str:
    conn.execute(text("INSERT INTO gc_probe (k, v) VALUES (:k, 1)"), {"k": key})
    if fail_after:
        raise ValueError(f"write {key} gives up after its insert")
    return key


async def _keys(db: Database) -> set[str]:
    async with db.begin() as conn:
        return {r[0] for r in await conn.execute(text("SELECT k FROM gc_probe"))}


async def test_a_failing_write_leaves_nothing_and_the_others_commit(db: Database) -> None:
    await _table(db)
    writes = [db.write(_insert, f"k{i}", i % 7 == 3) for i in range(60)]
    results = await asyncio.gather(*writes, return_exceptions=True)
    failed = {i for i, r in enumerate(results) if isinstance(r, ValueError)}
    assert failed == {i for i in range(60) if i % 7 == 3}
    assert [r for r in results if not isinstance(r, Exception)] == [
        f"k{i}" for i in range(60) if i not in failed
    ]
    assert await _keys(db) == {f"k{i}" for i in range(60) if i not in failed}


async def test_a_statement_error_fails_only_its_write(db: Database) -> None:
    await _table(db)
    first = await asyncio.gather(*(db.write(_insert, f"d{i}", False) for i in range(5)))
    assert first == [f"d{i}" for i in range(5)]
    # d2 again breaks the primary key: that write fails with the database's error, the
    # ones queued beside it commit.
    again = [db.write(_insert, k, False) for k in ("e1", "d2", "e2", "e3")]
    results = await asyncio.gather(*again, return_exceptions=True)
    assert isinstance(results[1], DatabaseError)
    assert [results[0], results[2], results[3]] == ["e1", "e2", "e3"]
    assert await _keys(db) == {"d0", "d1", "d2", "d3", "d4", "e1", "e2", "e3"}


async def test_writes_that_queue_together_share_transactions_on_sqlite(
    db: Database, engine_name: str
) -> None:
    if engine_name != "sqlite":
        pytest.skip("group commit is SQLite's writer thread")
    await _table(db)
    assert db.sync_engine is not None
    begins: list[Any] = []

    def count(conn: Any) -> None:
        begins.append(conn)

    event.listen(db.sync_engine, "begin", count)
    try:
        await asyncio.gather(*(db.write(_insert, f"g{i}", False) for i in range(200)))
    finally:
        event.remove(db.sync_engine, "begin", count)
    assert len(await _keys(db)) == 200
    # 200 writes queued at once: at most 64 to a transaction, so at least 4, and far
    # fewer than one each.
    assert 4 <= len(begins) <= 20, len(begins)


async def test_a_write_cancelled_before_it_starts_does_not_run(
    db: Database, engine_name: str
) -> None:
    if engine_name != "sqlite":
        pytest.skip("the writer thread's queue is SQLite's")
    await _table(db)
    gate = asyncio.Event()
    started = asyncio.get_running_loop().create_future()
    loop = asyncio.get_running_loop()

    def _blocker(conn: Connection) -> None:
        loop.call_soon_threadsafe(started.set_result, None)
        # Hold the writer thread until the test has cancelled the queued write.
        asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(timeout=10)

    blocker = asyncio.ensure_future(db.write(_blocker))
    await started
    queued = asyncio.ensure_future(db.write(_insert, "never", False))
    await asyncio.sleep(0.01)
    queued.cancel()
    gate.set()
    await blocker
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert await _keys(db) == set()


# --- write_grouped: PostgreSQL's group commit for short writes made together --------------

_caller: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="?")


def _insert_seen(conn: Connection, key: str, fail_after: bool) -> tuple[str, str, int | None]:
    """Like _insert, and returns what the caller's context holds and the transaction id
    (PostgreSQL's; None on SQLite)."""
    _insert(conn, key, fail_after)
    txid = None
    if conn.dialect.name == "postgresql":
        txid = conn.execute(text("SELECT txid_current()")).scalar_one()
    return key, _caller.get(), txid


async def _grouped(db: Database, key: str, fail_after: bool) -> tuple[str, str, int | None]:
    _caller.set(f"caller-{key}")
    return await db.write_grouped(_insert_seen, key, fail_after)


async def test_grouped_writes_share_transactions_and_each_sees_its_callers_context(
    db: Database, engine_name: str
) -> None:
    await _table(db)
    results = await asyncio.gather(*(_grouped(db, f"w{i}", False) for i in range(100)))
    assert [(k, c) for k, c, _ in results] == [(f"w{i}", f"caller-w{i}") for i in range(100)]
    assert await _keys(db) == {f"w{i}" for i in range(100)}
    if engine_name == "postgresql":
        # 100 writes made at once: the first runs alone, the rest share transactions.
        transactions = {txid for _, _, txid in results}
        assert 2 <= len(transactions) <= 20, len(transactions)


async def test_a_group_runs_its_writes_in_their_order(db: Database, engine_name: str) -> None:
    """Writes given an ``order`` run sorted by it within each shared transaction (so that
    every group locks shared rows, such as a tenant's audit bucket, in one order)."""
    if engine_name != "postgresql":
        pytest.skip("SQLite's write_grouped is write(): one writer, no lock order")
    await _table(db)
    ran: list[tuple[int, str]] = []

    def insert_noting(conn: Connection, key: str) -> None:
        _insert(conn, key, False)
        ran.append((conn.execute(text("SELECT txid_current()")).scalar_one(), key))

    # Made in key order, ordered the other way round.
    await asyncio.gather(
        *(db.write_grouped(insert_noting, f"k{i:02}", order=(f"{99 - i:02}",)) for i in range(100))
    )
    by_transaction: dict[int, list[str]] = {}
    for txid, key in ran:
        by_transaction.setdefault(txid, []).append(key)
    shared = [keys for keys in by_transaction.values() if len(keys) > 1]
    assert shared, by_transaction
    assert all(keys == sorted(keys, reverse=True) for keys in shared), shared
    assert await _keys(db) == {f"k{i:02}" for i in range(100)}


async def test_a_failing_grouped_write_fails_alone_and_the_others_commit(db: Database) -> None:
    await _table(db)
    await db.write(_insert, "taken", False)
    keys = [f"f{i}" for i in range(40)]
    keys[17] = "taken"  # breaks the primary key: the database's error, for that write only
    writes = [_grouped(db, k, i % 9 == 4) for i, k in enumerate(keys)]
    results = await asyncio.gather(*writes, return_exceptions=True)
    raised = {i for i, r in enumerate(results) if isinstance(r, Exception)}
    assert raised == {i for i in range(40) if i % 9 == 4} | {17}
    assert isinstance(results[17], DatabaseError)
    assert all(isinstance(results[i], ValueError) for i in raised - {17})
    committed = {keys[i] for i in range(40) if i not in raised}
    assert [r[:2] for r in results if not isinstance(r, BaseException)] == [
        (k, f"caller-{k}") for k in keys if k in committed
    ]
    assert await _keys(db) == committed | {"taken"}


def _insert_many(conn: Connection, keys: list[str]) -> list[str]:
    """``_insert`` for many keys in one statement; a key ending in "!" fails the call."""
    _many_calls.append(list(keys))
    if any(k.endswith("!") for k in keys):
        raise ValueError("one of them gives up")
    if conn.dialect.name == "postgresql":
        conn.execute(
            text("INSERT INTO gc_probe (k, v) SELECT k, 1 FROM unnest(CAST(:ks AS text[])) k"),
            {"ks": keys},
        )
    else:
        for k in keys:
            _insert(conn, k, False)
    return keys


def _insert_one(conn: Connection, key: str) -> str:
    if key.endswith("!"):
        raise ValueError(f"write {key} gives up")
    return _insert(conn, key, False)


_many_calls: list[list[str]] = []


async def test_grouped_writes_sharing_many_run_in_one_call(db: Database, engine_name: str) -> None:
    """``write_grouped(..., many=f)``: a group's writes that share ``f`` run as one call of
    it (one statement where each would run its own), each caller getting its own result;
    when the call fails, each write runs alone through its own ``fn`` (and only the
    failing one fails)."""
    await _table(db)
    _many_calls.clear()
    keys = [f"m{i:02}" for i in range(60)]
    keys[31] = "m31!"
    results: list[Any] = []
    for part in (keys[:30], keys[30:]):  # the second part's group holds the failing write
        # On SQLite, a slow write first: the others queue behind it for the writer thread.
        slow = asyncio.ensure_future(db.write(lambda conn: time.sleep(0.2)))
        await asyncio.sleep(0.05)
        results += await asyncio.gather(
            *(db.write_grouped(_insert_one, k, order=(k,), many=_insert_many) for k in part),
            return_exceptions=True,
        )
        await slow
    assert [r for r in results if isinstance(r, BaseException)] == [results[31]]
    assert isinstance(results[31], ValueError)
    assert [r for r in results if not isinstance(r, BaseException)] == [
        k for k in keys if k != "m31!"
    ]
    assert await _keys(db) == set(keys) - {"m31!"}
    # Groups of several writes ran as one call; the one holding m31! failed, and its
    # writes ran alone (their keys are in the table all the same).
    assert any(len(c) > 1 and "m31!" not in c for c in _many_calls), _many_calls
    assert any("m31!" in c for c in _many_calls), _many_calls
    if engine_name == "sqlite":  # the writer thread's group: every write queued
        assert sorted(map(len, _many_calls)) == [30, 30], _many_calls
    with pytest.raises(TypeError, match="one argument"):
        await db.write_grouped(_insert_seen, "x", False, many=_insert_many)


async def test_a_read_neither_waits_for_a_writer_nor_blocks_one(
    db: Database, engine_name: str
) -> None:
    await _table(db)
    await db.write(_insert, "before", False)
    # Another connection holds an open write transaction (on SQLite: the write lock).
    async with db.engine.connect() as writer:
        await writer.begin()
        await writer.execute(text("INSERT INTO gc_probe (k, v) VALUES ('uncommitted', 1)"))
        async with asyncio.timeout(5):  # begin() would wait busy_timeout (30 s) on SQLite
            async with db.read() as conn:
                seen = {r[0] for r in await conn.execute(text("SELECT k FROM gc_probe"))}
        assert seen == {"before"}
        await writer.commit()
    assert await _keys(db) == {"before", "uncommitted"}


def _read_keys(conn: Connection) -> tuple[set[str], str]:
    import threading

    keys = {r[0] for r in conn.execute(text("SELECT k FROM gc_probe"))}
    return keys, threading.current_thread().name


async def test_run_read_reads_in_one_hop_without_waiting_for_a_writer(
    db: Database, engine_name: str
) -> None:
    await _table(db)
    await db.write(_insert, "before", False)
    async with db.engine.connect() as writer:
        await writer.begin()
        await writer.execute(text("INSERT INTO gc_probe (k, v) VALUES ('uncommitted', 1)"))
        async with asyncio.timeout(5):
            keys, thread = await db.run_read(_read_keys)
        await writer.commit()
    assert keys == {"before"}
    if engine_name == "sqlite":
        assert thread.startswith("synckit-sqlite-reader")
    # A failing read leaves the reader usable.
    with pytest.raises(DatabaseError):
        await db.run_read(lambda conn: conn.execute(text("SELECT nope FROM gc_probe")).all())
    assert (await db.run_read(_read_keys))[0] == {"before", "uncommitted"}


# --- savepoint(): a block rolled back alone, cheaper than begin_nested -------------------


def _savepoints_in_use(conn: Connection) -> list[str]:
    """Inserts in nested savepoint blocks, some failing; what the transaction keeps."""
    _insert(conn, "outer", False)
    with savepoint(conn):
        _insert(conn, "kept", False)
        with pytest.raises(ValueError), savepoint(conn):
            _insert(conn, "inner-failed", True)
        with pytest.raises(DBAPIError), savepoint(conn):
            _insert(conn, "kept", False)  # a statement error: PostgreSQL's transaction
        _insert(conn, "after-errors", False)  # goes on after the rollback to the savepoint
    with pytest.raises(ValueError), savepoint(conn):
        _insert(conn, "block-failed", False)
        with savepoint(conn):
            _insert(conn, "nested-in-failed", False)
        raise ValueError("the outer block fails after its nested one was released")
    _insert(conn, "end", False)
    assert conn.info.get("synckit_savepoints", 0) == 0
    return sorted(r[0] for r in conn.execute(text("SELECT k FROM gc_probe")))


async def test_a_savepoint_block_rolls_back_alone_and_the_transaction_goes_on(
    db: Database,
) -> None:
    await _table(db)
    names: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "SAVEPOINT" in statement.upper():
            names.append(statement.split()[-1])

    engine = db.sync_engine if db.sync_engine is not None else db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", note)
    try:
        kept = await db.write(_savepoints_in_use)
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert kept == ["after-errors", "end", "kept", "outer"]
    assert await _keys(db) == set(kept)
    # Names fixed per depth (asyncpg prepares a statement once per text).
    assert set(names) == {"synckit_sp1", "synckit_sp2"}, names
