"""open_database and migrate_database agree: both awaited in a script (the plain
open_database call of existing code still works), on both engines."""

from __future__ import annotations

import pytest

from synckit import DatabaseError, migrate_database, open_database
from synckit.store.migrate import current


async def test_await_open_then_await_migrate(db_url: str) -> None:
    """`db = await open_database(url)` connects and checks it; `await migrate_database(db)`
    brings the schema to head; the plain call gives the same kind of Database."""
    db = await open_database(db_url)
    try:
        assert await current(db) is None
        await migrate_database(db)
        assert await current(db) is not None
    finally:
        await db.dispose()
    plain = open_database(db_url)
    try:
        assert await current(plain) is not None
    finally:
        await plain.dispose()


async def test_awaiting_an_unreachable_database_fails_at_once() -> None:
    """The awaited open connects: a server that is not there is a DatabaseError there,
    not at the first query."""
    with pytest.raises(DatabaseError):
        await open_database("postgresql://nobody@127.0.0.1:9/none")
