"""What a process keeps per event loop, database and resource in memory (the pacer's
shared view of a resource, the OAuth refresh lock of a tenant) belongs to one loop and
one database as given: a schema named in the URL is a database of its own, and a new
loop never inherits a dead loop's state, whatever id it gets."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace
from typing import Any

from synckit.runtime.credentials.oauth import _refresh_lock
from synckit.runtime.http.pacer import _shared

BASE = "postgresql://postgres@127.0.0.1:5432/test"


def database(given_url: str) -> Any:
    """What the two lookups read of a Database: the URL it was given."""
    return SimpleNamespace(given_url=given_url, url=BASE)


def test_two_schemas_of_one_server_are_two_databases() -> None:
    one, other = database(f"{BASE}?search_path=a"), database(f"{BASE}?search_path=b")

    async def lookups() -> None:
        assert _shared(one, "api:acme") is _shared(one, "api:acme")
        assert _shared(one, "api:acme") is not _shared(other, "api:acme")
        assert _refresh_lock(one, "acme") is _refresh_lock(one, "acme")
        assert _refresh_lock(one, "acme") is not _refresh_lock(other, "acme")

    asyncio.run(lookups())


def test_a_new_loop_never_gets_a_dead_loops_state() -> None:
    db = database(f"{BASE}?search_path=a")
    seen: list[Any] = []

    async def first() -> None:
        view = _shared(db, "api:acme")
        view.in_flight = 3  # what the dead loop's requests left behind
        seen.append(view)
        seen.append(_refresh_lock(db, "acme"))

    async def later() -> tuple[Any, Any]:
        return _shared(db, "api:acme"), _refresh_lock(db, "acme")

    for _ in range(20):  # loops made one after another often reuse the dead one's id
        asyncio.run(first())
        gc.collect()
        view, lock = asyncio.run(later())
        assert view.in_flight == 0 and view is not seen[-2]
        assert lock is not seen[-1]
